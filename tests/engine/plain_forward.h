// The oracle of engine tests that compare against the model itself: the logits of every position of
// `tokens` from one batch-invariant forward over all of them on a fresh cache of its own,
// independent of the engine's scheduling, batching and sampling. [tokens.size(), vocab] f32.
#pragma once

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/llama_model.h"

namespace tachyon::testing {

inline std::vector<float> plain_forward_logits(const LlamaModel& model, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = model.config();
  KvCacheConfig kv;
  kv.num_layers = c.num_layers;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  kv.block_size = 16;
  kv.num_blocks = static_cast<int>(tokens.size() + 15) / 16;
  auto cache = KvCache::create(kv);
  EXPECT_TRUE(cache.ok());
  if (!cache.ok()) return {};
  BlockManagerOptions bo;
  bo.num_blocks = kv.num_blocks;
  bo.block_size = kv.block_size;
  bo.prefix_caching = false;
  BlockManager blocks(bo);
  BlockTable table(kv.block_size);
  EXPECT_TRUE(blocks.grow_to(table, static_cast<int>(tokens.size())).ok());
  SequenceChunk chunk;
  chunk.block_table = &table;
  chunk.tokens = tokens;
  chunk.logits = LogitsWanted::kAll;
  Tensor logits;
  ForwardOptions fo;
  fo.linear_mode = ops::LinearMode::kBatchInvariant;
  const Status st = model.forward(build_forward_batch({chunk}), *cache, logits, fo);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return {};
  return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
}

}  // namespace tachyon::testing
