// The int8 per-channel and int4 group-wise formats: the rounding error of quantize/dequantize
// against its bound, bad inputs, and the fast kernel behind ops::linear against the reference
// "dequantize, then the scalar linear" on fresh random inputs of awkward sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/ggml_blocks.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/quant_linear.h"
#include "ops/ops.h"
#include "quant/quantize.h"
#include "ops/ops_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

using ops::cpu::Isa;

// A bf16 weight [out, in] (what the bundled models store) with a few outlier columns, so that
// scales differ a lot between rows and groups.
Tensor random_weight(int64_t out, int64_t in, std::mt19937& rng, DType dtype = DType::kBF16) {
  Tensor w32 = testing::random_tensor({out, in}, rng, -0.1f, 0.1f);
  for (int64_t o = 0; o < out; ++o) w32.data<float>()[o * in + (o * 7) % in] *= 20.0f;
  if (dtype == DType::kF32) return w32;
  Tensor w = Tensor::empty({out, in}, dtype);
  for (int64_t i = 0; i < out * in; ++i) {
    w.data<uint16_t>()[i] = dtype == DType::kBF16 ? f32_to_bf16(w32.data<float>()[i]) : f32_to_f16(w32.data<float>()[i]);
  }
  return w;
}

float weight_at(const Tensor& w, int64_t o, int64_t i) {
  const int64_t k = o * w.stride(0) + i;
  switch (w.dtype()) {
    case DType::kF32: return w.data<float>()[k];
    case DType::kBF16: return bf16_to_f32(w.data<uint16_t>()[k]);
    default: return f16_to_f32(w.data<uint16_t>()[k]);
  }
}

TEST(QuantizeInt8, ErrorWithinHalfAScalePerChannel) {
  std::mt19937 rng(testing::fresh_seed());
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor w = random_weight(37, 83, rng, dtype);
    auto q = quantize_int8_channel(w);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    EXPECT_EQ(q->format, QuantFormat::kInt8Channel);
    EXPECT_EQ(q->packed.dtype(), DType::kI8);
    const Tensor d = dequantize(*q);
    for (int64_t o = 0; o < 37; ++o) {
      const float scale = q->scales.data<float>()[o];
      float max_abs = 0.0f;
      for (int64_t i = 0; i < 83; ++i) max_abs = std::max(max_abs, std::fabs(weight_at(w, o, i)));
      EXPECT_FLOAT_EQ(scale, max_abs / 127.0f);
      for (int64_t i = 0; i < 83; ++i) {
        ASSERT_LE(std::fabs(weight_at(w, o, i) - d.data<float>()[o * 83 + i]), scale * 0.5f * (1 + 1e-5f))
            << dtype_name(dtype) << " row " << o << " col " << i;
      }
    }
  }
}

TEST(QuantizeInt8, ZeroRowAndRowStride) {
  Tensor w = Tensor::zeros({3, 16}, DType::kF32);
  for (int i = 0; i < 16; ++i) w.data<float>()[16 + i] = static_cast<float>(i) - 8.0f;
  auto q = quantize_int8_channel(w.slice(1, 0, 10));  // rows 16 apart, 10 columns
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->in_features, 10);
  EXPECT_EQ(q->scales.data<float>()[0], 0.0f);
  const Tensor d = dequantize(*q);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(d.data<float>()[i], 0.0f);
    EXPECT_NEAR(d.data<float>()[10 + i], static_cast<float>(i) - 8.0f, 8.0f / 127.0f / 2.0f);
  }
}

// ops::quantize_int8_rows (what a device quantizes with) makes the host quantizer's bytes.
TEST(QuantizeInt8, OpMatchesTheHostQuantizer) {
  std::mt19937 rng(testing::fresh_seed());
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor w = random_weight(29, 131, rng, dtype);
    auto q = quantize_int8_channel(w);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    Tensor packed = Tensor::empty({29, 131}, DType::kI8), scales = Tensor::empty({29}, DType::kF32);
    ops::quantize_int8_rows(w, packed, scales);
    EXPECT_TRUE(testing::bitwise_equal(packed, q->packed, "packed")) << dtype_name(dtype);
    EXPECT_TRUE(testing::bitwise_equal(scales, q->scales, "scales")) << dtype_name(dtype);
  }
}

TEST(QuantizeInt4, ErrorWithinHalfAScalePerGroup) {
  std::mt19937 rng(testing::fresh_seed());
  for (int group : {32, 64, 128}) {
    const int64_t out = 13, in = 256;
    const Tensor w = random_weight(out, in, rng);
    auto q = quantize_int4_group(w, group);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    EXPECT_EQ(q->group_size, group);
    EXPECT_EQ(q->packed.size(1), in / 2);
    EXPECT_EQ(q->scales.size(1), in / group);
    const Tensor d = dequantize(*q);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t g = 0; g < in / group; ++g) {
        const float scale = q->scales.data<float>()[o * (in / group) + g];
        const float zero = q->zeros.data<float>()[o * (in / group) + g];
        EXPECT_EQ(zero, std::nearbyint(zero));
        EXPECT_GE(zero, 0.0f);
        EXPECT_LE(zero, 15.0f);
        float lo = 0.0f, hi = 0.0f;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          lo = std::min(lo, weight_at(w, o, i));
          hi = std::max(hi, weight_at(w, o, i));
        }
        EXPECT_FLOAT_EQ(scale, (hi - lo) / 15.0f);
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          ASSERT_LE(std::fabs(weight_at(w, o, i) - d.data<float>()[o * in + i]), scale * 0.5f * (1 + 1e-4f) + 1e-7f)
              << "group size " << group << " row " << o << " col " << i;
        }
      }
    }
  }
}

