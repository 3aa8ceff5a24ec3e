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

// e4m3 from its definition: sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 is
// subnormal (m/8 * 2^-6); S.1111.111 is NaN, and there is no infinity.
double e4m3_value(uint8_t b) {
  const int sign = b & 0x80 ? -1 : 1;
  const int e = (b >> 3) & 0xf, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  return sign * (e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7));
}

// The nearest e4m3 to f by brute force over every finite encoding, ties to the even code,
// saturating at +-448.
uint8_t e4m3_reference(float f) {
  if (std::isnan(f)) return 0x7f;
  const double a = std::fabs(static_cast<double>(f));
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  uint8_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(e4m3_value(static_cast<uint8_t>(c)) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_d = d;
    }
  }
  return sign | best;
}

TEST(DType, F8E4M3DecodesEveryEncoding) {
  for (int b = 0; b < 256; ++b) {
    const double want = e4m3_value(static_cast<uint8_t>(b));
    const float got = f8e4m3_to_f32(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "b=" << b;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "b=" << b;
    if (b != 0x80) EXPECT_EQ(f32_to_f8e4m3(got), b) << "b=" << b;  // -0 encodes as 0x80 too
  }
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), kF8E4M3Max);
}

TEST(DType, F8E4M3RoundsToNearestEvenAndSaturates) {
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    float f = f32_from_bits(bits(rng));
    if (!std::isfinite(f)) continue;
    int unused_exp = 0;
    f = std::ldexp(std::frexp(f, &unused_exp), static_cast<int>(bits(rng) % 24) - 13);  // 2^-14 .. 2^10
    ASSERT_EQ(f32_to_f8e4m3(f), e4m3_reference(f)) << "seed " << seed << " f=" << f;
  }
  // Every midpoint between neighbouring codes goes to the even one.
  for (int c = 0; c < 0x7e; ++c) {
    const float mid = static_cast<float>((e4m3_value(static_cast<uint8_t>(c)) + e4m3_value(static_cast<uint8_t>(c + 1))) / 2);
    EXPECT_EQ(f32_to_f8e4m3(mid), (c & 1) == 0 ? c : c + 1) << "c=" << c;
    EXPECT_EQ(f32_to_f8e4m3(-mid), 0x80 | ((c & 1) == 0 ? c : c + 1)) << "c=" << c;
  }
  EXPECT_EQ(f32_to_f8e4m3(463.9f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: to even (0)
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(3.0f, -11)), 0x01);
}

TEST(DType, ParseNames) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("F16"), DType::kF16);
  EXPECT_EQ(parse_dtype("fp8"), DType::kF8E4M3);
  EXPECT_EQ(parse_dtype("int8"), DType::kI8);
  EXPECT_FALSE(parse_dtype("q4").has_value());
}

}  // namespace
}  // namespace tachyon
