// linear: every ISA path, both algorithms, every weight dtype == the scalar reference on fresh
// random inputs, odd sizes, strided views, NaN-prefilled outputs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ops/cpu/kernels.h"
#include "ops/cpu/reference.h"
#include "ops/ops.h"
#include "ops_test_util.h"

namespace tachyon {
namespace {

using ops::cpu::Isa;
using ops::cpu::LinearAlgo;
using testing::all_close;

// f32 accumulation over up to a few thousand products, judged against the output's magnitude.
constexpr double kTol = 2e-5;

struct Problem {
  Tensor x, bias;
  Weight w;
};

Problem make_problem(std::mt19937& rng, int64_t n, int64_t in, int64_t out, DType w_dtype, bool with_bias) {
  Problem p;
  p.x = testing::random_tensor({n, in}, rng);
  p.w.dense = testing::convert(testing::random_tensor({out, in}, rng), w_dtype);
  if (with_bias) p.bias = testing::random_tensor({out}, rng);
  return p;
}

Tensor run_reference(const Problem& p) {
  Tensor y = testing::nan_tensor({p.x.size(0), p.w.out_features()});
  ops::reference::linear(p.x, p.w, p.bias.defined() ? &p.bias : nullptr, y);
  return y;
}

TEST(Linear, MatchesReferenceOnOddShapes) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{67, 131}, {1, 1}, {8, 7}, {31, 64}, {256, 515}, {1000, 33}};
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (auto [in, out] : shapes) {
        for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 37, 64}) {
          const std::string what =
              fmt::format("{} {} n={} in={} out={}", ops::cpu::isa_name(isa), dtype_name(dtype), n, in, out);
          const Problem p = make_problem(rng, n, in, out, dtype, (n + in) % 2 == 0);
          Tensor y = testing::nan_tensor({n, out});
          ops::linear(p.x, p.w, p.bias.defined() ? &p.bias : nullptr, y);
          ASSERT_TRUE(all_close(y, run_reference(p), kTol, what));
        }
      }
    }
  }
}

// Batch-invariant mode: a token's output row is bit-identical whatever else shares the call
// (each row alone vs. all rows together vs. a shuffled subset), and still matches the reference.
TEST(Linear, BatchInvariantRowsAreBitIdenticalToBatchOne) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{67, 131}, {256, 515}, {896, 40}}) {
        const int64_t n = 37;
        const std::string what = fmt::format("{} {} in={} out={}", ops::cpu::isa_name(isa), dtype_name(dtype), in, out);
        const Problem p = make_problem(rng, n, in, out, dtype, in % 2 == 1);
        const Tensor* bias = p.bias.defined() ? &p.bias : nullptr;
        Tensor all = testing::nan_tensor({n, out});
        ops::linear(p.x, p.w, bias, all, ops::LinearMode::kBatchInvariant);
        ASSERT_TRUE(all_close(all, run_reference(p), kTol, what));
        for (int64_t t = 0; t < n; ++t) {
          Tensor one = testing::nan_tensor({1, out});
          ops::linear(p.x.slice(0, t, t + 1), p.w, bias, one);  // the ordinary batch-1 path
          ASSERT_EQ(std::memcmp(one.data<float>(), all.data<float>() + t * out, static_cast<size_t>(out) * 4), 0)
              << what << " token " << t;
        }
        Tensor some = testing::nan_tensor({5, out});
        ops::linear(p.x.slice(0, 9, 14), p.w, bias, some, ops::LinearMode::kBatchInvariant);
        ASSERT_EQ(std::memcmp(some.data<float>(), all.data<float>() + 9 * out, static_cast<size_t>(5 * out) * 4), 0)
            << what;
      }
    }
  }
}

TEST(Linear, BothAlgorithmsOnEveryTokenCount) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t n = 1; n <= 20; ++n) {
        const int64_t in = 129 + n, out = 97 + 3 * n;  // odd, changing with n
        const Problem p = make_problem(rng, n, in, out, dtype, n % 3 != 0);
        const Tensor expected = run_reference(p);
        for (LinearAlgo algo : {LinearAlgo::kGemv, LinearAlgo::kGemm}) {
          Tensor y = testing::nan_tensor({n, out});
          ops::cpu::LinearArgs a;
          a.x = p.x.data<float>();
          a.x_stride = in;
          a.w = p.w.dense.raw_data();
          a.w_dtype = dtype;
          a.w_stride = in;
          a.bias = p.bias.defined() ? p.bias.data<float>() : nullptr;
          a.y = y.data<float>();
          a.y_stride = out;
          a.n = n;
          a.in = in;
          a.out = out;
          ops::cpu::linear(a, algo);
          ASSERT_TRUE(all_close(y, expected, kTol,
                                fmt::format("{} {} {} n={}", ops::cpu::isa_name(isa), dtype_name(dtype),
                                            algo == LinearAlgo::kGemm ? "gemm" : "gemv", n)));
        }
      }
    }
  }
}

