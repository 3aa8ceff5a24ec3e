// Helpers shared by the quantization tests.
#pragma once

#include <gtest/gtest.h>

#include <span>

#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/llama_model.h"

namespace tachyon::testing {

// Logits [tokens.size(), vocab] of one sequence in one forward (on the host); with `hidden`, the
// final hidden rows [tokens.size(), hidden_size] there too.
inline Tensor prompt_logits(const LlamaModel& model, std::span<const int32_t> tokens, Tensor* hidden = nullptr) {
  const ModelConfig& c = model.config();
  KvCacheConfig kv;
  kv.num_layers = c.num_layers;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  kv.block_size = 16;
  kv.num_blocks = static_cast<int>(tokens.size() + 15) / 16 + 1;
  auto cache = KvCache::create(kv);
  EXPECT_TRUE(cache.ok());
  BlockManager blocks({kv.num_blocks, kv.block_size, false});
  BlockTable table(kv.block_size);
  EXPECT_TRUE(blocks.grow_to(table, static_cast<int>(tokens.size())).ok());
  ForwardBatch batch = build_forward_batch({SequenceChunk{&table, 0, tokens, LogitsWanted::kAll, {}}});
  Tensor logits;
  ForwardOptions options;
  options.hidden = hidden;
  const Status s = model.forward(batch, *cache, logits, options);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return logits;
}

}  // namespace tachyon::testing
