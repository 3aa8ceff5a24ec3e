// linear for AVX2 + FMA + F16C (the x86-64 baseline): 8-wide f32 vectors; bf16 widened by a zero
// extension and a 16-bit shift, f16 by vcvtph2ps. GEMV blocks 4 rows x 2 tokens, GEMM tiles are
// 6 tokens x 16 outputs (12 accumulators of the 16 ymm registers).
#if defined(__x86_64__)

#include <immintrin.h>

#include "ops/cpu/linear_isa.h"
#include "ops/cpu/linear_kernels.h"

namespace tachyon::ops::cpu {
namespace {

struct Avx2 {
  static constexpr int kWidth = 8;
  static constexpr int kGemvTokens = 2;
  static constexpr int kGemmMr = 6;
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const Bf16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V load(const F16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static float reduce_add(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

template <class WT>
void run(const LinearArgs& a, LinearAlgo algo) {
  if (algo == LinearAlgo::kGemm) {
    gemm<Avx2, WT>(a);
  } else {
    gemv<Avx2, WT>(a);
  }
}

}  // namespace

void linear_avx2(const LinearArgs& a, LinearAlgo algo) {
  switch (a.w_dtype) {
    case DType::kF32: run<float>(a, algo); break;
    case DType::kBF16: run<Bf16>(a, algo); break;
    case DType::kF16: run<F16>(a, algo); break;
    default: TACHYON_CHECK(false, "linear: weight dtype {}", dtype_name(a.w_dtype));
  }
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
