// linear for AVX2 + FMA + F16C (the x86-64 baseline): 8-wide f32 vectors; f16 widened by
// vcvtph2ps, bf16 by a zero extension and a 16-bit shift (GEMM packing) or as even/odd pairs
// (GEMV, below). GEMV blocks 4 rows x 2 tokens, GEMM tiles are 6 tokens x 16 outputs
// (12 accumulators of the 16 ymm registers).
#if defined(__x86_64__)

#include <immintrin.h>

#include <type_traits>
#include <vector>

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

// bf16 GEMV without widening instructions: one 256-bit load holds 16 bf16 (8 pairs); shifting each
// 32-bit lane left by 16 turns the even elements into f32, masking off the low half turns the odd
// ones into f32. x is split to match once per call ([16-column chunk][8 even, 8 odd]), so a row
// costs a load, a shift, an and and two FMAs per 16 weights — on cores with 128-bit vector units
// (Zen 1/2) that is a third fewer vector operations than widening with vpmovzxwd, and batch-1
// decode becomes bound by memory rather than by the core.
constexpr int64_t kPairChunk = 16;

// x [n, in] -> x_split [n, in16] (in16 = in rounded down to 16).
void split_even_odd(const LinearArgs& a, int64_t in16, float* x_split) {
  for (int64_t t = 0; t < a.n; ++t) {
    const float* x = a.x + t * a.x_stride;
    float* d = x_split + t * in16;
    for (int64_t c = 0; c < in16; c += kPairChunk) {
      for (int i = 0; i < 8; ++i) {
        d[c + i] = x[c + 2 * i];
        d[c + 8 + i] = x[c + 2 * i + 1];
      }
    }
  }
}

// Rows and prefetching as in gemv_tile (linear_kernels.h): rows[] are stream heads.
template <int R, int T>
inline void gemv_bf16_pairs_tile(const LinearArgs& a, const uint16_t* w, const float* x_split, int64_t in16,
                                 const int64_t* rows, int64_t tok0) {
  const int64_t in = a.in;
  const uint16_t* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = w + rows[r] * a.w_stride;
  const float* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = x_split + (tok0 + t) * in16;
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  // One token: even and odd halves accumulate apart (two FMA chains per row). Two tokens: one
  // accumulator per (row, token), so that 8 accumulators + x + one row's halves fit 16 registers.
  constexpr bool kSplit = T == 1;
  __m256 acc[R][T], acc_odd[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = acc_odd[r][t] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k < in16; k += kPairChunk) {
    if (R > 1 && (k & 31) == 0) {  // each stream's next row, one 64-byte line per 32 weights
      for (int r = 0; r < R; ++r) __builtin_prefetch(wr[r] + a.w_stride + k, 0, 3);
    }
    __m256 xe[T], xo[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      xe[t] = _mm256_loadu_ps(xs[t] + k);
      xo[t] = _mm256_loadu_ps(xs[t] + k + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[r] + k));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(v, high_half));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        acc[r][t] = _mm256_fmadd_ps(even, xe[t], acc[r][t]);
        if constexpr (kSplit) {
          acc_odd[r][t] = _mm256_fmadd_ps(odd, xo[t], acc_odd[r][t]);
        } else {
          acc[r][t] = _mm256_fmadd_ps(odd, xo[t], acc[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float y = Avx2::reduce_add(kSplit ? _mm256_add_ps(acc[r][t], acc_odd[r][t]) : acc[r][t]);
      const float* x = a.x + (tok0 + t) * a.x_stride;
      for (int64_t kk = in16; kk < in; ++kk) y += bf16_to_f32(wr[r][kk]) * x[kk];
      if (a.bias != nullptr) y += a.bias[rows[r]];
      a.y[(tok0 + t) * a.y_stride + rows[r]] = y;
    }
  }
}

template <int R>
inline void gemv_bf16_pairs_rows(const LinearArgs& a, const uint16_t* w, const float* x_split, int64_t in16,
                                 const int64_t* rows) {
  int64_t t = 0;
  if (!a.per_token) {
    for (; t + 2 <= a.n; t += 2) gemv_bf16_pairs_tile<R, 2>(a, w, x_split, in16, rows, t);
  }
  for (; t < a.n; ++t) gemv_bf16_pairs_tile<R, 1>(a, w, x_split, in16, rows, t);
}

void gemv_bf16_pairs(const LinearArgs& a) {
  const int64_t in16 = a.in / kPairChunk * kPairChunk;
  std::vector<float> x_split(static_cast<size_t>(a.n * in16));
  split_even_odd(a, in16, x_split.data());
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  gemv_streams(
      a, 2, [&](const int64_t* rows) { gemv_bf16_pairs_rows<kGemvRows>(a, w, x_split.data(), in16, rows); },
      [&](const int64_t* rows) { gemv_bf16_pairs_rows<1>(a, w, x_split.data(), in16, rows); });
}

template <class WT>
void run(const LinearArgs& a, LinearAlgo algo) {
  if (algo == LinearAlgo::kGemm) {
    gemm<Avx2, WT>(a);
  } else if constexpr (std::is_same_v<WT, Bf16>) {
    gemv_bf16_pairs(a);
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

void gemm_decoded_avx2(const LinearArgs& a, const RowDecoder& decoder) { gemm_decoded<Avx2>(a, decoder); }

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
