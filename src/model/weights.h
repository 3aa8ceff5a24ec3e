// The tensors of one Llama-family model, by role. Linear weights are `Weight` (dense views
// into the mapped file, or quantized); norms and biases are small f32 copies.
#pragma once

#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/ops.h"
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
  // On a GPU, q/k/v and gate/up are stored as one matrix each (one launch, one pass over the
  // input) and the separate weights above are row-range views of them; undefined otherwise.
  Weight qkv_proj;    // [q_dim + 2 * kv_dim, hidden]
  Tensor qkv_bias;    // [q_dim + 2 * kv_dim] f32, when q/k/v have biases
  Weight gate_up_proj;  // [2 * intermediate, hidden]
  // A sparse (MoE) layer: the router and the experts' stacked weights (ops::MoeExperts); its
  // gate/up/down_proj above hold the shared expert (Qwen2-MoE), undefined when it has none, and
  // shared_expert_gate [1, hidden] its sigmoid gate. A dense layer leaves these undefined.
  Weight router;        // [num_experts, hidden]
  ops::MoeExperts experts;
  Weight shared_expert_gate;
  bool is_moe() const { return experts.num_experts > 0; }
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, hidden] f32/f16/bf16
  std::vector<LayerWeights> layers;
  Tensor final_norm;    // [hidden] f32
  Weight lm_head;       // [vocab, hidden]; the embedding table itself when tied

  // Bytes read from memory per decoded token: every linear weight (of a sparse layer, the router
  // and `experts_per_token` of its experts, the average expert's bytes) + lm head + one embedding row.
  size_t decode_bytes_per_token(int experts_per_token = 0) const;
  size_t total_bytes() const;
};

// A copy of `weights` on `device`, dtypes unchanged (a tied LM head stays shared with the
// embedding). Quantized weights move packed where the device has kernels for their format (on a
// GPU: every QuantFormat); any other is an error naming the weight and the format.
Result<ModelWeights> copy_weights_to(const ModelWeights& weights, Device device);

// Makes LayerWeights::qkv_proj / gate_up_proj (and qkv_bias) on the weights' device, turning the
// separate weights into views of them: dense pieces of one dtype, or packed pieces of one format
// and group (their tensors' rows stacked). Layers whose pieces differ are left as they are.
Status fuse_projections(ModelWeights& weights);

// One weight whose rows are the parts' rows, one part after another (dense of one dtype, or packed
// of one format and group), in new memory on the parts' device: how experts stored one tensor
// each become a stack (ops::MoeExperts).
Result<Weight> stack_rows(std::vector<Weight> parts, const char* what);

}  // namespace tachyon
