// The linear (GEMV / GEMM) kernel bodies, written once over a vector-ISA traits type `S` and
// included by linear_avx2.cpp and linear_avx512.cpp only, each compiling them with its own ISA
// flags. Everything here has internal linkage (anonymous namespace) so the two instantiations
// can never be merged by the linker.
//
// S provides: kWidth (floats per vector), V, zero(), load(const float*), load(const Bf16*),
// load(const F16*), set1(float), fmadd(a, b, c), add(a, b), store(float*, V), reduce_add(V),
// and the GEMM tile shape kGemmMr (tokens) x 2 * kWidth (outputs).
//
// GEMV (few tokens): each thread owns a contiguous range of output rows, read as 4 far-apart
// sequential streams (gemv_streams); one row of each stream is multiplied at a time with a group
// of up to kGemvTokens tokens held in registers, so every weight byte comes from memory once (the
// rows stay in L1/L2 across token groups).
// GEMM (many tokens): per thread, a panel of kNc outputs x kKc inputs of W is converted to f32
// and packed as [kNc / NR][kKc][NR] (8 x 8 register transposes); an MR x NR micro-kernel
// broadcasts x and accumulates MR * 2 vectors in registers. W is read from memory once for all
// tokens. The panel comes from a 16-bit / f32 W (pack_panel) or from a RowDecoder that turns
// rows of a packed quantized W into f32 (pack_decoded_panel); the GEMM around it is the same.
// x86-64 only: both including files are compiled with at least AVX2 + FMA + F16C.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/linear_isa.h"

namespace tachyon::ops::cpu {
namespace {

// Weight element types (16-bit storage).
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};
inline float to_f32(float v) { return v; }
inline float to_f32(Bf16 v) { return bf16_to_f32(v.bits); }
inline float to_f32(F16 v) { return f16_to_f32(v.bits); }

constexpr int kGemvRows = 4;  // weight rows streamed together

// Splits the output rows over threads (whole row groups, at least ~64 KiB of weight per chunk so
// that thread start-up stays small next to the work) and walks each thread's rows
// [r_begin, r_end) as kGemvRows far-apart streams: step i takes rows r_begin + j * q + i for
// j < kGemvRows (q = (r_end - r_begin) / kGemvRows), then leftover rows one at a time. Each
// stream then runs sequentially through its own DRAM pages, which keeps as many independent
// hardware-prefetch streams busy as a long-row GEMV has; four adjacent short rows (in ~ 1k)
// would look like one stream and leave a core at about half of its read bandwidth.
// tile4(const int64_t rows[kGemvRows]) and tile1(const int64_t rows[1]) do the work.
template <class Tile4, class Tile1>
void gemv_streams(const LinearArgs& a, int64_t weight_elem_bytes, const Tile4& tile4, const Tile1& tile1) {
  const int64_t groups = (a.out + kGemvRows - 1) / kGemvRows;
  const int64_t group_bytes = kGemvRows * a.in * weight_elem_bytes;
  const int64_t grain = std::max<int64_t>(1, (int64_t{64} << 10) / std::max<int64_t>(group_bytes, 1));
  parallel_for(groups, grain, [&](int64_t g_begin, int64_t g_end) {
    const int64_t r_begin = g_begin * kGemvRows;
    const int64_t r_end = std::min(a.out, g_end * kGemvRows);
    const int64_t q = (r_end - r_begin) / kGemvRows;
    int64_t rows[kGemvRows];
    for (int64_t i = 0; i < q; ++i) {
      for (int j = 0; j < kGemvRows; ++j) rows[j] = r_begin + j * q + i;
      tile4(rows);
    }
    for (int64_t r = r_begin + kGemvRows * q; r < r_end; ++r) {
      rows[0] = r;
      tile1(rows);
    }
  });
}

// y[tok0 .. tok0+T, rows[0 .. R)] for T tokens; U-way unrolled over k. With R > 1 the rows are
// stream heads (gemv_streams) and each stream's next row is prefetched at the same column.
template <class S, class WT, int R, int T, int U>
inline void gemv_tile(const LinearArgs& a, const WT* w, const int64_t* rows, int64_t tok0) {
  using V = typename S::V;
  constexpr int W = S::kWidth;
  const int64_t in = a.in;
  const WT* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = w + rows[r] * a.w_stride;
  const float* xt[T];
  for (int t = 0; t < T; ++t) xt[t] = a.x + (tok0 + t) * a.x_stride;

  V acc[R][T][U];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      for (int u = 0; u < U; ++u) acc[r][t][u] = S::zero();

  constexpr int64_t kStepBytes = int64_t{U} * W * static_cast<int64_t>(sizeof(WT));
  int64_t k = 0;
  for (; k + U * W <= in; k += U * W) {
    if (R > 1 && (kStepBytes >= 64 || ((k * static_cast<int64_t>(sizeof(WT))) & 63) == 0)) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        for (int64_t off = 0; off < std::max<int64_t>(kStepBytes, 64); off += 64) {
          __builtin_prefetch(reinterpret_cast<const char*>(wr[r] + a.w_stride + k) + off, 0, 3);
        }
      }
    }
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      V wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = S::load(wr[r] + k + u * W);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const V xv = S::load(xt[t] + k + u * W);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t][u] = S::fmadd(wv[r], xv, acc[r][t][u]);
      }
    }
  }
  for (; k + W <= in; k += W) {
    V wv[R];
    for (int r = 0; r < R; ++r) wv[r] = S::load(wr[r] + k);
    for (int t = 0; t < T; ++t) {
      const V xv = S::load(xt[t] + k);
      for (int r = 0; r < R; ++r) acc[r][t][0] = S::fmadd(wv[r], xv, acc[r][t][0]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      V sum = acc[r][t][0];
      for (int u = 1; u < U; ++u) sum = S::add(sum, acc[r][t][u]);
      float y = S::reduce_add(sum);
      for (int64_t kk = k; kk < in; ++kk) y += to_f32(wr[r][kk]) * xt[t][kk];
      if (a.bias != nullptr) y += a.bias[rows[r]];
      a.y[(tok0 + t) * a.y_stride + rows[r]] = y;
    }
  }
}

