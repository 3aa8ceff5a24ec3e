// Mixture-of-experts ops on the CPU: the router's ranking rules (ties, NaN, renormalisation) and
// the grouped expert MLPs of the SIMD backend against the scalar reference, for dense and packed
// experts, with tokens spread over the experts, piled on one, or leaving some with none.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/cpu/reference.h"
#include "ops/ops.h"
#include "ops_test_util.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace tachyon {
namespace {

using testing::random_tensor;

Tensor ids_tensor(const std::vector<int32_t>& v, int64_t k) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size()) / k, k}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

TEST(MoeRoute, RanksByLogitTiesToTheLowerIdNanLast) {
  // Row 0: 3 and 1 tie at 2.0, 3 later; row 1: a NaN never ranks above a number.
  Tensor logits = Tensor::empty({2, 5}, DType::kF32);
  const float nan = std::nanf("");
  const float rows[2][5] = {{0.5f, 2.0f, -1.0f, 2.0f, 1.0f}, {nan, -3.0f, nan, -2.0f, -4.0f}};
  std::copy(&rows[0][0], &rows[0][0] + 10, logits.data<float>());
  Tensor ids = Tensor::empty({2, 3}, DType::kI32), w = Tensor::empty({2, 3}, DType::kF32);
  ops::moe_route(logits, /*normalize=*/false, ids, w);
  EXPECT_EQ(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + 3), (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(ids.data<int32_t>() + 3, ids.data<int32_t>() + 6), (std::vector<int32_t>{3, 1, 4}));
  // Unnormalised: softmax over all five of row 0.
  double sum = 0.0;
  for (float v : rows[0]) sum += std::exp(static_cast<double>(v) - 2.0);
  EXPECT_NEAR(w.data<float>()[0], 1.0 / sum, 1e-6);
  EXPECT_NEAR(w.data<float>()[1], 1.0 / sum, 1e-6);
  EXPECT_NEAR(w.data<float>()[2], std::exp(-1.0) / sum, 1e-6);
}

TEST(MoeRoute, NormalizedWeightsSumToOne) {
  std::mt19937 rng(testing::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << rng());
  for (const int64_t e : {4, 60, 128}) {
    for (const int64_t k : {1, 2, 8}) {
      if (k > e) continue;
      Tensor logits = random_tensor({7, e}, rng, -4.0f, 4.0f);
      Tensor ids = Tensor::empty({7, k}, DType::kI32), w = Tensor::empty({7, k}, DType::kF32);
      ops::moe_route(logits, /*normalize=*/true, ids, w);
      for (int64_t t = 0; t < 7; ++t) {
        double s = 0.0;
        for (int64_t j = 0; j < k; ++j) {
          s += w.data<float>()[t * k + j];
          if (j > 0) {  // descending logits
            EXPECT_GE(logits.data<float>()[t * e + ids.data<int32_t>()[t * k + j - 1]],
                      logits.data<float>()[t * e + ids.data<int32_t>()[t * k + j]]);
          }
        }
        EXPECT_NEAR(s, 1.0, 1e-5) << "experts " << e << " k " << k;
      }
    }
  }
}

// Experts of `format` ("f32", "bf16", "int4", "int8"), random.
ops::MoeExperts make_experts(int ne, int64_t hidden, int64_t inter, const std::string& format, std::mt19937& rng) {
  ops::MoeExperts x;
  x.num_experts = ne;
  x.inter = inter;
  const auto weight = [&](int64_t rows, int64_t cols) {
    Tensor w = random_tensor({rows, cols}, rng, -0.2f, 0.2f);
    Weight out;
    if (format == "bf16") {
      out.dense = testing::convert(w, DType::kBF16);
    } else if (format == "int4") {
      out.quant = std::make_shared<QuantWeight>(std::move(quantize_int4_group(w, 32)).value());
    } else if (format == "int8") {
      out.quant = std::make_shared<QuantWeight>(std::move(quantize_int8_channel(w)).value());
    } else {
      out.dense = w;
    }
    return out;
  };
  x.gate = weight(ne * inter, hidden);
  x.up = weight(ne * inter, hidden);
  x.down = weight(ne * hidden, inter);
  return x;
}