// The packed layout itself (quant/quantize.h): byte j of a 32-weight block holds weight j low and
// weight j + 16 high.
TEST(QuantizeInt4, PackedLayout) {
  Tensor w = Tensor::empty({1, 32}, DType::kF32);
  for (int i = 0; i < 32; ++i) w.data<float>()[i] = static_cast<float>(i % 16);  // 0..15 twice: scale 1, zero 0
  auto q = quantize_int4_group(w, 32);
  ASSERT_TRUE(q.ok());
  EXPECT_FLOAT_EQ(q->scales.data<float>()[0], 1.0f);
  EXPECT_EQ(q->zeros.data<float>()[0], 0.0f);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q->packed.data<uint8_t>()[j], j | (j << 4)) << j;
}

// GGUF Q4_0 blocks become kInt4Group (group 32, zero 8) without a dense detour: dequantizing
// the result gives io/gguf's Q4_0 decoding bit for bit, on blocks quantized by the GGUF writer
// and on hand-made ones (every nibble, negative and subnormal f16 scales).
TEST(QuantizeGguf, Q4_0BlocksAreInt4Group32) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  const int64_t out = 5, in = 96;
  const Tensor w = testing::random_tensor({out, in}, rng, -3.0f, 3.0f);
  std::vector<uint8_t> bytes;
  quantize_q4_0(w.data<float>(), out * in, &bytes);
  // Hand-made blocks in the last row: nibbles 0..15 in order, scales -0.5 and the smallest subnormal.
  for (int b = 0; b < 3; ++b) {
    uint8_t* block = bytes.data() + ((out - 1) * 3 + b) * 18;
    const uint16_t d = b == 0 ? f32_to_f16(-0.5f) : b == 1 ? uint16_t{0x0001} : f32_to_f16(0.0f);
    std::memcpy(block, &d, 2);
    for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>((j & 15) | ((15 - j) << 4));
  }
  Tensor blocks = Tensor::empty({static_cast<int64_t>(bytes.size())}, DType::kU8);
  std::memcpy(blocks.raw_data(), bytes.data(), bytes.size());
  auto q = unpack_gguf_q4_0(blocks, out, in);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->format, QuantFormat::kInt4Group);
  EXPECT_EQ(q->group_size, 32);
  std::vector<float> want(static_cast<size_t>(out * in));
  dequantize_q4_0(bytes.data(), out * in / 32, want.data());
  const Tensor got = dequantize(*q);
  for (int64_t i = 0; i < out * in; ++i) {
    ASSERT_EQ(f32_bits(got.data<float>()[i]), f32_bits(want[static_cast<size_t>(i)])) << "element " << i;
  }
  // The fast kernel on it equals the reference (the format's existing kernels run it).
  const Tensor x = testing::random_tensor({3, in}, rng);
  Tensor fast = Tensor::empty({3, out}, DType::kF32), ref = Tensor::empty({3, out}, DType::kF32);
  Weight packed;
  packed.quant = std::make_shared<QuantWeight>(*q);
  ops::cpu::set_int8_dot(false);  // the exact kernels (the integer ones have their own tests below)
  ops::linear(x, packed, nullptr, fast);
  ops::cpu::clear_int8_dot_override();
  ops::cpu::quant_linear_reference(x, *q, nullptr, ref);
  EXPECT_TRUE(testing::all_close(fast, ref, 1e-5, "q4_0 as int4 g32"));
  // Wrong sizes and a non-finite scale are errors, not reads past the end.
  EXPECT_EQ(unpack_gguf_q4_0(blocks.slice(0, 0, blocks.numel() - 1), out, in).status().code(), ErrorCode::kCorruptFile);
  EXPECT_EQ(unpack_gguf_q4_0(blocks, out, 95).status().code(), ErrorCode::kInvalidArgument);
  const uint16_t inf = 0x7c00;
  std::memcpy(blocks.raw_data(), &inf, 2);
  EXPECT_EQ(unpack_gguf_q4_0(blocks, out, in).status().code(), ErrorCode::kCorruptFile);
}

TEST(Quantize, BadInputsAreErrors) {
  std::mt19937 rng(testing::fresh_seed());
  const Tensor w = random_weight(8, 96, rng);
  auto not_multiple = quantize_int4_group(w, 64);
  ASSERT_FALSE(not_multiple.ok());
  EXPECT_NE(not_multiple.status().message().find("not a multiple of the group size 64"), std::string::npos)
      << not_multiple.status().to_string();
  EXPECT_FALSE(quantize_int4_group(w, 48).ok());
  EXPECT_TRUE(quantize_int4_group(w, 32).ok());
  const Tensor ints = Tensor::zeros({8, 32}, DType::kI32);
  auto not_float = quantize_int8_channel(ints);
  ASSERT_FALSE(not_float.ok());
  EXPECT_NE(not_float.status().message().find("expected f32, f16 or bf16"), std::string::npos);
  EXPECT_FALSE(quantize_int4_group(ints, 32).ok());
  EXPECT_FALSE(quantize_int8_channel(Tensor::zeros({32}, DType::kF32)).ok());
  Tensor nan = Tensor::zeros({2, 32}, DType::kF32);
  nan.data<float>()[40] = std::nanf("");
  EXPECT_FALSE(quantize_int8_channel(nan).ok());
  EXPECT_FALSE(quantize_int4_group(nan, 32).ok());
  EXPECT_FALSE(parse_quant_spec("int3", 128).ok());
  EXPECT_FALSE(parse_quant_spec("int4", 100).ok());
  Weight dense;
  dense.dense = w;
  auto once = quantize_weight(dense, QuantSpec{QuantFormat::kInt8Channel, 0});
  ASSERT_TRUE(once.ok());
  EXPECT_LT(once->nbytes(), dense.nbytes());
  EXPECT_FALSE(quantize_weight(*once, QuantSpec{QuantFormat::kInt8Channel, 0}).ok());
}

