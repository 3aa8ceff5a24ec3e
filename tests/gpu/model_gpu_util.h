// Helpers of the model-level GPU tests: a device tensor brought to the host, and sequences of one
// model sharing one paged cache, stepped chunk by chunk.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "core/device_memory.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/llama_model.h"

namespace tachyon::testing {

inline Tensor to_host(const Tensor& t) {
  auto h = copy_to(t, Device::cpu());
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  return std::move(h).value();
}

// Sequences of one model sharing one paged cache: each step runs every sequence's next chunk in
// one forward (logits of the chunk's last token, or of all its tokens).
struct Sessions {
  const LlamaModel* model;
  KvCache cache;
  BlockManager blocks;
  std::vector<BlockTable> tables;

  static Sessions make(const LlamaModel& model, int num_seqs, int max_tokens, DType kv_dtype, int block_size = 16) {
    const ModelConfig& c = model.config();
    KvCacheConfig kv;
    kv.num_layers = c.num_layers;
    kv.num_kv_heads = c.num_kv_heads;
    kv.head_dim = c.head_dim;
    kv.block_size = block_size;
    kv.dtype = kv_dtype;
    kv.device = model.device();
    kv.num_blocks = num_seqs * ((max_tokens + block_size - 1) / block_size + 1);
    auto cache = KvCache::create(kv);
    EXPECT_TRUE(cache.ok()) << cache.status().to_string();
    Sessions s{&model, std::move(cache).value(), BlockManager({kv.num_blocks, block_size, false, {}}), {}};
    for (int i = 0; i < num_seqs; ++i) s.tables.emplace_back(block_size);
    return s;
  }

  // chunks[i] appended to sequence i (empty: skipped); logits rows in sequence order.
  Tensor run(const std::vector<std::vector<int32_t>>& chunks, LogitsWanted wanted, const ForwardOptions& fo = {}) {
    std::vector<SequenceChunk> batch;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].empty()) continue;
      const int start = tables[i].num_tokens();
      EXPECT_TRUE(blocks.grow_to(tables[i], start + static_cast<int>(chunks[i].size())).ok());
      batch.push_back(SequenceChunk{&tables[i], start, chunks[i], wanted, {}});
    }
    ForwardBatch fb = build_forward_batch(batch);
    Tensor logits;
    const Status s = model->forward(fb, cache, logits, fo);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return logits;
  }
};

}  // namespace tachyon::testing
