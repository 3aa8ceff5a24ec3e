// linear() on the GPU with W8A8, per-channel fp8 and ternary weights (quant/quantize.h's layouts)
// against the CPU:
// - W8A8: the activation codes are quantize_activation_row's and the sums exact integers, so the
//   GEMV (1..8 tokens) and cuBLASLt's int8 GEMM (beyond) give quant_linear_reference's bits.
// - fp8: the GEMV computes in f32 on the exact weights (held to the double reference on the
//   dequantized weight); cuBLASLt's fp8 GEMM (9 and more tokens) runs on activations quantized per
//   token to e4m3, held tightly to the reference on those quantized activations and loosely to
//   the exact one. The e4m3 activation codes themselves equal the host's f32_to_f8e4m3.
// - ternary: the GEMV against the double reference; beyond 8 tokens the weight expanded to bf16
//   (its scales rounded) for cuBLASLt.
// Fresh random inputs, odd row counts, K split over the grid with ragged slices, strided
// activations and outputs whose padding must stay NaN; the backend path (weights moved by
// copy_weights_to, batch invariance) and what linear() refuses. Skips without a device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/device_memory.h"
#include "gpu_test_util.h"
#include "linear_reference.h"
#include "model/weights.h"
#include "ops/cpu/quant_linear.h"
#include "ops/cuda/launch.h"
#include "ops/ops.h"
#include "quant/quantize.h"

namespace tachyon {
namespace {

using testing::Mirror;
using testing::Reference;
using testing::reference;
using testing::within;
using testing::LinearRun;
using testing::RunOptions;
using testing::run_linear;
namespace cu = ::tachyon::ops::cuda;

// (in, out): a short odd matrix, unaligned-width inputs (in % 16 != 0 for W8A8), a wide odd
// matrix, and 4096 + 512 inputs (split K, a ragged last slice) on few and many rows.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{256, 37}, {1024, 4099}, {4608, 37}, {4608, 515}};

constexpr double kGemvTolerance = 5e-6;
// cuBLASLt on e4m3 activations: against the reference on the same quantized activations (Hopper's
// fp8 tensor cores accumulate in less than f32 between cuBLASLt's promotions: 2.3e-5 seen at
// K = 768..1024), and against the exact activations (each rounded by at most 2^-4 of itself).
constexpr double kFp8QuantizedTolerance = 1e-4;
constexpr double kFp8ExactTolerance = 6.25e-2;
// A weight expanded to bf16 for cuBLASLt with bf16 activations: against the reference on the
// rounded operands (f32 accumulation), and against the exact one (a ternary weight's scale and
// the activations rounded, 2^-8 each).
constexpr double kExpandedRoundedTolerance = 1e-3;
constexpr double kExpandedTolerance = 1e-2;

Tensor rounded_to_bf16(const Tensor& t) { return testing::convert(t, DType::kBF16).to_f32(); }

struct PackedWeight {
  QuantWeight q;
  Tensor dense;  // dequantize(q): [out, in] f32
  Mirror packed, scales;

  cu::LinearArgs args() const {
    cu::LinearArgs a;
    a.w = packed.ptr<void>();
    a.w_dtype = q.packed.dtype();
    a.w_stride = q.packed.stride(0);
    a.w_scales = scales.ptr<float>();
    if (q.format == QuantFormat::kW8A8 || q.format == QuantFormat::kFp8Channel) a.x_scale = q.input_scale;
    if (q.format == QuantFormat::kW8A8) a.scheme = cu::QuantScheme::kW8A8;
    if (q.format == QuantFormat::kTernary) {
      a.scheme = cu::QuantScheme::kTernary;
      a.w_group = q.group_size;
    }
    a.in = q.in_features;
    a.out = q.out_features;
    return a;
  }
};

std::unique_ptr<PackedWeight> make_weight(QuantFormat format, int64_t in, int64_t out, std::mt19937& rng,
                                          int group = 128) {
  QuantSpec spec;
  spec.format = format;
  spec.group_size = group;
  Weight dense;
  dense.dense = testing::random_tensor({out, in}, rng, -0.5f, 0.5f);
  auto w = quantize_weight(dense, spec);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  if (!w.ok()) return nullptr;
  auto p = std::make_unique<PackedWeight>();
  p->q = *w->quant;
  p->dense = dequantize(p->q);
  p->packed = Mirror(p->q.packed);
  p->scales = Mirror(p->q.scales);
  return p;
}

std::string describe(const PackedWeight& w, const RunOptions& o) {
  return fmt::format("{} [{}, {}] n={} bias={} ({}) x_pad={} y_pad={} algo={}", quant_format_name(w.q.format),
                     w.q.out_features, w.q.in_features, o.n, o.bias, dtype_name(o.bias_dtype), o.x_pad, o.y_pad,
                     static_cast<int>(o.algo));
}

// The CPU's W8A8 result (quant_linear_reference; its bias f32).
Tensor cpu_w8a8(const PackedWeight& w, const LinearRun& r) {
  Tensor y = Tensor::empty({r.x.size(0), w.q.out_features}, DType::kF32);
  const Tensor x = r.x.contiguous();
  const Tensor bias = r.bias.defined() ? r.bias.to_f32() : Tensor();
  ops::cpu::quant_linear_reference(x, w.q, bias.defined() ? &bias : nullptr, y);
  return y;
}

// x rows quantized to e4m3 per token as the device does it, back in f32 (codes times sx).
Tensor e4m3_rows(const Tensor& x) {
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(xc.shape(), DType::kF32);
  for (int64_t t = 0; t < xc.size(0); ++t) {
    const float* xr = xc.data<float>() + t * xc.size(1);
    float amax = 0.0f;
    for (int64_t i = 0; i < xc.size(1); ++i) amax = std::max(amax, std::fabs(xr[i]));
    const float inv = amax > 0.0f ? kF8E4M3Max / amax : 0.0f, sx = amax > 0.0f ? amax / kF8E4M3Max : 0.0f;
    for (int64_t i = 0; i < xc.size(1); ++i) {
      out.data<float>()[t * xc.size(1) + i] = f8e4m3_to_f32(f32_to_f8e4m3(xr[i] * inv)) * sx;
    }
  }
  return out;
}

#define SEEDED_RNG(rng)                                                                 \
  const uint32_t seed_ = testing::fresh_seed();                                         \
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed_, seed_)); \
  std::mt19937 rng(seed_)

