// The per-ISA entry points of linear (defined in linear_avx2.cpp / linear_avx512.cpp; the AVX-512
// ones may only be called after isa_supported(Isa::kAvx512)). `algo` is already resolved (never
// kAuto) by linear() in linear.cpp.
#pragma once

#include <cstdint>

#include "ops/cpu/kernels.h"

namespace tachyon::ops::cpu {

void linear_avx2(const LinearArgs& args, LinearAlgo algo);
void linear_avx512(const LinearArgs& args, LinearAlgo algo);

// Rows of a weight [out, in] held in some other form (a packed quantized format), decoded to f32
// on demand: decode(context, o, k0, kc, dst) writes W[o, k0 .. k0 + kc) to dst [kc] f32. The GEMM
// asks for k0 a multiple of 256 and kc = min(256, in - k0), so a format whose blocks divide 256 and
// `in` is only ever asked for whole blocks. Called from several threads at once.
struct RowDecoder {
  void (*decode)(const void* context, int64_t o, int64_t k0, int64_t kc, float* dst) = nullptr;
  const void* context = nullptr;
};

// y = x · W^T (+ bias) through the packed-panel GEMM (LinearAlgo::kGemm), with W's panels from
// `decoder` instead of args.w (args.w and args.w_dtype are unused; the rest as for linear).
void gemm_decoded_avx2(const LinearArgs& args, const RowDecoder& decoder);
void gemm_decoded_avx512(const LinearArgs& args, const RowDecoder& decoder);

}  // namespace tachyon::ops::cpu
