// The AVX2 + FMA (+ F16C) quantized linear (quant_linear.h). Per output row, 8 packed weights at a time
// are widened to i32, converted to f32 (int4: minus the group's zero point) and multiplied into
// f32 accumulators with up to kTokens tokens sharing each decoded vector; int8 applies the row's
// scale once at the end, int4 each group's scale when the group is done. Threads own blocks of
// kRowBlock rows: a block's packed rows stay in L1 while every token group passes over them, so
// each weight byte comes from memory once per call whatever the batch.
// Every token keeps the same two accumulator chains in the same order for any batch size and any
// tokens-per-tile, which makes the outputs batch-invariant below kQuantGemmMinTokens tokens.
// From kQuantGemmMinTokens tokens on, the row decoders at the end of this file feed the dense
// linear's packed-panel GEMM instead (gemm_decoded_*, linear_isa.h): a weight is decoded once per
// call rather than once per tile of a few tokens.
#include "ops/cpu/quant_linear.h"

#include "core/status.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/ggml_blocks.h"
#include "core/thread_pool.h"
#include "ops/cpu/ggml_blocks_avx2.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/linear_isa.h"
#include "ops/cpu/quant_rows.h"
#include "quant/quantize.h"

namespace tachyon::ops::cpu {
namespace {

constexpr int64_t kRowBlock = 8;   // rows a thread finishes before moving on
constexpr int kInt8Tokens = 4;     // tokens per tile: 8 accumulators + 2 weight vectors + x
constexpr int kInt4Tokens = 3;     // 6 group accumulators + 3 final ones + 4 weight vectors + x
constexpr int64_t kInt4Block = 32; // weights per 16 packed bytes (quant/quantize.h)
constexpr int kGgufTokens = 4;     // GGUF tiles: 4 tokens x 2 accumulators + 4 decoded weights + x

inline float reduce_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The rows of x of tokens tok0 .. tok0 + T.
template <int T>
inline void token_rows(const QuantLinearArgs& a, int64_t tok0, const float* (&xt)[T]) {
  for (int t = 0; t < T; ++t) xt[t] = a.x + (tok0 + t) * a.x_stride;
}

// y[t, o] = sum (+ bias[o]).
inline void store_output(const QuantLinearArgs& a, int64_t o, int64_t t, float sum) {
  a.y[t * a.y_stride + o] = a.bias != nullptr ? sum + a.bias[o] : sum;
}

// y[tok0 .. tok0 + T, o] for int8 per-channel weights (any in: 16, then 8, then scalar steps).
template <int T>
void int8_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features;
  const int8_t* w = q.packed.data<int8_t>() + o * in;  // [in] i8
  const float* xt[T];
  token_rows<T>(a, tok0, xt);
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= in; k += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k));
    const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt[t] + k), acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt[t] + k + 8), acc[t][1]);
    }
  }
  if (k + 8 <= in) {
    const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k))));
    for (int t = 0; t < T; ++t) acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt[t] + k), acc[t][0]);
    k += 8;
  }
  const float scale = q.scales.data<float>()[o];
  for (int t = 0; t < T; ++t) {
    float sum = reduce_add(_mm256_add_ps(acc[t][0], acc[t][1]));
    for (int64_t kk = k; kk < in; ++kk) sum += static_cast<float>(w[kk]) * xt[t][kk];
    store_output(a, o, tok0 + t, sum * scale);
  }
}

// y[tok0 .. tok0 + T, o] for int4 group-wise weights (in is a multiple of the group, itself a
// multiple of 32).
template <int T>
void int4_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, group = q.group_size, groups = in / group;
  const uint8_t* w = q.packed.data<uint8_t>() + o * (in / 2);  // [in / 2] u8
  const float* scales = q.scales.data<float>() + o * groups;   // [groups] f32
  const float* zeros = q.zeros.data<float>() + o * groups;     // [groups] f32
  const float* xt[T];
  token_rows<T>(a, tok0, xt);
  const __m128i low_nibbles = _mm_set1_epi8(0x0f);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const __m256 zero = _mm256_set1_ps(zeros[g]);
    __m256 gacc[T][2];
    for (int t = 0; t < T; ++t) gacc[t][0] = gacc[t][1] = _mm256_setzero_ps();
    for (int64_t k = g * group; k < (g + 1) * group; k += kInt4Block) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2));
      const __m128i lo = _mm_and_si128(b, low_nibbles);                     // weights k .. k + 16
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low_nibbles);  // weights k + 16 .. k + 32
      const __m256 w0 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), zero);
      const __m256 w1 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), zero);
      const __m256 w2 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), zero);
      const __m256 w3 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), zero);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        gacc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt[t] + k), gacc[t][0]);
        gacc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt[t] + k + 8), gacc[t][1]);
        gacc[t][0] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt[t] + k + 16), gacc[t][0]);
        gacc[t][1] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt[t] + k + 24), gacc[t][1]);
      }
    }
    const __m256 scale = _mm256_set1_ps(scales[g]);
    for (int t = 0; t < T; ++t) acc[t] = _mm256_fmadd_ps(scale, _mm256_add_ps(gacc[t][0], gacc[t][1]), acc[t]);
  }
  for (int t = 0; t < T; ++t) store_output(a, o, tok0 + t, reduce_add(acc[t]));
}

// The GGUF block formats (quant/quantize.h's kGguf* layouts). Each block's weights are decoded to
// f32 exactly as core/ggml_blocks.h defines them (one rounding per weight: the scale products are
// exact), 8 at a time, and multiplied into two accumulators per token.

