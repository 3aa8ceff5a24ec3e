#include "core/dtype.h"

#include <string>

namespace tachyon {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kF8E4M3: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kF8E4M3: return "f8e4m3";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  std::string s(name);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "f32" || s == "float32" || s == "float") return DType::kF32;
  if (s == "f16" || s == "float16" || s == "half" || s == "fp16") return DType::kF16;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "i8" || s == "int8") return DType::kI8;
  if (s == "u8" || s == "uint8") return DType::kU8;
  if (s == "i32" || s == "int32") return DType::kI32;
  if (s == "i64" || s == "int64") return DType::kI64;
  if (s == "f8e4m3" || s == "fp8" || s == "f8" || s == "float8_e4m3fn" || s == "e4m3") return DType::kF8E4M3;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // Subnormal: normalize.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return f32_from_bits(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13));
  }
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  return f32_from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in f16: shift the mantissa with the implicit bit.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t total_shift = 126 - exp;  // value = mant * 2^(exp-150) = m * 2^-24
    uint32_t result = mant >> total_shift;
    const uint32_t rem = mant & ((1u << total_shift) - 1);
    const uint32_t half = 1u << (total_shift - 1);
    if (rem > half || (rem == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  // Normal: rebias exponent, round mantissa to 10 bits (ties to even); a carry rolls into exp.
  uint32_t v = abs - (112u << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

float f8e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t mant = b & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return f32_from_bits(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    // Subnormal: mant * 2^-9.
    const float v = static_cast<float>(mant) * (1.0f / 512.0f);
    return sign != 0 ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 127 - 7) << 23) | (mant << 20));
}

uint8_t f32_to_f8e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;           // NaN
  if (abs >= 0x43e80000u) return sign | 0x7eu;  // >= 464 (the midpoint past 448) or Inf: saturate
  if (abs < 0x3c800000u) {
    // Below 2^-6, the smallest normal: a subnormal step of 2^-9. x * 2^9 is exact in f32, and
    // rintf rounds it to nearest even under the default rounding mode.
    const float scaled = f32_from_bits(abs) * 512.0f;
    const uint32_t m = static_cast<uint32_t>(__builtin_rintf(scaled));  // 0..8; 8 is the smallest normal
    return static_cast<uint8_t>(sign | m);
  }
  // Normal: rebias the exponent, round the mantissa to 3 bits (ties to even); a carry rolls into
  // the exponent (at most to 448's code, the inputs past it saturated above).
  uint32_t v = abs - (120u << 23);
  v += 0x7ffffu + ((v >> 20) & 1u);
  return static_cast<uint8_t>(sign | (v >> 20));
}

}  // namespace tachyon
