// The int4 group-wise linear with AVX-512 (quant_linear.h): the AVX2 kernel's arithmetic, 16
// weights per vector. Per 32 packed weights (16 bytes: weight j in the low nibble of byte j, j + 16
// in the high one) the low and high nibbles are widened to two vectors of 16 i32, converted to
// f32 minus the group's zero point (exact), and multiplied into two accumulators per token; each
// group's sums take its scale when the group is done. Every token keeps its own chains in the
// same order for any batch, so outputs are batch-invariant.
#include "ops/cpu/quant_linear.h"

#if defined(__x86_64__)

#include "ops/cpu/avx512_intrin.h"
#include "ops/cpu/quant_rows.h"

namespace tachyon::ops::cpu {
namespace {

constexpr int64_t kRowBlock = 8;  // rows a thread finishes before moving on (the block stays in L1)
constexpr int kTokens = 4;        // 8 group accumulators + 4 sums + 2 weight vectors + x
constexpr int64_t kBlock = 32;    // weights per 16 packed bytes

template <int T>
void int4_tile(const QuantLinearArgs& a, int64_t o, int64_t tok0) {
  const QuantWeight& q = *a.w;
  const int64_t in = q.in_features, group = q.group_size, groups = in / group;
  const uint8_t* w = q.packed.data<uint8_t>() + o * (in / 2);  // [in / 2] u8
  const float* scales = q.scales.data<float>() + o * groups;   // [groups] f32
  const float* zeros = q.zeros.data<float>() + o * groups;     // [groups] f32
  const float* xt[T];
  for (int t = 0; t < T; ++t) xt[t] = a.x + (tok0 + t) * a.x_stride;
  const __m128i low_nibbles = _mm_set1_epi8(0x0f);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const __m512 zero = _mm512_set1_ps(zeros[g]);
    __m512 gacc[T][2];
    for (int t = 0; t < T; ++t) gacc[t][0] = gacc[t][1] = _mm512_setzero_ps();
    for (int64_t k = g * group; k < (g + 1) * group; k += kBlock) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2));
      const __m128i lo = _mm_and_si128(b, low_nibbles);                     // weights k .. k + 16
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low_nibbles);  // weights k + 16 .. k + 32
      const __m512 w0 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), zero);
      const __m512 w1 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), zero);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        gacc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt[t] + k), gacc[t][0]);
        gacc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt[t] + k + 16), gacc[t][1]);
      }
    }
    const __m512 scale = _mm512_set1_ps(scales[g]);
    for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(scale, _mm512_add_ps(gacc[t][0], gacc[t][1]), acc[t]);
  }
  for (int t = 0; t < T; ++t) {
    const float sum = _mm512_reduce_add_ps(acc[t]);
    a.y[(tok0 + t) * a.y_stride + o] = a.bias != nullptr ? sum + a.bias[o] : sum;
  }
}

}  // namespace

void int4_rows_avx512(const QuantLinearArgs& a, int64_t o_begin, int64_t o_end) {
  run_rows<kTokens>(a, o_begin, o_end, kRowBlock,
                    [&a](auto tokens, int64_t o, int64_t tok0) { int4_tile<decltype(tokens)::value>(a, o, tok0); });
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