// Per row: the largest difference relative to the row's largest reference value.
void expect_close(const Tensor& got, const Tensor& want, double tolerance, const std::string& what) {
  const int64_t n = got.size(0), d = got.size(1);
  for (int64_t t = 0; t < n; ++t) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      const double a = got.data<float>()[t * d + i], b = want.data<float>()[t * d + i];
      diff = std::isnan(a) ? INFINITY : std::max(diff, std::abs(a - b));
      scale = std::max(scale, std::abs(b));
    }
    EXPECT_LE(diff, tolerance * std::max(scale, 1e-30)) << what << " token " << t;
  }
}

TEST(MoeExperts, SimdMatchesReference) {
  std::mt19937 rng(testing::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << rng());
  const int64_t hidden = 64, inter = 96;
  for (const std::string format : {"f32", "bf16", "int4", "int8"}) {
    for (const int ne : {8, 33}) {
      const ops::MoeExperts experts = make_experts(ne, hidden, inter, format, rng);
      for (const int64_t n : {1, 3, 40}) {
        for (const int64_t k : {1, 2, 8}) {
          SCOPED_TRACE(::testing::Message() << format << " experts " << ne << " tokens " << n << " k " << k);
          Tensor x = random_tensor({n, hidden}, rng);
          Tensor logits = random_tensor({n, ne}, rng, -3.0f, 3.0f);
          Tensor ids = Tensor::empty({n, k}, DType::kI32), w = Tensor::empty({n, k}, DType::kF32);
          ops::moe_route(logits, true, ids, w);
          Tensor want = Tensor::empty({n, hidden}, DType::kF32);
          ops::reference::moe_experts(x, experts, ids, w, want);
          for (const auto isa : testing::simd_isas()) {
            testing::IsaScope scope(isa);
            {
              // Packed experts with the activations unrounded: the reference's value to f32
              // reassociation, so the grouping and un-permutation are exact.
              const testing::ExactQuantizedLinears exact;
              Tensor got = testing::nan_tensor({n, hidden});
              ops::moe_experts(x, experts, ids, w, got);
              expect_close(got, want, 2e-5, ops::cpu::isa_name(isa));
            }
            // The integer dot products round each activation to int8 (per block), through two
            // products: 1.9e-2 to 2.9e-2 of the row's largest value seen.
            Tensor got = testing::nan_tensor({n, hidden});
            ops::moe_experts(x, experts, ids, w, got);
            expect_close(got, want, format == "int4" || format == "int8" ? 6e-2 : 2e-5, ops::cpu::isa_name(isa));
          }
        }
      }
    }
  }
}

// Routing edge cases: every token on one expert, experts that receive no token, one token whose
// chosen experts lie at both ends of the stack, a large batch.
TEST(MoeExperts, EdgeRoutingsMatchReference) {
  std::mt19937 rng(testing::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << rng());
  const int ne = 16;
  const int64_t hidden = 32, inter = 64;
  const ops::MoeExperts experts = make_experts(ne, hidden, inter, "f32", rng);
  struct Case {
    const char* name;
    int64_t n, k;
    std::vector<int32_t> ids;
  };
  std::vector<Case> cases = {{"all on expert 5", 6, 1, std::vector<int32_t>(6, 5)},
                             {"first and last experts only", 4, 2, {0, 15, 15, 0, 0, 15, 15, 0}},
                             {"one token, both ends", 1, 4, {15, 0, 7, 8}}};
  Case big{"512 tokens", 512, 2, {}};
  for (int64_t i = 0; i < 512 * 2; ++i) big.ids.push_back(static_cast<int32_t>((i * 7 + i / 3) % ne));
  cases.push_back(big);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = random_tensor({c.n, hidden}, rng);
    const Tensor ids = ids_tensor(c.ids, c.k);
    Tensor w = random_tensor({c.n, c.k}, rng, 0.0f, 1.0f);
    Tensor want = Tensor::empty({c.n, hidden}, DType::kF32);
    ops::reference::moe_experts(x, experts, ids, w, want);
    Tensor got = testing::nan_tensor({c.n, hidden});
    ops::moe_experts(x, experts, ids, w, got);
    expect_close(got, want, 2e-5, "simd");
  }
}

