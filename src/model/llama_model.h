// The one Llama-family forward (Llama 2/3, Mistral, Qwen2/2.5, Qwen3), written against ops/:
// embed → per layer [rms_norm → q,k,v (+bias) → (q/k norm) → rope → store K/V in the paged cache
// → paged attention → o_proj → residual add + rms_norm → SwiGLU MLP → residual] → final norm →
// LM head. The batch is flat: prefill chunks and decode tokens of several sequences together.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "kv/kv_cache.h"
#include "model/model_config.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace tachyon {

struct ForwardBatch {
  Tensor token_ids;   // [n_tokens] i32
  Tensor positions;   // [n_tokens] i32: position of each token in its sequence
  AttentionMetadata attention;
  Tensor logits_rows; // [n_logits] i32: rows of the batch whose logits are wanted
};

struct ForwardOptions {
  ops::LinearMode linear_mode = ops::LinearMode::kFastest;  // kBatchInvariant: outputs independent of batching
};

class LlamaModel {
 public:
  LlamaModel(ModelConfig config, ModelWeights weights);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }

  // Runs the batch, writing its K/V into `cache`, and fills logits [n_logits, vocab] f32.
  Status forward(const ForwardBatch& batch, KvCache& cache, Tensor& logits, const ForwardOptions& options = {}) const;

 private:
  ModelConfig config_;
  ModelWeights weights_;
  RopeTable rope_;
};

}  // namespace tachyon
