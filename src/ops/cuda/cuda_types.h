// Plain argument structs of the CUDA kernels, shared by the host API (cuda_ops.h) and the .cu
// files: the CUDA-only ones here, beside those every backend shares (ops/kernel_types.h).
// Everything here is raw device pointers, strides in elements and sizes: nothing of the engine,
// and no header that nvcc cannot parse (fmt is kept out of every .cu translation unit).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/kernel_types.h"

namespace tachyon::ops::cuda {

using Stream = cudaStream_t;

// The kernel types every backend shares (ops/kernel_types.h), under the names the CUDA code uses.
using Rows = ops::RowLayout;
using ops::AttentionBatch;
using ops::KvCacheView;

// A 16-bit copy of an op's f32 output rows: row r at data + r * stride, each value rounded to
// nearest even (the rounding linear() applies to activations before multiplying them in 16 bits),
// written by the same kernel as the f32 rows. null data: no copy.
struct Rows16 {
  void* data = nullptr;
  int64_t stride = 0;  // in elements
  DType dtype = DType::kBF16;  // kBF16 or kF16
};

// The GGUF block formats the kernels read (quant/quantize.h's kGguf* layouts: Q8_0 and Q6_K with
// their d apart, the others' blocks as stored); kNone for every other weight.
enum class GgufFormat : uint8_t { kNone, kQ8_0, kQ4_K, kQ6_K, kQ4_1, kQ5_0, kQ5_1, kIq4Nl, kQ5_K };

// How the kernels read a packed weight beyond its dtype (quant/quantize.h's layouts): kNone for
// dense, int8 (kInt8Channel), fp8 (kFp8Channel) and int4 (kInt4Group) weights, which the dtype
// tells apart; kW8A8 for int8 codes multiplied by int8-quantized activations; kTernary for 2-bit
// {-1, 0, +1} codes with group scales.
enum class QuantScheme : uint8_t { kNone, kW8A8, kTernary };

// y[n, out] = x[n, in] · W[out, in]^T (+ bias[out]). Device pointers.
struct LinearArgs {
  const float* x = nullptr;  // [n, in] f32, rows x_stride apart
  int64_t x_stride = 0;
  const void* w = nullptr;  // [out, in] f32 / f16 / bf16 / i8 (w_dtype), rows w_stride apart
  DType w_dtype = DType::kBF16;
  int64_t w_stride = 0;
  // No kernel that may still run on the stream writes w (or its scales): Weight::constant. The
  // int4 decode GEMM then requests its first weights before waiting for the kernel before.
  bool w_constant = false;
  // i8 weights (kInt8Channel): w_scales [out] f32, w = packed * scale. u8 weights: group-wise int4
  // (kInt4Group, quant/quantize.h's layout): w [out, in / 2] bytes (w_stride in bytes), w_scales
  // and w_zeros [out, in / w_group] f32, contiguous; w = (q - zero) * scale.
  // f8e4m3 weights (kFp8Channel): w_scales [out] f32, w = e4m3(packed) * scale.
  // scheme kW8A8: i8 w and w_scales as kInt8Channel; the activations are quantized per token
  // (quantize_activation_row) and y = fma(f32(sum qx qw), sx * scale, bias), the sum exact.
  // scheme kTernary: w [out, in / 4] u8 (blocks of 32 weights in 8 bytes, w_stride in bytes),
  // w_scales [out, in / w_group] f32 contiguous; w = (code - 1) * scale.
  const float* w_scales = nullptr;
  const float* w_zeros = nullptr;
  int w_group = 0;
  QuantScheme scheme = QuantScheme::kNone;
  // A static activation scale s > 0 (QuantWeight::input_scale): kW8A8 codes clamp(rint(x / s))
  // in place of the per-token ones (quantize_activation_row_static); f8e4m3 weights take their
  // activations rounded to e4m3 codes times s (round_activation_row_fp8). 0: per token / as is.
  float x_scale = 0.0f;
  // GGUF block weights (gguf != kNone; w_dtype i8 for Q8_0, u8 for the others): w the packed rows,
  // w_stride bytes apart (base and stride 16-byte aligned; Q4_1's 4-, Q5_0's and IQ4_NL's 2-,
  // Q5_1's 8-byte aligned, as their blocks lie), and w_scales_f16 the blocks' d [out, in / block]
  // f16, contiguous (Q8_0: one per 32 weights; Q6_K: one per 256; null for the other formats,
  // whose blocks hold their own).
  GgufFormat gguf = GgufFormat::kNone;
  const uint16_t* w_scales_f16 = nullptr;
  const void* bias = nullptr;  // [out] f32 / f16 / bf16 (bias_dtype), packed, or null
  DType bias_dtype = DType::kF32;
  float* y = nullptr;  // [n, out] f32, rows y_stride apart; must not overlap x
  int64_t y_stride = 0;
  int64_t n = 0, in = 0, out = 0;
};

// One stacked projection of a layer's experts (ops.h MoeExperts): expert e owns rows
// [e * rows, (e + 1) * rows) of w, `rows` being the expert's outputs (inter for gate and up,
// hidden for down). Dense f32 / f16 / bf16 (w_dtype), per-channel int8 (kI8: codes, scales
// [E * rows] f32) or group-wise int4 (kU8: quant/quantize.h's kInt4Group, w [E * rows, cols / 2]
// bytes, scales and zeros [E * rows, cols / group] f32, packed); rows w_stride elements (int4:
// bytes) apart.
struct MoeWeightView {
  const void* w = nullptr;
  DType w_dtype = DType::kBF16;
  int64_t w_stride = 0;
  const float* scales = nullptr;
  const float* zeros = nullptr;
  int group = 0;
};

// moe_experts (ops.h): y[t] = sum_j weights[t, j] * down(silu(gate x_t) * up x_t) of expert
// ids[t, j], summed in j order. Device pointers.
struct MoeArgs {
  const float* x = nullptr;  // [n, hidden] f32, rows x_stride apart
  int64_t x_stride = 0;
  const int32_t* ids = nullptr;    // [n, k] i32, packed (an id outside [0, num_experts): a NaN row of y)
  const float* weights = nullptr;  // [n, k] f32, packed
  float* y = nullptr;              // [n, hidden] f32, rows y_stride apart; must not overlap x
  int64_t y_stride = 0;
  int64_t n = 0, k = 0, hidden = 0, inter = 0;
  int num_experts = 0;
  MoeWeightView gate, up;  // [num_experts * inter, hidden]
  MoeWeightView down;      // [num_experts * hidden, inter]
  int64_t* expert_tokens = nullptr;  // [num_experts + 2] counters (ops.h moe_experts), or null
};

// rope_store_kv: q [n, q_heads, head_dim] and k [n, cache.num_kv_heads, head_dim] rotated in place
// (f32; x[t, h, :] at x + t * token_stride + h * head_stride), then k and v stored into the cache
// at slot_mapping (< 0: skip). positions, inv_freq ([rotary_dim / 2]) and slot_mapping on the
// device.
struct RopeStoreArgs {
  float* q = nullptr;
  int64_t q_heads = 0, q_token_stride = 0, q_head_stride = 0;
  float* k = nullptr;
  int64_t k_token_stride = 0, k_head_stride = 0;
  const float* v = nullptr;
  int64_t v_token_stride = 0, v_head_stride = 0;
  int64_t n = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int rotary_dim = 0;
  bool interleaved = false;
  float attention_scale = 1.0f;
  const int32_t* slot_mapping = nullptr;
};

}  // namespace tachyon::ops::cuda
