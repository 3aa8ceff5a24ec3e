// linear_fused on the device: the GEMV that adds its output into the residual or applies SwiGLU
// (the norm before it runs apart) gives the bits of the separate ops (rms_norm, linear, add,
// silu_mul) run on the same device, for 16-bit, f32 and per-channel int8 weights, 1..6 tokens,
// odd sizes and shapes whose K is split over the grid (the reduction then applies the epilogue),
// where the fused kernel does not take the case (more tokens than the GEMV's) too; it matches the
// CPU within tolerance; and the residual add is deferred exactly where the GEMV cannot take it.
// Skips without a device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "core/device_memory.h"
#include "gpu_test_util.h"
#include "model/weights.h"
#include "ops/ops.h"
#include "quant/quantize.h"

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
          // activations rounded to the weight's 16 bits.
          const bool gemv = n <= (std::string(wname) == "int8" ? cu::kLinearAutoGemvMaxTokensInt8
                                                              : cu::kLinearAutoGemvMaxTokens);
          ASSERT_TRUE(all_close(got, cy, gemv || std::string(wname) == "f32" ? 1e-4 : 2e-2, what + " vs the CPU"));
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

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
