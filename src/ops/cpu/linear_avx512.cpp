// linear for AVX-512 F/BW/VL/DQ (compiled with those flags; called only after the run-time CPU
// check): 16-wide f32 vectors; bf16 widened by a zero extension and a 16-bit shift, f16 by
// vcvtph2ps. GEMV blocks 4 rows x 4 tokens, GEMM tiles are 8 tokens x 32 outputs.
#if defined(__x86_64__)

#include "ops/cpu/avx512_intrin.h"

#include "ops/cpu/linear_isa.h"
#include "ops/cpu/linear_kernels.h"

namespace tachyon::ops::cpu {
namespace {

struct Avx512 {
  static constexpr int kWidth = 16;
  static constexpr int kGemvTokens = 4;
  static constexpr int kGemmMr = 8;
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const Bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V load(const F16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
};

template <class WT>
void run(const LinearArgs& a, LinearAlgo algo) {
  if (algo == LinearAlgo::kGemm) {
    gemm<Avx512, WT>(a);
  } else {
    gemv<Avx512, WT>(a);
  }
}

}  // namespace

void linear_avx512(const LinearArgs& a, LinearAlgo algo) {
  switch (a.w_dtype) {
    case DType::kF32: run<float>(a, algo); break;
    case DType::kBF16: run<Bf16>(a, algo); break;
    case DType::kF16: run<F16>(a, algo); break;
    default: TACHYON_CHECK(false, "linear: weight dtype {}", dtype_name(a.w_dtype));
  }
}

void gemm_decoded_avx512(const LinearArgs& a, const RowDecoder& decoder) { gemm_decoded<Avx512>(a, decoder); }

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