// acc[t][j % 2] += w[j] * x_t[k + 8 j] for four decoded vectors w[0..4) at column k. Inlined by
// force: past GCC's inlining budget for quant_linear's tiles it became a call per 32 weights with
// the accumulators in memory (exact Q8_0 on an L3-resident 4096 x 1024 matrix, one thread: 549
// against 355 us).
template <int T>
__attribute__((always_inline)) inline void fma4(const __m256 (&w)[4], const float* const (&xt)[T], int64_t k,
                                               __m256 (&acc)[T][2]) {
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    acc[t][0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xt[t] + k), acc[t][0]);
    acc[t][1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt[t] + k + 8), acc[t][1]);
    acc[t][0] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt[t] + k + 16), acc[t][0]);
    acc[t][1] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt[t] + k + 24), acc[t][1]);
  }
}

template <int T>
inline void store_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0, const __m256 (&acc)[T][2]) {
  for (int t = 0; t < T; ++t) store_output(a, o, tok0 + t, reduce_add(_mm256_add_ps(acc[t][0], acc[t][1])));
}

inline __m256 f16_splat(uint16_t bits) { return _mm256_set1_ps(_cvtsh_ss(bits)); }

// Q6_K's 6-bit codes (0..63) of weights l0 .. l0 + 7 of each 32-weight quarter k of a 128-weight
// half: low nibbles from ql (L = ql + 64 h + l0; quarters 0/2 from L, 1/3 from L + 32, their low
// and high nibbles), two high bits from qh (H = qh + 32 h + l0, bits 2k .. 2k + 1).
inline void q6_k_codes(const uint8_t* L, const uint8_t* H, __m256i (&codes)[4]) {
  const auto load8 = [](const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  };
  const __m256i low4 = _mm256_set1_epi32(15), low2 = _mm256_set1_epi32(3);
  const __m256i lo = load8(L), hi = load8(L + 32), qh = load8(H);
  codes[0] = _mm256_or_si256(_mm256_and_si256(lo, low4), _mm256_slli_epi32(_mm256_and_si256(qh, low2), 4));
  codes[1] = _mm256_or_si256(_mm256_and_si256(hi, low4),
                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, 2), low2), 4));
  codes[2] = _mm256_or_si256(_mm256_srli_epi32(lo, 4),
                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, 4), low2), 4));
  codes[3] = _mm256_or_si256(_mm256_srli_epi32(hi, 4), _mm256_slli_epi32(_mm256_srli_epi32(qh, 6), 4));
}

// Q8_0: per block of 32, w = d * code.
template <int T>
void q8_0_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, blocks = in / kGgmlBlock32;
  const int8_t* codes = q.packed.data<int8_t>() + o * in;      // [in] i8
  const uint16_t* d = q.scales.data<uint16_t>() + o * blocks;  // [in / 32] f16
  const float* xt[T];
  token_rows<T>(a, tok0, xt);
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256 scale = f16_splat(d[b]);
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + b * kGgmlBlock32));
    const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
    const __m256 w[4] = {_mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c0))),
                         _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8)))),
                         _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c1))),
                         _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c1, 8))))};
    fma4<T>(w, xt, b * kGgmlBlock32, acc);
  }
  store_tile<T>(a, o, tok0, acc);
}


// Q4_1, Q5_0, Q5_1 and IQ4_NL: per block of 32, w = d * code, or d * code + m as one fmadd (d * code
// is exact, 11 x 5 significant bits, so the weight rounds once as ggml_blocks.cpp's mul and add).
template <int T, typename Block>
void block32_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t blocks = q.in_features / kGgmlBlock32;
  const uint8_t* row = q.packed.data<uint8_t>() + o * blocks * Block::kBytes;  // [in / 32 * kBytes] u8
  const float* xt[T];
  token_rows<T>(a, tok0, xt);
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* p = row + b * Block::kBytes;
    uint16_t d_bits, m_bits = 0;
    std::memcpy(&d_bits, p, 2);
    if constexpr (Block::kMOffset >= 0) std::memcpy(&m_bits, p + Block::kMOffset, 2);
    const __m256 d = f16_splat(d_bits), m = f16_splat(m_bits);
    const __m256i c = Block::codes(p);
    const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
    const __m256i codes[4] = {_mm256_cvtepi8_epi32(c0), _mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8)),
                              _mm256_cvtepi8_epi32(c1), _mm256_cvtepi8_epi32(_mm_srli_si128(c1, 8))};
    __m256 w[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 f = _mm256_cvtepi32_ps(codes[k]);
      w[k] = Block::kMOffset >= 0 ? _mm256_fmadd_ps(d, f, m) : _mm256_mul_ps(d, f);
    }
    fma4<T>(w, xt, b * kGgmlBlock32, acc);
  }
  store_tile<T>(a, o, tok0, acc);
}

// Q4_K: per sub-block of 32, w = (d * sc) * q - dmin * m (one fmsub: the product is exact).
template <int T>
void q4_k_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, blocks = in / kGgmlBlockK;
  const uint8_t* row = q.packed.data<uint8_t>() + o * blocks * kQ4_KBytes;
  const float* xt[T];
  token_rows<T>(a, tok0, xt);
  const __m128i low_nibbles = _mm_set1_epi8(0x0f);
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * kQ4_KBytes;
    uint16_t d_bits, dmin_bits;
    std::memcpy(&d_bits, block, 2);
    std::memcpy(&dmin_bits, block + 2, 2);
    const float d = _cvtsh_ss(d_bits), dmin = _cvtsh_ss(dmin_bits);
    const uint8_t* qs = block + 16;
    for (int c = 0; c < 4; ++c) {
      const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 32 * c));
      const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 32 * c + 16));
      for (int half = 0; half < 2; ++half) {  // sub-block 2c: low nibbles; 2c + 1: high nibbles
        int sc, m;
        q4_k_scale_min(block + 4, 2 * c + half, &sc, &m);
        const __m256 scale = _mm256_set1_ps(d * static_cast<float>(sc));
        const __m256 min = _mm256_set1_ps(dmin * static_cast<float>(m));
        const __m128i n0 = half == 0 ? _mm_and_si128(b0, low_nibbles) : _mm_and_si128(_mm_srli_epi16(b0, 4), low_nibbles);
        const __m128i n1 = half == 0 ? _mm_and_si128(b1, low_nibbles) : _mm_and_si128(_mm_srli_epi16(b1, 4), low_nibbles);
        const __m256 w[4] = {
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(n0)), min),
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(n0, 8))), min),
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(n1)), min),
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(n1, 8))), min)};
        fma4<T>(w, xt, b * kGgmlBlockK + 64 * c + 32 * half, acc);
      }
    }
  }
  store_tile<T>(a, o, tok0, acc);
}