// The device's activation quantizer (static_scale 0: per token) on x [n, in] into codes rows ld
// apart against `host(dtype, row, in, codes)`, which fills one row's expected codes (zero beyond
// in, as they start) and returns its sx: every byte and every sx equal.
using HostCodes = std::function<float(DType, const float*, int64_t, uint8_t*)>;
void expect_codes_match_the_host(const Tensor& x, int64_t ld, float static_scale, const HostCodes& host) {
  const int64_t n = x.size(0), in = x.size(1);
  Mirror dx(x);
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    Mirror codes(testing::nan_tensor({n, ld / 4}));  // poisoned bytes
    Mirror sx(testing::nan_tensor({n}));
    ASSERT_EQ(cu::detail::launch_quantize_activations(dx.ptr<float>(), in, n, in, dtype, codes.ptr<void>(), ld,
                                                      sx.ptr<float>(), static_scale, nullptr),
              cudaSuccess);
    ASSERT_OK(cu::synchronize(nullptr));
    ASSERT_OK(codes.download());
    ASSERT_OK(sx.download());
    const uint8_t* got = static_cast<const uint8_t*>(codes.host().raw_data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = x.data<float>() + t * in;
      std::vector<uint8_t> want(static_cast<size_t>(ld), 0);
      const float want_sx = host(dtype, xr, in, want.data());
      const float got_sx = sx.host().data<float>()[t];
      EXPECT_TRUE((std::isnan(want_sx) && std::isnan(got_sx)) || got_sx == want_sx)
          << dtype_name(dtype) << " row " << t << ": sx " << got_sx << " vs " << want_sx;
      for (int64_t i = 0; i < ld; ++i) {
        ASSERT_EQ(got[t * ld + i], want[static_cast<size_t>(i)])
            << dtype_name(dtype) << " row " << t << " column " << i << " (x " << (i < in ? xr[i] : 0.0f) << ")";
      }
    }
  }
}

// Per-token quantization of activations: int8 codes and scales are quantize_activation_row's bit
// for bit, e4m3 codes are f32_to_f8e4m3's; zero rows, rows with a NaN, tiny values (e4m3
// subnormals) and the zero padding up to the codes' row stride.
TEST(CudaLinearQuant, ActivationCodesMatchTheHost) {
  TACHYON_SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  const int64_t n = 6, in = 1000, ld = 1008;
  Tensor x = testing::random_tensor({n, in}, rng, -3.0f, 3.0f);
  for (int64_t i = 0; i < in; ++i) x.data<float>()[1 * in + i] = 0.0f;
  x.data<float>()[2 * in + 17] = NAN;
  for (int64_t i = 0; i < in; ++i) x.data<float>()[3 * in + i] *= (i % 7 == 0 ? 1.0f : 1e-5f);  // e4m3 subnormal codes
  x.data<float>()[4 * in + 999] = 250.0f;  // one outlier
  expect_codes_match_the_host(x, ld, 0.0f, [](DType dtype, const float* xr, int64_t len, uint8_t* want) {
    if (dtype == DType::kI8) return quantize_activation_row(xr, len, reinterpret_cast<int8_t*>(want));
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < len; ++i) {
      finite = finite && std::isfinite(xr[i]);
      amax = std::max(amax, std::fabs(xr[i]));
    }
    if (finite && amax > 0.0f) {
      const float inv = kF8E4M3Max / amax;
      for (int64_t i = 0; i < len; ++i) want[i] = f32_to_f8e4m3(xr[i] * inv);
    }
    return !finite ? NAN : amax / kF8E4M3Max;
  });
}

// A static scale s (QuantWeight::input_scale): int8 codes and sx are
// quantize_activation_row_static's bit for bit (clipped past 127 s, NaN rows NaN), e4m3 codes
// f32_to_f8e4m3(x / s) with sx = s (NaN for the NaN row, its codes zero).
TEST(CudaLinearQuant, StaticActivationCodesMatchTheHost) {
  TACHYON_SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  const int64_t n = 4, in = 1000, ld = 1008;
  const float scale = 0.01f;  // int8 clips past 1.27, e4m3 past 4.48
  Tensor x = testing::random_tensor({n, in}, rng, -6.0f, 6.0f);
  x.data<float>()[2 * in + 17] = NAN;
  for (int64_t i = 0; i < in; ++i) x.data<float>()[3 * in + i] *= 1e-3f;  // e4m3 subnormal codes
  expect_codes_match_the_host(x, ld, scale, [scale](DType dtype, const float* xr, int64_t len, uint8_t* want) {
    if (dtype == DType::kI8) return quantize_activation_row_static(xr, len, scale, reinterpret_cast<int8_t*>(want));
    for (int64_t i = 0; i < len; ++i) {
      if (!std::isfinite(xr[i])) {
        std::fill(want, want + len, uint8_t{0});
        return NAN;
      }
    }
    for (int64_t i = 0; i < len; ++i) want[i] = f32_to_f8e4m3(xr[i] * (1.0f / scale));
    return scale;
  });
}

