// ModelConfig: everything the one Llama-family forward needs to know, read from a HF
// config.json, GGUF metadata or a llama2.c header. Architecture differences are flags here
// (QKV bias, q/k norm, sliding window, tied embeddings, rope style and scaling), never copies
// of the forward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "ops/ops.h"

namespace tachyon {

class GgufFile;

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM", "Qwen2ForCausalLM", ... (or GGUF "llama", "qwen2")
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 2048;
  float rms_norm_eps = 1e-5f;
  RopeConfig rope;
  // Per-dimension-pair divisors of the rope frequencies (GGUF `rope_freqs.weight`, how
  // llama.cpp stores Llama 3.1 scaling); empty = none.
  std::vector<float> rope_freq_divisors;
  bool attention_bias = false;      // Qwen2: biases on q/k/v projections
  bool qk_norm = false;             // Qwen3: RMSNorm over each head of q and k before RoPE
  int sliding_window = 0;           // Mistral: attend to the last N positions; 0 = full
  bool tie_word_embeddings = false; // LM head reuses the embedding table
  // Mixture of experts (Qwen3-MoE, Qwen2-MoE, Mixtral): a sparse layer's MLP is num_experts
  // SwiGLU experts of moe_intermediate_size, of which each token runs the num_experts_per_tok its
  // router ranks highest (weighted by their softmax probabilities, renormalised over the chosen
  // when norm_topk_prob), plus, with shared_expert_intermediate_size > 0 (Qwen2-MoE), a shared
  // expert scaled by sigmoid of its gate. num_experts = 0: a dense model.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = true;
  int shared_expert_intermediate_size = 0;
  // Which layers are sparse: all but mlp_only_layers, of those every decoder_sparse_step-th (HF
  // Qwen-MoE: layer l when (l + 1) % step == 0). Dense layers use intermediate_size.
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  bool is_moe() const { return num_experts > 0; }
  bool is_moe_layer(int layer) const;
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Parameter count (embedding counted once when tied).
  int64_t num_parameters() const;
  // Parameters a token uses: num_parameters() less the experts a sparse layer leaves unchosen
  // (the "A3B" of Qwen3-30B-A3B; embeddings counted as num_parameters() counts them).
  int64_t active_parameters() const;
  // Checks the numbers fit together (positive, divisible, within sane limits).
  Status validate(const std::string& source) const;
  std::string summary() const;
};

// config.json of a Hugging Face model directory. Unknown architectures -> Unsupported.
Result<ModelConfig> model_config_from_hf(const nlohmann::json& config, const std::string& path);
// GGUF metadata (general.architecture = llama | qwen2 | qwen3 | mistral).
Result<ModelConfig> model_config_from_gguf(const GgufFile& gguf);

}  // namespace tachyon