// Model-sized shapes (Qwen2.5-0.5B's MLP), decode and prefill token counts, more than one K block.
TEST(Linear, MatchesReferenceOnModelShapes) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{896, 4864}, {4864, 896}}) {
      for (int64_t n : {1, 3, 17}) {
        const Problem p = make_problem(rng, n, in, out, DType::kBF16, false);
        Tensor y = testing::nan_tensor({n, out});
        ops::linear(p.x, p.w, nullptr, y);
        ASSERT_TRUE(all_close(y, run_reference(p), kTol,
                              fmt::format("{} bf16 n={} in={} out={}", ops::cpu::isa_name(isa), n, in, out)));
      }
    }
  }
}

// x and y as column slices of wider buffers (the layout of a fused projection's output); columns
// outside y's view must stay untouched.
TEST(Linear, StridedViews) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (int64_t n : {1, 5, 23}) {
      const int64_t in = 70, out = 45;
      Tensor x_wide = testing::random_tensor({n, in + 13}, rng);
      Tensor x = x_wide.slice(1, 5, 5 + in);
      Weight w;
      w.dense = testing::convert(testing::random_tensor({out, in}, rng), DType::kBF16);
      Tensor y_wide = testing::nan_tensor({n, out + 20});
      Tensor y = y_wide.slice(1, 10, 10 + out);
      ops::linear(x, w, nullptr, y);
      Tensor expected = testing::nan_tensor({n, out});
      ops::reference::linear(x.contiguous(), w, nullptr, expected);
      ASSERT_TRUE(all_close(y, expected, kTol, fmt::format("{} n={}", ops::cpu::isa_name(isa), n)));
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < out + 20; ++c) {
          if (c >= 10 && c < 10 + out) continue;
          ASSERT_TRUE(std::isnan(y_wide.data<float>()[t * (out + 20) + c])) << "wrote outside y at " << t << "," << c;
        }
      }
    }
  }
}

TEST(Linear, ThreadCountsAgree) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (int threads : {1, 2, 3, 5}) {
    testing::ThreadScope ts(threads);
    for (int64_t n : {1, 4, 11, 50}) {
      const Problem p = make_problem(rng, n, 301, 203, DType::kF16, true);
      Tensor y = testing::nan_tensor({n, 203});
      ops::linear(p.x, p.w, &p.bias, y);
      ASSERT_TRUE(all_close(y, run_reference(p), kTol, fmt::format("threads={} n={}", threads, n)));
    }
  }
}

// Few outputs, many tokens: the GEMM splits tokens over threads instead of outputs.
TEST(Linear, FewOutputsManyTokens) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  testing::ThreadScope ts(3);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    const Problem p = make_problem(rng, 203, 77, 5, DType::kF32, true);
    Tensor y = testing::nan_tensor({203, 5});
    ops::linear(p.x, p.w, &p.bias, y);
    ASSERT_TRUE(all_close(y, run_reference(p), kTol, ops::cpu::isa_name(isa)));
  }
}

TEST(Linear, HalfPrecisionBiasAndEmptyInput) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    Problem p = make_problem(rng, 3, 40, 19, DType::kBF16, true);
    const Tensor bias16 = testing::convert(p.bias, DType::kBF16);
    Tensor y = testing::nan_tensor({3, 19});
    ops::linear(p.x, p.w, &bias16, y);
    p.bias = bias16.to_f32();
    EXPECT_TRUE(all_close(y, run_reference(p), kTol, "bf16 bias"));

    // in = 0: y is the bias.
    Problem e = make_problem(rng, 4, 0, 9, DType::kF32, true);
    Tensor ye = testing::nan_tensor({4, 9});
    ops::linear(e.x, e.w, &e.bias, ye);
    for (int64_t t = 0; t < 4; ++t) {
      for (int64_t o = 0; o < 9; ++o) ASSERT_EQ(ye.data<float>()[t * 9 + o], e.bias.data<float>()[o]);
    }
  }
}

TEST(Linear, ScalarIsaRunsTheReference) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  testing::IsaScope scope(Isa::kScalar);
  const Problem p = make_problem(rng, 3, 33, 21, DType::kBF16, true);
  Tensor y = testing::nan_tensor({3, 21});
  ops::linear(p.x, p.w, &p.bias, y);
  EXPECT_TRUE(testing::bitwise_equal(y, run_reference(p), "scalar isa"));
}

}  // namespace
}  // namespace tachyon