// The rounding of activations to an fp8 weight's static scale: round_activation_row_fp8's bits
// (saturation, subnormals, NaN kept), rows read x_stride apart.
TEST(CudaLinearQuant, Fp8StaticRoundingMatchesTheHost) {
  TACHYON_SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  const int64_t n = 3, in = 777, stride = 800;
  const float scale = 0.003f;
  Tensor x = testing::random_tensor({n, stride}, rng, -2.0f, 2.0f);
  x.data<float>()[5] = NAN;
  x.data<float>()[stride + 6] = -INFINITY;
  for (int64_t i = 0; i < in; ++i) x.data<float>()[2 * stride + i] *= 1e-3f;
  Mirror dx(x);
  Mirror dy(testing::nan_tensor({n, in}));
  ASSERT_EQ(cu::detail::launch_round_activations_fp8(dx.ptr<float>(), stride, n, in, scale, dy.ptr<float>(), nullptr),
            cudaSuccess);
  ASSERT_OK(cu::synchronize(nullptr));
  ASSERT_OK(dy.download());
  std::vector<float> want(static_cast<size_t>(in));
  for (int64_t t = 0; t < n; ++t) {
    round_activation_row_fp8(x.data<float>() + t * stride, in, scale, want.data());
    for (int64_t i = 0; i < in; ++i) {
      const float got = dy.host().data<float>()[t * in + i], w = want[static_cast<size_t>(i)];
      ASSERT_TRUE(f32_bits(got) == f32_bits(w) || (std::isnan(got) && std::isnan(w)))
          << "row " << t << " column " << i << ": " << got << " vs " << w;
    }
  }
}

// W8A8 with a static activation scale through the GEMV and cuBLASLt's int8 GEMM: the CPU's bits
// (activations in [-1, 1] clipped past 127 * 0.005 = 0.635).
TEST(CudaLinearQuant, W8A8WithAStaticScaleEqualsTheCpuBitForBit) {
  TACHYON_SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{1024, 4099}, {4608, 515}, {1000, 77}}) {
    auto w = make_weight(QuantFormat::kW8A8, in, out, rng);
    ASSERT_TRUE(w != nullptr);
    w->q.input_scale = 0.005f;
    for (int64_t n : {1, 3, 8, 9, 33}) {
      for (cu::LinearAlgo algo : {cu::LinearAlgo::kAuto, cu::LinearAlgo::kGemv, cu::LinearAlgo::kCublasLt}) {
        if (algo == cu::LinearAlgo::kGemv && n > cu::detail::kGemvW8A8MaxTokens) continue;
        RunOptions o;
        o.n = n;
        o.algo = algo;
        o.bias = n % 2 == 1;
        o.x_pad = n == 3 ? 4 : 0;
        LinearRun r;
        ASSERT_TRUE(run_linear(**ctx, *w, o, rng, &r)) << describe(*w, o);
        ASSERT_TRUE(testing::bitwise_equal(r.y, cpu_w8a8(*w, r), describe(*w, o) + " static"));
      }
    }
  }
}

// fp8 with a static activation scale: every path computes on the activations rounded to it (the
// GEMV on round_activation_row_fp8's values in f32; cuBLASLt's fp8 GEMM on their codes; the bf16
// expansion on them rounded to bf16), held as the per-token paths are to their references.
TEST(CudaLinearQuant, Fp8WithAStaticScaleMatchesTheCpu) {
  TACHYON_SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{1024, 512}, {4608, 515}, {256, 37}}) {
    auto w = make_weight(QuantFormat::kFp8Channel, in, out, rng);
    ASSERT_TRUE(w != nullptr);
    w->q.input_scale = 0.0015f;  // activations in [-1, 1] saturate past 0.672
    for (int64_t n : {1, 3, 5, 9, 33, 130}) {
      RunOptions o;
      o.n = n;
      o.bias = n % 2 == 1;
      o.x_pad = n == 5 ? 1 : 0;
      if (n == 3 || n == 5) o.algo = cu::LinearAlgo::kCublasLt;  // a prefill of a few tokens
      LinearRun r;
      ASSERT_TRUE(run_linear(**ctx, *w, o, rng, &r)) << describe(*w, o);
      const Tensor xc = r.x.contiguous();
      Tensor rounded = Tensor::empty(xc.shape(), DType::kF32);
      for (int64_t t = 0; t < n; ++t) {
        round_activation_row_fp8(xc.data<float>() + t * in, in, w->q.input_scale, rounded.data<float>() + t * in);
      }
      if (n <= cu::kLinearAutoGemvMaxTokensFp8 && o.algo != cu::LinearAlgo::kCublasLt) {
        ASSERT_TRUE(within(r.y, reference(w->dense, rounded, r.bias), kGemvTolerance, describe(*w, o) + " static"));
        continue;
      }
      auto fp8 = within(r.y, reference(w->dense, rounded, r.bias), kFp8QuantizedTolerance,
                        describe(*w, o) + " static, fp8 GEMM");
      if (out % 16 == 0 || fp8) {
        ASSERT_TRUE(fp8);
      } else {
        ASSERT_TRUE(within(r.y, reference(rounded_to_bf16(w->dense), rounded_to_bf16(rounded), r.bias),
                           kExpandedRoundedTolerance, describe(*w, o) + " static (no fp8 GEMM: expanded to bf16)"));
      }
    }
  }
}