// x [n, in] and y [n, out] are views with row strides larger than their widths, y starts as NaN
// (an output the kernel forgets stays NaN) and the columns past `out` must stay untouched. The exact
// f32 kernels are held to the reference; where the integer dot products run (dot_linear_supported:
// the GGUF block formats, int8, int4), they are held as tightly to the reference on the activations
// as they quantize them (each block of 32 by quantize_activation_row), and to the exact reference
// within the activations' rounding: half a step (max |x| / 127 of the block) times sum |w| over
// each block. From kQuantGemmMinTokens tokens on, every format but W8A8 runs the GEMM on decoded
// panels, exact f32 whatever int8_dot says, and is held to the reference alone.
void expect_kernel_matches_reference(const QuantWeight& q, int64_t n, bool with_bias, std::mt19937& rng) {
  const int64_t in = q.in_features, out = q.out_features;
  const Tensor x_storage = testing::random_tensor({n, in + 5}, rng);
  const Tensor x = x_storage.slice(1, 2, 2 + in);
  const Tensor bias = testing::random_tensor({out}, rng);
  Tensor expected = Tensor::empty({n, out}, DType::kF32);
  ops::cpu::quant_linear_reference(x, q, with_bias ? &bias : nullptr, expected);
  const Tensor dense = dequantize(q);
  // The activations as the integer kernels see them: per token, blocks of 32 rounded to int8.
  std::vector<double> xq(static_cast<size_t>(n * in)), half_step(static_cast<size_t>(n * in));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t b0 = 0; b0 < in; b0 += 32) {
      const int64_t len = std::min<int64_t>(32, in - b0);
      int8_t codes[32];
      const float d = quantize_activation_row(x.data<float>() + t * x.stride(0) + b0, len, codes);
      for (int64_t i = 0; i < len; ++i) {
        xq[static_cast<size_t>(t * in + b0 + i)] = static_cast<double>(d) * codes[i];
        half_step[static_cast<size_t>(t * in + b0 + i)] = 0.5 * d;
      }
    }
  }
  Weight w;
  w.quant = std::make_shared<const QuantWeight>(q);
  const bool dot = ops::cpu::dot_linear_supported(q);
  const bool gemm = n >= ops::cpu::kQuantGemmMinTokens && q.format != QuantFormat::kW8A8;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!ops::cpu::isa_supported(isa)) continue;
    ops::cpu::set_isa(isa);
    for (bool int8_dot : {false, true}) {
      if (int8_dot && !dot) continue;
      ops::cpu::set_int8_dot(int8_dot);
      for (ops::LinearMode mode : {ops::LinearMode::kFastest, ops::LinearMode::kBatchInvariant}) {
        // Batch-invariant calls keep the few-token kernels at any n.
        const bool gemm_runs = gemm && mode == ops::LinearMode::kFastest;
        const bool rounded = int8_dot && !gemm_runs;  // the activations as int8 codes
        Tensor y_storage = Tensor::empty({n, out + 3}, DType::kF32);
        for (int64_t i = 0; i < y_storage.numel(); ++i) y_storage.data<float>()[i] = std::nanf("");
        Tensor y = y_storage.slice(1, 0, out);
        ops::linear(x, w, with_bias ? &bias : nullptr, y, mode);
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t o = 0; o < out; ++o) {
            // f32 accumulation against a double sum: at most ~in roundings of the running sum, each
            // within 2^-24 of sum |w x|.
            double abs_sum = with_bias ? std::fabs(bias.data<float>()[o]) : 0.0;
            double quantized = with_bias ? bias.data<float>()[o] : 0.0, rounding = 0.0;
            for (int64_t i = 0; i < in; ++i) {
              const double wi = dense.data<float>()[o * in + i];
              const size_t ti = static_cast<size_t>(t * in + i);
              abs_sum += std::fabs(wi * (rounded ? xq[ti] : x.data<float>()[t * x.stride(0) + i]));
              quantized += wi * xq[ti];
              rounding += std::fabs(wi) * half_step[ti];
            }
            const float got = y.data<float>()[t * y.stride(0) + o];
            const double f32_error = 1.2e-7 * static_cast<double>(in + 8) * abs_sum + 1e-6;
            const std::string what =
                fmt::format("{} {} {} n={} token {} row {}", quant_format_name(q.format), ops::cpu::isa_name(isa),
                            gemm_runs ? "gemm" : int8_dot ? "int8 dot" : "exact", n, t, o);
            ASSERT_TRUE(std::isfinite(got)) << what;
            if (rounded) {
              ASSERT_NEAR(got, quantized, f32_error) << what;
              ASSERT_NEAR(got, expected.data<float>()[t * out + o], rounding + f32_error) << what;
            } else {
              ASSERT_NEAR(got, expected.data<float>()[t * out + o], f32_error) << what;
            }
          }
          for (int64_t c = out; c < out + 3; ++c) ASSERT_TRUE(std::isnan(y_storage.data<float>()[t * (out + 3) + c]));
        }
      }
    }
    ops::cpu::clear_int8_dot_override();
    ops::cpu::clear_isa_override();
  }
}

