// linear() on the GPU with GGUF block weights (Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K as
// quant/quantize.h lays them out) against the scalar reference: the weight dequantize() defines,
// multiplied in double precision.
// The GEMV (1..8 tokens, forced and as kAuto picks it) computes in f32 on the exact weights; the
// expansion to bf16 for cuBLASLt (9 and more tokens) rounds weights and activations, so it is held
// tightly to the reference on rounded operands and loosely to the exact one. Errors are measured
// against the size of the sum's terms (sum |w x| + |bias|). Fresh random inputs, odd row counts,
// K with split slices and ragged ends, rows of 32-weight blocks that start at every alignment
// their format allows (and weights that start at a later row, as fused projections' views do),
// strided activations (unaligned: scalar loads), outputs and their row padding poisoned with NaN;
// a token's GEMV result the same bits in every token bucket; the backend path (weights moved by
// copy_weights_to, batch invariance) and the arguments linear() refuses. Skips without a device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "gpu_test_util.h"
#include "linear_reference.h"
#include "model/weights.h"
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

constexpr QuantFormat kFormats[] = {QuantFormat::kGgufQ8_0, QuantFormat::kGgufQ4_1,  QuantFormat::kGgufQ5_0,
                                    QuantFormat::kGgufQ5_1, QuantFormat::kGgufIq4Nl, QuantFormat::kGgufQ4_K,
                                    QuantFormat::kGgufQ5_K, QuantFormat::kGgufQ6_K};

bool has_block_scales(QuantFormat f) { return f == QuantFormat::kGgufQ8_0 || f == QuantFormat::kGgufQ6_K; }

// (in, out): one block row, a wide odd matrix, and 4096 + 256 (split K with a ragged last slice)
// on few and on many rows; for the 32-weight blocks also 3 and 28 blocks a row (in = 96, 896: no
// whole warp step, and rows that start off a 16-byte boundary: Q4_1's 60 bytes, Q5_0's 66 and 616,
// Q5_1's 72, IQ4_NL's 54 and 504) and 4096 + 288 (split K whose last slice ends inside a step).
std::vector<std::pair<int64_t, int64_t>> shapes_for(QuantFormat f) {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{256, 37}, {512, 4099}, {4352, 37}, {4352, 515}};
  if (gguf_block_weights(f) == 32) {
    for (auto shape : {std::pair<int64_t, int64_t>{96, 37}, {96, 515}, {896, 37}, {896, 515}, {4384, 37}}) {
      shapes.push_back(shape);
    }
  }
  return shapes;
}

// The f32 GEMV against the double reference, per element, relative to sum |w x| + |bias|.
constexpr double kGemvTolerance = 5e-6;
// cuBLASLt on the bf16-expanded weight: against the reference on bf16-rounded weights and
// activations (cuBLASLt's f32 accumulation, and the odd weight whose f32 value sits on a bf16
// rounding boundary), and against the exact reference (the rounding of both operands, 2^-8 each).
constexpr double kExpandedRoundedTolerance = 1e-3;
constexpr double kExpandedTolerance = 1e-2;

cu::GgufFormat cuda_format(QuantFormat f) {
  switch (f) {
    case QuantFormat::kGgufQ8_0: return cu::GgufFormat::kQ8_0;
    case QuantFormat::kGgufQ4_1: return cu::GgufFormat::kQ4_1;
    case QuantFormat::kGgufQ5_0: return cu::GgufFormat::kQ5_0;
    case QuantFormat::kGgufQ5_1: return cu::GgufFormat::kQ5_1;
    case QuantFormat::kGgufIq4Nl: return cu::GgufFormat::kIq4Nl;
    case QuantFormat::kGgufQ4_K: return cu::GgufFormat::kQ4_K;
    case QuantFormat::kGgufQ5_K: return cu::GgufFormat::kQ5_K;
    case QuantFormat::kGgufQ6_K: return cu::GgufFormat::kQ6_K;
    default: ADD_FAILURE() << quant_format_name(f) << " is not a GGUF block format"; return cu::GgufFormat::kNone;
  }
}

// A GGUF weight made from random dense values, its dequantized values (the definition) and its
// tensors on the device.
struct GgufWeight {
  QuantWeight q;
  Tensor dense;  // dequantize(q): [out, in] f32
  Mirror packed, scales;

