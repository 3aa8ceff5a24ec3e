// The tensors of one Llama-family model, by role. Linear weights are `Weight` (dense views
// into the mapped file, or quantized); norms and biases are small f32 copies.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "quant/quant_weight.h"

namespace tachyon {

struct LayerWeights {
  Tensor attn_norm;   // [hidden] f32
  Weight q_proj;      // [num_heads * head_dim, hidden]
  Weight k_proj;      // [num_kv_heads * head_dim, hidden]
  Weight v_proj;      // [num_kv_heads * head_dim, hidden]
  Weight o_proj;      // [hidden, num_heads * head_dim]
  Tensor q_bias;      // [num_heads * head_dim] f32, or undefined
  Tensor k_bias;      // [num_kv_heads * head_dim] f32, or undefined
  Tensor v_bias;      // [num_kv_heads * head_dim] f32, or undefined
  Tensor o_bias;      // [hidden] f32, or undefined
  Tensor q_norm;      // [head_dim] f32 (qk_norm), or undefined
  Tensor k_norm;      // [head_dim] f32 (qk_norm), or undefined
  Tensor ffn_norm;    // [hidden] f32
  Weight gate_proj;   // [intermediate, hidden]
  Weight up_proj;     // [intermediate, hidden]
  Weight down_proj;   // [hidden, intermediate]
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, hidden] f32/f16/bf16
  std::vector<LayerWeights> layers;
  Tensor final_norm;    // [hidden] f32
  Weight lm_head;       // [vocab, hidden]; the embedding table itself when tied

  // Bytes read from memory per decoded token (all linear weights + lm head + one embedding row).
  size_t decode_bytes_per_token() const;
  size_t total_bytes() const;
};

}  // namespace tachyon