// All tokens of rows[0 .. R): token groups of T (the last group smaller).
template <class S, class WT, int R>
inline void gemv_rows(const LinearArgs& a, const WT* w, const int64_t* rows) {
  constexpr int T = S::kGemvTokens;
  int64_t t = 0;
  if (a.n == 1 || a.per_token) {
    // Batch 1 (or batch-invariant): two accumulators per row for more ILP.
    for (; t < a.n; ++t) gemv_tile<S, WT, R, 1, 2>(a, w, rows, t);
    return;
  }
  for (; t + T <= a.n; t += T) gemv_tile<S, WT, R, T, 1>(a, w, rows, t);
  switch (a.n - t) {
    case 0: break;
    case 1: gemv_tile<S, WT, R, 1, 2>(a, w, rows, t); break;
    case 2:
      if constexpr (T > 2) gemv_tile<S, WT, R, 2, 1>(a, w, rows, t);
      break;
    case 3:
      if constexpr (T > 3) gemv_tile<S, WT, R, 3, 1>(a, w, rows, t);
      break;
    case 4:
      if constexpr (T > 4) gemv_tile<S, WT, R, 4, 1>(a, w, rows, t);
      break;
    case 5:
      if constexpr (T > 5) gemv_tile<S, WT, R, 5, 1>(a, w, rows, t);
      break;
    default: break;
  }
  static_assert(T <= 6, "extend the remainder switch above");
}

template <class S, class WT>
void gemv(const LinearArgs& a) {
  const WT* w = static_cast<const WT*>(a.w);
  gemv_streams(
      a, sizeof(WT), [&](const int64_t* rows) { gemv_rows<S, WT, kGemvRows>(a, w, rows); },
      [&](const int64_t* rows) { gemv_rows<S, WT, 1>(a, w, rows); });
}

// ---------------------------------------------------------------------------------------------
// GEMM

