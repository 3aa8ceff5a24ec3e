// The GGUF block formats kept packed (Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K): hand-computed blocks against core/ggml_blocks.h's
// decoding, the kGguf* layouts of quant/ against the stored blocks they come from, the
// round-to-nearest encoders against their error bounds, and bad blocks. (gguf-py's own decoding
// of random Q4_K/Q6_K blocks is checked in tests/io/reference_fixtures_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/ggml_blocks.h"
#include "quant/quantize.h"
#include "ops/ops_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

void put_f16(uint8_t* p, float v) {
  const uint16_t bits = f32_to_f16(v);
  std::memcpy(p, &bits, 2);
}

Tensor bytes_tensor(const std::vector<uint8_t>& bytes) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bytes.size())}, DType::kU8);
  std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

// One Q4_K block built field by field: d 0.5, dmin 0.25, sub-block scales 1..7, 63 and mins
// 0, 1, 2, 3, 60, 61, 62, 63 (sub-blocks 4..7 need the top bits the packing spreads over bytes
// 0..7), and code byte l of each 32-byte chunk holding l % 16 low and 15 - l % 16 high.
std::vector<uint8_t> hand_q4_k_block() {
  const int sc[8] = {1, 2, 3, 4, 5, 6, 7, 63}, m[8] = {0, 1, 2, 3, 60, 61, 62, 63};
  std::vector<uint8_t> b(kQ4_KBytes, 0);
  put_f16(b.data(), 0.5f);
  put_f16(b.data() + 2, 0.25f);
  uint8_t* scales = b.data() + 4;
  for (int s = 0; s < 4; ++s) {
    scales[s] = static_cast<uint8_t>(sc[s] | ((sc[s + 4] >> 4) << 6));
    scales[s + 4] = static_cast<uint8_t>(m[s] | ((m[s + 4] >> 4) << 6));
    scales[s + 8] = static_cast<uint8_t>((sc[s + 4] & 15) | ((m[s + 4] & 15) << 4));
  }
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) b[16 + 32 * c + l] = static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4));
  }
  return b;
}

TEST(GgufBlocks, HandComputedQ4_K) {
  const std::vector<uint8_t> block = hand_q4_k_block();
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    q4_k_scale_min(block.data() + 4, s, &sc, &m);
    const int want_sc[8] = {1, 2, 3, 4, 5, 6, 7, 63}, want_m[8] = {0, 1, 2, 3, 60, 61, 62, 63};
    EXPECT_EQ(sc, want_sc[s]) << "sub-block " << s;
    EXPECT_EQ(m, want_m[s]) << "sub-block " << s;
  }
  float w[256];
  dequantize_q4_k(block.data(), 1, w);
  // Weight 3: sub-block 0, low nibble 3: 0.5 * 1 * 3 - 0.25 * 0.
  EXPECT_EQ(w[3], 1.5f);
  // Weight 64 * 2 + 32 + 5: sub-block 5, high nibble of byte 5 of chunk 2 = 10: 0.5 * 6 * 10 - 0.25 * 61.
  EXPECT_EQ(w[165], 14.75f);
  // Weight 64 * 3 + 32 + 1: sub-block 7, high nibble 14: 0.5 * 63 * 14 - 0.25 * 63.
  EXPECT_EQ(w[225], 425.25f);
  // Weight 64 * 2 + 20: sub-block 4, low nibble 4: 0.5 * 5 * 4 - 0.25 * 60.
  EXPECT_EQ(w[148], -5.0f);
}

TEST(GgufBlocks, HandComputedQ6_K) {
  // d 0.5, scales[i] = i - 8, every ql byte 0x5a (low nibble 10, high 5), every qh byte 0b11100100
  // (2-bit fields 0, 1, 2, 3): codes 10, 26, 37, 53 for the four 32-weight quarters of each half.
  std::vector<uint8_t> block(kQ6_KBytes, 0);
  std::memset(block.data(), 0x5a, 128);
  std::memset(block.data() + kQ6_KQh, 0xe4, 64);
  for (int i = 0; i < 16; ++i) block[kQ6_KScales + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 8));
  put_f16(block.data() + kQ6_KD, 0.5f);
  float w[256];
  dequantize_q6_k(block.data(), 1, w);
  EXPECT_EQ(w[0], 88.0f);     // scale -8, code 10: 0.5 * -8 * (10 - 32)
  EXPECT_EQ(w[40], 18.0f);    // scale -6, code 26
  EXPECT_EQ(w[200], 10.0f);   // scale 4, code 37
  EXPECT_EQ(w[255], 73.5f);   // scale 7, code 53
  EXPECT_EQ(w[127], -10.5f);  // scale -1, code 53
}

