// The GGUF block formats Q8_0, Q4_K and Q6_K: hand-computed blocks against core/ggml_blocks.h's
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

// Random stored blocks (random bytes, a finite d) of a [out, in] tensor of `format`.
std::vector<uint8_t> random_blocks(QuantFormat format, int64_t out, int64_t in, std::mt19937& rng) {
  std::vector<uint8_t> bytes(static_cast<size_t>(out * gguf_row_bytes(format, in)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(1e-4f, 5e-2f);
  const int64_t block_bytes = format == QuantFormat::kGgufQ8_0 ? kQ8_0Bytes : format == QuantFormat::kGgufQ4_K ? kQ4_KBytes : kQ6_KBytes;
  for (size_t b = 0; b < bytes.size(); b += static_cast<size_t>(block_bytes)) {
    switch (format) {
      case QuantFormat::kGgufQ8_0: put_f16(&bytes[b], scale(rng)); break;
      case QuantFormat::kGgufQ4_K:
        put_f16(&bytes[b], scale(rng));
        put_f16(&bytes[b + 2], scale(rng));
        break;
      default: put_f16(&bytes[b + kQ6_KD], scale(rng)); break;
    }
  }
  return bytes;
}

void decode_stored(QuantFormat format, const std::vector<uint8_t>& bytes, float* out) {
  switch (format) {
    case QuantFormat::kGgufQ8_0: dequantize_q8_0(bytes.data(), static_cast<int64_t>(bytes.size()) / kQ8_0Bytes, out); break;
    case QuantFormat::kGgufQ4_K: dequantize_q4_k(bytes.data(), static_cast<int64_t>(bytes.size()) / kQ4_KBytes, out); break;
    default: dequantize_q6_k(bytes.data(), static_cast<int64_t>(bytes.size()) / kQ6_KBytes, out); break;
  }
}

constexpr QuantFormat kFormats[] = {QuantFormat::kGgufQ8_0, QuantFormat::kGgufQ4_K, QuantFormat::kGgufQ6_K};

// The in-memory layouts stand for exactly the stored blocks, bit for bit.
TEST(GgufBlocks, UnpackedLayoutsDecodeToTheStoredBlocks) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (QuantFormat format : kFormats) {
    const int64_t out = 7, in = format == QuantFormat::kGgufQ8_0 ? 96 : 768;
    const std::vector<uint8_t> bytes = random_blocks(format, out, in, rng);
    auto q = unpack_gguf_blocks(format, bytes_tensor(bytes), out, in);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    EXPECT_EQ(q->format, format);
    EXPECT_EQ(q->group_size, format == QuantFormat::kGgufQ8_0 ? 32 : 256);
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
    // A non-finite d in the last row's second block.
    const int64_t block_bytes = gguf_row_bytes(format, in) / (in / (format == QuantFormat::kGgufQ8_0 ? 32 : 256));
    const size_t at = static_cast<size_t>(2 * gguf_row_bytes(format, in) + block_bytes) +
                      (format == QuantFormat::kGgufQ6_K ? kQ6_KD : 0);
    const uint16_t inf = 0x7c00;
    std::memcpy(&bytes[at], &inf, 2);
    auto bad = unpack_gguf_blocks(format, bytes_tensor(bytes), out, in);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), ErrorCode::kCorruptFile);
    EXPECT_NE(bad.status().message().find("block 1 of row 2"), std::string::npos) << bad.status().to_string();
  }
  const Tensor dense = Tensor::zeros({4, 96}, DType::kF32);
  EXPECT_EQ(quantize_gguf_blocks(dense, QuantFormat::kGgufQ4_K).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(quantize_gguf_blocks(dense, QuantFormat::kGgufQ8_0).ok());
  Tensor nan = Tensor::zeros({2, 256}, DType::kF32);
  nan.data<float>()[300] = std::nanf("");
  EXPECT_FALSE(quantize_gguf_blocks(nan, QuantFormat::kGgufQ6_K).ok());
  EXPECT_TRUE(parse_quant_spec("q4_k", 128).ok());
  EXPECT_FALSE(parse_quant_spec("q5_k", 128).ok());
}

// The round-to-nearest encoders: every weight within its bound (Q8_0: d / 2 and d's f16 rounding; Q4_K: half a
// sub-block step plus half of dmin, the rounding of the min; Q6_K: half a step), all-zero rows
// stay zero.
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
    switch (format) {
      case QuantFormat::kGgufQ8_0: quantize_q8_0(w.data<float>(), out * in, &raw); break;
      case QuantFormat::kGgufQ4_K: quantize_q4_k(w.data<float>(), out * in, &raw); break;
      default: quantize_q6_k(w.data<float>(), out * in, &raw); break;
    }
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        const int64_t k = o * in + i;
        double bound = 0.0;
        if (format == QuantFormat::kGgufQ8_0) {
          uint16_t d;
          std::memcpy(&d, &raw[static_cast<size_t>(k / 32 * kQ8_0Bytes)], 2);
          // Codes are chosen against the f32 d, the block stores it rounded to f16 (as ggml's
          // quantizer does): up to 127 codes times that rounding, 2^-11 of d, on top of d / 2.
          bound = f16_to_f32(d) * (0.5 + 127.0 / 2048.0);
        } else if (format == QuantFormat::kGgufQ4_K) {
          const uint8_t* b = &raw[static_cast<size_t>(k / 256 * kQ4_KBytes)];
          uint16_t d, dmin;
          std::memcpy(&d, b, 2);
          std::memcpy(&dmin, b + 2, 2);
          int sc, m;
          q4_k_scale_min(b + 4, static_cast<int>(k % 256 / 32), &sc, &m);
          bound = f16_to_f32(d) * sc / 2.0 + f16_to_f32(dmin) / 2.0;
        } else {
          const uint8_t* b = &raw[static_cast<size_t>(k / 256 * kQ6_KBytes)];
          uint16_t d;
          std::memcpy(&d, b + kQ6_KD, 2);
          bound = f16_to_f32(d) * static_cast<int8_t>(b[kQ6_KScales + k % 256 / 16]) / 2.0;
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