constexpr int64_t kKc = 256;  // inputs per packed panel (RowDecoder, linear_isa.h, relies on 256)
constexpr int64_t kNc = 128;  // outputs per packed panel (a multiple of every NR)

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
inline std::unique_ptr<float, AlignedFree> alloc_floats(int64_t count) {
  const size_t bytes = (static_cast<size_t>(count) * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return std::unique_ptr<float, AlignedFree>(static_cast<float*>(p));
}

// 8 weights widened to f32 (AVX2 is the baseline of every file that includes this header).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const Bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const F16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// In-register transpose of the 8 x 8 block r[row][col].
inline void transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// packed[(o - o0) / NR][k - k0][(o - o0) % NR] = W[o, k] as f32; rows >= out are zero.
// 8 rows x 8 columns at a time: widened, transposed in registers, stored as 8 packed rows.
template <class WT, int NR>
void pack_panel(const LinearArgs& a, const WT* w, int64_t o0, int64_t nc, int64_t k0, int64_t kc, float* packed) {
  static_assert(NR % 8 == 0, "NR must be a multiple of 8");
  for (int64_t j = 0; j < nc; j += NR) {
    float* tile = packed + j * kc;
    for (int cb = 0; cb < NR; cb += 8) {
      const WT* src[8];
      bool valid[8];
      for (int i = 0; i < 8; ++i) {
        const int64_t o = o0 + j + cb + i;
        valid[i] = o < a.out;
        src[i] = valid[i] ? w + o * a.w_stride + k0 : w;
      }
      int64_t k = 0;
      for (; k + 8 <= kc; k += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = valid[i] ? load8(src[i] + k) : _mm256_setzero_ps();
        transpose8x8(r);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(tile + (k + i) * NR + cb, r[i]);
      }
      for (; k < kc; ++k) {
        for (int i = 0; i < 8; ++i) tile[k * NR + cb + i] = valid[i] ? to_f32(src[i][k]) : 0.0f;
      }
    }
  }
}

// pack_panel's layout from a RowDecoder: each group of 8 rows is decoded into rows [8][kc] f32
// (one decode call per row and panel), then transposed 8 x 8 as pack_panel does; rows >= out
// are zero. k0 and kc are multiples of kKc or reach `in`, so they hold whole blocks of every
// format (RowDecoder's contract).
template <int NR>
void pack_decoded_panel(const LinearArgs& a, const RowDecoder& decoder, int64_t o0, int64_t nc, int64_t k0,
                        int64_t kc, float* packed) {
  static_assert(NR % 8 == 0, "NR must be a multiple of 8");
  alignas(64) float rows[8][kKc];  // [8, kc] f32: the decoded rows of one group
  for (int64_t j = 0; j < nc; j += NR) {
    float* tile = packed + j * kc;
    for (int cb = 0; cb < NR; cb += 8) {
      for (int i = 0; i < 8; ++i) {
        const int64_t o = o0 + j + cb + i;
        if (o < a.out) {
          decoder.decode(decoder.context, o, k0, kc, rows[i]);
        } else {
          std::fill(rows[i], rows[i] + kc, 0.0f);
        }
      }
      int64_t k = 0;
      for (; k + 8 <= kc; k += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_load_ps(rows[i] + k);
        transpose8x8(r);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(tile + (k + i) * NR + cb, r[i]);
      }
      for (; k < kc; ++k) {
        for (int i = 0; i < 8; ++i) tile[k * NR + cb + i] = rows[i][k];
      }
    }
  }
}

// c[M, NR] (row stride cs) = (accumulate ? c : init ? init[NR] : 0) + x[M, kc] · packed[kc][NR].
template <class S, int M>
inline void micro_kernel(const float* x, int64_t xs,        // [M, kc] f32, rows xs apart
                         const float* packed,               // [kc][NR] f32
                         int64_t kc, float* c, int64_t cs,  // [M, NR] f32, rows cs apart
                         const float* init, bool accumulate) {
  using V = typename S::V;
  constexpr int W = S::kWidth;
  V acc[M][2];
  for (int m = 0; m < M; ++m) {
    if (accumulate) {
      acc[m][0] = S::load(c + m * cs);
      acc[m][1] = S::load(c + m * cs + W);
    } else if (init != nullptr) {
      acc[m][0] = S::load(init);
      acc[m][1] = S::load(init + W);
    } else {
      acc[m][0] = S::zero();
      acc[m][1] = S::zero();
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    const V b0 = S::load(packed + k * 2 * W);
    const V b1 = S::load(packed + k * 2 * W + W);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const V xv = S::set1(x[m * xs + k]);
      acc[m][0] = S::fmadd(xv, b0, acc[m][0]);
      acc[m][1] = S::fmadd(xv, b1, acc[m][1]);
    }
  }
  for (int m = 0; m < M; ++m) {
    S::store(c + m * cs, acc[m][0]);
    S::store(c + m * cs + W, acc[m][1]);
  }
}

template <class S>
using MicroKernelFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, const float*, bool);

template <class S, int M>
constexpr MicroKernelFn<S> micro_kernel_for() {
  return &micro_kernel<S, M>;
}

// micro_kernel<S, m> for m in 1..kGemmMr.
template <class S, size_t... I>
constexpr auto make_micro_kernels(std::index_sequence<I...>) {
  return std::array<MicroKernelFn<S>, sizeof...(I)>{micro_kernel_for<S, static_cast<int>(I) + 1>()...};
}

