#include <cmath>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "test_util.h"

namespace tachyon {
namespace {

// Reference: exact rounding through double arithmetic on the representable neighbours.
uint16_t f16_reference(float f) {
  if (std::isnan(f)) return 0x7e00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  // Find the nearest of all 0x7c00 finite magnitudes by bisection over the ordered encoding.
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (f16_to_f32(mid) <= a) lo = mid; else hi = static_cast<uint16_t>(mid - 1);
  }
  if (lo == 0x7bff) return sign | lo;
  const double below = f16_to_f32(lo), above = f16_to_f32(static_cast<uint16_t>(lo + 1));
  const double d0 = a - below, d1 = above - a;
  uint16_t pick = d0 < d1 ? lo : (d1 < d0 ? static_cast<uint16_t>(lo + 1) : ((lo & 1) ? static_cast<uint16_t>(lo + 1) : lo));
  return sign | pick;
}

TEST(DType, F16RoundTripsEveryEncoding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << "h=" << h;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = f32_from_bits(bits(rng));
    if (!std::isfinite(f)) continue;
    // Bias toward the f16 range.
    int unused_exp = 0;
    f = std::ldexp(std::frexp(f, &unused_exp), static_cast<int>(bits(rng) % 44) - 28);
    ASSERT_EQ(f32_to_f16(f), f16_reference(f)) << "seed " << seed << " f=" << f;
  }
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly between 0x3f80 and 0x3f81: ties to even.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(f32_to_bf16(f), h);
    }
  }
}

TEST(DType, ParseNames) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("F16"), DType::kF16);
  EXPECT_FALSE(parse_dtype("q4").has_value());
}

}  // namespace
}  // namespace tachyon
