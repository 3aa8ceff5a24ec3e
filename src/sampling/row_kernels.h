// Vectorizable loops over one [vocab] f32 row (or a block of it), used by the sampler. Each loop
// is written so that the compiler vectorizes it without fast-math (reductions carry `omp simd`);
// none allocates. The association order of the sums is fixed by the compiler for a given build,
// so one binary always produces the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tachyon::row {

// t[i] = logits[i] when finite, else -inf (NaN and +inf included); returns max t (-inf if none).
float sanitize(const float* logits, float* t, size_t n);  // logits, t: [n]

// Largest value of x[0, n); -inf for an all -inf row.
float max_value(const float* x, size_t n);
// Lowest index i with x[i] == value; n when there is none.
size_t first_index_of(const float* x, size_t n, float value);
// Whether any x[begin, end) > threshold; whether any x[begin, end) >= floor.
bool any_greater(const float* x, size_t begin, size_t end, float threshold);
bool any_at_least(const float* x, size_t begin, size_t end, float floor);

// The same tests over exactly kChunk values, inline: a fixed trip count compiles to a few
// unrolled vector compares, where the general loops above pay for their prologue and epilogue.
inline constexpr size_t kChunk = 64;
inline bool chunk_any_greater(const float* x, float threshold) {  // x: [kChunk]
  int count = 0;
#pragma omp simd reduction(+ : count)
  for (size_t i = 0; i < kChunk; ++i) count += x[i] > threshold;
  return count != 0;
}
inline bool chunk_any_at_least(const float* x, float floor) {  // x: [kChunk]
  int count = 0;
#pragma omp simd reduction(+ : count)
  for (size_t i = 0; i < kChunk; ++i) count += x[i] >= floor;
  return count != 0;
}

// t[i] = (t[i] - shift) * scale and w[i] = e^t[i] (exactly 0 where t[i] < -87, within 2 ulp
// elsewhere), for t[i] - shift <= 0; returns the sum of w in double.
double scale_exp_sum(float* t, float* w, size_t n, float shift, float scale);  // t, w: [n]

}  // namespace tachyon::row
