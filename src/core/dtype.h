// Element types of dense tensors and the scalar f32 <-> f16/bf16/f8e4m3 conversions (round to
// nearest even, NaN kept NaN; f16/bf16 overflow to Inf, f8e4m3 saturates to +-448). Quantized
// block formats are not DTypes: they live in quant/QuantWeight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tachyon {

// kF8E4M3 is OCP FP8 E4M3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits, no
// infinities, 0x7f / 0xff the only NaNs, largest finite 448.
enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kU8, kI32, kI64, kF8E4M3 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
std::optional<DType> parse_dtype(std::string_view name);  // "f32", "float16", "bf16", ...

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 is the top half of an f32.
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// e4m3: exact decoding; encoding rounds to the nearest value (ties to even), saturating to
// +-448 (finite inputs past it, and +-Inf), NaN to 0x7f.
float f8e4m3_to_f32(uint8_t b);
uint8_t f32_to_f8e4m3(float f);
inline constexpr float kF8E4M3Max = 448.0f;

}  // namespace tachyon
