// y = x · W^T (+ bias) with W in a packed low-bit format (quant/quantize.h defines the layouts
// and their meaning). Two implementations, never sharing code:
// - quant_linear_reference: dequantize (quant/quantize.h), then the scalar reference linear. The
//   oracle of the kernel tests and what runs under TACHYON_ISA=scalar.
// - quant_linear: AVX2 + FMA (the x86-64 baseline; it also runs when AVX-512 is active, except
//   that int4 takes AVX-512 there and W8A8 AVX-512 VNNI when the CPU has it). Weights
//   are decoded in registers, 8 at a time, and multiplied into f32 accumulators; each thread owns
//   a range of output rows and streams every packed byte from memory once per call. Every token
//   is accumulated in the same order whatever the batch, so outputs are batch-invariant.
// Both take checked arguments (ops::linear checks them).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "quant/quant_weight.h"

namespace tachyon::ops::cpu {

struct QuantLinearArgs {
  const float* x = nullptr;  // [n, in] f32, rows x_stride apart
  int64_t x_stride = 0;
  const QuantWeight* w = nullptr;  // any QuantFormat, [out, in]
  const float* bias = nullptr;     // [out] f32, or null
  float* y = nullptr;              // [n, out] f32, rows y_stride apart
  int64_t y_stride = 0;
  int64_t n = 0;
  // W8A8 only, filled by quant_linear: the activations quantized per token
  // (quantize_activation_row), codes [n, qx_stride] with zero codes from in to qx_stride (a
  // multiple of 64), and their scales [n].
  const int8_t* qx = nullptr;
  int64_t qx_stride = 0;
  const float* qx_scales = nullptr;
};

void quant_linear(const QuantLinearArgs& args);

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