// Q5_K: Q4_K's tile with the fifth bits (bit 2c of qh[l] for the low nibbles of chunk c, 2c + 1
// for the high ones); w = (d * sc) * q - dmin * m, the product exact (11 x 6 x 5 significant bits).
template <int T>
void q5_k_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, blocks = in / kGgmlBlockK;
  const uint8_t* row = q.packed.data<uint8_t>() + o * blocks * kQ5_KBytes;
  const float* xt[T];
  token_rows<T>(a, tok0, xt);
  const __m128i low_nibbles = _mm_set1_epi8(0x0f), bit4 = _mm_set1_epi8(0x10);
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * kQ5_KBytes;
    uint16_t d_bits, dmin_bits;
    std::memcpy(&d_bits, block, 2);
    std::memcpy(&dmin_bits, block + 2, 2);
    const float d = _cvtsh_ss(d_bits), dmin = _cvtsh_ss(dmin_bits);
    const uint8_t* qs = block + kQ5_KQs;
    // qh[0..16) and qh[16..32), shifted right by 2c for chunk c: bits 0 and 1 of each byte are
    // then the chunk's (a 16-bit shift moves the next byte's bits in only at bit 8 - 2c >= 2).
    __m128i h0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ5_KQh));
    __m128i h1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ5_KQh + 16));
    for (int c = 0; c < 4; ++c) {
      const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 32 * c));
      const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 32 * c + 16));
      for (int half = 0; half < 2; ++half) {  // sub-block 2c: low nibbles and bit 0; 2c + 1: high nibbles and bit 1
        int sc, m;
        q4_k_scale_min(block + 4, 2 * c + half, &sc, &m);
        const __m256 scale = _mm256_set1_ps(d * static_cast<float>(sc));
        const __m256 min = _mm256_set1_ps(dmin * static_cast<float>(m));
        const __m128i f0 = _mm_and_si128(half == 0 ? _mm_slli_epi16(h0, 4) : _mm_slli_epi16(h0, 3), bit4);
        const __m128i f1 = _mm_and_si128(half == 0 ? _mm_slli_epi16(h1, 4) : _mm_slli_epi16(h1, 3), bit4);
        const __m128i n0 = _mm_or_si128(
            half == 0 ? _mm_and_si128(b0, low_nibbles) : _mm_and_si128(_mm_srli_epi16(b0, 4), low_nibbles), f0);
        const __m128i n1 = _mm_or_si128(
            half == 0 ? _mm_and_si128(b1, low_nibbles) : _mm_and_si128(_mm_srli_epi16(b1, 4), low_nibbles), f1);
        const __m256 w[4] = {
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(n0)), min),
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(n0, 8))), min),
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(n1)), min),
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(n1, 8))), min)};
        fma4<T>(w, xt, b * kGgmlBlockK + 64 * c + 32 * half, acc);
      }
      h0 = _mm_srli_epi16(h0, 2);
      h1 = _mm_srli_epi16(h1, 2);
    }
  }
  store_tile<T>(a, o, tok0, acc);
}

// Q6_K: per 16 weights, w = (d * scale) * (q - 32); the 6-bit codes are assembled in 32-bit lanes,
// 8 consecutive l of one half at a time (core/ggml_blocks.h's indexing).
template <int T>
void q6_k_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, blocks = in / kGgmlBlockK;
  const uint8_t* row = q.packed.data<uint8_t>() + o * blocks * kQ6_KD;  // blocks less their d
  const uint16_t* d = q.scales.data<uint16_t>() + o * blocks;           // [in / 256] f16
  const float* xt[T];
  token_rows<T>(a, tok0, xt);
  const __m256i bias = _mm256_set1_epi32(32);
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = row + b * kQ6_KD;
    const auto* scales = reinterpret_cast<const int8_t*>(block + kQ6_KScales);
    const float db = _cvtsh_ss(d[b]);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* L = block + 64 * h;
      const uint8_t* H = block + kQ6_KQh + 32 * h;
      for (int l0 = 0; l0 < 32; l0 += 8) {
        __m256i codes[4];
        q6_k_codes(L + l0, H + l0, codes);
        for (int k = 0; k < 4; ++k) {  // weights 128h + 32k + l0 .. + 8
          const int i = 128 * h + 32 * k + l0;
          const __m256 scale = _mm256_set1_ps(db * static_cast<float>(scales[i / 16]));
          const __m256 w = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(codes[k], bias)));
          const int64_t col = b * kGgmlBlockK + i;
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t) acc[t][k % 2] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xt[t] + col), acc[t][k % 2]);
        }
      }
    }
  }
  store_tile<T>(a, o, tok0, acc);
}