  cu::LinearArgs args() const {
    cu::LinearArgs a;
    a.w = packed.ptr<void>();
    a.w_dtype = q.packed.dtype();
    a.w_stride = q.packed.stride(0);
    a.gguf = cuda_format(q.format);
    if (q.scales.defined()) a.w_scales_f16 = scales.ptr<uint16_t>();
    a.in = q.in_features;
    a.out = q.out_features;
    return a;
  }
};

std::unique_ptr<GgufWeight> make_weight(QuantFormat format, int64_t in, int64_t out, std::mt19937& rng) {
  auto q = quantize_gguf_blocks(testing::random_tensor({out, in}, rng, -0.5f, 0.5f), format);
  EXPECT_TRUE(q.ok()) << q.status().to_string();
  if (!q.ok()) return nullptr;
  auto w = std::make_unique<GgufWeight>();
  w->q = std::move(q).value();
  w->dense = dequantize(w->q);
  w->packed = Mirror(w->q.packed);
  if (w->q.scales.defined()) w->scales = Mirror(w->q.scales);
  return w;
}

std::string describe(const GgufWeight& w, const RunOptions& o) {
  return fmt::format("{} [{}, {}] n={} bias={} ({}) x_pad={} y_pad={}", quant_format_name(w.q.format),
                     w.q.out_features, w.q.in_features, o.n, o.bias, dtype_name(o.bias_dtype), o.x_pad, o.y_pad);
}

Tensor rounded_to_bf16(const Tensor& t) { return testing::convert(t, DType::kBF16).to_f32(); }

// The GEMV at every token bucket, forced and through kAuto (which picks it up to 8 tokens).
TEST(CudaLinearGguf, GemvMatchesTheDequantizedWeight) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  for (QuantFormat format : kFormats) {
    for (auto [in, out] : shapes_for(format)) {
      auto w = make_weight(format, in, out, rng);
      ASSERT_TRUE(w != nullptr);
      for (int64_t n : {1, 2, 3, 5, 8}) {
        for (cu::LinearAlgo algo : {cu::LinearAlgo::kGemv, cu::LinearAlgo::kAuto}) {
          RunOptions o;
          o.n = n;
          o.algo = algo;
          o.bias = (n + in / 256) % 2 == 1;
          o.bias_dtype = n == 3 ? DType::kBF16 : DType::kF32;
          o.x_pad = n == 5 ? 1 : (n == 2 ? 4 : 0);  // 1: rows not 16-byte aligned (scalar x loads)
          o.y_pad = n % 2 == 0 ? 3 : 0;
          LinearRun r;
          ASSERT_TRUE(run_linear(**ctx, *w, o, rng, &r)) << describe(*w, o);
          ASSERT_TRUE(within(r.y, reference(w->dense, r.x, r.bias), kGemvTolerance,
                             describe(*w, o) + (algo == cu::LinearAlgo::kGemv ? " gemv" : " auto")));
        }
      }
    }
  }
}

// 9 and 33 tokens through kAuto (the weight expanded to bf16, cuBLASLt), and that path forced at
// one token.
TEST(CudaLinearGguf, ExpandedWeightMatchesTheDequantizedWeight) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  for (QuantFormat format : kFormats) {
    for (auto [in, out] : shapes_for(format)) {
      auto w = make_weight(format, in, out, rng);
      ASSERT_TRUE(w != nullptr);
      const Tensor w_rounded = rounded_to_bf16(w->dense);
      for (auto [n, algo] : {std::pair{int64_t{9}, cu::LinearAlgo::kAuto},
                             std::pair{int64_t{33}, cu::LinearAlgo::kAuto},
                             std::pair{int64_t{1}, cu::LinearAlgo::kCublasLt}}) {
        RunOptions o;
        o.n = n;
        o.algo = algo;
        o.bias = n != 1;
        o.bias_dtype = n == 33 ? DType::kBF16 : DType::kF32;  // a separate kernel vs the epilogue
        o.x_pad = n == 9 ? 3 : 0;
        o.y_pad = n == 33 ? 5 : 0;
        LinearRun r;
        ASSERT_TRUE(run_linear(**ctx, *w, o, rng, &r)) << describe(*w, o);
        ASSERT_TRUE(within(r.y, reference(w_rounded, rounded_to_bf16(r.x), r.bias), kExpandedRoundedTolerance,
                           describe(*w, o) + " vs bf16-rounded operands"));
        ASSERT_TRUE(within(r.y, reference(w->dense, r.x, r.bias), kExpandedTolerance, describe(*w, o) + " vs exact"));
      }
    }
  }
}