// W8A8 through the GEMV (every token bucket, forced and kAuto) and cuBLASLt's int8 GEMM (kAuto
// beyond 8 tokens, and forced at one): the CPU's bits.
TEST(CudaLinearQuant, W8A8EqualsTheCpuBitForBit) {
  TACHYON_SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  std::vector<std::pair<int64_t, int64_t>> shapes = kShapes;
  shapes.push_back({1000, 77});  // in % 16 != 0: the scalar tail, and cuBLASLt's alignment
  for (auto [in, out] : shapes) {
    auto w = make_weight(QuantFormat::kW8A8, in, out, rng);
    ASSERT_TRUE(w != nullptr);
    for (int64_t n : {1, 2, 3, 5, 8, 9, 33, 130}) {
      for (cu::LinearAlgo algo : {cu::LinearAlgo::kAuto, cu::LinearAlgo::kGemv, cu::LinearAlgo::kCublasLt}) {
        if (algo == cu::LinearAlgo::kGemv && n > cu::detail::kGemvW8A8MaxTokens) continue;
        if (algo == cu::LinearAlgo::kCublasLt && n != 1 && n != 33) continue;
        RunOptions o;
        o.n = n;
        o.algo = algo;
        o.bias = (n + in / 256) % 2 == 1;
        o.bias_dtype = n == 3 ? DType::kBF16 : DType::kF32;
        o.x_pad = n == 5 ? 1 : (n == 2 ? 4 : 0);
        o.y_pad = n % 2 == 0 ? 3 : 0;
        LinearRun r;
        ASSERT_TRUE(run_linear(**ctx, *w, o, rng, &r)) << describe(*w, o);
        ASSERT_TRUE(testing::bitwise_equal(r.y, cpu_w8a8(*w, r), describe(*w, o)));
      }
    }
  }
}

// fp8: the GEMV (forced up to 16 tokens, and kAuto where it picks it) on the exact weight;
// cuBLASLt's fp8 GEMM beyond on e4m3 activations. Where cuBLASLt has no fp8 algorithm (odd row
// counts, unaligned outputs) the weight is expanded to bf16 instead; an aligned shape must take
// the fp8 GEMM.
TEST(CudaLinearQuant, Fp8MatchesTheDequantizedWeight) {
  TACHYON_SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  std::vector<std::pair<int64_t, int64_t>> shapes = kShapes;
  shapes.push_back({1024, 512});
  for (auto [in, out] : shapes) {
    auto w = make_weight(QuantFormat::kFp8Channel, in, out, rng);
    ASSERT_TRUE(w != nullptr);
    for (int64_t n : {1, 2, 3, 5, 8, 16}) {
      RunOptions o;
      o.n = n;
      o.algo = n > cu::kLinearAutoGemvMaxTokensFp8 ? cu::LinearAlgo::kGemv : cu::LinearAlgo::kAuto;
      o.bias = n % 2 == 1;
      o.bias_dtype = n == 3 ? DType::kF16 : DType::kF32;
      o.x_pad = n == 5 ? 1 : 0;
      o.y_pad = n == 2 ? 3 : 0;
      LinearRun r;
      ASSERT_TRUE(run_linear(**ctx, *w, o, rng, &r)) << describe(*w, o);
      ASSERT_TRUE(within(r.y, reference(w->dense, r.x, r.bias), kGemvTolerance, describe(*w, o)));
    }
    for (int64_t n : {9, 33, 130}) {
      RunOptions o;
      o.n = n;
      o.bias = n != 9;
      o.bias_dtype = n == 33 ? DType::kBF16 : DType::kF32;
      o.x_pad = n == 9 ? 16 : 0;
      o.y_pad = n == 33 ? 5 : 0;
      LinearRun r;
      ASSERT_TRUE(run_linear(**ctx, *w, o, rng, &r)) << describe(*w, o);
      const bool aligned = out % 16 == 0 && o.y_pad == 0;
      auto fp8 = within(r.y, reference(w->dense, e4m3_rows(r.x), r.bias), kFp8QuantizedTolerance,
                        describe(*w, o) + " vs e4m3 activations");
      if (aligned || fp8) {
        ASSERT_TRUE(fp8);
      } else {
        ASSERT_TRUE(within(r.y, reference(rounded_to_bf16(w->dense), rounded_to_bf16(r.x), r.bias),
                           kExpandedRoundedTolerance, describe(*w, o) + " (no fp8 GEMM: expanded to bf16)"));
      }
      ASSERT_TRUE(within(r.y, reference(w->dense, r.x, r.bias), kFp8ExactTolerance, describe(*w, o) + " vs exact"));
    }
  }
}

// The expansion of fp8 rows to bf16 (what runs before sm_89): bf16(e4m3(code) * scale) exactly.
TEST(CudaLinearQuant, Fp8ExpansionRoundsEachWeightOnce) {
  TACHYON_SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{4608, 37}, {100, 9}}) {  // vector and scalar paths
    auto w = make_weight(QuantFormat::kFp8Channel, in, out, rng);
    ASSERT_TRUE(w != nullptr);
    const int64_t ld = (in + 7) / 8 * 8;
    Mirror dst(testing::nan_tensor({out, ld}, DType::kBF16));
    ASSERT_EQ(cu::detail::launch_dequantize_rows(w->packed.ptr<void>(), DType::kF8E4M3, w->q.packed.stride(0),
                                                 w->scales.ptr<float>(), out, in, dst.ptr<uint16_t>(), ld, nullptr),
              cudaSuccess);
    ASSERT_OK(cu::synchronize(nullptr));
    ASSERT_OK(dst.download());
    const uint8_t* codes = static_cast<const uint8_t*>(w->q.packed.raw_data());
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        const uint16_t want = f32_to_bf16(f8e4m3_to_f32(codes[o * in + i]) * w->q.scales.data<float>()[o]);
        ASSERT_EQ(dst.host().data<uint16_t>()[o * ld + i], want) << "row " << o << " column " << i;
      }
    }
  }
}