// W8A8: exact int32 sums of int8 x int8, 32 columns at a time. maddubs multiplies unsigned by
// signed bytes, so each product is formed as |qx| * (w with qx's sign): both at most 127, a pair's
// sum at most 32258, which int16 holds without saturating.
template <int T>
void w8a8_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, body = in / 32 * 32;
  const int8_t* w = q.packed.data<int8_t>() + o * in;  // [in] i8
  const int8_t* xt[T];
  for (int t = 0; t < T; ++t) xt[t] = a.qx + (tok0 + t) * a.qx_stride;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_si256();
  for (int64_t k = 0; k < body; k += 32) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt[t] + k));
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(wv, xv));
      acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(pairs, ones));
    }
  }
  const float scale = q.scales.data<float>()[o];
  for (int t = 0; t < T; ++t) {
    __m128i lanes = _mm_add_epi32(_mm256_castsi256_si128(acc[t]), _mm256_extracti128_si256(acc[t], 1));
    lanes = _mm_add_epi32(lanes, _mm_shuffle_epi32(lanes, 0x4e));
    lanes = _mm_add_epi32(lanes, _mm_shuffle_epi32(lanes, 0xb1));
    int32_t sum = _mm_cvtsi128_si32(lanes);
    for (int64_t k = body; k < in; ++k) sum += static_cast<int32_t>(xt[t][k]) * w[k];
    const float s = a.qx_scales[tok0 + t] * scale;
    const float y = a.bias != nullptr ? std::fma(static_cast<float>(sum), s, a.bias[o]) : static_cast<float>(sum) * s;
    a.y[(tok0 + t) * a.y_stride + o] = y;
  }
}

// Ternary: multiply-free inside a group. Each 8 weights' 2-bit codes become two lane masks
// (+1 and -1) and the token's x is added under one and subtracted under the other (0 skips);
// the group's sum is scaled once. Two chains per token alternate between the 8-weight slices.
template <int T>
void ternary_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, group = q.group_size, groups = in / group;
  const uint8_t* w = q.packed.data<uint8_t>() + o * (in / 4);  // [in / 4] u8
  const float* scales = q.scales.data<float>() + o * groups;   // [groups] f32
  const float* xt[T];
  token_rows<T>(a, tok0, xt);
  const __m256i three = _mm256_set1_epi32(3), two = _mm256_set1_epi32(2), zero = _mm256_setzero_si256();
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256 gacc[T][2];
    for (int t = 0; t < T; ++t) gacc[t][0] = gacc[t][1] = _mm256_setzero_ps();
    for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += 32) {
      const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k0 / 4)));
      for (int k = 0; k < 4; ++k) {  // weights k0 + 8k .. k0 + 8k + 8
        const __m256i c = _mm256_and_si256(_mm256_srli_epi32(bytes, 2 * k), three);
        const __m256 plus = _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, two));
        const __m256 minus = _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, zero));
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          const __m256 xv = _mm256_loadu_ps(xt[t] + k0 + 8 * k);
          __m256& chain = gacc[t][k % 2];
          chain = _mm256_sub_ps(_mm256_add_ps(chain, _mm256_and_ps(xv, plus)), _mm256_and_ps(xv, minus));
        }
      }
    }
    const __m256 scale = _mm256_set1_ps(scales[g]);
    for (int t = 0; t < T; ++t) acc[t] = _mm256_fmadd_ps(scale, _mm256_add_ps(gacc[t][0], gacc[t][1]), acc[t]);
  }
  for (int t = 0; t < T; ++t) store_output(a, o, tok0 + t, reduce_add(acc[t]));
}

// fp8 e4m3 per channel: a code's bits moved into an f16 (sign to bit 15, exponent and mantissa
// to bits 7..14) are the same value times 2^-8 for every finite code, subnormals included (the
// exponent biases differ by 8), so F16C converts 8 at a time and 2^8 joins the row's scale.
template <int T>
void fp8_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, body = in / 16 * 16;
  const uint8_t* w = q.packed.data<uint8_t>() + o * in;  // [in] e4m3
  const float* xt[T];
  token_rows<T>(a, tok0, xt);
  const __m256i sign = _mm256_set1_epi16(static_cast<short>(0x80)), rest = _mm256_set1_epi16(0x7f);
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < body; k += 16) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, sign), 8),
                                      _mm256_slli_epi16(_mm256_and_si256(b, rest), 7));
    const __m256 w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    const __m256 w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt[t] + k), acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt[t] + k + 8), acc[t][1]);
    }
  }
  const float scale = q.scales.data<float>()[o];
  for (int t = 0; t < T; ++t) {
    float sum = reduce_add(_mm256_add_ps(acc[t][0], acc[t][1])) * 256.0f;
    for (int64_t kk = body; kk < in; ++kk) sum += f8e4m3_to_f32(w[kk]) * xt[t][kk];
    store_output(a, o, tok0 + t, sum * scale);
  }
}

// ---------------------------------------------------------------------------------------------
// Row decoders for the GEMM path (RowDecoder, linear_isa.h): W[o, k0 .. k0 + kc) to f32 exactly as
// dequantize() (quant/quantize.cpp) writes it, with the tiles' block arithmetic above (one rounding
// per weight for the GGUF blocks; int4 rounds w - zero, then times the scale, as dequantize does).
// k0 and kc hold whole blocks (multiples of 32 or 256, or reaching `in` for the per-channel formats).
// The context is the QuantWeight.

inline void store4(float* dst, const __m256 (&w)[4]) {
  for (int j = 0; j < 4; ++j) _mm256_storeu_ps(dst + 8 * j, w[j]);
}

void decode_q8_0(const void* context, int64_t o, int64_t k0, int64_t kc, float* dst) {
  const QuantWeight& q = *static_cast<const QuantWeight*>(context);
  const int64_t in = q.in_features, blocks = in / kGgmlBlock32;
  const int8_t* codes = q.packed.data<int8_t>() + o * in;      // [in] i8
  const uint16_t* d = q.scales.data<uint16_t>() + o * blocks;  // [in / 32] f16
  for (int64_t b = k0 / kGgmlBlock32; b < (k0 + kc) / kGgmlBlock32; ++b) {
    const __m256 scale = f16_splat(d[b]);
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + b * kGgmlBlock32));
    const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
    const __m256 w[4] = {_mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c0))),
                         _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8)))),
                         _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c1))),
                         _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c1, 8))))};
    store4(dst + b * kGgmlBlock32 - k0, w);
  }
}

