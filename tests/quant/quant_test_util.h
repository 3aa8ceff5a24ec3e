// Helpers shared by the quantization tests.
#pragma once

#include <gtest/gtest.h>

#include <span>

#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "test_util.h"

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
  BlockManager blocks({kv.num_blocks, kv.block_size, false, {}});
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

// The bundled model cut to its first `layers` layers, linear weights in f32 (`loaded` keeps the
// rest: tokenizer, config).
inline LlamaModel demo_f32(int layers, LoadedModel* loaded) {
  LoadOptions o;
  o.path = source_dir() + "/models/tachyon-demo";
  auto m = load_model(o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  *loaded = std::move(m).value();
  ModelConfig c = loaded->model->config();
  ModelWeights w = loaded->model->weights();
  c.num_layers = layers;
  w.layers.resize(static_cast<size_t>(layers));
  for (LayerWeights& l : w.layers) {
    for (Weight* p : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      p->dense = p->dense.to_f32();
    }
  }
  return LlamaModel(c, std::move(w));
}

}  // namespace tachyon::testing