// Batch-invariant mode: a token's result is bit for bit the same alone and batched with tokens
// that share its experts.
TEST(MoeExperts, BatchInvariantRowsEqualAlone) {
  std::mt19937 rng(testing::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << rng());
  const int ne = 8;
  const int64_t hidden = 64, inter = 96, n = 24, k = 2;
  for (const std::string format : {"bf16", "int4"}) {
    const ops::MoeExperts experts = make_experts(ne, hidden, inter, format, rng);
    Tensor x = random_tensor({n, hidden}, rng);
    Tensor logits = random_tensor({n, ne}, rng, -3.0f, 3.0f);
    Tensor ids = Tensor::empty({n, k}, DType::kI32), w = Tensor::empty({n, k}, DType::kF32);
    ops::moe_route(logits, true, ids, w);
    Tensor all = Tensor::empty({n, hidden}, DType::kF32);
    ops::moe_experts(x, experts, ids, w, all, ops::LinearMode::kBatchInvariant);
    for (int64_t t = 0; t < n; ++t) {
      Tensor one = Tensor::empty({1, hidden}, DType::kF32);
      ops::moe_experts(x.slice(0, t, t + 1), experts, ids.slice(0, t, t + 1), w.slice(0, t, t + 1), one,
                       ops::LinearMode::kBatchInvariant);
      for (int64_t i = 0; i < hidden; ++i) {
        ASSERT_EQ(one.data<float>()[i], all.data<float>()[t * hidden + i]) << format << " token " << t << " dim " << i;
      }
    }
  }
}

// The routing counters: slots per expert, distinct experts, calls, added to what they held.
TEST(MoeExperts, CountsTokensPerExpert) {
  std::mt19937 rng(testing::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << rng());
  const int ne = 6;
  const ops::MoeExperts experts = make_experts(ne, 16, 32, "f32", rng);
  Tensor counts = Tensor::zeros({ne + 2}, DType::kI64);
  counts.data<int64_t>()[2] = 100;  // added to, never reset
  for (int call = 0; call < 2; ++call) {
    const Tensor ids = ids_tensor({0, 2, 2, 5, 0, 2}, 2);  // 3 tokens: experts 0, 2, 5 chosen
    Tensor w = random_tensor({3, 2}, rng, 0.0f, 1.0f), x = random_tensor({3, 16}, rng);
    Tensor y = Tensor::empty({3, 16}, DType::kF32);
    ops::moe_experts(x, experts, ids, w, y, ops::LinearMode::kFastest, &counts);
  }
  const std::vector<int64_t> want = {4, 0, 106, 0, 0, 2, 6, 2};
  EXPECT_EQ(std::vector<int64_t>(counts.data<int64_t>(), counts.data<int64_t>() + ne + 2), want);
}

TEST(MoeExperts, SigmoidGatedAdd) {
  std::mt19937 rng(testing::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << rng());
  Tensor y = random_tensor({5, 16}, rng), x = random_tensor({5, 16}, rng), g = random_tensor({5, 1}, rng, -4.f, 4.f);
  Tensor want = y.contiguous();
  ops::reference::add_sigmoid_gated(want, x, g);
  ops::add_sigmoid_gated(y, x, g);
  expect_close(y, want, 1e-6, "add_sigmoid_gated");
}

}  // namespace
}  // namespace tachyon