template <typename Block>
void decode_block32(const void* context, int64_t o, int64_t k0, int64_t kc, float* dst) {
  const QuantWeight& q = *static_cast<const QuantWeight*>(context);
  const int64_t blocks = q.in_features / kGgmlBlock32;
  const uint8_t* row = q.packed.data<uint8_t>() + o * blocks * Block::kBytes;  // [in / 32 * kBytes] u8
  for (int64_t b = k0 / kGgmlBlock32; b < (k0 + kc) / kGgmlBlock32; ++b) {
    const uint8_t* p = row + b * Block::kBytes;
    uint16_t d_bits, m_bits = 0;
    std::memcpy(&d_bits, p, 2);
    if constexpr (Block::kMOffset >= 0) std::memcpy(&m_bits, p + Block::kMOffset, 2);
    const __m256 d = f16_splat(d_bits), m = f16_splat(m_bits);
    const __m256i c = Block::codes(p);
    const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
    const __m256i codes[4] = {_mm256_cvtepi8_epi32(c0), _mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8)),
                              _mm256_cvtepi8_epi32(c1), _mm256_cvtepi8_epi32(_mm_srli_si128(c1, 8))};
    __m256 w[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 f = _mm256_cvtepi32_ps(codes[k]);
      w[k] = Block::kMOffset >= 0 ? _mm256_fmadd_ps(d, f, m) : _mm256_mul_ps(d, f);
    }
    store4(dst + b * kGgmlBlock32 - k0, w);
  }
}

// Q4_K and Q5_K (kFifthBit): q4_k_tile's and q5_k_tile's decoding, 32 weights per sub-block.
template <bool kFifthBit>
void decode_q4_5_k(const void* context, int64_t o, int64_t k0, int64_t kc, float* dst) {
  const QuantWeight& q = *static_cast<const QuantWeight*>(context);
  constexpr int64_t kBytes = kFifthBit ? kQ5_KBytes : kQ4_KBytes;
  constexpr int64_t kQs = kFifthBit ? kQ5_KQs : 16;
  const int64_t blocks = q.in_features / kGgmlBlockK;
  const uint8_t* row = q.packed.data<uint8_t>() + o * blocks * kBytes;
  const __m128i low_nibbles = _mm_set1_epi8(0x0f), bit4 = _mm_set1_epi8(0x10);
  for (int64_t b = k0 / kGgmlBlockK; b < (k0 + kc) / kGgmlBlockK; ++b) {
    const uint8_t* block = row + b * kBytes;
    float* out = dst + b * kGgmlBlockK - k0;
    uint16_t d_bits, dmin_bits;
    std::memcpy(&d_bits, block, 2);
    std::memcpy(&dmin_bits, block + 2, 2);
    const float d = _cvtsh_ss(d_bits), dmin = _cvtsh_ss(dmin_bits);
    const uint8_t* qs = block + kQs;
    __m128i h0 = _mm_setzero_si128(), h1 = _mm_setzero_si128();
    if constexpr (kFifthBit) {
      h0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ5_KQh));
      h1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ5_KQh + 16));
    }
    for (int c = 0; c < 4; ++c) {
      const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 32 * c));
      const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 32 * c + 16));
      for (int half = 0; half < 2; ++half) {
        int sc, m;
        q4_k_scale_min(block + 4, 2 * c + half, &sc, &m);
        const __m256 scale = _mm256_set1_ps(d * static_cast<float>(sc));
        const __m256 min = _mm256_set1_ps(dmin * static_cast<float>(m));
        __m128i n0 = half == 0 ? _mm_and_si128(b0, low_nibbles) : _mm_and_si128(_mm_srli_epi16(b0, 4), low_nibbles);
        __m128i n1 = half == 0 ? _mm_and_si128(b1, low_nibbles) : _mm_and_si128(_mm_srli_epi16(b1, 4), low_nibbles);
        if constexpr (kFifthBit) {
          n0 = _mm_or_si128(n0, _mm_and_si128(half == 0 ? _mm_slli_epi16(h0, 4) : _mm_slli_epi16(h0, 3), bit4));
          n1 = _mm_or_si128(n1, _mm_and_si128(half == 0 ? _mm_slli_epi16(h1, 4) : _mm_slli_epi16(h1, 3), bit4));
        }
        const __m256 w[4] = {
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(n0)), min),
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(n0, 8))), min),
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(n1)), min),
            _mm256_fmsub_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(n1, 8))), min)};
        store4(out + 64 * c + 32 * half, w);
      }
      if constexpr (kFifthBit) {
        h0 = _mm_srli_epi16(h0, 2);
        h1 = _mm_srli_epi16(h1, 2);
      }
    }
  }
}

// Q6_K: q6_k_tile's decoding.
void decode_q6_k(const void* context, int64_t o, int64_t k0, int64_t kc, float* dst) {
  const QuantWeight& q = *static_cast<const QuantWeight*>(context);
  const int64_t blocks = q.in_features / kGgmlBlockK;
  const uint8_t* row = q.packed.data<uint8_t>() + o * blocks * kQ6_KD;  // blocks less their d
  const uint16_t* d = q.scales.data<uint16_t>() + o * blocks;           // [in / 256] f16
  const __m256i bias = _mm256_set1_epi32(32);
  for (int64_t b = k0 / kGgmlBlockK; b < (k0 + kc) / kGgmlBlockK; ++b) {
    const uint8_t* block = row + b * kQ6_KD;
    float* out = dst + b * kGgmlBlockK - k0;
    const auto* scales = reinterpret_cast<const int8_t*>(block + kQ6_KScales);
    const float db = _cvtsh_ss(d[b]);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* L = block + 64 * h;
      const uint8_t* H = block + kQ6_KQh + 32 * h;
      for (int l0 = 0; l0 < 32; l0 += 8) {
        __m256i codes[4];
        q6_k_codes(L + l0, H + l0, codes);
        for (int k = 0; k < 4; ++k) {  // weights 128h + 32k + l0 .. + 8
          const int i = 128 * h + 32 * k + l0;
          const __m256 scale = _mm256_set1_ps(db * static_cast<float>(scales[i / 16]));
          _mm256_storeu_ps(out + i, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(codes[k], bias))));
        }
      }
    }
  }
}

