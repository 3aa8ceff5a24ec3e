// The few-token integer dot-product linear (quant_linear.h) for group-wise int4 weights (Q4_0 files
// load as group 32) with AVX-512 VNNI; only called when kAvx512 is active and
// cpu_has_avx512_vnni(). The arithmetic per block of 32 columns and token is the AVX2 tile's
// (quant_linear_dot_avx2.cpp): y += (s_g * d_x) * sum_i q * code_x - s_g * z_g * dsum_x, with
// vpdpbusd in place of maddubs + madd (unsigned codes 0..15 times the signed activation codes, four
// products a lane). One 512-bit vector takes two blocks (64 weights): lanes 0-7 sum block b, lanes
// 8-15 block b + 1, and each half is scaled by its group's s times its block's d_x
// (QuantLinearArgs::qx_d_lanes repeats d_x over the block's 8 lanes). The integer sums are exact;
// the f32 order differs from the AVX2 tile's but is the same for any batch: each token keeps two
// chains (even and odd pairs of blocks) in the same order whatever the tile's size, so outputs are
// batch-invariant within this ISA.
// The other arithmetic-bound formats (Q8_0, Q5_0 as q in 0..31 less 16 times the block's code sum,
// and the same pairs of blocks) were no faster from DRAM at one thread: Q5_0 1,096-1,127 against
// 1,071-1,135 us on a 4096 x 4096 matrix, Q8_0 1,452 against 1,427-1,513 (the AVX2 tiles already
// stream them near a core's read bandwidth), so they keep the AVX2 tiles.
#include "ops/cpu/quant_linear.h"

#if defined(__x86_64__)

#include <cmath>

#include "ops/cpu/avx512_intrin.h"
#include "ops/cpu/quant_rows.h"

namespace tachyon::ops::cpu {
namespace {

constexpr int kTokens = 4;
constexpr int64_t kRowBlock = 8;
constexpr int64_t kBlock = 32;
// The AVX2 tiles' distance (quant_linear_dot_avx2.cpp kPrefetchBytes).
constexpr int kPrefetchBytes = 4096;

template <int T>
struct TokenLanes {
  const int8_t* codes[T];           // [qx_stride]
  const float* d_lanes[T];          // [qx_stride / 32 * 8]
  const float* dsum[T];             // [qx_stride / 32]
  TokenLanes(const QuantLinearArgs& a, int64_t tok0) {
    const int64_t blocks = a.qx_stride / kBlock;
    for (int t = 0; t < T; ++t) {
      codes[t] = a.qx + (tok0 + t) * a.qx_stride;
      d_lanes[t] = a.qx_d_lanes + (tok0 + t) * blocks * 8;
      dsum[t] = a.qx_dsum + (tok0 + t) * blocks;
    }
  }
};

// One pair of blocks (b, b + 1) for every token: acc += f32(dot(w, x)) * (sw * d_x). `w` holds the
// pair's 64 unsigned codes (block b + 1's zero past the row's last block, against the activations'
// padding block of zero codes and zero d).
template <int T>
inline __attribute__((always_inline)) void pair_step(const TokenLanes<T>& x, int64_t b, __m512i w, __m512 sw,
                                                     __m512 (&acc)[T]) {
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const __m512i xv = _mm512_loadu_si512(x.codes[t] + b * kBlock);
    const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xv);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(sw, _mm512_loadu_ps(x.d_lanes[t] + b * 8)),
                             acc[t]);
  }
}

// Two scales as 16 f32 lanes: the first in lanes 0-7, the second in 8-15.
inline __m512 pair_scales(float s0, float s1) {
  return _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
}

// Walks a row's blocks in pairs, alternating two chains (pair(b, single, acc, chain)), then a
// last single block (single: block b + 1 left out); the per-token sums of both chains, in this
// order for any T. A tile's scalar corrections keep one chain per chain and block of the pair (with
// a single chain its fma latency, 4 cycles a block, bounded the int4 tile).
template <int T, typename Pair>
inline __attribute__((always_inline)) void walk_pairs(int64_t blocks, __m512 (&even)[T], __m512 (&odd)[T],
                                                      const Pair& pair) {
  for (int t = 0; t < T; ++t) even[t] = odd[t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= blocks; b += 4) {
    pair(b, false, even, 0);
    pair(b + 2, false, odd, 1);
  }
  if (b + 2 <= blocks) {
    pair(b, false, even, 0);
    b += 2;
  }
  if (b < blocks) pair(b, true, odd, 1);
}

