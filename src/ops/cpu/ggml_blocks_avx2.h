// The 32-weight GGUF blocks (Q4_1, Q5_0, Q5_1, IQ4_NL; core/ggml_blocks.h) as 32 codes in a
// 256-bit register, for the AVX2 quantized linears (quant_linear_avx2.cpp's exact f32 tiles and
// quant_linear_dot_avx2.cpp's integer dot products, which must decode them alike). Included only by
// files compiled with AVX2; everything has internal linkage, like linear_kernels.h.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/ggml_blocks.h"

namespace tachyon::ops::cpu {
namespace {

// The 32-weight GGUF blocks (Q4_1, Q5_0, Q5_1, IQ4_NL): a block's weights as 32 bytes in column
// order (byte j weight j; the nibbles qs[j] & 15 are weights 0..15, qs[j] >> 4 weights 16..31).
// The blocks sit 2- or 4-byte aligned in the row: every load is unaligned.
inline __m256i block_nibbles(const uint8_t* qs) {
  // The 16 bytes in both lanes (a broadcast load, no shuffle), the high lane's shifted down by 4.
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
}

// 0xff in byte j where bit j of the 32 bits at `qh` is set: byte j takes the byte holding bit j
// (byte j / 8 of the broadcast word), every other bit of it is forced on, and only a set bit j
// leaves the byte all ones.
inline __m256i block_bit_mask(const uint8_t* qh) {
  int32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(bits), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);  // byte k: every bit but k
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
}

// Each format's block: its bytes, m's offset (-1 where there is none; d is at 0), whether its
// codes are signed, and codes(block) -> the 32 codes, int8 or uint8, with w = d * code (+ m).
struct Q4_1Block {
  static constexpr int64_t kBytes = kQ4_1Bytes;
  static constexpr int kMOffset = 2;
  static constexpr bool kSigned = false;
  static __m256i codes(const uint8_t* block) { return block_nibbles(block + 4); }  // 0..15
};
struct Q5_0Block {
  static constexpr int64_t kBytes = kQ5_0Bytes;
  static constexpr int kMOffset = -1;
  static constexpr bool kSigned = true;
  // q - 16 in -16..15: a clear fifth bit makes the nibble n the byte 0xf0 | n = n - 16.
  static __m256i codes(const uint8_t* block) {
    return _mm256_or_si256(block_nibbles(block + 6),
                           _mm256_andnot_si256(block_bit_mask(block + 2), _mm256_set1_epi8(-16)));
  }
};
struct Q5_1Block {
  static constexpr int64_t kBytes = kQ5_1Bytes;
  static constexpr int kMOffset = 2;
  static constexpr bool kSigned = false;
  static __m256i codes(const uint8_t* block) {  // 0..31
    return _mm256_or_si256(block_nibbles(block + 8),
                           _mm256_and_si256(block_bit_mask(block + 4), _mm256_set1_epi8(16)));
  }
};
struct Iq4NlBlock {
  static constexpr int64_t kBytes = kIq4NlBytes;
  static constexpr int kMOffset = -1;
  static constexpr bool kSigned = true;
  static __m256i codes(const uint8_t* block) {  // the table's levels, -127..113
    const __m256i levels =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
    return _mm256_shuffle_epi8(levels, block_nibbles(block + 2));
  }
};

}  // namespace
}  // namespace tachyon::ops::cpu