// The integer kernels' activation blocks are quantize_activation_row's on each block of 32, bit
// for bit: random rows of odd widths, an all-zero block, a block with a NaN and one with an
// infinity (NaN scale), the codes past `in` zero, dsum = d * the block's code sum.
TEST(QuantLinear, ActivationBlocksAreTheRowQuantizerPerBlock) {
  std::mt19937 rng(testing::fresh_seed());
  for (int64_t in : {7, 32, 96, 131, 896}) {
    const int64_t n = 3, stride = (in + 63) / 64 * 64, blocks = stride / 32;
    Tensor x = testing::random_tensor({n, in + 3}, rng, -4.0f, 4.0f);
    float* xd = x.data<float>();
    if (in >= 96) {
      for (int i = 32; i < 64; ++i) xd[i] = 0.0f;  // token 0, block 1
      xd[(in + 3) + 70] = std::nanf("");           // token 1, block 2
      xd[2 * (in + 3) + 5] = INFINITY;             // token 2, block 0
    }
    std::vector<int8_t> codes(static_cast<size_t>(n * stride), 99);
    std::vector<float> d(static_cast<size_t>(n * blocks)), dsum(d.size());
    ops::cpu::quantize_activation_blocks(xd, in + 3, n, in, codes.data(), stride, d.data(), dsum.data());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t len = std::max<int64_t>(0, std::min<int64_t>(32, in - 32 * b));
        int8_t want[32] = {};
        const float want_d = len > 0 ? quantize_activation_row(xd + t * (in + 3) + 32 * b, len, want) : 0.0f;
        const size_t at = static_cast<size_t>(t * blocks + b);
        const std::string what = fmt::format("in {} token {} block {}", in, t, b);
        ASSERT_EQ(f32_bits(d[at]), f32_bits(want_d)) << what;
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) {
          ASSERT_EQ(codes[static_cast<size_t>(t * stride + 32 * b + i)], i < len ? want[i] : 0) << what << " code " << i;
          sum += want[i];
        }
        if (std::isfinite(want_d)) {
          ASSERT_EQ(dsum[at], want_d * static_cast<float>(sum)) << what;
        } else {
          ASSERT_TRUE(std::isnan(dsum[at])) << what;
        }
      }
    }
  }
}

TEST(QuantLinear, Int8KernelMatchesReference) {
  std::mt19937 rng(testing::fresh_seed());
  for (int threads : {1, 2}) {
    const int saved = num_threads();
    set_num_threads(threads);
    for (int64_t in : {8, 29, 96, 264}) {
      for (int64_t n : {1, 3, 17}) {
        auto q = quantize_int8_channel(random_weight(67, in, rng));
        ASSERT_TRUE(q.ok());
        expect_kernel_matches_reference(*q, n, n != 3, rng);
      }
    }
    set_num_threads(saved);
  }
}

TEST(QuantLinear, Int4KernelMatchesReference) {
  std::mt19937 rng(testing::fresh_seed());
  for (int threads : {1, 2}) {
    const int saved = num_threads();
    set_num_threads(threads);
    for (int group : {32, 64, 128}) {
      for (int64_t n : {1, 3, 17}) {
        auto q = quantize_int4_group(random_weight(61, 3 * group, rng), group);
        ASSERT_TRUE(q.ok()) << q.status().to_string();
        expect_kernel_matches_reference(*q, n, n == 17, rng);
      }
    }
    set_num_threads(saved);
  }
}

constexpr QuantFormat kGgufFormats[] = {QuantFormat::kGgufQ8_0, QuantFormat::kGgufQ4_1, QuantFormat::kGgufQ5_0,
                                        QuantFormat::kGgufQ5_1, QuantFormat::kGgufIq4Nl, QuantFormat::kGgufQ4_K,
                                        QuantFormat::kGgufQ5_K, QuantFormat::kGgufQ6_K};

// Every GGUF block format through the encoders, on both ISAs, the integer kernels and the exact
// ones, each held to its tolerance (expect_kernel_matches_reference): for the 32-weight blocks one
// block, an odd count and Qwen2.5-0.5B's 896 (no multiple of 256); rows not a multiple of the 8-row
// blocks; token counts that leave every remainder tile of run_rows.
TEST(QuantLinear, GgufBlockKernelsMatchReference) {
  std::mt19937 rng(testing::fresh_seed());
  for (int threads : {1, 2}) {
    const int saved = num_threads();
    set_num_threads(threads);
    for (QuantFormat format : kGgufFormats) {
      const bool block32 = gguf_block_weights(format) == kGgmlBlock32;
      for (int64_t in : block32 ? std::vector<int64_t>{32, 96, 896} : std::vector<int64_t>{256, 768}) {
        for (int64_t n : {1, 2, 3, 5, 17}) {
          auto q = quantize_gguf_blocks(random_weight(block32 ? 67 : 29, in, rng), format);
          ASSERT_TRUE(q.ok()) << q.status().to_string();
          expect_kernel_matches_reference(*q, n, n != 3, rng);
        }
      }
    }
    set_num_threads(saved);
  }
}

// A [out, in] weight of `format` made of random bytes, so that every code, fifth bit, IQ4_NL level
// and 6-bit scale pattern occurs (the encoders leave some rare), with finite f16 fields (d, and m
// or dmin) of random sign and magnitude 2^-12 .. 2^-6.
QuantWeight random_gguf_weight(QuantFormat format, int64_t out, int64_t in, std::mt19937& rng) {
  const int64_t weights = gguf_block_weights(format), block_bytes = gguf_row_bytes(format, weights);
  const bool has_second = format == QuantFormat::kGgufQ4_1 || format == QuantFormat::kGgufQ5_1 ||
                          format == QuantFormat::kGgufQ4_K || format == QuantFormat::kGgufQ5_K;
  const int64_t d_at = format == QuantFormat::kGgufQ6_K ? kQ6_KD : 0;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> exponent(-12.0f, -6.0f);
  Tensor blocks = Tensor::empty({out * gguf_row_bytes(format, in)}, DType::kU8);
  uint8_t* bytes = blocks.data<uint8_t>();
  for (int64_t i = 0; i < blocks.numel(); ++i) bytes[i] = static_cast<uint8_t>(byte(rng));
  for (int64_t b = 0; b < blocks.numel() / block_bytes; ++b) {
    for (int64_t at : {d_at, has_second ? int64_t{2} : int64_t{-1}}) {
      if (at < 0) continue;
      const float v = std::exp2(exponent(rng)) * (byte(rng) < 128 ? -1.0f : 1.0f);
      const uint16_t bits = f32_to_f16(v);
      std::memcpy(bytes + b * block_bytes + at, &bits, 2);
    }
  }
  auto q = unpack_gguf_blocks(format, blocks, out, in);
  TACHYON_CHECK(q.ok(), "{}", q.status().to_string());
  return *q;
}