// Outputs [o_begin, o_end) (multiples of NR except at `out`) for tokens [t_begin, t_end).
// pack(o0, nc, k0, kc, packed) fills packed [nc / NR][kc][NR] f32 with W[o0 .. o0 + nc, k0 .. k0 + kc)
// (zero rows from `out` on), as pack_panel lays it out.
template <class S, class PackPanel>
void gemm_range(const LinearArgs& a, const PackPanel& pack, const float* bias_padded, int64_t o_begin, int64_t o_end,
                int64_t t_begin, int64_t t_end) {
  constexpr int W = S::kWidth;
  constexpr int NR = 2 * W;
  constexpr int MR = S::kGemmMr;
  static constexpr auto kernels = make_micro_kernels<S>(std::make_index_sequence<MR>{});
  auto packed = alloc_floats(kNc * kKc);
  alignas(64) float edge[MR * NR] = {};  // a partial output tile (out not a multiple of NR)

  for (int64_t o0 = o_begin; o0 < o_end; o0 += kNc) {
    const int64_t nc_valid = std::min(kNc, o_end - o0);
    const int64_t nc = (nc_valid + NR - 1) / NR * NR;
    for (int64_t k0 = 0; k0 < a.in; k0 += kKc) {
      const int64_t kc = std::min(kKc, a.in - k0);
      pack(o0, nc, k0, kc, packed.get());
      const bool accumulate = k0 > 0;
      for (int64_t t0 = t_begin; t0 < t_end; t0 += MR) {
        const int m = static_cast<int>(std::min<int64_t>(MR, t_end - t0));
        const auto kernel = kernels[static_cast<size_t>(m - 1)];
        const float* xb = a.x + t0 * a.x_stride + k0;
        for (int64_t j = 0; j < nc; j += NR) {
          const int64_t o = o0 + j;
          const float* init = (bias_padded != nullptr) ? bias_padded + o : nullptr;
          const int64_t valid = std::min<int64_t>(NR, a.out - o);
          if (valid == NR) {
            kernel(xb, a.x_stride, packed.get() + j * kc, kc, a.y + t0 * a.y_stride + o, a.y_stride, init, accumulate);
          } else {
            if (accumulate) {
              for (int mm = 0; mm < m; ++mm) std::memcpy(edge + mm * NR, a.y + (t0 + mm) * a.y_stride + o, valid * 4);
            }
            kernel(xb, a.x_stride, packed.get() + j * kc, kc, edge, NR, init, accumulate);
            for (int mm = 0; mm < m; ++mm) std::memcpy(a.y + (t0 + mm) * a.y_stride + o, edge + mm * NR, valid * 4);
          }
        }
      }
    }
  }
}

template <class S, class PackPanel>
void gemm_packed(const LinearArgs& a, const PackPanel& pack) {
  constexpr int NR = 2 * S::kWidth;
  constexpr int MR = S::kGemmMr;
  const int64_t tiles = (a.out + NR - 1) / NR;
  std::unique_ptr<float, AlignedFree> bias_padded;
  if (a.bias != nullptr) {
    bias_padded = alloc_floats(tiles * NR);
    std::memcpy(bias_padded.get(), a.bias, static_cast<size_t>(a.out) * 4);
    std::fill(bias_padded.get() + a.out, bias_padded.get() + tiles * NR, 0.0f);
  }
  const int threads = num_threads();
  const int64_t token_blocks = (a.n + MR - 1) / MR;
  if (tiles >= 2 * threads || token_blocks < 2 * threads) {
    // Split the outputs: each thread packs and reads only its own slice of W.
    // At least ~1M multiply-adds per chunk.
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, a.n * a.in * NR));
    parallel_for(tiles, grain, [&](int64_t tb, int64_t te) {
      gemm_range<S>(a, pack, bias_padded.get(), tb * NR, std::min(a.out, te * NR), 0, a.n);
    });
  } else {
    // Few outputs, many tokens: split the tokens (each thread packs all of W).
    parallel_for(token_blocks, 1, [&](int64_t bb, int64_t be) {
      gemm_range<S>(a, pack, bias_padded.get(), 0, a.out, bb * MR, std::min(a.n, be * MR));
    });
  }
}

template <class S, class WT>
void gemm(const LinearArgs& a) {
  const WT* w = static_cast<const WT*>(a.w);
  gemm_packed<S>(a, [&](int64_t o0, int64_t nc, int64_t k0, int64_t kc, float* packed) {
    pack_panel<WT, 2 * S::kWidth>(a, w, o0, nc, k0, kc, packed);
  });
}

// a.w and a.w_dtype are unused: W's rows come from `decoder`.
template <class S>
void gemm_decoded(const LinearArgs& a, const RowDecoder& decoder) {
  gemm_packed<S>(a, [&](int64_t o0, int64_t nc, int64_t k0, int64_t kc, float* packed) {
    pack_decoded_panel<2 * S::kWidth>(a, decoder, o0, nc, k0, kc, packed);
  });
}

}  // namespace
}  // namespace tachyon::ops::cpu
