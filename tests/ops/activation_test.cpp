// silu_mul, softmax and embedding == the scalar reference.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/cpu/reference.h"
#include "ops/ops.h"
#include "ops_test_util.h"

namespace tachyon {
namespace {

using ops::cpu::Isa;
using testing::all_close;

TEST(SiluMul, MatchesReference) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (int64_t d : {1, 9, 64, 131, 4864}) {
      for (int64_t n : {1, 6, 21}) {
        // Wide range: the exp must hold from deep negative (silu -> 0) to large positive inputs.
        const Tensor gate = testing::random_tensor({n, d}, rng, -30.0f, 30.0f);
        const Tensor up = testing::random_tensor({n, d}, rng);
        Tensor out = testing::nan_tensor({n, d});
        ops::silu_mul(gate, up, out);
        Tensor expected = testing::nan_tensor({n, d});
        ops::reference::silu_mul(gate, up, expected);
        // Per element (no cancellation): a few f32 ulps.
        ASSERT_TRUE(all_close(out, expected, 1e-6, fmt::format("{} n={} d={}", ops::cpu::isa_name(isa), n, d)));
      }
    }
  }
}

// gate and up as the two halves of a fused gate_up projection output.
TEST(SiluMul, HalvesOfFusedGateUp) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    const int64_t n = 5, ff = 75;
    const Tensor gate_up = testing::random_tensor({n, 2 * ff}, rng, -8.0f, 8.0f);
    Tensor out = testing::nan_tensor({n, ff});
    ops::silu_mul(gate_up.slice(1, 0, ff), gate_up.slice(1, ff, 2 * ff), out);
    Tensor expected = testing::nan_tensor({n, ff});
    ops::reference::silu_mul(gate_up.slice(1, 0, ff).contiguous(), gate_up.slice(1, ff, 2 * ff).contiguous(), expected);
    ASSERT_TRUE(all_close(out, expected, 1e-6, ops::cpu::isa_name(isa)));
  }
}

TEST(Softmax, MatchesReference) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (int64_t d : {1, 2, 7, 8, 100, 1000, 151936}) {
      for (int64_t n : {1, 3}) {
        Tensor x = testing::random_tensor({n, d}, rng, -40.0f, 40.0f);
        // Row t shifted by 500 t (softmax must subtract the row max) and one masked (-inf) entry.
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t i = 0; i < d; ++i) x.data<float>()[t * d + i] += 500.0f * static_cast<float>(t);
          if (d > 2) x.data<float>()[t * d + d / 2] = -INFINITY;
        }
        Tensor expected = x.contiguous();
        ops::reference::softmax(expected);
        ops::softmax(x);
        ASSERT_TRUE(all_close(x, expected, 1e-5, fmt::format("{} n={} d={}", ops::cpu::isa_name(isa), n, d)));
        for (int64_t t = 0; t < n && d > 2; ++t) ASSERT_EQ(x.data<float>()[t * d + d / 2], 0.0f);
      }
    }
  }
}

TEST(Embedding, MatchesReferenceForEveryTableDtype) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int64_t d : {1, 12, 67, 896}) {
        const int64_t vocab = 301, n = 13;
        const Tensor table = testing::convert(testing::random_tensor({vocab, d}, rng), dtype);
        Tensor ids = testing::random_i32({n}, rng, 0, vocab - 1);
        ids.data<int32_t>()[0] = 0;
        ids.data<int32_t>()[n - 1] = static_cast<int32_t>(vocab - 1);
        Tensor out = testing::nan_tensor({n, d});
        ops::embedding(table, ids, out);
        Tensor expected = testing::nan_tensor({n, d});
        ops::reference::embedding(table, ids, expected);
        // A pure conversion: identical bits.
        ASSERT_TRUE(testing::bitwise_equal(out, expected,
                                           fmt::format("{} {} d={}", ops::cpu::isa_name(isa), dtype_name(dtype), d)));
      }
    }
  }
}

}  // namespace
}  // namespace tachyon