// Blocks of random bytes (every bit pattern the layouts allow) through both kernels and ISAs.
TEST(QuantLinear, GgufRandomBlocksMatchReference) {
  std::mt19937 rng(testing::fresh_seed());
  for (QuantFormat format : kGgufFormats) {
    const int64_t in = gguf_block_weights(format) == kGgmlBlock32 ? 160 : 512;
    for (int64_t n : {1, 5}) expect_kernel_matches_reference(random_gguf_weight(format, 13, in, rng), n, n == 5, rng);
  }
}

// The exact kernels decode each weight as core/ggml_blocks.cpp does, bit for bit: with x the
// identity, y[t, o] is weight [o, t] alone (every other product is a zero; only a zero weight's
// sign may differ, which == ignores).
TEST(QuantLinear, GgufExactKernelsDecodeAsDefined) {
  std::mt19937 rng(testing::fresh_seed());
  for (QuantFormat format : kGgufFormats) {
    const int64_t in = gguf_block_weights(format) == kGgmlBlock32 ? 96 : 256, out = 11;
    Tensor x = Tensor::zeros({in, in}, DType::kF32);
    for (int64_t i = 0; i < in; ++i) x.data<float>()[i * in + i] = 1.0f;
    for (bool random_bytes : {false, true}) {
      Weight w;
      if (random_bytes) {
        w.quant = std::make_shared<const QuantWeight>(random_gguf_weight(format, out, in, rng));
      } else {
        auto q = quantize_gguf_blocks(random_weight(out, in, rng), format);
        ASSERT_TRUE(q.ok()) << q.status().to_string();
        w.quant = std::make_shared<const QuantWeight>(*q);
      }
      const Tensor dense = dequantize(*w.quant);
      ops::cpu::set_int8_dot(false);
      for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
        if (!ops::cpu::isa_supported(isa)) continue;
        ops::cpu::set_isa(isa);
        Tensor y = Tensor::empty({in, out}, DType::kF32);
        ops::linear(x, w, nullptr, y);
        for (int64_t t = 0; t < in; ++t) {
          for (int64_t o = 0; o < out; ++o) {
            ASSERT_EQ(y.data<float>()[t * out + o], dense.data<float>()[o * in + t])
                << quant_format_name(format) << (random_bytes ? " random bytes " : " encoded ")
                << ops::cpu::isa_name(isa) << " weight [" << o << ", " << t << "]";
          }
        }
        ops::cpu::clear_isa_override();
      }
      ops::cpu::clear_int8_dot_override();
    }
  }
}

// A token's output is the same bit for bit alone as in a batch (whatever tile of run_rows and
// thread split it lands in), for every GGUF format, ISA and kernel (integer and exact).
TEST(QuantLinear, BlockKernelsAreBatchInvariant) {
  std::mt19937 rng(testing::fresh_seed());
  const int64_t n = 7, out = 37;
  const int saved = num_threads();
  set_num_threads(2);
  // The GGUF block formats, then int4 at groups 32 (Q4_0's) and 128, in of an odd number of
  // blocks (the AVX-512 VNNI int4 kernel's last, unpaired block).
  std::vector<Result<QuantWeight>> weights;
  for (QuantFormat format : kGgufFormats) {
    const int64_t in = gguf_block_weights(format) == kGgmlBlock32 ? 896 : 512;
    weights.push_back(quantize_gguf_blocks(random_weight(out, in, rng), format));
  }
  weights.push_back(quantize_int4_group(random_weight(out, 864, rng), 32));
  weights.push_back(quantize_int4_group(random_weight(out, 896, rng), 128));
  for (const Result<QuantWeight>& q : weights) {
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    const QuantFormat format = q->format;
    const int64_t in = q->in_features;
    Weight w;
    w.quant = std::make_shared<const QuantWeight>(*q);
    const Tensor x = testing::random_tensor({n, in}, rng);
    const Tensor bias = testing::random_tensor({out}, rng);
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!ops::cpu::isa_supported(isa)) continue;
      ops::cpu::set_isa(isa);
      for (bool int8_dot : {false, true}) {
        ops::cpu::set_int8_dot(int8_dot);
        Tensor batch = Tensor::empty({n, out}, DType::kF32);
        ops::linear(x, w, &bias, batch);
        for (int64_t t = 0; t < n; ++t) {
          Tensor alone = Tensor::empty({1, out}, DType::kF32);
          ops::linear(x.slice(0, t, t + 1), w, &bias, alone);
          for (int64_t o = 0; o < out; ++o) {
            ASSERT_EQ(f32_bits(alone.data<float>()[o]), f32_bits(batch.data<float>()[t * out + o]))
                << quant_format_name(format) << " " << ops::cpu::isa_name(isa) << (int8_dot ? " int8 dot" : " exact")
                << " token " << t << " row " << o;
          }
        }
      }
      ops::cpu::clear_int8_dot_override();
      ops::cpu::clear_isa_override();
    }
  }
  set_num_threads(saved);
}

