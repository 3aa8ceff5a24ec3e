// The GGUF block formats on the device (quant/quantize.h's kGguf* layouts, core/ggml_blocks.h's
// bits): the sizes and loads that linear_gguf.cu's GEMVs and linear_gguf_expand.cu's expansion
// to bf16 share. Internal linkage, included by those two files only.
#pragma once

#include <cstdint>

#include "core/ggml_blocks.h"
#include "ops/cuda/cuda_types.h"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int64_t kBlockK = 256;           // weights per Q4_K / Q5_K / Q6_K block
constexpr int64_t kQ4KBytes = 144;         // a Q4_K block: f16 d, f16 dmin, scales[12], qs[128]
constexpr int64_t kQ5KBytes = 176;         // a Q5_K block: Q4_K's header, qh[32], qs[128] at 48
constexpr int64_t kQ6KBytes = 208;         // a Q6_K block less its d: ql[128], qh[64], scales[16]
static_assert(kQ5KBytes == kQ5_KBytes && kQ4KBytes == kQ4_KBytes && kQ6KBytes == kQ6_KD);

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

template <GgufFormat F>
struct Block32;
template <>
struct Block32<GgufFormat::kQ4_1> {
  static constexpr int64_t kBytes = kQ4_1Bytes;  // f16 d, f16 m, qs[16]
};
template <>
struct Block32<GgufFormat::kQ5_0> {
  static constexpr int64_t kBytes = kQ5_0Bytes;  // f16 d, qh[4], qs[16]
};
template <>
struct Block32<GgufFormat::kQ5_1> {
  static constexpr int64_t kBytes = kQ5_1Bytes;  // f16 d, f16 m, qh[4], qs[16]
};
template <>
struct Block32<GgufFormat::kIq4Nl> {
  static constexpr int64_t kBytes = kIq4NlBytes;  // f16 d, qs[16]
};

template <GgufFormat F>
struct KQuantBlock;
template <>
struct KQuantBlock<GgufFormat::kQ4_K> {
  static constexpr int kBytes = static_cast<int>(kQ4KBytes);
};
template <>
struct KQuantBlock<GgufFormat::kQ5_K> {
  static constexpr int kBytes = static_cast<int>(kQ5KBytes);
};
template <>
struct KQuantBlock<GgufFormat::kQ6_K> {
  static constexpr int kBytes = static_cast<int>(kQ6KBytes);
};

// Bytes p .. p + 3 at a 2-byte aligned address, as two u16 loads.
__device__ __forceinline__ uint32_t load_u32_align2(const uint8_t* p) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(__ldg(h)) | (static_cast<uint32_t>(__ldg(h + 1)) << 16);
}

// IQ4_NL's 16 levels plus 128, four to a word (level i in byte i % 4 of word i / 4).
constexpr uint32_t iq4_nl_table_word(int w) {
  uint32_t word = 0;
  for (int i = 0; i < 4; ++i) {
    word |= static_cast<uint32_t>(kIq4NlValues[4 * w + i] + 128) << (8 * i);
  }
  return word;
}
constexpr uint32_t kIq4NlTable0 = iq4_nl_table_word(0), kIq4NlTable1 = iq4_nl_table_word(1),
                   kIq4NlTable2 = iq4_nl_table_word(2), kIq4NlTable3 = iq4_nl_table_word(3);

// The levels (+ 128) that the 4 nibbles of the low 16 bits of `nibbles` index, one byte each in
// the nibbles' order: bits 0..2 pick a byte of the low or the high table half, bit 3 the half.
__device__ __forceinline__ uint32_t iq4_nl_lookup4(uint32_t nibbles) {
  const uint32_t index = nibbles & 0x7777u;
  const uint32_t low = __byte_perm(kIq4NlTable0, kIq4NlTable1, index);
  const uint32_t high = __byte_perm(kIq4NlTable2, kIq4NlTable3, index);
  return __byte_perm(low, high, 0x3210u | ((nibbles & 0x8888u) >> 1));
}

// IQ4_NL: the levels (+ 128) of the 4 low nibbles of `qs` (x) and of its 4 high nibbles (y), byte
// i from byte i of qs. qs's nibbles run low 0, high 0, low 1, high 1, ...
__device__ __forceinline__ uint2 iq4_nl_levels(uint32_t qs) {
  const uint32_t a = iq4_nl_lookup4(qs), b = iq4_nl_lookup4(qs >> 16);
  return make_uint2(__byte_perm(a, b, 0x6420u), __byte_perm(a, b, 0x7531u));
}

}  // namespace
}  // namespace tachyon::ops::cuda::detail
