// The W8A8 linear with AVX-512 VNNI (quant_linear.h): vpdpbusd multiplies unsigned by signed bytes
// and adds groups of four into int32 lanes, 64 columns per instruction. The activation codes
// (-127..127) are biased to unsigned by flipping their top bit (qx + 128), so each token's sum is
// sum (qx + 128) * w - 128 * sum w; sum w comes from the same instruction with a vector of ones,
// once per row for all tokens of a tile. Every sum is exact, so the result equals the AVX2 path
// bit for bit. Row tails load with a byte mask (zero weights add nothing); the activation rows are
// padded with zero codes to a multiple of 64.
#include "ops/cpu/quant_linear.h"

#if defined(__x86_64__)

#include <cmath>

#include "ops/cpu/avx512_intrin.h"
#include "ops/cpu/quant_rows.h"

namespace tachyon::ops::cpu {
namespace {

constexpr int64_t kRowBlock = 8;
constexpr int kTokens = 4;

// (Through memory: g++ 12's _mm512_reduce_add_epi32 trips -Wmaybe-uninitialized in its own header.)
inline int32_t lane_sum(__m512i v) {
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, v);
  int32_t s = 0;
  for (int32_t x : lanes) s += x;
  return s;
}

template <int T>
void w8a8_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features;
  const int8_t* w = q.packed.data<int8_t>() + o * in;  // [in] i8
  const int8_t* xt[T];
  for (int t = 0; t < T; ++t) xt[t] = a.qx + (tok0 + t) * a.qx_stride;
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80)), ones = _mm512_set1_epi8(1);
  __m512i acc[T], wsum = _mm512_setzero_si512();
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_si512();
  for (int64_t k = 0; k < in; k += 64) {
    const __mmask64 mask = in - k >= 64 ? ~__mmask64{0} : (__mmask64{1} << (in - k)) - 1;
    const __m512i wv = _mm512_maskz_loadu_epi8(mask, w + k);
    wsum = _mm512_dpbusd_epi32(wsum, ones, wv);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m512i xv = _mm512_xor_si512(_mm512_loadu_si512(xt[t] + k), bias);  // qx + 128 as u8
      acc[t] = _mm512_dpbusd_epi32(acc[t], xv, wv);
    }
  }
  const int32_t w_total = lane_sum(wsum);
  const float scale = q.scales.data<float>()[o];
  for (int t = 0; t < T; ++t) {
    const int32_t sum = lane_sum(acc[t]) - 128 * w_total;
    const float s = a.qx_scales[tok0 + t] * scale;
    const float y = a.bias != nullptr ? std::fma(static_cast<float>(sum), s, a.bias[o]) : static_cast<float>(sum) * s;
    a.y[(tok0 + t) * a.y_stride + o] = y;
  }
}

}  // namespace

void w8a8_rows_vnni(const QuantLinearArgs& a, int64_t o_begin, int64_t o_end) {
  run_rows<kTokens>(a, o_begin, o_end, kRowBlock,
                    [&a](auto tokens, int64_t o, int64_t tok0) { w8a8_tile<decltype(tokens)::value>(a, o, tok0); });
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