// int8 per channel: code * scale (any in: 8 at a time, then scalar).
void decode_int8(const void* context, int64_t o, int64_t k0, int64_t kc, float* dst) {
  const QuantWeight& q = *static_cast<const QuantWeight*>(context);
  const int8_t* w = q.packed.data<int8_t>() + o * q.in_features + k0;  // [kc] i8
  const float scale = q.scales.data<float>()[o];
  const __m256 s = _mm256_set1_ps(scale);
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k)));
    _mm256_storeu_ps(dst + k, _mm256_mul_ps(_mm256_cvtepi32_ps(c), s));
  }
  for (; k < kc; ++k) dst[k] = static_cast<float>(w[k]) * scale;
}

// fp8 e4m3 per channel: fp8_tile's f16 widening (2^-8 times the code's value), 2^8 (exact), then
// the scale.
void decode_fp8(const void* context, int64_t o, int64_t k0, int64_t kc, float* dst) {
  const QuantWeight& q = *static_cast<const QuantWeight*>(context);
  const uint8_t* w = q.packed.data<uint8_t>() + o * q.in_features + k0;  // [kc] e4m3
  const float scale = q.scales.data<float>()[o];
  const __m256 s = _mm256_set1_ps(scale), two8 = _mm256_set1_ps(256.0f);
  const __m128i sign = _mm_set1_epi16(static_cast<short>(0x80)), rest = _mm_set1_epi16(0x7f);
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, sign), 8), _mm_slli_epi16(_mm_and_si128(b, rest), 7));
    _mm256_storeu_ps(dst + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(h), two8), s));
  }
  for (; k < kc; ++k) dst[k] = f8e4m3_to_f32(w[k]) * scale;
}

// int4 group-wise: (code - zero) * scale per 32-weight block (a group is whole blocks).
void decode_int4(const void* context, int64_t o, int64_t k0, int64_t kc, float* dst) {
  const QuantWeight& q = *static_cast<const QuantWeight*>(context);
  const int64_t in = q.in_features, group = q.group_size, groups = in / group;
  const uint8_t* w = q.packed.data<uint8_t>() + o * (in / 2);  // [in / 2] u8
  const float* scales = q.scales.data<float>() + o * groups;   // [groups] f32
  const float* zeros = q.zeros.data<float>() + o * groups;     // [groups] f32
  const __m128i low_nibbles = _mm_set1_epi8(0x0f);
  for (int64_t k = k0; k < k0 + kc; k += kInt4Block) {
    const __m256 zero = _mm256_set1_ps(zeros[k / group]), scale = _mm256_set1_ps(scales[k / group]);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2));
    const __m128i lo = _mm_and_si128(b, low_nibbles);                     // weights k .. k + 16
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low_nibbles);  // weights k + 16 .. k + 32
    const __m128i n[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int j = 0; j < 4; ++j) {
      const __m256 v = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(n[j])), zero);
      _mm256_storeu_ps(dst + k - k0 + 8 * j, _mm256_mul_ps(v, scale));
    }
  }
}

// Ternary: (code - 1) * the group's scale; weight 8j + i of a 32-weight block is bits 2j of byte i.
void decode_ternary(const void* context, int64_t o, int64_t k0, int64_t kc, float* dst) {
  const QuantWeight& q = *static_cast<const QuantWeight*>(context);
  const int64_t in = q.in_features, group = q.group_size, groups = in / group;
  const uint8_t* w = q.packed.data<uint8_t>() + o * (in / 4);  // [in / 4] u8
  const float* scales = q.scales.data<float>() + o * groups;   // [groups] f32
  const __m256i three = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1);
  for (int64_t k = k0; k < k0 + kc; k += 32) {
    const __m256 scale = _mm256_set1_ps(scales[k / group]);
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k / 4)));
    for (int j = 0; j < 4; ++j) {
      const __m256i t = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(bytes, 2 * j), three), one);
      _mm256_storeu_ps(dst + k - k0 + 8 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(t), scale));
    }
  }
}

// The decoder of every format the GEMM path takes (W8A8 never: its definition rounds the
// activations); decode == nullptr for the others.
RowDecoder row_decoder(const QuantWeight& q) {
  RowDecoder r;
  r.context = &q;
  switch (q.format) {
    case QuantFormat::kGgufQ8_0: r.decode = decode_q8_0; break;
    case QuantFormat::kGgufQ4_1: r.decode = decode_block32<Q4_1Block>; break;
    case QuantFormat::kGgufQ5_0: r.decode = decode_block32<Q5_0Block>; break;
    case QuantFormat::kGgufQ5_1: r.decode = decode_block32<Q5_1Block>; break;
    case QuantFormat::kGgufIq4Nl: r.decode = decode_block32<Iq4NlBlock>; break;
    case QuantFormat::kGgufQ4_K: r.decode = decode_q4_5_k<false>; break;
    case QuantFormat::kGgufQ5_K: r.decode = decode_q4_5_k<true>; break;
    case QuantFormat::kGgufQ6_K: r.decode = decode_q6_k; break;
    case QuantFormat::kInt8Channel: r.decode = decode_int8; break;
    case QuantFormat::kFp8Channel: r.decode = decode_fp8; break;
    case QuantFormat::kInt4Group: r.decode = decode_int4; break;
    case QuantFormat::kTernary: r.decode = decode_ternary; break;
    default: r.decode = nullptr; break;
  }
  return r;
}

}  // namespace