// The GEMM path (kQuantGemmMinTokens tokens and more) for every format it takes: token counts that
// fill the micro-tiles of both ISAs unevenly (33, 64, 130), outputs not a multiple of the 8-row
// panels' groups or of NR (67, 29), ins of one block, several, and several k panels (896 for the
// 32-weight blocks: no multiple of the 256-wide panel), with and without bias, 1 and 2 threads.
// GgufExactKernelsDecodeAsDefined checks the GGUF decoders bit for bit on random blocks.
TEST(QuantLinear, GemmPathMatchesReference) {
  std::mt19937 rng(testing::fresh_seed());
  struct Case {
    int64_t n, out;
  };
  const Case cases[] = {{33, 67}, {64, 29}, {130, 29}};
  for (int threads : {1, 2}) {
    const int saved = num_threads();
    set_num_threads(threads);
    const auto run = [&](const Result<QuantWeight>& q, int64_t n) {
      ASSERT_TRUE(q.ok()) << q.status().to_string();
      expect_kernel_matches_reference(*q, n, n != 64, rng);
    };
    for (const Case& c : cases) {
      for (QuantFormat format : kGgufFormats) {
        const bool block32 = gguf_block_weights(format) == kGgmlBlock32;
        for (int64_t in : block32 ? std::vector<int64_t>{32, 896} : std::vector<int64_t>{256, 768}) {
          run(quantize_gguf_blocks(random_weight(c.out, in, rng), format), c.n);
        }
      }
      for (int64_t in : {29, 264, 896}) {
        run(quantize_int8_channel(random_weight(c.out, in, rng)), c.n);
        run(quantize_fp8_channel(random_weight(c.out, in, rng)), c.n);
      }
      for (int group : {32, 128}) {
        run(quantize_int4_group(random_weight(c.out, 7 * group, rng), group), c.n);
        run(quantize_ternary(random_weight(c.out, 7 * group, rng), group), c.n);
      }
    }
    set_num_threads(saved);
  }
}

// LinearMode::kBatchInvariant keeps a quantized linear on the few-token kernels at any batch: a
// token's row of a 40-token call equals its batch-1 output bit for bit (the fastest mode would
// take the GEMM path there, whose exact activations round differently).
TEST(QuantLinear, BatchInvariantModeKeepsTheDecodeKernelsPastTheGemmThreshold) {
  std::mt19937 rng(testing::fresh_seed());
  const int64_t n = ops::cpu::kQuantGemmMinTokens + 8, in = 896, out = 45;
  const Tensor x = random_weight(n, in, rng, DType::kF32);
  for (QuantFormat format : {QuantFormat::kGgufQ5_0, QuantFormat::kGgufQ8_0, QuantFormat::kGgufQ4_1}) {
    auto q = quantize_gguf_blocks(random_weight(out, in, rng), format);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    Weight w;
    w.quant = std::make_shared<QuantWeight>(std::move(q).value());
    Tensor all = testing::nan_tensor({n, out});
    ops::linear(x, w, nullptr, all, ops::LinearMode::kBatchInvariant);
    Tensor fastest = testing::nan_tensor({n, out});
    ops::linear(x, w, nullptr, fastest);
    bool differs = false;
    for (int64_t t = 0; t < n; ++t) {
      Tensor one = testing::nan_tensor({1, out});
      ops::linear(x.slice(0, t, t + 1), w, nullptr, one);
      ASSERT_EQ(std::memcmp(one.data<float>(), all.data<float>() + t * out, static_cast<size_t>(out) * 4), 0)
          << quant_format_name(format) << " token " << t;
      differs = differs || std::memcmp(one.data<float>(), fastest.data<float>() + t * out, static_cast<size_t>(out) * 4) != 0;
    }
    // On x86-64 with the integer dot products on, the fastest mode's GEMM rounds differently.
    if (ops::cpu::active_isa() != Isa::kScalar && ops::cpu::int8_dot_enabled()) EXPECT_TRUE(differs) << quant_format_name(format);
  }
}

// Absmean ternary: every code in {-1, 0, +1}, the scale the group's mean |w|, each weight the
// nearest of {-s, 0, s} when |w| <= 1.5 s, the hand-made group decoded as defined, the layout's
// bit positions.
TEST(QuantizeTernary, AbsmeanCodesAndLayout) {
  std::mt19937 rng(testing::fresh_seed());
  const Tensor w = random_weight(7, 256, rng, DType::kF32);
  for (int group : {32, 64, 128, 256}) {
    auto q = quantize_ternary(w, group);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    const Tensor d = dequantize(*q);
    for (int64_t o = 0; o < 7; ++o) {
      for (int64_t g = 0; g < 256 / group; ++g) {
        double mean = 0.0;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) mean += std::fabs(w.data<float>()[o * 256 + i]);
        mean /= group;
        const float s = q->scales.data<float>()[o * (256 / group) + g];
        EXPECT_NEAR(s, mean, 1e-6 * mean);
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          const float x = w.data<float>()[o * 256 + i], v = d.data<float>()[o * 256 + i];
          ASSERT_TRUE(v == 0.0f || v == s || v == -s) << v;
          const float want = std::fabs(x) < 0.5f * s ? 0.0f : (x > 0 ? s : -s);
          if (std::fabs(std::fabs(x) - 0.5f * s) > 1e-6f * s) ASSERT_EQ(v, want) << "w " << x << " scale " << s;
        }
      }
    }
  }
  // Weights 0..31 of a group of 32: +1 at 3 (byte 3, bits 0-1), -1 at 9 (byte 1, bits 2-3), the rest 0.
  Tensor hand = Tensor::zeros({1, 32}, DType::kF32);
  hand.data<float>()[3] = 16.0f;
  hand.data<float>()[9] = -16.0f;
  auto q = quantize_ternary(hand, 32);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->scales.data<float>()[0], 1.0f);  // mean |w| = 32 / 32
  const uint8_t* b = q->packed.data<uint8_t>();
  EXPECT_EQ(b[3], 0b01010110);  // weight 3: +1 -> 2; weights 11, 19, 27: 0 -> 1
  EXPECT_EQ(b[1], 0b01010001);  // weight 9: -1 -> 0 at bits 2-3
  EXPECT_EQ(b[0], 0b01010101);
  EXPECT_EQ(dequantize(*q).data<float>()[3], 1.0f);
  EXPECT_EQ(dequantize(*q).data<float>()[9], -1.0f);
  EXPECT_FALSE(quantize_ternary(w, 48).ok());
  EXPECT_FALSE(quantize_ternary(Tensor::zeros({2, 96}, DType::kF32), 64).ok());
}

