// y = x · W^T (+ bias) with W in a packed low-bit format (quant/quantize.h defines the layouts
// and their meaning). Two implementations, never sharing code:
// - quant_linear_reference: dequantize (quant/quantize.h), then the scalar reference linear. The
//   oracle of the kernel tests and what runs under TACHYON_ISA=scalar.
// - quant_linear: AVX2 + FMA (the x86-64 baseline; it also runs when AVX-512 is active, except
//   that int4 takes AVX-512 there and W8A8 AVX-512 VNNI when the CPU has it). The GGUF block
//   formats (Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K), int8 and int4 multiply int8 codes
//   of the activations by integer dot products (dot_linear_supported); the other formats' weights
//   are decoded in registers, 8 at a time, and multiplied into f32 accumulators (as those are
//   where int8_dot_enabled() is off); each thread owns a range of output rows and streams every
//   packed byte from memory once per call. Below kQuantGemmMinTokens tokens every token is
//   accumulated in the same order whatever the batch, so those outputs are batch-invariant (a
//   token alone equals it in any batch of fewer than kQuantGemmMinTokens tokens, bit for bit).
//   From kQuantGemmMinTokens tokens on (prefill), every format but W8A8 runs the dense linear's
//   packed-panel GEMM (linear_kernels.h) on W decoded to f32 panel by panel (RowDecoder): the f32
//   product of the unrounded activations with dequantize()'s weights, the reference's value up to
//   f32 reassociation (each token's sum runs over k in order, from the bias). That order is the
//   same for any n on this path but not the few-token kernels' (which also round the activations
//   to int8 where dot_linear_supported), so a token's output depends on whether its batch reaches
//   kQuantGemmMinTokens; batch_invariant callers keep the few-token kernels for any n.
// Both take checked arguments (ops::linear checks them).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "quant/quant_weight.h"

namespace tachyon::ops::cpu {

// The fewest tokens that take the GEMM path. `tachyon_bench gemv --rows 4864 --cols 896 (1024 for
// the K-quants) --quant F --tokens N --threads 2` on a 2-core AVX-512 machine: the GEMM overtakes
// the few-token kernels from ~16 tokens for int4, ~20 for q8_0, q4_k and q6_k and ~28 for int8;
// at 32 it is 7-40 % faster for all of them. Above 16 also keeps speculative verification (at
// most 16 tokens) and decode on the batch-invariant kernels.
inline constexpr int64_t kQuantGemmMinTokens = 32;

struct QuantLinearArgs {
  const float* x = nullptr;  // [n, in] f32, rows x_stride apart
  int64_t x_stride = 0;
  const QuantWeight* w = nullptr;  // any QuantFormat, [out, in]
  const float* bias = nullptr;     // [out] f32, or null
  float* y = nullptr;              // [n, out] f32, rows y_stride apart
  int64_t y_stride = 0;
  int64_t n = 0;
  // Every n through the few-token kernels (never the GEMM path), so that a token's output is the
  // same alone and in any batch (ops::LinearMode::kBatchInvariant).
  bool batch_invariant = false;
  // W8A8 only, filled by quant_linear: the activations quantized per token
  // (quantize_activation_row, or quantize_activation_row_static with the weight's input_scale), codes [n, qx_stride] with zero codes from in to qx_stride (a
  // multiple of 64), and their scales [n].
  const int8_t* qx = nullptr;
  int64_t qx_stride = 0;
  const float* qx_scales = nullptr;
  // The integer dot-product kernels (dot_linear_supported), filled by quant_linear: the
  // activations quantized in blocks of 32 (quantize_activation_blocks), codes [n, qx_stride]
  // (qx_stride a multiple of 64, zero codes from in on), and per block its scale qx_d and its
  // scale times the sum of its codes qx_dsum [n, qx_stride / 32].
  const float* qx_d = nullptr;
  const float* qx_dsum = nullptr;
  // Q6_K only: per half block of 16 codes, 32 * its block's d * the sum of its codes
  // [n, qx_stride / 16] (the codes' share of Q6_K's offset of 32).
  const float* qx_dhalf = nullptr;
  // dot_rows_vnni only, filled by quant_linear: each block's d_x repeated over its 8 lanes of
  // vpdpbusd's sums [n, qx_stride / 32 * 8].
  const float* qx_d_lanes = nullptr;
};

void quant_linear(const QuantLinearArgs& args);

// The GGUF block formats (Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K), per-channel int8 and
// group-wise int4 (group a multiple of 32) run as integer dot products against activations
// quantized to int8 in blocks of 32 (quant_linear_dot_avx2.cpp): the activations' rounding (half a
// step of max|x| / 127 per block of 32) is the difference from the exact f32 kernels, which
// TACHYON_INT8_DOT=0 or set_int8_dot(false) selects (isa.h; docs/quant.md).
bool dot_linear_supported(const QuantWeight& w);
// Per token, blocks of 32 of x [n, in] (rows x_stride apart): codes [n, stride] (stride a multiple
// of 32, >= in; zero past in), d [n, stride / 32] and dsum = d * sum of the block's codes. A block
// is quantize_activation_row's (quant/quantize.h) bit for bit: a NaN scale where it holds a
// non-finite value, zero codes and scale where it is all zero.
void quantize_activation_blocks(const float* x, int64_t x_stride, int64_t n, int64_t in, int8_t* codes,
                                int64_t stride, float* d, float* dsum);
void dot_rows_avx2(const QuantLinearArgs& args, int64_t o_begin, int64_t o_end);

// The integer dot-product rows with AVX-512 VNNI (quant_linear_dot_avx512.cpp; only called while
// kAvx512 is active and cpu_has_avx512_vnni()) for the formats it runs: group-wise int4 (group a
// multiple of 32), whose AVX2 tile is bound by its arithmetic.
bool dot_vnni_supported(const QuantWeight& w);
void dot_rows_vnni(const QuantLinearArgs& args, int64_t o_begin, int64_t o_end);

// W8A8 rows [o_begin, o_end) for every token with AVX-512 VNNI (quant_linear_w8a8_vnni.cpp; only
// called when cpu_has_avx512_vnni()). The integer sums are exact, so it equals the AVX2 path bit
// for bit.
void w8a8_rows_vnni(const QuantLinearArgs& args, int64_t o_begin, int64_t o_end);

// int4 group-wise rows [o_begin, o_end) for every token with AVX-512 (quant_linear_int4_avx512.cpp;
// only called while kAvx512 is active): 16 weights per vector, the same per-token chains for any
// batch.
void int4_rows_avx512(const QuantLinearArgs& args, int64_t o_begin, int64_t o_end);

// x [n, in] f32, bias [out] f32 or null, y [n, out] f32 (row strides of the tensors).
void quant_linear_reference(const Tensor& x, const QuantWeight& w, const Tensor* bias, Tensor& y);

}  // namespace tachyon::ops::cpu