TEST(GgufBlocks, HandComputedQ5_0AndIq4Nl) {
  // Q5_0: d 0.25, qh with bits 0 and 17 set, qs[0] = 0x3f (weight 0 low nibble 15, weight 16 high 3),
  // qs[1] = 0x21 (weight 1: 1, weight 17: 2).
  std::vector<uint8_t> q5(kQ5_0Bytes, 0);
  put_f16(q5.data(), 0.25f);
  const uint32_t qh = (1u << 0) | (1u << 17);
  std::memcpy(q5.data() + 2, &qh, 4);
  q5[6] = 0x3f;
  q5[7] = 0x21;
  float w[32];
  dequantize_q5_0(q5.data(), 1, w);
  EXPECT_EQ(w[0], 0.25f * ((15 | 16) - 16));  // 3.75
  EXPECT_EQ(w[16], 0.25f * (3 - 16));         // -3.25
  EXPECT_EQ(w[1], 0.25f * (1 - 16));
  EXPECT_EQ(w[17], 0.25f * ((2 | 16) - 16));  // 0.5
  EXPECT_EQ(w[5], -4.0f);                     // code 0
  // IQ4_NL: d 0.5, qs[j] = j | (15 - j) << 4: weight j is level j, weight j + 16 level 15 - j.
  std::vector<uint8_t> nl(kIq4NlBytes, 0);
  put_f16(nl.data(), 0.5f);
  for (int j = 0; j < 16; ++j) nl[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  dequantize_iq4_nl(nl.data(), 1, w);
  EXPECT_EQ(w[0], -63.5f);   // level 0: -127
  EXPECT_EQ(w[8], 0.5f);     // level 8: 1
  EXPECT_EQ(w[16], 56.5f);   // level 15: 113
  EXPECT_EQ(w[31], -63.5f);  // level 0
}

constexpr QuantFormat kFormats[] = {QuantFormat::kGgufQ8_0, QuantFormat::kGgufQ4_1, QuantFormat::kGgufQ5_0,
                                    QuantFormat::kGgufQ5_1, QuantFormat::kGgufIq4Nl, QuantFormat::kGgufQ4_K,
                                    QuantFormat::kGgufQ5_K, QuantFormat::kGgufQ6_K};

// The bytes of one stored block, and the offsets of its f16 fields (-1: none).
int64_t block_bytes(QuantFormat format) { return gguf_row_bytes(format, gguf_block_weights(format)); }
std::vector<int64_t> f16_fields(QuantFormat format) {
  switch (format) {
    case QuantFormat::kGgufQ4_1:
    case QuantFormat::kGgufQ5_1:
    case QuantFormat::kGgufQ4_K:
    case QuantFormat::kGgufQ5_K: return {0, 2};
    case QuantFormat::kGgufQ6_K: return {kQ6_KD};
    default: return {0};
  }
}

// Random stored blocks (random bytes, finite f16 fields) of a [out, in] tensor of `format`.
std::vector<uint8_t> random_blocks(QuantFormat format, int64_t out, int64_t in, std::mt19937& rng) {
  std::vector<uint8_t> bytes(static_cast<size_t>(out * gguf_row_bytes(format, in)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(1e-4f, 5e-2f);
  const size_t step = static_cast<size_t>(block_bytes(format));
  for (size_t b = 0; b < bytes.size(); b += step) {
    for (int64_t at : f16_fields(format)) put_f16(&bytes[b + static_cast<size_t>(at)], scale(rng));
  }
  return bytes;
}

void decode_stored(QuantFormat format, const std::vector<uint8_t>& bytes, float* out) {
  const int64_t n = static_cast<int64_t>(bytes.size()) / block_bytes(format);
  switch (format) {
    case QuantFormat::kGgufQ8_0: dequantize_q8_0(bytes.data(), n, out); break;
    case QuantFormat::kGgufQ4_1: dequantize_q4_1(bytes.data(), n, out); break;
    case QuantFormat::kGgufQ5_0: dequantize_q5_0(bytes.data(), n, out); break;
    case QuantFormat::kGgufQ5_1: dequantize_q5_1(bytes.data(), n, out); break;
    case QuantFormat::kGgufIq4Nl: dequantize_iq4_nl(bytes.data(), n, out); break;
    case QuantFormat::kGgufQ4_K: dequantize_q4_k(bytes.data(), n, out); break;
    case QuantFormat::kGgufQ5_K: dequantize_q5_k(bytes.data(), n, out); break;
    default: dequantize_q6_k(bytes.data(), n, out); break;
  }
}

void encode(QuantFormat format, const float* x, int64_t n, std::vector<uint8_t>* out) {
  switch (format) {
    case QuantFormat::kGgufQ8_0: quantize_q8_0(x, n, out); break;
    case QuantFormat::kGgufQ4_1: quantize_q4_1(x, n, out); break;
    case QuantFormat::kGgufQ5_0: quantize_q5_0(x, n, out); break;
    case QuantFormat::kGgufQ5_1: quantize_q5_1(x, n, out); break;
    case QuantFormat::kGgufIq4Nl: quantize_iq4_nl(x, n, out); break;
    case QuantFormat::kGgufQ4_K: quantize_q4_k(x, n, out); break;
    case QuantFormat::kGgufQ5_K: quantize_q5_k(x, n, out); break;
    default: quantize_q6_k(x, n, out); break;
  }
}

// The in-memory layouts stand for exactly the stored blocks, bit for bit.
TEST(GgufBlocks, UnpackedLayoutsDecodeToTheStoredBlocks) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (QuantFormat format : kFormats) {
    const int64_t out = 7, in = gguf_block_weights(format) == 32 ? 96 : 768;
    const std::vector<uint8_t> bytes = random_blocks(format, out, in, rng);
    auto q = unpack_gguf_blocks(format, bytes_tensor(bytes), out, in);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    EXPECT_EQ(q->format, format);
    EXPECT_EQ(q->group_size, gguf_block_weights(format));
    Weight w;
    w.quant = std::make_shared<QuantWeight>(*q);
    EXPECT_EQ(w.nbytes(), bytes.size()) << quant_format_name(format) << ": the packed weight is the file's bytes";
    std::vector<float> want(static_cast<size_t>(out * in));
    decode_stored(format, bytes, want.data());
    const Tensor got = dequantize(*q);
    for (int64_t i = 0; i < out * in; ++i) {
      ASSERT_EQ(f32_bits(got.data<float>()[i]), f32_bits(want[static_cast<size_t>(i)]))
          << quant_format_name(format) << " element " << i;
    }
  }
}

TEST(GgufBlocks, BadBlocksAreErrors) {
  std::mt19937 rng(testing::fresh_seed());
  for (QuantFormat format : kFormats) {
    SCOPED_TRACE(quant_format_name(format));
    const int64_t out = 3, in = 512;
    std::vector<uint8_t> bytes = random_blocks(format, out, in, rng);
    const Tensor good = bytes_tensor(bytes);
    EXPECT_TRUE(unpack_gguf_blocks(format, good, out, in).ok());
    EXPECT_EQ(unpack_gguf_blocks(format, good.slice(0, 0, good.numel() - 1), out, in).status().code(),
              ErrorCode::kCorruptFile);
    EXPECT_EQ(unpack_gguf_blocks(format, good, out, in + 1).status().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(unpack_gguf_blocks(format, good, out + 1, in).status().code(), ErrorCode::kCorruptFile);
    // A non-finite value in each f16 field of the last row's second block (a NaN, then an Inf).
    for (int64_t field : f16_fields(format)) {
      std::vector<uint8_t> corrupt = bytes;
      const size_t at = static_cast<size_t>(2 * gguf_row_bytes(format, in) + block_bytes(format) + field);
      const uint16_t bits = field == 0 ? 0x7e00 : 0x7c00;
      std::memcpy(&corrupt[at], &bits, 2);
      auto bad = unpack_gguf_blocks(format, bytes_tensor(corrupt), out, in);
      ASSERT_FALSE(bad.ok());
      EXPECT_EQ(bad.status().code(), ErrorCode::kCorruptFile);
      EXPECT_NE(bad.status().message().find("block 1 of row 2"), std::string::npos) << bad.status().to_string();
    }
  }
  const Tensor dense = Tensor::zeros({4, 96}, DType::kF32);
  EXPECT_EQ(quantize_gguf_blocks(dense, QuantFormat::kGgufQ4_K).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(quantize_gguf_blocks(dense, QuantFormat::kGgufQ5_K).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(quantize_gguf_blocks(dense, QuantFormat::kGgufQ8_0).ok());
  EXPECT_TRUE(quantize_gguf_blocks(dense, QuantFormat::kGgufQ5_0).ok());
  Tensor nan = Tensor::zeros({2, 256}, DType::kF32);
  nan.data<float>()[300] = std::nanf("");
  EXPECT_FALSE(quantize_gguf_blocks(nan, QuantFormat::kGgufQ6_K).ok());
  EXPECT_FALSE(quantize_gguf_blocks(nan, QuantFormat::kGgufQ4_1).ok());
  for (const char* name : {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q4_k", "q5_k", "q6_k"}) {
    auto spec = parse_quant_spec(name, 128);
    ASSERT_TRUE(spec.ok()) << name;
    EXPECT_EQ(spec->gguf_q4_0, std::string(name) == "q4_0");
  }
  EXPECT_FALSE(parse_quant_spec("q3_k", 128).ok());
  EXPECT_FALSE(parse_quant_spec("iq4_xs", 128).ok());
}

// `--quant q4_0` holds Q4_0's blocks as int4 group 32 (zero 8): the weights a Q4_0 file of the
// same values decodes to, bit for bit.
TEST(GgufBlocks, Q4_0SpecIsTheQ4_0Encoding) {
  std::mt19937 rng(testing::fresh_seed());
  const int64_t out = 5, in = 96;
  Tensor w = testing::random_tensor({out, in}, rng, -1.0f, 1.0f);
  auto spec = parse_quant_spec("q4_0", 128);
  ASSERT_TRUE(spec.ok());
  Weight dense;
  dense.dense = w;
  auto q = quantize_weight(dense, *spec);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->quant->format, QuantFormat::kInt4Group);
  EXPECT_EQ(q->quant->group_size, 32);
  std::vector<uint8_t> raw;
  quantize_q4_0(w.data<float>(), out * in, &raw);
  std::vector<float> want(static_cast<size_t>(out * in));
  dequantize_q4_0(raw.data(), out * in / 32, want.data());
  const Tensor got = dequantize(*q->quant);
  for (int64_t i = 0; i < out * in; ++i) {
    ASSERT_EQ(f32_bits(got.data<float>()[i]), f32_bits(want[static_cast<size_t>(i)])) << "element " << i;
  }
}

// The round-to-nearest encoders: every weight within its bound, all-zero rows stay zero.
// - Q8_0: half a step, plus the f16 rounding of d times the largest code magnitude (codes are
//   chosen against the f32 d, as ggml's quantizer does): 127 codes of 2^-11 of d.
// - Q5_0: as Q8_0 with 16 codes, but a whole step: the largest magnitude maps to -16 and its
//   opposite side stops at +15.
// - Q4_1, Q5_1: half a step plus the f16 rounding of the min (2^-11 of |m|).
// - IQ4_NL: half the widest gap between levels (23 / 2 steps) or, above the top level 113, up to
//   14 steps, plus 127 codes of d's rounding.
// - Q4_K, Q5_K: half a sub-block step plus half of dmin (the rounding of the min); Q6_K: half a step.
TEST(GgufBlocks, EncodersStayWithinTheirBounds) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (QuantFormat format : kFormats) {
    const int64_t out = 9, in = 512;
    Tensor w = testing::random_tensor({out, in}, rng, -0.1f, 0.1f);
    for (int64_t o = 0; o < out; ++o) w.data<float>()[o * in + (o * 37) % in] *= 25.0f;  // outliers
    for (int64_t i = 0; i < in; ++i) w.data<float>()[(out - 1) * in + i] = 0.0f;
    auto q = quantize_gguf_blocks(w, format);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    const Tensor got = dequantize(*q);
    std::vector<uint8_t> raw;  // the stored blocks, to read each block's scales
    encode(format, w.data<float>(), out * in, &raw);
    const int64_t bw = gguf_block_weights(format);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        const int64_t k = o * in + i;
        const uint8_t* b = &raw[static_cast<size_t>(k / bw * block_bytes(format))];
        const auto f16_at = [&](int64_t at) {
          uint16_t bits;
          std::memcpy(&bits, b + at, 2);
          return static_cast<double>(std::fabs(f16_to_f32(bits)));
        };
        double bound = 0.0;
        switch (format) {
          case QuantFormat::kGgufQ8_0: bound = f16_at(0) * (0.5 + 127.0 / 2048.0); break;
          case QuantFormat::kGgufQ5_0: bound = f16_at(0) * (1.0 + 16.0 / 2048.0); break;
          case QuantFormat::kGgufQ4_1:
          case QuantFormat::kGgufQ5_1: bound = f16_at(0) / 2.0 + f16_at(2) / 2048.0; break;
          case QuantFormat::kGgufIq4Nl: bound = f16_at(0) * (14.0 + 127.0 / 2048.0); break;
          case QuantFormat::kGgufQ4_K:
          case QuantFormat::kGgufQ5_K: {
            int sc, m;
            q4_k_scale_min(b + 4, static_cast<int>(k % 256 / 32), &sc, &m);
            bound = f16_at(0) * sc / 2.0 + f16_at(2) / 2.0;
            break;
          }
          default: bound = f16_at(kQ6_KD) * static_cast<int8_t>(b[kQ6_KScales + k % 256 / 16]) / 2.0; break;
        }
        const double err = std::fabs(static_cast<double>(got.data<float>()[k]) - w.data<float>()[k]);
        ASSERT_LE(err, bound * (1 + 1e-5) + 1e-9) << quant_format_name(format) << " weight [" << o << ", " << i << "]";
        if (o == out - 1) {
          ASSERT_EQ(got.data<float>()[k], 0.0f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tachyon