// The GEMV gives a token the same bits in every token bucket (what LinearMode::kBatchInvariant
// relies on): the last rows of an 8-token call alone, in 1, 2, 3 and 5, split K or not.
TEST(CudaLinearGguf, GemvGivesATokenTheSameBitsInAnyBucket) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  for (QuantFormat format : kFormats) {
    for (auto [in, out] : {std::pair<int64_t, int64_t>{768, 37}, {4352, 515}}) {
      auto w = make_weight(format, in, out, rng);
      ASSERT_TRUE(w != nullptr);
      Mirror dx(testing::random_tensor({8, in}, rng));
      const auto run = [&](int64_t first, int64_t n, Tensor* y) {
        Mirror dy(testing::nan_tensor({n, out}));
        cu::LinearArgs a = w->args();
        a.x = dx.ptr<float>() + first * in;
        a.x_stride = in;
        a.y = dy.ptr<float>();
        a.y_stride = out;
        a.n = n;
        Status s = cu::linear(**ctx, a, nullptr, cu::LinearAlgo::kGemv);
        if (s.ok()) s = cu::synchronize(nullptr);
        if (s.ok()) s = dy.download();
        *y = dy.host();
        return s;
      };
      Tensor all;
      ASSERT_OK(run(0, 8, &all));
      for (int64_t n : {1, 2, 3, 5}) {
        Tensor part;
        ASSERT_OK(run(8 - n, n, &part));
        ASSERT_TRUE(testing::bitwise_equal(all.slice(0, 8 - n, 8).contiguous(), part,
                                           fmt::format("{} [{}, {}]: the last {} of 8 tokens alone",
                                                       quant_format_name(format), out, in, n)));
      }
    }
  }
}

// Rows first.. of a GgufWeight as a weight of their own, its LinearArgs pointing into the blocks:
// what a fused projection's views give linear() (a base only as aligned as the format's rows).
struct GgufRowView {
  const GgufWeight* whole = nullptr;
  int64_t first = 0;
  QuantWeight q;  // the format and the view's [out, in] (what run_linear reads)
  Tensor dense;   // rows first.. of whole->dense: [out, in] f32

  GgufRowView(const GgufWeight& w, int64_t first_row) : whole(&w), first(first_row) {
    q.format = w.q.format;
    q.in_features = w.q.in_features;
    q.out_features = w.q.out_features - first_row;
    dense = w.dense.slice(0, first_row, w.q.out_features);
  }

  cu::LinearArgs args() const {
    cu::LinearArgs a = whole->args();
    a.w = static_cast<const uint8_t*>(a.w) + first * a.w_stride;
    if (a.w_scales_f16 != nullptr) a.w_scales_f16 += first * (q.in_features / gguf_block_weights(q.format));
    a.out = q.out_features;
    return a;
  }
};

// Weights that begin at row 1 and 3 of their blocks (for the 32-weight blocks, bases 2, 4 or 8
// bytes off 16), through the GEMV and the expansion.
TEST(CudaLinearGguf, WeightsFromALaterRowMatchTheDequantizedWeight) {
  TACHYON_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  for (QuantFormat format : kFormats) {
    for (int64_t in : {int64_t{96}, int64_t{768}, int64_t{896}}) {
      if (in % gguf_block_weights(format) != 0) continue;
      auto w = make_weight(format, in, 41, rng);
      ASSERT_TRUE(w != nullptr);
      for (int64_t first : {1, 3}) {
        const GgufRowView view(*w, first);
        for (auto [n, algo] : {std::pair{int64_t{1}, cu::LinearAlgo::kGemv},
                               std::pair{int64_t{6}, cu::LinearAlgo::kGemv},
                               std::pair{int64_t{12}, cu::LinearAlgo::kAuto}}) {
          RunOptions o;
          o.n = n;
          o.algo = algo;
          o.bias = n == 6;
          const std::string what = fmt::format("{} [{}, {}] from row {} n={}", quant_format_name(format),
                                               view.q.out_features, in, first, n);
          LinearRun r;
          ASSERT_TRUE(run_linear(**ctx, view, o, rng, &r)) << what;
          if (n <= cu::detail::kGemvGgufMaxTokens) {
            ASSERT_TRUE(within(r.y, reference(view.dense, r.x, r.bias), kGemvTolerance, what));
          } else {
            ASSERT_TRUE(within(r.y, reference(rounded_to_bf16(view.dense), rounded_to_bf16(r.x), r.bias),
                               kExpandedRoundedTolerance, what + " vs bf16-rounded operands"));
          }
        }
      }
    }
  }
}

