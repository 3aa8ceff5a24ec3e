// The sampler's vectorized row kernels (src/sampling/row_kernels.h) against plain scalar loops,
// on fresh random rows whose lengths are not multiples of the vector or chunk width.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "sampling/row_kernels.h"
#include "test_util.h"

namespace tachyon {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Distance from got to the correctly rounded f32 of exact, in units of that value's ulp.
double ulp_error(float got, double exact) {
  const float rounded = static_cast<float>(exact);
  const double ulp = std::nextafter(rounded, kInf) - rounded;
  return std::fabs(static_cast<double>(got) - exact) / ulp;
}

TEST(RowKernels, ScaleExpSumMatchesStdExp) {
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> wide(-95.0f, 0.0f), narrow(-1e-3f, 0.0f);
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i) x.push_back(i % 2 ? wide(rng) : narrow(rng));
  x.insert(x.end(), {0.0f, -0.0f, -kInf, -87.0f, -86.99f, -87.01f, -1e-30f});
  std::vector<float> t = x, w(x.size());
  const double sum = row::scale_exp_sum(t.data(), w.data(), t.size(), 0.0f, 1.0f);
  double expected_sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(t[i], x[i]);
    if (!(x[i] >= -87.0f)) {
      ASSERT_EQ(w[i], 0.0f) << "x=" << x[i];
    } else {
      ASSERT_LE(ulp_error(w[i], std::exp(static_cast<double>(x[i]))), 2.0)
          << "seed " << seed << " x=" << x[i];
    }
    expected_sum += w[i];
  }
  EXPECT_EQ(w[x.size() - 7], 1.0f);  // e^0 is exactly 1
  EXPECT_NEAR(sum, expected_sum, 1e-12 * expected_sum);
}

TEST(RowKernels, ScaleExpSumShiftsThenScales) {
  std::vector<float> t = {5.0f, 3.0f, -kInf, 4.5f, 5.0f};
  std::vector<float> w(t.size());
  row::scale_exp_sum(t.data(), w.data(), t.size(), 5.0f, 1.0f / 0.7f);
  const float scale = 1.0f / 0.7f;
  EXPECT_EQ(t[0], 0.0f);
  EXPECT_EQ(t[1], (3.0f - 5.0f) * scale);
  EXPECT_EQ(t[2], -kInf);
  EXPECT_EQ(t[3], (4.5f - 5.0f) * scale);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[2], 0.0f);
}

TEST(RowKernels, SanitizeMaxAndSearchesMatchScalarLoops) {
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-50.0f, 50.0f);
  for (size_t n : {1u, 7u, 63u, 64u, 65u, 1000u, 4099u}) {
    std::vector<float> logits(n);
    for (float& x : logits) x = value(rng);
    logits[rng() % n] = std::numeric_limits<float>::quiet_NaN();
    logits[rng() % n] = kInf;
    logits[rng() % n] = -kInf;
    std::vector<float> t(n);
    const float max = row::sanitize(logits.data(), t.data(), n);
    float expected_max = -kInf;
    for (size_t i = 0; i < n; ++i) {
      const float expected = std::isfinite(logits[i]) ? logits[i] : -kInf;
      ASSERT_EQ(t[i], expected) << "seed " << seed << " n " << n << " i " << i;
      if (expected > expected_max) expected_max = expected;
    }
    EXPECT_EQ(max, expected_max);
    EXPECT_EQ(row::max_value(t.data(), n), expected_max);

    // first_index_of finds the first of planted duplicates, or n.
    const size_t first = rng() % n;
    t[first] = 123.0f;
    if (first + 5 < n) t[first + 5] = 123.0f;
    EXPECT_EQ(row::first_index_of(t.data(), n, 123.0f), first);
    EXPECT_EQ(row::first_index_of(t.data(), n, 1e9f), n);

    for (int trial = 0; trial < 20; ++trial) {
      const size_t begin = rng() % n, end = begin + rng() % (n - begin + 1);
      const float threshold = value(rng);
      bool greater = false, at_least = false;
      for (size_t i = begin; i < end; ++i) {
        greater |= t[i] > threshold;
        at_least |= t[i] >= threshold;
      }
      EXPECT_EQ(row::any_greater(t.data(), begin, end, threshold), greater);
      EXPECT_EQ(row::any_at_least(t.data(), begin, end, threshold), at_least);
      if (begin + row::kChunk <= n) {
        bool chunk_greater = false, chunk_at_least = false;
        for (size_t i = begin; i < begin + row::kChunk; ++i) {
          chunk_greater |= t[i] > threshold;
          chunk_at_least |= t[i] >= threshold;
        }
        EXPECT_EQ(row::chunk_any_greater(t.data() + begin, threshold), chunk_greater);
        EXPECT_EQ(row::chunk_any_at_least(t.data() + begin, threshold), chunk_at_least);
      }
    }
    // Equality at the threshold separates the two predicates.
    EXPECT_FALSE(row::any_greater(t.data(), first, first + 1, 123.0f));
    EXPECT_TRUE(row::any_at_least(t.data(), first, first + 1, 123.0f));
  }
}

TEST(RowKernels, AllNonFiniteRowHasNoMax) {
  const std::vector<float> logits = {std::nanf(""), kInf, -kInf};
  std::vector<float> t(3);
  EXPECT_EQ(row::sanitize(logits.data(), t.data(), 3), -kInf);
}

}  // namespace
}  // namespace tachyon
