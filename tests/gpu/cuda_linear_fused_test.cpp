// linear_fused on the device: the GEMV that adds its output into the residual or applies SwiGLU
// (the norm before it runs apart) gives the bits of the separate ops (rms_norm, linear, add,
// silu_mul) run on the same device, for 16-bit, f32 and per-channel int8 weights, 1..6 tokens,
// odd sizes and shapes whose K is split over the grid (the reduction then applies the epilogue),
// where the fused kernel does not take the case (more tokens than the GEMV's) too; it matches the
// CPU within tolerance; and the residual add is deferred exactly where the GEMV cannot take it.
// Past the GEMV's token counts, the norm and SwiGLU stage their 16-bit rounding for the linears
// after them (LinearContext::stage_activations): read once, only for the rows staged, with the
// separate ops' bits. Skips without a device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "core/device_memory.h"
#include "gpu_test_util.h"
#include "model/weights.h"
#include "ops/ops.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace tachyon {
namespace {

using testing::all_close;
namespace cu = ::tachyon::ops::cuda;

Tensor on(const Tensor& t, Device d) {
  auto r = copy_to(t, d);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : Tensor();
}

struct FusedCase {
  bool norm, add, swiglu;
};

TEST(CudaLinearFused, EqualsTheSeparateOpsBitwise) {
  TACHYON_SKIP_WITHOUT_GPU();
  ASSERT_OK(cu::start_backend(0));
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  // The CPU's int8 linear in f32 on the exact activations (its integer path rounds them to int8).
  const testing::ExactQuantizedLinears exact;
  struct Shape {
    int64_t in, out;
  };
  // 4096 -> 64 splits K over the grid; 1000 and 1002 leave scalar tails.
  for (const Shape& sh : {Shape{4096, 302}, Shape{4096, 64}, Shape{1000, 146}, Shape{1002, 90}}) {
    for (const char* wname : {"bf16", "f16", "f32", "int8"}) {
      const Tensor dense = testing::random_tensor({sh.out, sh.in}, rng, -0.2f, 0.2f);
      Weight host_w;
      if (std::string(wname) == "int8") {
        auto q = quantize_int8_channel(dense);
        ASSERT_TRUE(q.ok()) << q.status().to_string();
        host_w.quant = std::make_shared<const QuantWeight>(std::move(q).value());
      } else {
        const DType d = std::string(wname) == "bf16" ? DType::kBF16 : std::string(wname) == "f16" ? DType::kF16 : DType::kF32;
        host_w.dense = testing::convert(dense, d);
      }
      ModelWeights hm;
      hm.layers.resize(1);
      hm.layers[0].o_proj = host_w;
      auto moved = copy_weights_to(hm, gpu);
      ASSERT_TRUE(moved.ok()) << moved.status().to_string();
      const Weight& w = moved->layers[0].o_proj;
      const Tensor bias = testing::random_tensor({sh.out}, rng);
      const Tensor norm_w = testing::convert(testing::random_tensor({sh.in}, rng, 0.5f, 1.5f), DType::kBF16);
      const Tensor dbias = on(bias, gpu), dnorm = on(norm_w, gpu);
      for (const FusedCase& fc : {FusedCase{true, false, false}, FusedCase{false, true, false},
                                  FusedCase{true, false, true}, FusedCase{false, false, true}}) {
        for (int64_t n : {1, 2, 4, 6}) {
          const bool with_bias = n % 2 == 1;
          const std::string what = fmt::format("{} {}->{} norm {} add {} swiglu {} n {} bias {}", wname, sh.in,
                                               sh.out, fc.norm, fc.add, fc.swiglu, n, with_bias);
          const int64_t y_cols = fc.swiglu ? sh.out / 2 : sh.out;
          Tensor x = testing::random_tensor({n, sh.in}, rng, -2.0f, 2.0f);
          const Tensor y0 = testing::random_tensor({n, y_cols}, rng);
          Tensor dx = on(x, gpu);
          const Tensor* b = with_bias ? &dbias : nullptr;

          // Fused (where the backend can).
          Tensor sx = on(testing::nan_tensor({n, sh.in}), gpu), sy = on(testing::nan_tensor({n, sh.out}), gpu);
          ops::LinearFusion f;
          if (fc.norm) {
            f.norm_weight = &dnorm;
            f.norm_eps = 1e-5f;
            f.scratch_x = &sx;
          }
          f.add_to_output = fc.add;
          f.swiglu = fc.swiglu;
          f.scratch_y = &sy;
          Tensor fused_y = on(y0, gpu);
          ASSERT_FALSE(ops::linear_fused(dx, w, b, f, fused_y)) << what;

          // The separate ops on the device.
          Tensor apart_y = on(y0, gpu);
          Tensor h = on(testing::nan_tensor({n, sh.in}), gpu), lin = on(testing::nan_tensor({n, sh.out}), gpu);
          const Tensor* in = &dx;
          if (fc.norm) {
            ops::rms_norm(dx, dnorm, 1e-5f, h);
            in = &h;
          }
          ops::linear(*in, w, b, lin);
          if (fc.swiglu) {
            ops::silu_mul(lin.slice(1, 0, y_cols), lin.slice(1, y_cols, sh.out), apart_y);
          } else if (fc.add) {
            ops::add(apart_y, lin);
          } else {
            ops::linear(*in, w, b, apart_y);
          }
          ASSERT_OK(ops::synchronize(gpu));
          const Tensor got = on(fused_y, cpu), want = on(apart_y, cpu);
          ASSERT_TRUE(testing::bitwise_equal(got, want, what));

          // And the CPU's linear_fused, within f32 tolerance.
          Tensor csx = testing::nan_tensor({n, sh.in}), csy = testing::nan_tensor({n, sh.out});
          ops::LinearFusion cf = f;
          cf.norm_weight = fc.norm ? &norm_w : nullptr;
          cf.scratch_x = &csx;
          cf.scratch_y = &csy;
          Tensor cy = y0.contiguous();
          Tensor cx = x.contiguous();
          ASSERT_FALSE(ops::linear_fused(cx, host_w, with_bias ? &bias : nullptr, cf, cy)) << what;
          // The GEMV computes in f32 like the CPU; beyond its token counts cuBLASLt multiplies
          // activations rounded to the weight's 16 bits. SwiGLU then multiplies two such outputs,
          // each one's error scaled by the other factor, which can exceed the outputs' RMS that
          // all_close measures against: 2.01e-2 measured at 1000 -> 146, n 6, bf16 (seed
          // 3377562982), so swiglu gets 3e-2.
          const bool gemv = n <= (std::string(wname) == "int8" ? cu::kLinearAutoGemvMaxTokensInt8
                                                              : cu::kLinearAutoGemvMaxTokens);
          const double rounded_tol = fc.swiglu ? 3e-2 : 2e-2;
          ASSERT_TRUE(all_close(got, cy, gemv || std::string(wname) == "f32" ? 1e-4 : rounded_tol, what + " vs the CPU"));
        }
      }
    }
  }
}

// Group-128 int4 gate/up weights at 1-2 tokens: SwiGLU in the staged tensor-core GEMM's epilogue
// (with the K split finished by the last block, or a single slice) writes the bits of the linear
// followed by silu_mul; beyond 2 tokens the separate ops run. Half widths that are not a multiple
// of a warp's 8 outputs, with and without a bias and a norm before; also against the CPU.
TEST(CudaLinearFused, Int4SwiGLUEqualsTheSeparateOpsBitwise) {
  TACHYON_SKIP_WITHOUT_GPU();
  ASSERT_OK(cu::start_backend(0));
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  const testing::ExactQuantizedLinears exact;  // the CPU's int4 linear in f32
  struct Shape {
    int64_t in, half;
  };
  for (const Shape& sh : {Shape{256, 37}, Shape{1536, 203}, Shape{7168, 1031}, Shape{4096, 1024}}) {
    const int64_t out = 2 * sh.half;
    Weight dense_w;
    dense_w.dense = testing::random_tensor({out, sh.in}, rng, -0.2f, 0.2f);
    QuantSpec spec;
    spec.format = QuantFormat::kInt4Group;
    spec.group_size = 128;
    auto q = quantize_weight(dense_w, spec);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    const Weight host_w = std::move(*q);
    ModelWeights hm;
    hm.layers.resize(1);
    hm.layers[0].q_proj = host_w;
    auto moved = copy_weights_to(hm, gpu);
    ASSERT_TRUE(moved.ok()) << moved.status().to_string();
    const Weight& w = moved->layers[0].q_proj;
    const Tensor bias = testing::random_tensor({out}, rng);
    const Tensor norm_w = testing::convert(testing::random_tensor({sh.in}, rng, 0.5f, 1.5f), DType::kBF16);
    const Tensor dbias = on(bias, gpu), dnorm = on(norm_w, gpu);
    for (bool norm : {false, true}) {
      for (int64_t n : {1, 2, 3}) {
        for (bool with_bias : {false, true}) {
          const std::string what =
              fmt::format("int4 g128 {}->2x{} norm {} n {} bias {}", sh.in, sh.half, norm, n, with_bias);
          const Tensor x = testing::random_tensor({n, sh.in}, rng, -2.0f, 2.0f);
          Tensor dx = on(x, gpu);
          const Tensor* b = with_bias ? &dbias : nullptr;
          Tensor sx = on(testing::nan_tensor({n, sh.in}), gpu), sy = on(testing::nan_tensor({n, out}), gpu);
          ops::LinearFusion f;
          if (norm) {
            f.norm_weight = &dnorm;
            f.norm_eps = 1e-5f;
            f.scratch_x = &sx;
          }
          f.swiglu = true;
          f.scratch_y = &sy;
          Tensor fused_y = on(testing::nan_tensor({n, sh.half}), gpu);
          ASSERT_FALSE(ops::linear_fused(dx, w, b, f, fused_y)) << what;

          Tensor apart_y = on(testing::nan_tensor({n, sh.half}), gpu);
          Tensor h = on(testing::nan_tensor({n, sh.in}), gpu), lin = on(testing::nan_tensor({n, out}), gpu);
          const Tensor* in = &dx;
          if (norm) {
            ops::rms_norm(dx, dnorm, 1e-5f, h);
            in = &h;
          }
          ops::linear(*in, w, b, lin);
          ops::silu_mul(lin.slice(1, 0, sh.half), lin.slice(1, sh.half, out), apart_y);
          ASSERT_OK(ops::synchronize(gpu));
          const Tensor got = on(fused_y, cpu), want = on(apart_y, cpu);
          ASSERT_TRUE(testing::bitwise_equal(got, want, what));

          Tensor csx = testing::nan_tensor({n, sh.in}), csy = testing::nan_tensor({n, out});
          ops::LinearFusion cf = f;
          cf.norm_weight = norm ? &norm_w : nullptr;
          cf.scratch_x = &csx;
          cf.scratch_y = &csy;
          Tensor cy = testing::nan_tensor({n, sh.half});
          Tensor cx = x.contiguous();
          ASSERT_FALSE(ops::linear_fused(cx, host_w, with_bias ? &bias : nullptr, cf, cy)) << what;
          // The tensor-core GEMM multiplies activations rounded to bf16.
          ASSERT_TRUE(all_close(got, cy, 2e-2, what + " vs the CPU"));
        }
      }
    }
  }
}

// The residual add runs inside the GEMV where it can (not deferred) and is deferred where it
// cannot (more tokens than the GEMV takes); the pending add of the next norm is add_rms_norm's,
// bit for bit, whether the epilogue after it fuses or not.
TEST(CudaLinearFused, DefersTheAddOnlyWhereTheGemvCannotTakeIt) {
  TACHYON_SKIP_WITHOUT_GPU();
  ASSERT_OK(cu::start_backend(0));
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  const int64_t d = 512, ff = 2 * 384;
  ModelWeights hm;
  hm.layers.resize(1);
  hm.layers[0].o_proj.dense = testing::convert(testing::random_tensor({d, d}, rng, -0.1f, 0.1f), DType::kBF16);
  hm.layers[0].down_proj.dense = testing::convert(testing::random_tensor({ff, d}, rng, -0.1f, 0.1f), DType::kBF16);
  auto moved = copy_weights_to(hm, gpu);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  const Weight& o = moved->layers[0].o_proj;
  const Weight& gate_up = moved->layers[0].down_proj;  // any slot copy_weights_to leaves as it is
  const Tensor norm_w = on(testing::convert(testing::random_tensor({d}, rng, 0.5f, 1.5f), DType::kBF16), gpu);
  for (int64_t n : {1, 2, 3, 5, 17}) {
    const std::string what = fmt::format("n {}", n);
    Tensor a = on(testing::random_tensor({n, d}, rng), gpu);
    const Tensor x0 = testing::random_tensor({n, d}, rng);
    // The separate ops.
    Tensor ex = on(x0, gpu), eo = on(testing::nan_tensor({n, d}), gpu), eh = on(testing::nan_tensor({n, d}), gpu);
    Tensor egu = on(testing::nan_tensor({n, ff}), gpu), eg = on(testing::nan_tensor({n, ff / 2}), gpu);
    ops::linear(a, o, nullptr, eo);
    ops::add_rms_norm(ex, eo, norm_w, 1e-5f, eh);
    ops::linear(eh, gate_up, nullptr, egu);
    ops::silu_mul(egu.slice(1, 0, ff / 2), egu.slice(1, ff / 2, ff), eg);
    // Through linear_fused, as the model calls it.
    Tensor x = on(x0, gpu), out = on(testing::nan_tensor({n, d}), gpu), h = on(testing::nan_tensor({n, d}), gpu);
    Tensor gu = on(testing::nan_tensor({n, ff}), gpu);
    ops::LinearFusion residual;
    residual.add_to_output = true;
    residual.may_defer_add = true;
    residual.scratch_y = &out;
    const bool deferred = ops::linear_fused(a, o, nullptr, residual, x);
    EXPECT_EQ(deferred, n > cu::kLinearFusedMaxTokens) << what;
    ops::LinearFusion mlp;
    mlp.norm_weight = &norm_w;
    mlp.norm_eps = 1e-5f;
    mlp.pending_add = deferred ? &out : nullptr;
    mlp.swiglu = true;
    mlp.scratch_x = &h;
    mlp.scratch_y = &gu;
    Tensor g = gu.slice(1, 0, ff / 2);
    ASSERT_FALSE(ops::linear_fused(x, gate_up, nullptr, mlp, g)) << what;
    ASSERT_OK(ops::synchronize(gpu));
    ASSERT_TRUE(testing::bitwise_equal(on(x, cpu), on(ex, cpu), what + ": the residual"));
    ASSERT_TRUE(testing::bitwise_equal(on(gu, cpu).slice(1, 0, ff / 2).contiguous(), on(eg, cpu),
                                       what + ": the activation"));
  }
}

// Activations a producer staged (LinearContext::stage_activations) are what linear() multiplies
// instead of rounding x itself, exactly where linear_activation_dtype says it rounds x: for the
// next call only, for the rows and rounding they were staged for, and not after forget_staged().
// Staged zeros make the difference visible: where they are read, y is 0 (no bias).
TEST(CudaLinearFused, StagedActivationsAreReadOnceForTheirRowsOnly) {
  TACHYON_SKIP_WITHOUT_GPU();
  ASSERT_OK(cu::start_backend(0));
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  auto ctx = cu::LinearContext::create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  const int64_t in = 1024, out = 200;
  const Tensor dense = testing::random_tensor({out, in}, rng, -0.2f, 0.2f);
  for (const char* wname : {"bf16", "f16", "f32", "int8", "int4", "fp8"}) {
    const std::string kind(wname);
    // The weight on the device and linear()'s arguments for it.
    Tensor w, scales, zeros;
    cu::LinearArgs base;
    if (kind == "int8" || kind == "int4" || kind == "fp8") {
      auto q = kind == "int8"   ? quantize_int8_channel(dense)
               : kind == "int4" ? quantize_int4_group(dense, 128)
                                : quantize_fp8_channel(dense);
      ASSERT_TRUE(q.ok()) << q.status().to_string();
      w = on(q->packed, gpu);
      scales = on(q->scales, gpu);
      base.w_scales = scales.data<float>();
      if (kind == "int4") {
        zeros = on(q->zeros, gpu);
        base.w_zeros = zeros.data<float>();
        base.w_group = 128;
      }
    } else {
      w = on(testing::convert(dense, kind == "bf16" ? DType::kBF16 : kind == "f16" ? DType::kF16 : DType::kF32), gpu);
    }
    base.w = w.raw_data();
    base.w_dtype = w.dtype();
    base.w_stride = w.stride(0);
    base.in = in;
    base.out = out;
    for (int64_t n : {2, 3, 9, 40}) {
      const std::string what = fmt::format("{} n {}", wname, n);
      const Tensor x = on(testing::random_tensor({n, in + 3}, rng, -2.0f, 2.0f), gpu);
      Tensor y = on(testing::nan_tensor({n, out}), gpu);
      cu::LinearArgs a = base;
      a.x = x.data<float>();
      a.x_stride = x.stride(0);
      a.y = y.data<float>();
      a.y_stride = y.stride(0);
      a.n = n;
      const auto run = [&]() -> Tensor {
        const Status s = cu::linear(**ctx, a, nullptr);
        EXPECT_TRUE(s.ok()) << what << ": " << s.to_string();
        EXPECT_TRUE(cu::synchronize(nullptr).ok());
        return on(y, cpu);
      };
      // Stages zeros for x's rows (n_staged of them) at `rounding`.
      const auto stage_zeros = [&](int64_t n_staged, DType rounding) {
        auto rows = (*ctx)->stage_activations(a.x, a.x_stride, n_staged, in, rounding);
        ASSERT_TRUE(rows.ok()) << rows.status().to_string();
        ASSERT_OK(cu::memset_device(rows->data, 0, static_cast<size_t>(n_staged * rows->stride) * 2, nullptr));
      };
      const Tensor want = run();
      const DType rounded = cu::linear_activation_dtype(**ctx, a);
      EXPECT_TRUE(rounded == DType::kF32 || rounded == (kind == "f16" ? DType::kF16 : DType::kBF16)) << what;
      if (kind == "f32" || n <= 2) {
        EXPECT_EQ(rounded, DType::kF32) << what;  // plain f32, or a GEMV
      }
      if ((kind == "bf16" || kind == "f16" || kind == "int8") && n >= 9) {
        EXPECT_NE(rounded, DType::kF32) << what;
      }
      const DType staged_as = rounded == DType::kF32 ? DType::kBF16 : rounded;
      stage_zeros(n, staged_as);
      const Tensor staged = run();
      if (rounded == DType::kF32) {
        ASSERT_TRUE(testing::bitwise_equal(staged, want, what + ": staged rows it does not read"));
      } else {
        ASSERT_TRUE(testing::bitwise_equal(staged, Tensor::zeros({n, out}, DType::kF32), what + ": staged zeros"));
      }
      ASSERT_TRUE(testing::bitwise_equal(run(), want, what + ": the call after"));
      stage_zeros(n - 1, staged_as);
      ASSERT_TRUE(testing::bitwise_equal(run(), want, what + ": other rows staged"));
      stage_zeros(n, staged_as == DType::kBF16 ? DType::kF16 : DType::kBF16);
      ASSERT_TRUE(testing::bitwise_equal(run(), want, what + ": another rounding staged"));
      stage_zeros(n, staged_as);
      (*ctx)->forget_staged();
      ASSERT_TRUE(testing::bitwise_equal(run(), want, what + ": forgotten"));
    }
  }
}

// A block as the model runs it at a batch where linear() multiplies in 16 bits: the norm (with a
// pending residual add) and SwiGLU hand their rounding to the gate/up and down linears; the
// residual, the activation and the down projection's output are those of the separate ops, bit
// for bit. An op that changes the activation between SwiGLU and the down projection drops the
// hand-over: the down projection then multiplies the changed values.
TEST(CudaLinearFused, NormAndSwiGLUHandTheirRoundingToTheLinears) {
  TACHYON_SKIP_WITHOUT_GPU();
  ASSERT_OK(cu::start_backend(0));
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  const int64_t d = 1024, f = 704;
  for (const char* wname : {"bf16", "f16", "int8"}) {
    const std::string kind(wname);
    ModelWeights hm;
    hm.layers.resize(1);
    const auto make = [&](int64_t rows, int64_t cols) {
      const Tensor dense = testing::random_tensor({rows, cols}, rng, -0.1f, 0.1f);
      Weight hw;
      if (kind == "int8") {
        auto q = quantize_int8_channel(dense);
        EXPECT_TRUE(q.ok());
        hw.quant = std::make_shared<const QuantWeight>(std::move(q).value());
      } else {
        hw.dense = testing::convert(dense, kind == "bf16" ? DType::kBF16 : DType::kF16);
      }
      return hw;
    };
    hm.layers[0].o_proj = make(2 * f, d);  // gate/up (any slot copy_weights_to leaves as it is)
    hm.layers[0].down_proj = make(d, f);
    auto moved = copy_weights_to(hm, gpu);
    ASSERT_TRUE(moved.ok()) << moved.status().to_string();
    const Weight& gate_up = moved->layers[0].o_proj;
    const Weight& down = moved->layers[0].down_proj;
    const Tensor norm_w = on(testing::convert(testing::random_tensor({d}, rng, 0.5f, 1.5f), DType::kBF16), gpu);
    for (int64_t n : {5, 16, 33}) {
      for (bool change_between : {false, true}) {
        const std::string what = fmt::format("{} n {} changed between {}", wname, n, change_between);
        const Tensor x0 = testing::random_tensor({n, d}, rng);
        const Tensor pending = on(testing::random_tensor({n, d}, rng), gpu);
        const Tensor delta = on(testing::random_tensor({n, f}, rng), gpu);
        // The separate ops.
        Tensor ex = on(x0, gpu), eh = on(testing::nan_tensor({n, d}), gpu);
        Tensor egu = on(testing::nan_tensor({n, 2 * f}), gpu), eg = on(testing::nan_tensor({n, f}), gpu);
        Tensor ey = on(testing::nan_tensor({n, d}), gpu);
        ops::add_rms_norm(ex, pending, norm_w, 1e-5f, eh);
        ops::linear(eh, gate_up, nullptr, egu);
        ops::silu_mul(egu.slice(1, 0, f), egu.slice(1, f, 2 * f), eg);
        if (change_between) ops::add(eg, delta);
        ops::linear(eg, down, nullptr, ey);
        // As the model calls them.
        Tensor x = on(x0, gpu), h = on(testing::nan_tensor({n, d}), gpu);
        Tensor gu = on(testing::nan_tensor({n, 2 * f}), gpu), y = on(testing::nan_tensor({n, d}), gpu);
        ops::LinearFusion mlp;
        mlp.norm_weight = &norm_w;
        mlp.norm_eps = 1e-5f;
        mlp.pending_add = &pending;
        mlp.swiglu = true;
        mlp.scratch_x = &h;
        mlp.scratch_y = &gu;
        Tensor g = gu.slice(1, 0, f);
        ASSERT_FALSE(ops::linear_fused(x, gate_up, nullptr, mlp, g)) << what;
        if (change_between) ops::add(g, delta);
        ops::linear(g, down, nullptr, y);
        ASSERT_OK(ops::synchronize(gpu));
        ASSERT_TRUE(testing::bitwise_equal(on(x, cpu), on(ex, cpu), what + ": the residual"));
        ASSERT_TRUE(testing::bitwise_equal(on(gu, cpu).slice(1, 0, f).contiguous(), on(eg, cpu), what + ": the activation"));
        ASSERT_TRUE(testing::bitwise_equal(on(y, cpu), on(ey, cpu), what + ": the down projection"));
      }
    }
  }
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
