// linear_fused on the CPU == its definition written out with the scalar reference ops: the norm
// prologue, the residual add and SwiGLU epilogues (y over the gate half of the scratch output, as
// the model passes it), weights in f32 and bf16, with and without a bias; a deferred add and the
// pending add of the next norm; what it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/cpu/reference.h"
#include "ops/ops.h"
#include "ops_test_util.h"

namespace tachyon {
namespace {

using testing::all_close;

constexpr double kTol = 2e-5;

struct FusedCase {
  bool norm, add, swiglu;
};

TEST(LinearFused, MatchesItsDefinition) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (DType w_dtype : {DType::kF32, DType::kBF16}) {
    for (const FusedCase& fc : {FusedCase{true, false, false}, FusedCase{false, true, false},
                                FusedCase{true, false, true}, FusedCase{false, false, true},
                                FusedCase{true, true, false}}) {
      for (int64_t n : {1, 3, 9}) {
        const int64_t in = 67, out = fc.swiglu ? 2 * 29 : 31;
        const bool with_bias = n != 3;
        const std::string what = fmt::format("{} norm {} add {} swiglu {} n {}", dtype_name(w_dtype), fc.norm,
                                             fc.add, fc.swiglu, n);
        Tensor x = testing::random_tensor({n, in}, rng, -2.0f, 2.0f);
        Weight w;
        w.dense = testing::convert(testing::random_tensor({out, in}, rng), w_dtype);
        const Tensor bias = testing::random_tensor({out}, rng);
        const Tensor norm_w = testing::convert(testing::random_tensor({in}, rng, 0.5f, 1.5f), DType::kBF16);
        const int64_t y_cols = fc.swiglu ? out / 2 : out;
        const Tensor y0 = testing::random_tensor({n, y_cols}, rng);

        // The definition, with the reference ops.
        Tensor xin = x.contiguous();
        if (fc.norm) ops::reference::rms_norm(x, norm_w.to_f32(), 1e-5f, xin);
        Tensor lin = testing::nan_tensor({n, out});
        ops::reference::linear(xin, w, with_bias ? &bias : nullptr, lin);
        Tensor expected = y0.contiguous();
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t j = 0; j < y_cols; ++j) {
            float& e = expected.data<float>()[t * y_cols + j];
            const float v = lin.data<float>()[t * out + j];
            if (fc.swiglu) {
              const float up = lin.data<float>()[t * out + y_cols + j];
              e = v / (1.0f + std::exp(-v)) * up;
            } else {
              e = fc.add ? e + v : v;
            }
          }
        }

        ops::LinearFusion f;
        Tensor scratch_x = testing::nan_tensor({n, in});
        Tensor scratch_y = testing::nan_tensor({n, out});
        if (fc.norm) {
          f.norm_weight = &norm_w;
          f.norm_eps = 1e-5f;
          f.scratch_x = &scratch_x;
        }
        f.add_to_output = fc.add;
        f.swiglu = fc.swiglu;
        f.scratch_y = &scratch_y;
        Tensor y = fc.swiglu ? scratch_y.slice(1, 0, y_cols) : y0.contiguous();
        ASSERT_FALSE(ops::linear_fused(x, w, with_bias ? &bias : nullptr, f, y)) << what;
        ASSERT_TRUE(all_close(y.contiguous(), expected, kTol, what));
      }
    }
  }
}

// A residual add the CPU defers: y untouched, the result in scratch_y; the next call's pending
// add is add_rms_norm's (x written back) before its norm.
TEST(LinearFused, DefersTheAddIntoTheNextNorm) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  const int64_t n = 3, d = 40, ff = 2 * 24;
  Tensor a = testing::random_tensor({n, d}, rng);
  Tensor x = testing::random_tensor({n, d}, rng);
  Weight o, gate_up;
  o.dense = testing::random_tensor({d, d}, rng);
  gate_up.dense = testing::random_tensor({ff, d}, rng);
  const Tensor norm_w = testing::random_tensor({d}, rng, 0.5f, 1.5f);
  Tensor out = testing::nan_tensor({n, d}), h = testing::nan_tensor({n, d}), gu = testing::nan_tensor({n, ff});

  // The separate ops, on copies.
  Tensor ex = x.contiguous(), eo = testing::nan_tensor({n, d}), eh = testing::nan_tensor({n, d});
  Tensor egu = testing::nan_tensor({n, ff}), eg = testing::nan_tensor({n, ff / 2});
  ops::linear(a, o, nullptr, eo);
  ops::add_rms_norm(ex, eo, norm_w, 1e-6f, eh);
  ops::linear(eh, gate_up, nullptr, egu);
  ops::silu_mul(egu.slice(1, 0, ff / 2), egu.slice(1, ff / 2, ff), eg);

  const Tensor x_before = x.contiguous();
  ops::LinearFusion residual;
  residual.add_to_output = true;
  residual.may_defer_add = true;
  residual.scratch_y = &out;
  ASSERT_TRUE(ops::linear_fused(a, o, nullptr, residual, x));
  ASSERT_TRUE(testing::bitwise_equal(x, x_before, "x until the deferred add"));
  ASSERT_TRUE(testing::bitwise_equal(out, eo, "the deferred result"));
  ops::LinearFusion mlp;
  mlp.norm_weight = &norm_w;
  mlp.norm_eps = 1e-6f;
  mlp.pending_add = &out;
  mlp.swiglu = true;
  mlp.scratch_x = &h;
  mlp.scratch_y = &gu;
  Tensor g = gu.slice(1, 0, ff / 2);
  ASSERT_FALSE(ops::linear_fused(x, gate_up, nullptr, mlp, g));
  ASSERT_TRUE(testing::bitwise_equal(x, ex, "x + the pending add"));
  ASSERT_TRUE(testing::bitwise_equal(g.contiguous(), eg, "swiglu of the normed sum"));
}

TEST(LinearFused, AddIsElementwise) {
  std::mt19937 rng(7);
  Tensor y = testing::random_tensor({3, 10}, rng);
  const Tensor wide = testing::random_tensor({3, 14}, rng);
  const Tensor x = wide.slice(1, 2, 12);  // a strided view
  Tensor expected = y.contiguous();
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t i = 0; i < 10; ++i) expected.data<float>()[t * 10 + i] += wide.data<float>()[t * 14 + 2 + i];
  }
  ops::add(y, x);
  ASSERT_TRUE(testing::bitwise_equal(y, expected, "add"));
}

TEST(LinearFusedDeathTest, RefusesMissingScratch) {
  std::mt19937 rng(3);
  Tensor x = testing::random_tensor({2, 8}, rng);
  Weight w;
  w.dense = testing::random_tensor({6, 8}, rng);
  Tensor y = testing::nan_tensor({2, 6});
  ops::LinearFusion f;
  f.add_to_output = true;  // and no scratch_y
  EXPECT_DEATH((void)ops::linear_fused(x, w, nullptr, f, y), "scratch_y");
  const Tensor norm_w = testing::random_tensor({8}, rng);
  ops::LinearFusion g;
  g.norm_weight = &norm_w;  // and no scratch_x
  EXPECT_DEATH((void)ops::linear_fused(x, w, nullptr, g, y), "scratch_x");
  ops::LinearFusion p;
  p.pending_add = &y;  // and no norm
  EXPECT_DEATH((void)ops::linear_fused(x, w, nullptr, p, y), "pending add without a norm");
}

}  // namespace
}  // namespace tachyon