// Ternary: the GEMV at every token bucket and group size (forced, and through kAuto up to its
// limit), and the bf16 expansion kAuto picks beyond.
TEST(CudaLinearQuant, TernaryMatchesTheDequantizedWeight) {
  TACHYON_SKIP_WITHOUT_GPU();
  SEEDED_RNG(rng);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  for (int group : {32, 64, 128, 256}) {
    for (auto [in, out] : kShapes) {
      auto w = make_weight(QuantFormat::kTernary, in, out, rng, group);
      ASSERT_TRUE(w != nullptr);
      for (int64_t n : {1, 2, 3, 5, 8}) {
        RunOptions o;
        o.n = n;
        o.algo = n <= cu::kLinearAutoGemvMaxTokensTernary && n % 2 == 1 ? cu::LinearAlgo::kAuto : cu::LinearAlgo::kGemv;
        o.bias = n % 2 == 1;
        o.bias_dtype = n == 3 ? DType::kBF16 : DType::kF32;
        o.x_pad = n == 5 ? 4 : 0;
        o.y_pad = n == 2 ? 3 : 0;
        LinearRun r;
        ASSERT_TRUE(run_linear(**ctx, *w, o, rng, &r)) << describe(*w, o) << " g" << group;
        ASSERT_TRUE(within(r.y, reference(w->dense, r.x, r.bias), kGemvTolerance,
                           describe(*w, o) + fmt::format(" g{}", group)));
      }
      if (group != 128) continue;
      for (int64_t n : {5, 9, 40}) {  // kAuto: the weight expanded
        RunOptions o;
        o.n = n;
        o.bias = n == 40;
        o.y_pad = 2;
        LinearRun r;
        ASSERT_TRUE(run_linear(**ctx, *w, o, rng, &r)) << describe(*w, o);
        ASSERT_TRUE(within(r.y, reference(w->dense, r.x, r.bias), kExpandedTolerance, describe(*w, o) + " expanded"));
      }
    }
  }
}

// The int4 decode GEMM (group 128, 1-2 tokens: the activations staged and rounded in the kernel,
// its first weights requested before or after pdl_wait()) on K slices of every length the planner
// might pick: one chunk to a whole row, a ragged last slice, row counts that leave warps and
// blocks idle, split K finished by the kernel itself (arrival counters, which it leaves zero) or
// by the reduction kernel. Against the reference on x rounded to bf16.
TEST(CudaLinearQuant, Int4DecodeGemmOnEverySlicing) {
  TACHYON_SKIP_WITHOUT_GPU();
  auto cc = cu::current_compute_capability();
  ASSERT_TRUE(cc.ok()) << cc.status().to_string();
  if (*cc < 80) GTEST_SKIP() << "the int4 tensor-core GEMM needs sm_80+";
  SEEDED_RNG(rng);
  for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{1536, 200}, {3072, 1031}}) {
    auto w = make_weight(QuantFormat::kInt4Group, in, out, rng, 128);
    ASSERT_TRUE(w != nullptr);
    const Mirror zeros(w->q.zeros);
    for (int64_t n = 1; n <= cu::detail::kGemmMmaInt4StageMaxTokens; ++n) {
      Mirror dx(testing::random_tensor({n, in + 8}, rng));  // rows 16-byte aligned
      const Tensor x = dx.host().slice(1, 0, in);
      const Tensor bias = testing::random_tensor({out}, rng);
      const Mirror db(bias);
      const Reference ref = reference(w->dense, rounded_to_bf16(x), n == 1 ? bias : Tensor());
      for (int64_t want : {1, 2, 3, 5, 12}) {
        cu::detail::GemvShape shape;
        shape.vector_loads = true;
        shape.rows_per_warp = 16;
        shape.step = 128;
        shape.chunk = (in / 128 + want - 1) / want * 128;
        shape.splits = static_cast<int>((in + shape.chunk - 1) / shape.chunk);
        for (bool kernel_finishes : {true, false}) {
          if (shape.splits == 1 && !kernel_finishes) continue;
          const bool constant = want % 2 == 1;  // the first loads before pdl_wait() (LinearArgs::w_constant)
          const std::string what = fmt::format("int4 g128 [{}, {}] n={} chunk={} splits={} {}{}", out, in, n, shape.chunk,
                                               shape.splits, kernel_finishes ? "counters" : "reduction kernel",
                                               constant ? ", constant weight" : "");
          cu::LinearArgs a = w->args();
          a.w_constant = constant;
          a.w_zeros = zeros.ptr<float>();
          a.w_group = 128;
          a.x = dx.ptr<float>(x);
          a.x_stride = x.stride(0);
          a.bias = n == 1 ? db.ptr<void>() : nullptr;
          a.n = n;
          ASSERT_TRUE(cu::detail::gemm_mma_int4_supported(a, a.x_stride)) << what;
          ASSERT_TRUE(cu::detail::gemm_mma_int4_stages_x(a, shape)) << what;
          Mirror dy(testing::nan_tensor({n, out}));
          Mirror partial(testing::nan_tensor({shape.splits, n, out}));
          Mirror counters(Tensor::zeros({cu::detail::gemm_mma_int4_row_blocks(a)}, DType::kI32));
          a.y = dy.ptr<float>();
          a.y_stride = out;
          ASSERT_EQ(cu::detail::launch_gemm_mma_int4(a, nullptr, 0, shape, partial.ptr<float>(),
                                                     kernel_finishes ? counters.ptr<unsigned>() : nullptr, nullptr),
                    cudaSuccess)
              << what;
          ASSERT_TRUE(cu::synchronize(nullptr).ok()) << what;
          ASSERT_TRUE(dy.download().ok() && counters.download().ok()) << what;
          ASSERT_TRUE(within(dy.host(), ref, 2e-5, what));
          for (int64_t b = 0; b < counters.host().numel(); ++b) {
            ASSERT_EQ(counters.host().data<int32_t>()[b], 0) << what << ": block column " << b << "'s counter";
          }
        }
      }
    }
  }
}

