// ops::sample (the device-side draw of the engine, here its CPU form, which the CUDA kernel is
// tested against in tests/gpu) draws exactly what the Sampler draws for requests with
// temperature and min-p only: the same token for the same uniform draw, and the same reported
// logprob, over random rows, temperatures, min-p values and greedy rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "ops/ops.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "test_util.h"

namespace tachyon {
namespace {

TEST(OpsSample, DrawsWhatTheSamplerDraws) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (TACHYON_TEST_SEED=" << seed << " reproduces)");
  std::mt19937 rng(seed);
  constexpr int kVocab = 1000;
  constexpr int kRows = 64;
  const std::vector<std::pair<float, float>> configs = {{1.0f, 0.0f}, {0.7f, 0.0f}, {1.3f, 0.05f},
                                                        {0.0f, 0.0f}, {0.9f, 0.2f}};
  int mismatches = 0, total = 0;
  for (auto [temperature, min_p] : configs) {
    Tensor x = testing::random_tensor({kRows, kVocab}, rng);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= 4.0f;
    x.data<float>()[3 * kVocab + 7] = std::numeric_limits<float>::quiet_NaN();  // excluded like -inf
    SamplingParams sp;
    sp.temperature = temperature;
    sp.min_p = min_p;
    sp.seed = seed + static_cast<uint64_t>(total);
    Sampler sampler(sp);
    Rng draws(*sp.seed);
    Tensor params = Tensor::empty({kRows, 4}, DType::kF32);
    for (int r = 0; r < kRows; ++r) {
      const double u = temperature == 0.0f ? 0.0 : draws.next_double();
      float* p = params.data<float>() + 4 * r;
      p[0] = temperature;
      p[1] = min_p;
      p[2] = static_cast<float>(u);
      p[3] = static_cast<float>(u - static_cast<double>(p[2]));
    }
    Tensor ids = Tensor::empty({kRows}, DType::kI32), lps = Tensor::empty({kRows}, DType::kF32);
    ops::sample(x, params, ids, lps);
    for (int r = 0; r < kRows; ++r) {
      auto expected = sampler.sample(x.data<float>() + r * kVocab, kVocab);
      ASSERT_TRUE(expected.ok()) << expected.status().to_string();
      ++total;
      // The two compute exp() differently in the last bits: a draw that lands within rounding of
      // a boundary between two tokens may pick the neighbour; anything else must agree.
      if (ids.data<int32_t>()[r] != expected->token) {
        ++mismatches;
        continue;
      }
      EXPECT_NEAR(lps.data<float>()[r], expected->logprob, 1e-4 * (1.0 + std::fabs(expected->logprob)))
          << "T " << temperature << " min_p " << min_p << " row " << r;
    }
  }
  EXPECT_LE(mismatches, 1) << "of " << total << " draws";
}

TEST(OpsSample, RowsWithoutAFiniteValue) {
  Tensor x = Tensor::empty({1, 8}, DType::kF32);
  for (int i = 0; i < 8; ++i) x.data<float>()[i] = -std::numeric_limits<float>::infinity();
  Tensor params = Tensor::empty({1, 4}, DType::kF32);
  const float p[4] = {1.0f, 0.0f, 0.5f, 0.0f};
  std::copy(p, p + 4, params.data<float>());
  Tensor ids = Tensor::empty({1}, DType::kI32), lps = Tensor::empty({1}, DType::kF32);
  ops::sample(x, params, ids, lps);
  EXPECT_EQ(ids.data<int32_t>()[0], 0);
  EXPECT_EQ(lps.data<float>()[0], -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace tachyon