// Per-channel e4m3: the scale max|w| / 448, every code the nearest e4m3 value of w / scale (so the
// error of each weight is within half an e4m3 step of its magnitude: 2^-4 relative, or the
// subnormal step), the row's largest weight exactly +-448 * scale.
TEST(QuantizeFp8, PerChannelE4M3) {
  std::mt19937 rng(testing::fresh_seed());
  const Tensor w = random_weight(11, 200, rng, DType::kF32);
  auto q = quantize_fp8_channel(w);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  const Tensor d = dequantize(*q);
  for (int64_t o = 0; o < 11; ++o) {
    float amax = 0.0f;
    for (int64_t i = 0; i < 200; ++i) amax = std::max(amax, std::fabs(w.data<float>()[o * 200 + i]));
    const float s = q->scales.data<float>()[o];
    EXPECT_EQ(s, amax / 448.0f);
    for (int64_t i = 0; i < 200; ++i) {
      const float x = w.data<float>()[o * 200 + i], v = d.data<float>()[o * 200 + i];
      const double bound = std::max(std::fabs(x) / 16.0, 0.5 * std::ldexp(1.0, -9) * s) * (1 + 1e-6);
      ASSERT_LE(std::fabs(v - x), bound) << "row " << o << " column " << i;
    }
  }
  Tensor zero = Tensor::zeros({2, 16}, DType::kF32);
  auto z = quantize_fp8_channel(zero);
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(dequantize(*z).data<float>()[5], 0.0f);
}

TEST(QuantLinear, Fp8KernelMatchesReference) {
  std::mt19937 rng(testing::fresh_seed());
  for (int threads : {1, 2}) {
    const int saved = num_threads();
    set_num_threads(threads);
    for (int64_t in : {8, 29, 96, 264}) {
      for (int64_t n : {1, 3, 5, 17}) {
        auto q = quantize_fp8_channel(random_weight(43, in, rng));
        ASSERT_TRUE(q.ok());
        expect_kernel_matches_reference(*q, n, n != 3, rng);
        // A static activation scale: the activations rounded to e4m3 codes of it first (0.001
        // saturates the inputs past 0.448).
        for (float input_scale : {0.01f, 0.001f}) {
          q->input_scale = input_scale;
          expect_kernel_matches_reference(*q, n, n != 3, rng);
        }
      }
    }
    set_num_threads(saved);
  }
}

TEST(QuantLinear, TernaryKernelMatchesReference) {
  std::mt19937 rng(testing::fresh_seed());
  for (int threads : {1, 2}) {
    const int saved = num_threads();
    set_num_threads(threads);
    for (int group : {32, 128, 256}) {
      for (int64_t n : {1, 3, 17}) {
        auto q = quantize_ternary(random_weight(53, 512, rng), group);
        ASSERT_TRUE(q.ok()) << q.status().to_string();
        expect_kernel_matches_reference(*q, n, n != 1, rng);
      }
    }
    set_num_threads(saved);
  }
}

TEST(QuantizeW8A8, ActivationRowsAsDefined) {
  const float x[5] = {1.0f, -2.0f, 0.5f, 4.0f, -0.015748031f};
  int8_t codes[5];
  const float sx = quantize_activation_row(x, 5, codes);
  EXPECT_EQ(sx, 4.0f / 127.0f);
  // x * 127 / 4: 31.75, -63.5 (ties to even), 15.875, 127, -0.5 (ties to even: 0).
  const int8_t want[5] = {32, -64, 16, 127, 0};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(codes[i], want[i]) << i;
  const float zeros[3] = {0.0f, -0.0f, 0.0f};
  EXPECT_EQ(quantize_activation_row(zeros, 3, codes), 0.0f);
  const float inf[3] = {1.0f, INFINITY, 2.0f};
  EXPECT_TRUE(std::isnan(quantize_activation_row(inf, 3, codes)));
  EXPECT_EQ(codes[0], 0);
}

// A static scale s: codes rint(x / s) clamped to +-127, s returned; a non-finite row gives NaN and
// zero codes.
TEST(QuantizeW8A8, StaticActivationRowsAsDefined) {
  const float x[6] = {1.0f, -2.0f, 0.5f, 4.0f, -300.0f, 0.025f};
  int8_t codes[6];
  EXPECT_EQ(quantize_activation_row_static(x, 6, 0.05f, codes), 0.05f);
  // x * 20: 20, -40, 10, 80, -6000 (clamped), 0.5 (ties to even: 0).
  const int8_t want[6] = {20, -40, 10, 80, -127, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(codes[i], want[i]) << i;
  const float nan_row[3] = {1.0f, std::nanf(""), 2.0f};
  EXPECT_TRUE(std::isnan(quantize_activation_row_static(nan_row, 3, 0.05f, codes)));
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[2], 0);
}

// An fp8 weight's static activation scale s: x / s rounded to the nearest e4m3 value (saturating
// at 448), times s; NaN stays NaN.
TEST(QuantizeFp8, StaticActivationRoundingAsDefined) {
  const float x[6] = {1.0f, 0.3f, 1000.0f, -INFINITY, 0.0f, std::nanf("")};
  float y[6];
  round_activation_row_fp8(x, 6, 0.5f, y);
  EXPECT_EQ(y[0], 1.0f);     // 2 is an e4m3 value
  EXPECT_EQ(y[1], 0.3125f);  // 0.6 -> 0.625 (steps of 1/16 in [0.5, 1))
  EXPECT_EQ(y[2], 224.0f);   // 2000 saturates to 448
  EXPECT_EQ(y[3], -224.0f);
  EXPECT_EQ(y[4], 0.0f);
  EXPECT_TRUE(std::isnan(y[5]));
}