// The streamed int4 GEMM (sm_90) against the reference on the bf16-rounded activations: shapes
// with a partial row tile and a half stage at the end of K, one and two tokens, its own plan and
// hand-made ones (K split 1-4 ways, as few as one block so that every item of the grid passes
// through one ring of stages), constant weights or not. y's row padding must stay NaN and the
// split-K counters zero; through linear() too.
TEST(CudaLinearQuant, Int4StreamedGemmOnEveryPlan) {
  TACHYON_SKIP_WITHOUT_GPU();
  auto cc = cu::current_compute_capability();
  ASSERT_TRUE(cc.ok()) << cc.status().to_string();
  if (*cc / 10 != 9) GTEST_SKIP() << "the streamed int4 GEMM needs sm_90";
  auto sms = cu::current_sm_count();
  ASSERT_TRUE(sms.ok()) << sms.status().to_string();
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  SEEDED_RNG(rng);
  for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{512, 7}, {1536, 200}, {3584, 1031}, {4096, 48}}) {
    auto w = make_weight(QuantFormat::kInt4Group, in, out, rng, 128);
    ASSERT_TRUE(w != nullptr);
    const Mirror zeros(w->q.zeros);
    const int64_t tiles = (out + 15) / 16, stages = (in + 1023) / 1024;
    for (int64_t n = 1; n <= cu::detail::kGemmInt4StreamMaxTokens; ++n) {
      Mirror dx(testing::random_tensor({n, in + 4}, rng));  // rows 16-byte aligned, strided
      const Tensor x = dx.host().slice(1, 0, in);
      const Tensor bias = testing::random_tensor({out}, rng);
      const Mirror db(bias);
      const bool with_bias = n == 1;
      const Reference ref = reference(w->dense, rounded_to_bf16(x), with_bias ? bias : Tensor());
      cu::LinearArgs a = w->args();
      a.w_zeros = zeros.ptr<float>();
      a.w_group = 128;
      a.x = dx.ptr<float>(x);
      a.x_stride = x.stride(0);
      a.bias = with_bias ? db.ptr<void>() : nullptr;
      a.n = n;
      a.y_stride = out + 3;
      ASSERT_TRUE(cu::detail::gemm_int4_stream_supported(a, *cc)) << in << " " << out;
      std::vector<cu::detail::Int4StreamPlan> plans = {cu::detail::plan_gemm_int4_stream(a, *sms)};
      for (int64_t want : {1, 2, 4}) {
        for (int64_t blocks : {int64_t{1}, int64_t{5}, int64_t{*sms}}) {
          cu::detail::Int4StreamPlan plan;
          plan.chunk = (stages + want - 1) / want * 1024;
          plan.splits = static_cast<int>((in + plan.chunk - 1) / plan.chunk);
          plan.items = tiles * plan.splits;
          plan.blocks = static_cast<int>(std::min(blocks, plan.items));
          plans.push_back(plan);
        }
      }
      for (size_t i = 0; i < plans.size(); ++i) {
        const cu::detail::Int4StreamPlan& plan = plans[i];
        const bool constant = i % 2 == 0;
        const std::string what = fmt::format("int4 g128 [{}, {}] n={} chunk={} splits={} blocks={}{}{}", out, in, n,
                                             plan.chunk, plan.splits, plan.blocks, i == 0 ? " (planned)" : "",
                                             constant ? ", constant weight" : "");
        a.w_constant = constant;
        Mirror dy(testing::nan_tensor({n, out + 3}));
        Mirror partial(testing::nan_tensor({plan.splits, n, out}));
        Mirror counters(Tensor::zeros({tiles}, DType::kI32));
        a.y = dy.ptr<float>();
        ASSERT_EQ(cu::detail::launch_gemm_int4_stream(a, plan, partial.ptr<float>(), counters.ptr<unsigned>(), nullptr),
                  cudaSuccess)
            << what;
        ASSERT_TRUE(cu::synchronize(nullptr).ok()) << what;
        ASSERT_TRUE(dy.download().ok() && counters.download().ok()) << what;
        ASSERT_TRUE(within(dy.host().slice(1, 0, out), ref, 2e-5, what));
        ASSERT_TRUE(testing::all_nan(dy.host().slice(1, out, out + 3), "y padding")) << what;
        for (int64_t b = 0; b < tiles; ++b) {
          ASSERT_EQ(counters.host().data<int32_t>()[b], 0) << what << ": tile " << b << "'s counter";
        }
      }
      // Through linear(): kStream with the context's partials and counters, and kAuto where it runs
      // the streamed GEMM (kInt4StreamByDefault, or TACHYON_INT4_STREAM=1; elsewhere kAuto's other
      // kernels have their own tests and tolerances).
      const char* env = std::getenv("TACHYON_INT4_STREAM");
      const bool auto_streams = env == nullptr || *env == '\0' ? cu::kInt4StreamByDefault : std::string_view(env) != "0";
      Mirror dy(testing::nan_tensor({n, out + 3}));
      a.y = dy.ptr<float>();
      for (cu::LinearAlgo algo : {cu::LinearAlgo::kStream, cu::LinearAlgo::kAuto}) {
        if (algo == cu::LinearAlgo::kAuto && !auto_streams) continue;
        ASSERT_TRUE(cu::linear(**ctx, a, nullptr, algo).ok());
        ASSERT_TRUE(cu::synchronize(nullptr).ok());
        ASSERT_TRUE(dy.download().ok());
        ASSERT_TRUE(within(dy.host().slice(1, 0, out), ref, 2e-5, fmt::format("linear() [{}, {}] n={}", out, in, n)));
      }
    }
  }
  // What it does not take: 3 tokens, in % 512 != 0, another group.
  auto w = make_weight(QuantFormat::kInt4Group, 640, 32, rng, 128);
  ASSERT_TRUE(w != nullptr);
  const Mirror zeros(w->q.zeros);
  Mirror dx(testing::random_tensor({3, 640}, rng));
  Mirror dy(testing::nan_tensor({3, 32}));
  cu::LinearArgs a = w->args();
  a.w_zeros = zeros.ptr<float>();
  a.w_group = 128;
  a.x = dx.ptr<float>();
  a.x_stride = 640;
  a.y = dy.ptr<float>();
  a.y_stride = 32;
  a.n = 3;
  EXPECT_FALSE(cu::detail::gemm_int4_stream_supported(a, *cc));
  EXPECT_FALSE(cu::linear(**ctx, a, nullptr, cu::LinearAlgo::kStream).ok());
  a.n = 1;
  EXPECT_FALSE(cu::detail::gemm_int4_stream_supported(a, *cc));  // 640 % 512 != 0
  EXPECT_TRUE(cu::linear(**ctx, a, nullptr, cu::LinearAlgo::kAuto).ok());  // the register-path GEMM instead
}

