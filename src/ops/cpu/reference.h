// Scalar reference kernels: one plain-loop implementation of every op in ops/ops.h, with the
// same signatures and semantics, accumulating in double where that is cheap. They are the
// oracle of the kernel tests and the path that runs under TACHYON_ISA=scalar (or on CPUs without
// AVX2). They favour obviousness over speed and must never share code with the fast kernels
// beyond the definitions below that fix the ops' numerics (rope_angle_cos_sin).
// Arguments are assumed checked by ops:: (shapes, dtypes, devices); tests call these directly
// with valid arguments.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>

#include "core/tensor.h"
#include "ops/ops.h"

namespace tachyon::ops::reference {

// The rotation angle of rope pair i at `position` is f32(position * inv_freq[i]) — one f32
// rounding, as Hugging Face computes it — and cos/sin of that angle are evaluated in double, then
// multiplied by the table's attention_scale. Every rope implementation uses this definition.
inline void rope_cos_sin(int32_t position, float inv_freq, float attention_scale, float* cos_out, float* sin_out) {
  const float angle = static_cast<float>(position) * inv_freq;
  *cos_out = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_scale;
  *sin_out = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_scale;
}

void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y);
void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y);
void rope(Tensor& x, const Tensor& positions, const RopeTable& table);
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out);
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
// Mixture of experts: the router one row at a time (softmax in double, rounded to f32, then a
// stable ranking); the experts one (token, choice) at a time through linear() of the expert's
// rows (packed experts dequantized to f32 first), summed in choice order.
void moe_route(const Tensor& logits, bool normalize, Tensor& ids, Tensor& weights);
void moe_experts(const Tensor& x, const MoeExperts& experts, const Tensor& ids, const Tensor& weights, Tensor& y);
void add_sigmoid_gated(Tensor& y, const Tensor& x, const Tensor& gate);
void softmax(Tensor& x);
void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvLayer& cache);
// One (token, kv head) row x[head_dim] of a quantized cache (i8 / f8e4m3): codes[head_dim] and
// its scale, by ops.h KvLayer's rule. The CPU store_kv kernel quantizes through this too.
void quantize_kv_row(const float* x, int64_t head_dim, DType dtype, void* codes, float* scale);
// One row x[head_dim] of a history pool (ops.h KvLayer): bits 8 (codes[head_dim] i8, params[1]
// f32 s) or 4 (codes[head_dim / 2] u8, params[2] f16 s, lo).
void quantize_history_row(const float* x, int64_t head_dim, int bits, void* codes, void* params);
// Element i of a history row as f32.
float history_value(const void* codes, const void* params, int bits, int64_t i);
// An int4 history row's (s, lo) as f32, from its f16 params.
std::pair<float, float> int4_history_params(const void* params);
void compress_kv_blocks(const Tensor& pairs, KvLayer& cache);
// Key bounds (ops.h KvLayer) of one (history block, kv head) from its keys' element-wise minimum
// mn and maximum mx [head_dim] (a NaN anywhere: the non-finite block): codes [2, head_dim / 2]
// and params [key_bound_groups(head_dim), 2] = lo, step.
void key_bounds_codes(const float* mn, const float* mx, int64_t head_dim, uint8_t* codes, float* params);
// The bound of ops.h select_kv_blocks for query head q[head_dim] (summed in double).
float key_bound(const float* q, const uint8_t* codes, const float* params, int64_t head_dim);
void select_kv_blocks(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta, Tensor& tables,
                      Tensor& lens);
// Gathers each sequence's K/V through its block table, one key at a time (a quantized cache's
// as code * scale), and takes a full softmax per (query, head) with the causal and
// sliding-window mask.
void paged_attention(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta,
                     const AttentionParams& params, Tensor& out);

// Textbook attention of one sequence over a contiguous cache: q [n, num_heads, head_dim] f32 are
// the last n positions of a context whose keys and values are k, v [context_len, num_kv_heads,
// head_dim] f32; out [n, num_heads, head_dim] f32. Builds the full score matrix. The end of the
// paged-vs-contiguous chain of oracles.
void contiguous_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                          Tensor& out);

}  // namespace tachyon::ops::reference
