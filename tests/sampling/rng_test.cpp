// Rng: known answers from the published splitmix64 and xoshiro256** reference code, and golden
// values that pin the seeded stream (changing them is a compatibility break, see rng.h).
#include <array>
#include <cstdint>
#include <set>

#include <gtest/gtest.h>

#include "sampling/rng.h"

namespace tachyon {
namespace {

TEST(Rng, SplitMix64MatchesReference) {
  uint64_t state = 0;
  EXPECT_EQ(splitmix64_next(state), 0xe220a8397b1dcdafull);
  EXPECT_EQ(splitmix64_next(state), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(splitmix64_next(state), 0x06c45d188009454full);
}

TEST(Rng, Xoshiro256StarStarMatchesReference) {
  Rng rng = Rng::from_state({1, 2, 3, 4});
  const std::array<uint64_t, 4> expected = {11520ull, 0ull, 1509978240ull, 1215971899390074240ull};
  for (uint64_t value : expected) EXPECT_EQ(rng.next_u64(), value);
}

TEST(Rng, SeededStreamIsPinned) {
  Rng rng(42);
  std::array<uint64_t, 3> got{};
  for (uint64_t& value : got) value = rng.next_u64();
  // Golden values of this implementation; see the file comment before changing them.
  const std::array<uint64_t, 3> golden = {1546998764402558742ull, 6990951692964543102ull,
                                           12544586762248559009ull};
  EXPECT_EQ(got, golden);
}

TEST(Rng, SameSeedSameStreamDifferentSeedsDiffer) {
  Rng a(7), b(7), c(8);
  bool any_difference = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    any_difference |= x != c.next_u64();
  }
  EXPECT_TRUE(any_difference);
}

TEST(Rng, NextDoubleIsInUnitIntervalWithMeanOneHalf) {
  Rng rng(123);
  double sum = 0.0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = rng.next_double();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  // Standard error of the mean is 1 / sqrt(12 n) ~ 0.0009; 6 sigma.
  EXPECT_NEAR(sum / n, 0.5, 0.0055);
}

TEST(Rng, RandomSeedsDiffer) {
  std::set<uint64_t> seeds;
  for (int i = 0; i < 8; ++i) seeds.insert(random_seed());
  EXPECT_GT(seeds.size(), 1u);
}

}  // namespace
}  // namespace tachyon