// The planner's K slices for the decode GEMM, on Llama shapes and odd ones: whole groups, every
// column covered, at most 32 splits, and always a slicing the staged kernel takes.
TEST(CudaLinearQuant, Int4DecodePlanFitsTheStagedKernel) {
  TACHYON_SKIP_WITHOUT_GPU();
  auto sms = cu::current_sm_count();
  ASSERT_TRUE(sms.ok()) << sms.status().to_string();
  for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{
           {4096, 4096}, {4096, 1024}, {4096, 6144}, {4096, 28672}, {14336, 4096}, {4096, 128256}, {128, 7}, {1536, 200}}) {
    for (int64_t n = 1; n <= cu::detail::kGemmMmaInt4StageMaxTokens; ++n) {
      Mirror dx(Tensor::zeros({n, in}, DType::kF32));
      cu::LinearArgs a;
      a.x = dx.ptr<float>();
      a.x_stride = in;
      a.w_dtype = DType::kU8;
      a.w_group = 128;
      a.n = n;
      a.in = in;
      a.out = out;
      const cu::detail::GemvShape shape = cu::detail::plan_gemm_mma_int4(a, *sms);
      const std::string what = fmt::format("[{}, {}] n={}: chunk {} splits {}", out, in, n, shape.chunk, shape.splits);
      EXPECT_EQ(shape.chunk % 128, 0) << what;
      EXPECT_GE(shape.chunk, 128) << what;
      EXPECT_EQ(shape.splits, (in + shape.chunk - 1) / shape.chunk) << what;
      EXPECT_LE(shape.splits, 32) << what;
      EXPECT_TRUE(cu::detail::gemm_mma_int4_stages_x(a, shape)) << what;
    }
  }
}

// What linear() refuses for these weights, with a Status rather than a launch.
TEST(CudaLinearQuant, RefusesWhatNoKernelTakes) {
  TACHYON_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  auto w8a8 = make_weight(QuantFormat::kW8A8, 512, 64, rng);
  auto fp8 = make_weight(QuantFormat::kFp8Channel, 512, 64, rng);
  auto ternary = make_weight(QuantFormat::kTernary, 512, 64, rng);
  ASSERT_TRUE(w8a8 != nullptr && fp8 != nullptr && ternary != nullptr);
  Mirror dx(testing::random_tensor({16, 513}, rng)), dy(testing::nan_tensor({16, 64}));
  const auto call = [&](cu::LinearArgs a, int64_t n, cu::LinearAlgo algo, int64_t x_offset = 0) {
    a.x = dx.ptr<float>() + x_offset;
    a.x_stride = 513;
    a.y = dy.ptr<float>();
    a.y_stride = 64;
    a.n = n;
    return cu::linear(**ctx, a, nullptr, algo);
  };
  ASSERT_OK(call(w8a8->args(), 8, cu::LinearAlgo::kGemv));
  EXPECT_FALSE(call(w8a8->args(), 9, cu::LinearAlgo::kGemv).ok());
  EXPECT_FALSE(call(w8a8->args(), 4, cu::LinearAlgo::kMma).ok());
  cu::LinearArgs no_scales = w8a8->args();
  no_scales.w_scales = nullptr;
  EXPECT_FALSE(call(no_scales, 1, cu::LinearAlgo::kAuto).ok());
  EXPECT_FALSE(call(fp8->args(), 4, cu::LinearAlgo::kMma).ok());
  cu::LinearArgs fp8_no_scales = fp8->args();
  fp8_no_scales.w_scales = nullptr;
  EXPECT_FALSE(call(fp8_no_scales, 1, cu::LinearAlgo::kAuto).ok());
  EXPECT_FALSE(call(ternary->args(), 4, cu::LinearAlgo::kMma).ok());
  EXPECT_FALSE(call(ternary->args(), 1, cu::LinearAlgo::kGemv, /*x_offset=*/1).ok()) << "unaligned activations";
  ASSERT_OK(call(ternary->args(), 1, cu::LinearAlgo::kAuto, /*x_offset=*/1));  // kAuto expands instead
  cu::LinearArgs odd_group = ternary->args();
  odd_group.w_group = 96;
  EXPECT_FALSE(call(odd_group, 1, cu::LinearAlgo::kAuto).ok());
  cu::LinearArgs misaligned = ternary->args();
  misaligned.w_stride += 8;
  EXPECT_FALSE(call(misaligned, 1, cu::LinearAlgo::kAuto).ok());
  ASSERT_OK(cu::synchronize(nullptr));
}