// What linear() refuses for these weights, with a Status rather than a launch.
TEST(CudaLinearGguf, RefusesWhatNoKernelTakes) {
  TACHYON_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  auto q8 = make_weight(QuantFormat::kGgufQ8_0, 512, 64, rng);
  auto q4 = make_weight(QuantFormat::kGgufQ4_K, 512, 64, rng);
  ASSERT_TRUE(q8 != nullptr && q4 != nullptr);
  Mirror dx(testing::random_tensor({16, 512}, rng)), dy(testing::nan_tensor({16, 64}));
  const auto call = [&](cu::LinearArgs a, int64_t n, cu::LinearAlgo algo) {
    a.x = dx.ptr<float>();
    a.x_stride = 512;
    a.y = dy.ptr<float>();
    a.y_stride = 64;
    a.n = n;
    return cu::linear(**ctx, a, nullptr, algo);
  };
  ASSERT_OK(call(q8->args(), 8, cu::LinearAlgo::kGemv));
  EXPECT_FALSE(call(q8->args(), cu::detail::kGemvGgufMaxTokens + 1, cu::LinearAlgo::kGemv).ok());
  EXPECT_FALSE(call(q8->args(), 4, cu::LinearAlgo::kMma).ok());
  cu::LinearArgs no_scales = q8->args();
  no_scales.w_scales_f16 = nullptr;
  EXPECT_FALSE(call(no_scales, 1, cu::LinearAlgo::kAuto).ok());
  cu::LinearArgs with_scales = q4->args();
  with_scales.w_scales_f16 = q8->scales.ptr<uint16_t>();
  EXPECT_FALSE(call(with_scales, 1, cu::LinearAlgo::kAuto).ok());
  cu::LinearArgs misaligned = q4->args();
  misaligned.w_stride += 8;
  EXPECT_FALSE(call(misaligned, 1, cu::LinearAlgo::kAuto).ok());
  cu::LinearArgs ragged = q4->args();
  ragged.in = 384;  // not a whole number of 256-weight blocks
  EXPECT_FALSE(call(ragged, 1, cu::LinearAlgo::kAuto).ok());
  // The 32-weight blocks: rows of 66 (Q5_0) and 72 (Q5_1) bytes run; a base or stride off the
  // blocks' alignment (2 and 8 bytes), block scales beside them, or a ragged in do not.
  auto q5_0 = make_weight(QuantFormat::kGgufQ5_0, 96, 64, rng);
  auto q5_1 = make_weight(QuantFormat::kGgufQ5_1, 96, 64, rng);
  ASSERT_TRUE(q5_0 != nullptr && q5_1 != nullptr);
  for (cu::LinearAlgo algo : {cu::LinearAlgo::kGemv, cu::LinearAlgo::kCublasLt}) {
    ASSERT_OK(call(q5_0->args(), 3, algo));
    ASSERT_OK(call(q5_1->args(), 3, algo));
  }
  cu::LinearArgs odd_stride = q5_0->args();
  odd_stride.w_stride += 1;
  EXPECT_FALSE(call(odd_stride, 1, cu::LinearAlgo::kAuto).ok());
  cu::LinearArgs odd_base = q5_0->args();
  odd_base.w = static_cast<const uint8_t*>(odd_base.w) + 1;
  EXPECT_FALSE(call(odd_base, 1, cu::LinearAlgo::kAuto).ok());
  cu::LinearArgs base_off_8 = q5_1->args();
  base_off_8.w = static_cast<const uint8_t*>(base_off_8.w) + 4;
  EXPECT_FALSE(call(base_off_8, 1, cu::LinearAlgo::kAuto).ok());
  EXPECT_FALSE(call(base_off_8, 9, cu::LinearAlgo::kAuto).ok());
  cu::LinearArgs q5_scales = q5_0->args();
  q5_scales.w_scales_f16 = q8->scales.ptr<uint16_t>();
  EXPECT_FALSE(call(q5_scales, 1, cu::LinearAlgo::kAuto).ok());
  cu::LinearArgs q5_ragged = q5_0->args();
  q5_ragged.in = 80;
  EXPECT_FALSE(call(q5_ragged, 1, cu::LinearAlgo::kAuto).ok());
  ASSERT_OK(cu::synchronize(nullptr));
}