// y = f32(sum qx * qw) * (sx * sw) + bias, on a hand-made weight.
TEST(QuantizeW8A8, LinearAsDefined) {
  QuantWeight q;
  q.format = QuantFormat::kW8A8;
  q.out_features = 2;
  q.in_features = 3;
  q.packed = Tensor::empty({2, 3}, DType::kI8);
  const int8_t w[6] = {127, -1, 0, 5, 5, -127};
  std::memcpy(q.packed.raw_data(), w, 6);
  q.scales = Tensor::empty({2}, DType::kF32);
  q.scales.data<float>()[0] = 0.5f;
  q.scales.data<float>()[1] = 0.25f;
  Tensor x = Tensor::empty({1, 3}, DType::kF32);
  const float xv[3] = {127.0f, -63.5f, 1.0f};  // sx = 1, codes 127, -64 (ties to even), 1
  std::memcpy(x.raw_data(), xv, sizeof(xv));
  Tensor y = Tensor::empty({1, 2}, DType::kF32);
  Weight packed;
  packed.quant = std::make_shared<QuantWeight>(q);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!ops::cpu::isa_supported(isa)) continue;
    ops::cpu::set_isa(isa);
    ops::linear(x, packed, nullptr, y);
    ops::cpu::clear_isa_override();
    EXPECT_EQ(y.data<float>()[0], (127.0f * 127 + 64) * 0.5f) << ops::cpu::isa_name(isa);
    EXPECT_EQ(y.data<float>()[1], (127.0f * 5 - 64 * 5 - 127) * 0.25f) << ops::cpu::isa_name(isa);
  }
}

// The AVX2 and AVX-512 VNNI kernels equal the definition bit for bit (the sums are exact), on odd
// widths (row tails), token counts around the tiles, strided views, a NaN row, both thread counts,
// with per-token scales and with a static one that clips the inputs past 127 * 0.02 = 2.54.
TEST(QuantizeW8A8, KernelsEqualTheReferenceBitForBit) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  const auto check = [&](const Weight& w, int64_t n) {
    const int64_t in = w.in_features();
    const Tensor x_storage = testing::random_tensor({n, in + 3}, rng, -4.0f, 4.0f);
    const Tensor x = x_storage.slice(1, 1, 1 + in);
    if (n == 5) x.data<float>()[2 * x.stride(0) + in / 2] = std::nanf("");
    const Tensor bias = testing::random_tensor({37}, rng);
    const bool with_bias = n % 2 == 1;
    Tensor expected = Tensor::empty({n, 37}, DType::kF32);
    ops::cpu::quant_linear_reference(x, *w.quant, with_bias ? &bias : nullptr, expected);
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!ops::cpu::isa_supported(isa)) continue;
      ops::cpu::set_isa(isa);
      Tensor y = Tensor::empty({n, 37}, DType::kF32);
      for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = -12345.0f;
      ops::linear(x, w, with_bias ? &bias : nullptr, y);
      ops::cpu::clear_isa_override();
      for (int64_t i = 0; i < n * 37; ++i) {
        const float got = y.data<float>()[i], want = expected.data<float>()[i];
        ASSERT_TRUE(f32_bits(got) == f32_bits(want) || (std::isnan(got) && std::isnan(want)))
            << ops::cpu::isa_name(isa) << (ops::cpu::cpu_has_avx512_vnni() ? " (vnni)" : "") << " in=" << in
            << " n=" << n << " input scale " << w.quant->input_scale << " element " << i << ": " << got << " vs "
            << want;
      }
    }
  };
  for (int threads : {1, 2}) {
    const int saved = num_threads();
    set_num_threads(threads);
    for (int64_t in : {29, 64, 96, 264, 1000}) {
      for (int64_t n : {1, 2, 3, 4, 5, 9, 17}) {
        Weight dense;
        dense.dense = random_weight(37, in, rng);
        auto w = quantize_weight(dense, QuantSpec{QuantFormat::kW8A8, 0});
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        ASSERT_EQ(w->quant->format, QuantFormat::kW8A8);
        check(*w, n);
        auto scaled = std::make_shared<QuantWeight>(*w->quant);
        scaled->input_scale = 0.02f;
        Weight with_scale;
        with_scale.quant = scaled;
        check(with_scale, n);
      }
    }
    set_num_threads(saved);
  }
}

// TACHYON_ISA=scalar (here: the scalar override) runs the reference, bit for bit.
TEST(QuantLinear, ScalarIsaRunsTheReference) {
  std::mt19937 rng(testing::fresh_seed());
  auto q = quantize_int4_group(random_weight(9, 64, rng), 32);
  ASSERT_TRUE(q.ok());
  const Tensor x = testing::random_tensor({2, 64}, rng);
  Tensor expected = Tensor::empty({2, 9}, DType::kF32), y = Tensor::empty({2, 9}, DType::kF32);
  ops::cpu::quant_linear_reference(x, *q, nullptr, expected);
  Weight w;
  w.quant = std::make_shared<const QuantWeight>(*q);
  ops::cpu::set_isa(Isa::kScalar);
  ops::linear(x, w, nullptr, y);
  ops::cpu::clear_isa_override();
  for (int i = 0; i < 18; ++i) EXPECT_EQ(y.data<float>()[i], expected.data<float>()[i]);
}

}  // namespace
}  // namespace tachyon