// The backend: weights moved by copy_weights_to keep their layout, ops::linear runs them at any
// token count (W8A8 with the CPU's bits), and LinearMode::kBatchInvariant gives a token the same
// bits alone and inside a batch.
TEST(CudaLinearQuant, BackendRunsWeightsMovedToTheDevice) {
  TACHYON_SKIP_WITHOUT_GPU();
  ASSERT_OK(cu::start_backend(0));
  const Device gpu = Device::cuda(0);
  SEEDED_RNG(rng);
  const int64_t in = 768, out = 304;  // rows cuBLASLt's fp8 GEMM takes
  constexpr QuantFormat kFormats[] = {QuantFormat::kW8A8, QuantFormat::kFp8Channel, QuantFormat::kTernary};
  ModelWeights host;
  host.layers.resize(1);
  Weight* slots[] = {&host.layers[0].q_proj, &host.layers[0].k_proj, &host.layers[0].v_proj};
  std::vector<std::unique_ptr<PackedWeight>> made;
  for (int i = 0; i < 3; ++i) {
    made.push_back(make_weight(kFormats[i], in, out, rng));
    ASSERT_TRUE(made.back() != nullptr);
    slots[i]->quant = std::make_shared<const QuantWeight>(made.back()->q);
  }
  auto moved = copy_weights_to(host, gpu);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  const Weight* device_weights[] = {&moved->layers[0].q_proj, &moved->layers[0].k_proj, &moved->layers[0].v_proj};
  const Tensor bias = testing::random_tensor({out}, rng);
  auto dbias = copy_to(bias, gpu);
  ASSERT_TRUE(dbias.ok());
  for (int i = 0; i < 3; ++i) {
    const QuantWeight& q = *device_weights[i]->quant;
    const std::string name = quant_format_name(q.format);
    ASSERT_EQ(q.format, kFormats[i]);
    EXPECT_TRUE(q.packed.device() == gpu && q.scales.device() == gpu) << name;
    for (int64_t n : {1, 4, 8, 11, 40}) {
      const std::string what = fmt::format("{} n={}", name, n);
      const Tensor x = testing::random_tensor({n, in}, rng);
      const bool with_bias = n % 2 == 0;
      auto dx = copy_to(x, gpu);
      auto dy = copy_to(testing::nan_tensor({n, out}), gpu);
      ASSERT_TRUE(dx.ok() && dy.ok());
      ops::linear(*dx, *device_weights[i], with_bias ? &*dbias : nullptr, *dy);
      auto y = copy_to(*dy, Device::cpu());
      ASSERT_TRUE(y.ok());
      const Reference ref = reference(made[i]->dense, x, with_bias ? bias : Tensor());
      LinearRun r{x, with_bias ? bias : Tensor(), Tensor()};
      if (q.format == QuantFormat::kW8A8) {
        ASSERT_TRUE(testing::bitwise_equal(*y, cpu_w8a8(*made[i], r), what));
      } else if (q.format == QuantFormat::kFp8Channel && n > cu::kLinearAutoGemvMaxTokensFp8) {
        ASSERT_TRUE(within(*y, reference(made[i]->dense, e4m3_rows(x), with_bias ? bias : Tensor()),
                           kFp8QuantizedTolerance, what));
      } else {
        ASSERT_TRUE(within(*y, ref, n <= cu::kLinearAutoGemvMaxTokensTernary ? kGemvTolerance : kExpandedTolerance,
                           what));
      }
      ops::linear(*dx, *device_weights[i], with_bias ? &*dbias : nullptr, *dy, ops::LinearMode::kBatchInvariant);
      auto yi = copy_to(*dy, Device::cpu());
      ASSERT_TRUE(yi.ok());
      if (q.format == QuantFormat::kW8A8) {
        ASSERT_TRUE(testing::bitwise_equal(*yi, cpu_w8a8(*made[i], r), what + " batch-invariant"));
      } else {
        ASSERT_TRUE(within(*yi, ref, kGemvTolerance, what + " batch-invariant"));
      }
      if (n > 1) {
        auto dx1 = copy_to(x.slice(0, n - 1, n).contiguous(), gpu);
        auto dy1 = copy_to(testing::nan_tensor({1, out}), gpu);
        ASSERT_TRUE(dx1.ok() && dy1.ok());
        ops::linear(*dx1, *device_weights[i], with_bias ? &*dbias : nullptr, *dy1, ops::LinearMode::kBatchInvariant);
        auto y1 = copy_to(*dy1, Device::cpu());
        ASSERT_TRUE(y1.ok());
        ASSERT_TRUE(testing::bitwise_equal(yi->slice(0, n - 1, n).contiguous(), *y1,
                                           what + ": the last row alone vs in the batch"));
      }
    }
  }
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
