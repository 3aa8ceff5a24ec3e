// rms_norm and add_rms_norm == the scalar reference, on odd widths, 2-D and 3-D (per-head)
// layouts, strided views, half-precision weights.
#include <gtest/gtest.h>

#include <random>

#include "ops/cpu/reference.h"
#include "ops/ops.h"
#include "ops_test_util.h"

namespace tachyon {
namespace {

using ops::cpu::Isa;
using testing::all_close;

constexpr double kTol = 1e-5;

TEST(RmsNorm, MatchesReference) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (DType w_dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t d : {1, 7, 64, 67, 896, 4097}) {
        for (int64_t n : {1, 5, 33}) {
          const std::string what = fmt::format("{} w={} n={} d={}", ops::cpu::isa_name(isa), dtype_name(w_dtype), n, d);
          const Tensor x = testing::random_tensor({n, d}, rng, -3.0f, 3.0f);
          const Tensor w = testing::convert(testing::random_tensor({d}, rng, 0.5f, 1.5f), w_dtype);
          Tensor y = testing::nan_tensor({n, d});
          ops::rms_norm(x, w, 1e-6f, y);
          Tensor expected = testing::nan_tensor({n, d});
          ops::reference::rms_norm(x, w.to_f32(), 1e-6f, expected);
          ASSERT_TRUE(all_close(y, expected, kTol, what));
        }
      }
    }
  }
}

// Per-head norm (Qwen3 q_norm/k_norm) on the q part of a fused QKV output: [n, heads, head_dim]
// with a token stride wider than heads * head_dim; in place.
TEST(RmsNorm, PerHeadOnStridedViewInPlace) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    const int64_t n = 7, heads = 3, kv_heads = 1, head_dim = 40;
    Tensor qkv = testing::random_tensor({n, heads + 2 * kv_heads, head_dim}, rng);
    Tensor q = qkv.slice(1, 0, heads);
    const Tensor before = qkv.contiguous();
    const Tensor w = testing::random_tensor({head_dim}, rng);
    Tensor expected = testing::nan_tensor({n, heads, head_dim});
    ops::reference::rms_norm(q.contiguous(), w, 1e-5f, expected);
    ops::rms_norm(q, w, 1e-5f, q);
    ASSERT_TRUE(all_close(q, expected, kTol, ops::cpu::isa_name(isa)));
    ASSERT_TRUE(testing::bitwise_equal(qkv.slice(1, heads, heads + 2 * kv_heads),
                                       before.slice(1, heads, heads + 2 * kv_heads), "k/v untouched"));
  }
}

TEST(AddRmsNorm, MatchesReference) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (int64_t d : {3, 16, 67, 896, 1031}) {
      for (int64_t n : {1, 4, 19}) {
        const std::string what = fmt::format("{} n={} d={}", ops::cpu::isa_name(isa), n, d);
        const Tensor residual0 = testing::random_tensor({n, d}, rng, -2.0f, 2.0f);
        const Tensor x = testing::random_tensor({n, d}, rng);
        const Tensor w = testing::random_tensor({d}, rng);
        Tensor residual = residual0.contiguous();
        Tensor y = testing::nan_tensor({n, d});
        ops::add_rms_norm(residual, x, w, 1e-6f, y);
        Tensor expected_residual = residual0.contiguous();
        Tensor expected = testing::nan_tensor({n, d});
        ops::reference::add_rms_norm(expected_residual, x, w, 1e-6f, expected);
        // The residual add is one f32 addition per element in every path: identical bits.
        ASSERT_TRUE(testing::bitwise_equal(residual, expected_residual, what + " residual"));
        ASSERT_TRUE(all_close(y, expected, kTol, what));
      }
    }
  }
}

}  // namespace
}  // namespace tachyon