void quant_linear(const QuantLinearArgs& args) {
  const QuantWeight& q = *args.w;
  const int64_t out = q.out_features;
  if (args.n == 0 || out == 0) return;
  if (q.format == QuantFormat::kFp8Channel && q.input_scale > 0.0f) {
    // A static fp8 activation scale: the activations rounded to it once, then the fp8 linear.
    std::vector<float> rounded(static_cast<size_t>(args.n * q.in_features));
    for (int64_t t = 0; t < args.n; ++t) {
      round_activation_row_fp8(args.x + t * args.x_stride, q.in_features, q.input_scale,
                               rounded.data() + t * q.in_features);
    }
    QuantWeight unscaled = q;  // shares the tensors' storage
    unscaled.input_scale = 0.0f;
    QuantLinearArgs a = args;
    a.x = rounded.data();
    a.x_stride = q.in_features;
    a.w = &unscaled;
    quant_linear(a);
    return;
  }
  if (args.n >= kQuantGemmMinTokens && !args.batch_invariant && q.in_features > 0) {
    const RowDecoder decoder = row_decoder(q);
    if (decoder.decode != nullptr) {
      // Many tokens: W decoded to f32 once per packed panel and reused by every token (the dense
      // linear's GEMM, linear_kernels.h), instead of once per tile of a few tokens.
      LinearArgs g;
      g.x = args.x;
      g.x_stride = args.x_stride;
      g.bias = args.bias;
      g.y = args.y;
      g.y_stride = args.y_stride;
      g.n = args.n;
      g.in = q.in_features;
      g.out = out;
      const bool avx512 = active_isa() == Isa::kAvx512;
      log_path_once("linear: {} {} decoded to f32 panels (gemm, >= {} tokens)", avx512 ? "avx512" : "avx2",
                    quant_format_name(q.format), kQuantGemmMinTokens);
      if (avx512) {
        gemm_decoded_avx512(g, decoder);
      } else {
        gemm_decoded_avx2(g, decoder);
      }
      return;
    }
  }
  QuantLinearArgs a = args;
  std::vector<int8_t> qx;
  std::vector<float> qx_scales;
  // The dot_linear_supported formats through the exact f32 kernels below only where
  // int8_dot_enabled() is off.
  if (dot_linear_supported(q) && int8_dot_enabled()) {
    // Each token's blocks once per call, padded with zero codes to a multiple of 64 columns.
    a.qx_stride = (q.in_features + 63) / 64 * 64;
    qx.assign(static_cast<size_t>(a.n * a.qx_stride), 0);
    std::vector<float> d(static_cast<size_t>(a.n * a.qx_stride / 32)), dsum(d.size());
    quantize_activation_blocks(a.x, a.x_stride, a.n, q.in_features, qx.data(), a.qx_stride, d.data(), dsum.data());
    a.qx = qx.data();
    a.qx_d = d.data();
    a.qx_dsum = dsum.data();
    std::vector<float> dhalf;
    if (q.format == QuantFormat::kGgufQ6_K) {
      const int64_t halves = a.qx_stride / 16;
      dhalf.resize(static_cast<size_t>(a.n * halves));
      for (int64_t t = 0; t < a.n; ++t) {
        const int8_t* codes = qx.data() + t * a.qx_stride;
        for (int64_t h = 0; h < halves; ++h) {
          int32_t sum = 0;
          for (int i = 0; i < 16; ++i) sum += codes[16 * h + i];
          dhalf[static_cast<size_t>(t * halves + h)] = 32.0f * d[static_cast<size_t>(t * (halves / 2) + h / 2)] *
                                                       static_cast<float>(sum);
        }
      }
      a.qx_dhalf = dhalf.data();
    }
    const bool vnni_dot = active_isa() == Isa::kAvx512 && cpu_has_avx512_vnni() && dot_vnni_supported(q);
    std::vector<float> d_lanes;
    if (vnni_dot) {
      // Each block's d_x over its 8 lanes of vpdpbusd's sums (dot_rows_vnni).
      d_lanes.resize(d.size() * 8);
      for (size_t i = 0; i < d_lanes.size(); ++i) d_lanes[i] = d[i / 8];
      a.qx_d_lanes = d_lanes.data();
    }
    log_path_once("linear: {} {} x int8 activations (integer dot products)",
                  vnni_dot ? "avx512-vnni" : "avx2", quant_format_name(q.format));
    // Blocks of 8 rows, at least ~32 KiB of packed weight per chunk, as below.
    const int64_t blocks = (out + 7) / 8;
    const int64_t grain = std::max<int64_t>(1, (int64_t{32} << 10) / (8 * q.in_features * a.n));
    parallel_for(blocks, grain, [&](int64_t b_begin, int64_t b_end) {
      if (vnni_dot) {
        dot_rows_vnni(a, b_begin * 8, std::min(out, b_end * 8));
      } else {
        dot_rows_avx2(a, b_begin * 8, std::min(out, b_end * 8));
      }
    });
    return;
  }
  const bool vnni = q.format == QuantFormat::kW8A8 && active_isa() == Isa::kAvx512 && cpu_has_avx512_vnni();
  const bool int4_avx512 = q.format == QuantFormat::kInt4Group && active_isa() == Isa::kAvx512;
  if (q.format == QuantFormat::kInt4Group) log_path_once("linear: {} int4", int4_avx512 ? "avx512" : "avx2");
  if (q.format == QuantFormat::kW8A8) {
    // Each token's codes once per call, padded with zero codes for the 64-byte VNNI loads.
    a.qx_stride = (q.in_features + 63) / 64 * 64;
    qx.assign(static_cast<size_t>(a.n * a.qx_stride), 0);
    qx_scales.resize(static_cast<size_t>(a.n));
    for (int64_t t = 0; t < a.n; ++t) {
      const float* x_row = a.x + t * a.x_stride;
      int8_t* codes = qx.data() + t * a.qx_stride;
      qx_scales[static_cast<size_t>(t)] = q.input_scale > 0.0f
                                              ? quantize_activation_row_static(x_row, q.in_features, q.input_scale, codes)
                                              : quantize_activation_row(x_row, q.in_features, codes);
    }
    a.qx = qx.data();
    a.qx_scales = qx_scales.data();
    log_path_once("linear: {} w8a8 ({} activation scales)", vnni ? "avx512-vnni" : "avx2",
                  q.input_scale > 0.0f ? "static" : "per-token");
  }
  const int64_t row_bytes = q.format == QuantFormat::kInt4Group ? q.in_features / 2
                            : q.format == QuantFormat::kTernary ? q.in_features / 4
                            : q.format == QuantFormat::kInt8Channel || q.format == QuantFormat::kW8A8 ||
                                    q.format == QuantFormat::kFp8Channel
                                ? q.in_features
                                : gguf_row_bytes(q.format, q.in_features);
  // Whole row blocks, at least ~32 KiB of packed weight per chunk so thread start-up stays small.
  const int64_t blocks = (out + kRowBlock - 1) / kRowBlock;
  const int64_t grain = std::max<int64_t>(1, (int64_t{32} << 10) / std::max<int64_t>(1, kRowBlock * row_bytes * a.n));
  // A tile function template as run_rows' callable.
#define TILE(f) [&a](auto tokens, int64_t o, int64_t tok0) { f<decltype(tokens)::value>(a, o, tok0); }
#define BLOCK32_TILE(B) \
  [&a](auto tokens, int64_t o, int64_t tok0) { block32_tile<decltype(tokens)::value, B>(a, o, tok0); }
  parallel_for(blocks, grain, [&](int64_t b_begin, int64_t b_end) {
    const int64_t o_begin = b_begin * kRowBlock, o_end = std::min(out, b_end * kRowBlock);
    switch (q.format) {
      case QuantFormat::kInt8Channel: run_rows<kInt8Tokens>(a, o_begin, o_end, kRowBlock, TILE(int8_tile)); break;
      case QuantFormat::kInt4Group:
        if (int4_avx512) {
          int4_rows_avx512(a, o_begin, o_end);
        } else {
          run_rows<kInt4Tokens>(a, o_begin, o_end, kRowBlock, TILE(int4_tile));
        }
        break;
      case QuantFormat::kTernary: run_rows<kInt4Tokens>(a, o_begin, o_end, kRowBlock, TILE(ternary_tile)); break;
      case QuantFormat::kFp8Channel: run_rows<kInt8Tokens>(a, o_begin, o_end, kRowBlock, TILE(fp8_tile)); break;
      case QuantFormat::kW8A8:
        if (vnni) {
          w8a8_rows_vnni(a, o_begin, o_end);
        } else {
          run_rows<kInt8Tokens>(a, o_begin, o_end, kRowBlock, TILE(w8a8_tile));
        }
        break;
      case QuantFormat::kGgufQ8_0: run_rows<kGgufTokens>(a, o_begin, o_end, kRowBlock, TILE(q8_0_tile)); break;
      case QuantFormat::kGgufQ4_K: run_rows<kGgufTokens>(a, o_begin, o_end, kRowBlock, TILE(q4_k_tile)); break;
      case QuantFormat::kGgufQ6_K: run_rows<kGgufTokens>(a, o_begin, o_end, kRowBlock, TILE(q6_k_tile)); break;
      case QuantFormat::kGgufQ5_K: run_rows<kGgufTokens>(a, o_begin, o_end, kRowBlock, TILE(q5_k_tile)); break;
      case QuantFormat::kGgufQ4_1: run_rows<kGgufTokens>(a, o_begin, o_end, kRowBlock, BLOCK32_TILE(Q4_1Block)); break;
      case QuantFormat::kGgufQ5_0: run_rows<kGgufTokens>(a, o_begin, o_end, kRowBlock, BLOCK32_TILE(Q5_0Block)); break;
      case QuantFormat::kGgufQ5_1: run_rows<kGgufTokens>(a, o_begin, o_end, kRowBlock, BLOCK32_TILE(Q5_1Block)); break;
      case QuantFormat::kGgufIq4Nl:
        run_rows<kGgufTokens>(a, o_begin, o_end, kRowBlock, BLOCK32_TILE(Iq4NlBlock));
        break;
      default: TACHYON_CHECK(false, "quant_linear: no kernel for {}", quant_format_name(q.format));
    }
  });
#undef BLOCK32_TILE
#undef TILE
}

}  // namespace tachyon::ops::cpu

#else  // !__x86_64__: active_isa() is kScalar and ops::linear runs quant_linear_reference.

namespace tachyon::ops::cpu {
void quant_linear(const QuantLinearArgs&) {
  TACHYON_CHECK(false, "quant_linear: no SIMD kernel in this build (the scalar ISA should be active)");
}
void w8a8_rows_vnni(const QuantLinearArgs&, int64_t, int64_t) {
  TACHYON_CHECK(false, "w8a8_rows_vnni: no SIMD kernel in this build");
}
bool dot_vnni_supported(const QuantWeight&) { return false; }
void dot_rows_vnni(const QuantLinearArgs&, int64_t, int64_t) {
  TACHYON_CHECK(false, "dot_rows_vnni: no SIMD kernel in this build");
}
void int4_rows_avx512(const QuantLinearArgs&, int64_t, int64_t) {
  TACHYON_CHECK(false, "int4_rows_avx512: no SIMD kernel in this build");
}
}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