// The backend: weights moved by copy_weights_to keep their layout (f16 scales for Q8_0 and Q6_K,
// none for the other formats, no zeros), ops::linear runs them at any token count, and
// LinearMode::kBatchInvariant gives a token the same bits alone and inside a batch it splits into
// GEMV chunks.
TEST(CudaLinearGguf, BackendRunsWeightsMovedToTheDevice) {
  TACHYON_SKIP_WITHOUT_GPU();
  ASSERT_OK(cu::start_backend(0));
  const Device gpu = Device::cuda(0);
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  const int64_t in = 768, out = 301;
  constexpr int kCount = sizeof(kFormats) / sizeof(kFormats[0]);
  // One format per projection of three layers (q, k, v of each).
  ModelWeights host;
  host.layers.resize(3);
  const auto slot = [](ModelWeights& w, int i) -> Weight& {
    LayerWeights& l = w.layers[i / 3];
    return i % 3 == 0 ? l.q_proj : i % 3 == 1 ? l.k_proj : l.v_proj;
  };
  std::vector<Tensor> dense;
  for (int i = 0; i < kCount; ++i) {
    auto q = quantize_gguf_blocks(testing::random_tensor({out, in}, rng, -0.5f, 0.5f), kFormats[i]);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    dense.push_back(dequantize(*q));
    slot(host, i).quant = std::make_shared<const QuantWeight>(std::move(q).value());
  }
  auto moved = copy_weights_to(host, gpu);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  const Tensor bias = testing::random_tensor({out}, rng);
  auto dbias = copy_to(bias, gpu);
  ASSERT_TRUE(dbias.ok());
  for (int i = 0; i < kCount; ++i) {
    const Weight& device_weight = slot(*moved, i);
    const QuantWeight& q = *device_weight.quant;
    const std::string name = quant_format_name(q.format);
    ASSERT_EQ(q.format, kFormats[i]);
    EXPECT_TRUE(q.packed.device() == gpu) << name;
    EXPECT_FALSE(q.zeros.defined()) << name;
    if (!has_block_scales(q.format)) {
      EXPECT_FALSE(q.scales.defined()) << name;
    } else {
      ASSERT_TRUE(q.scales.defined()) << name;
      EXPECT_TRUE(q.scales.device() == gpu && q.scales.dtype() == DType::kF16) << name;
    }
    for (int64_t n : {1, 4, 8, 11, 40}) {
      const std::string what = fmt::format("{} n={}", name, n);
      const Tensor x = testing::random_tensor({n, in}, rng);
      const bool with_bias = n % 2 == 0;
      auto dx = copy_to(x, gpu);
      auto dy = copy_to(testing::nan_tensor({n, out}), gpu);
      ASSERT_TRUE(dx.ok() && dy.ok());
      ops::linear(*dx, device_weight, with_bias ? &*dbias : nullptr, *dy);
      auto y = copy_to(*dy, Device::cpu());
      ASSERT_TRUE(y.ok());
      const Reference ref = reference(dense[i], x, with_bias ? bias : Tensor());
      ASSERT_TRUE(within(*y, ref, n <= cu::detail::kGemvGgufMaxTokens ? kGemvTolerance : kExpandedTolerance, what));
      ops::linear(*dx, device_weight, with_bias ? &*dbias : nullptr, *dy, ops::LinearMode::kBatchInvariant);
      auto yi = copy_to(*dy, Device::cpu());
      ASSERT_TRUE(yi.ok());
      ASSERT_TRUE(within(*yi, ref, kGemvTolerance, what + " batch-invariant"));
      if (n > 1) {
        // The last row alone: another token bucket, and for n > 8 another GEMV chunk's position.
        auto dx1 = copy_to(x.slice(0, n - 1, n).contiguous(), gpu);
        auto dy1 = copy_to(testing::nan_tensor({1, out}), gpu);
        ASSERT_TRUE(dx1.ok() && dy1.ok());
        ops::linear(*dx1, device_weight, with_bias ? &*dbias : nullptr, *dy1, ops::LinearMode::kBatchInvariant);
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