inline void store(const QuantLinearArgs& a, int64_t o, int64_t t, float sum) {
  a.y[t * a.y_stride + o] = a.bias != nullptr ? sum + a.bias[o] : sum;
}

// int4 group-wise: 32 packed bytes a pair (weight j of a block in the low nibble of its byte j,
// j + 16 in the high one), spread to the 128-bit lanes [block b low, b high, b + 1 low, b + 1 high].
template <int T>
void int4_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, blocks = in / kBlock, groups = in / q.group_size;
  const int64_t shift = q.group_size == 32 ? 0 : q.group_size == 64 ? 1 : q.group_size == 128 ? 2 : -1;
  const int64_t per_group = q.group_size / kBlock;
  const uint8_t* w = q.packed.data<uint8_t>() + o * (in / 2);  // [in / 2] u8, 16 bytes per 32 weights
  const float* scales = q.scales.data<float>() + o * groups;   // [groups] f32
  const float* zeros = q.zeros.data<float>() + o * groups;     // [groups] f32
  const TokenLanes<T> x(a, tok0);
  _mm_prefetch(reinterpret_cast<const char*>(scales + 8 * groups), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(zeros + 8 * groups), _MM_HINT_T0);
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4), low_nibbles = _mm512_set1_epi8(0x0f);
  // The zero points' share per chain, block of the pair and token, (s * z) * dsum per block,
  // subtracted at the end.
  float correction[2][2][T] = {};
  __m512 even[T], odd[T];
  walk_pairs<T>(blocks, even, odd, [&](int64_t b, bool single, __m512 (&acc)[T], int chain) __attribute__((always_inline)) {
    _mm_prefetch(reinterpret_cast<const char*>(w + b * (kBlock / 2)) + kPrefetchBytes, _MM_HINT_T0);
    const __m256i packed = _mm256_maskz_loadu_epi8(single ? 0xffff : 0xffffffff, w + b * (kBlock / 2));
    const __m512i wide = _mm512_castsi256_si512(packed);
    const __m512i codes = _mm512_and_si512(
        _mm512_srlv_epi64(_mm512_shuffle_i64x2(wide, wide, _MM_SHUFFLE(1, 1, 0, 0)), nibble_shift), low_nibbles);
    const int64_t g0 = shift >= 0 ? b >> shift : b / per_group;
    const int64_t g1 = single ? g0 : shift >= 0 ? (b + 1) >> shift : (b + 1) / per_group;
    const float s0 = scales[g0], s1 = single ? 0.0f : scales[g1];
    pair_step<T>(x, b, codes, pair_scales(s0, s1), acc);
    const float sz0 = s0 * zeros[g0];
    for (int t = 0; t < T; ++t) correction[chain][0][t] = std::fma(sz0, x.dsum[t][b], correction[chain][0][t]);
    if (!single) {
      const float sz1 = s1 * zeros[g1];
      for (int t = 0; t < T; ++t) correction[chain][1][t] = std::fma(sz1, x.dsum[t][b + 1], correction[chain][1][t]);
    }
  });
  for (int t = 0; t < T; ++t) {
    const float total = (correction[0][0][t] + correction[0][1][t]) + (correction[1][0][t] + correction[1][1][t]);
    store(a, o, tok0 + t, _mm512_reduce_add_ps(_mm512_add_ps(even[t], odd[t])) - total);
  }
}

}  // namespace

bool dot_vnni_supported(const QuantWeight& w) {
  return w.format == QuantFormat::kInt4Group && w.group_size > 0 && w.group_size % kBlock == 0;
}

void dot_rows_vnni(const QuantLinearArgs& a, int64_t o_begin, int64_t o_end) {
  if (a.w->format != QuantFormat::kInt4Group) return;
  run_rows<kTokens>(a, o_begin, o_end, kRowBlock,
                    [&a](auto tokens, int64_t o, int64_t tok0) { int4_tile<decltype(tokens)::value>(a, o, tok0); });
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
