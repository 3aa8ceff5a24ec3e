// Vectorizable row loops for the sampler; see row_kernels.h. The exp avoids every branch and
// every conditionally evaluated float operation, which is what keeps GCC vectorizing it under
// the default -ftrapping-math.
#include "sampling/row_kernels.h"

#include <bit>
#include <cmath>
#include <limits>

namespace tachyon::row {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// e^v for v <= 0: e^v = 2^k * e^r with k = round(v / ln2), r = v - k ln2 in [-ln2/2, ln2/2];
// round-to-nearest by adding 1.5 * 2^23, Cody-Waite split of ln2, a degree-6 polynomial for e^r
// (a Chebyshev fit on that interval, absolute error 2e-9; its constant term is exactly 1, so
// e^0 is exactly 1), k added to the exponent bits. Below -87 the mask zeroes the result (there k
// would leave the normal range); -inf gives 0.
inline float exp_nonpositive(float v) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  constexpr float kRound = 12582912.0f;
  const float shifted = v * kLog2e + kRound;
  const float k = shifted - kRound;
  const uint32_t k_bits = std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kRound);
  const float r = (v - k * kLn2Hi) - k * kLn2Lo;
  float p = 0.0013941108433972675f;
  p = p * r + 0.0083751263981533357f;
  p = p * r + 0.041666352896775157f;
  p = p * r + 0.16666415514653275f;
  p = p * r + 0.50000000471177577f;
  p = p * r + 1.0000000377162138f;
  p = p * r + 1.0f;
  const uint32_t bits = std::bit_cast<uint32_t>(p) + (k_bits << 23);
  const uint32_t keep = ~static_cast<uint32_t>(std::bit_cast<int32_t>(v + 87.0f) >> 31);
  return std::bit_cast<float>(bits & keep);
}

}  // namespace

float sanitize(const float* logits, float* t, size_t n) {
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (size_t i = 0; i < n; ++i) {
    const float x = std::isfinite(logits[i]) ? logits[i] : kNegInf;
    t[i] = x;
    m = x > m ? x : m;
  }
  return m;
}

float max_value(const float* x, size_t n) {
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (size_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

size_t first_index_of(const float* x, size_t n, float value) {
  size_t begin = 0;
  for (; begin + kChunk <= n; begin += kChunk) {
    int count = 0;
#pragma omp simd reduction(+ : count)
    for (size_t i = begin; i < begin + kChunk; ++i) count += x[i] == value;
    if (count != 0) break;
  }
  for (size_t i = begin; i < n; ++i) {
    if (x[i] == value) return i;
  }
  return n;
}

bool any_greater(const float* x, size_t begin, size_t end, float threshold) {
  int found = 0;
#pragma omp simd reduction(| : found)
  for (size_t i = begin; i < end; ++i) found |= x[i] > threshold;
  return found != 0;
}

bool any_at_least(const float* x, size_t begin, size_t end, float floor) {
  int found = 0;
#pragma omp simd reduction(| : found)
  for (size_t i = begin; i < end; ++i) found |= x[i] >= floor;
  return found != 0;
}

double scale_exp_sum(float* t, float* w, size_t n, float shift, float scale) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (size_t i = 0; i < n; ++i) {
    const float v = (t[i] - shift) * scale;
    const float e = exp_nonpositive(v);
    t[i] = v;
    w[i] = e;
    s += static_cast<double>(e);
  }
  return s;
}

}  // namespace tachyon::row
