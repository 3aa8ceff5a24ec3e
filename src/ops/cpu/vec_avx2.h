// Small AVX2 + FMA + F16C building blocks shared by the row-wise CPU kernels (norms, rope,
// activations, attention): a vector exp, horizontal reductions, and loads that widen f16/bf16 to
// f32. Header-only; included only by files compiled with the x86-64 baseline flags.
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>

#include "core/dtype.h"

namespace tachyon::ops::cpu::avx2 {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x for f32 lanes, within ~2 ulp on [-87.3, 88.7]; 0 below, +Inf-like (3.4e38) above.
// x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two parts so n ln2 is exact), e^r from a
// degree-7 polynomial (Taylor coefficients trimmed to f32), scaled by 2^n through the exponent bits.
inline __m256 exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 hi = _mm256_set1_ps(88.72283f);
  const __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^n: n in [-126, 128]; split as 2^(n/2) * 2^(n - n/2) so n = 128 does not overflow the field.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
  const __m256 result = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  return _mm256_andnot_ps(below, result);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8_bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Loads of a cache element type, widened to f32 (scalar and 8 lanes), for templates over the
// K/V cache dtype.
struct LoadF32 {
  using T = float;
  static __m256 load(const T* p) { return load8(p); }
  static float scalar(T v) { return v; }
};
struct LoadBf16 {
  using T = uint16_t;
  static __m256 load(const T* p) { return load8_bf16(p); }
  static float scalar(T v) { return bf16_to_f32(v); }
};
struct LoadF16 {
  using T = uint16_t;
  static __m256 load(const T* p) { return load8_f16(p); }
  static float scalar(T v) { return f16_to_f32(v); }
};
// The codes of a quantized cache (the row's scale is applied by the caller).
struct LoadI8 {
  using T = int8_t;
  static __m256 load(const T* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static float scalar(T v) { return static_cast<float>(v); }
};
// e4m3 bits s.eeee.mmm placed as f16 bits s.0eeee.mmm0000000 are the same number times 2^-8,
// subnormals included (both formats' subnormal steps line up), so F16C widens them exactly.
struct LoadF8E4M3 {
  using T = uint8_t;
  static __m256 load(const T* p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
  }
  static float scalar(T v) { return f8e4m3_to_f32(v); }
};

}  // namespace tachyon::ops::cpu::avx2

#endif  // __x86_64__
