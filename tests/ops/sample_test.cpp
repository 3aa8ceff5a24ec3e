// ops::sample and ops::adjust_logits (the device-side draw of the engine, here in their CPU form,
// which the CUDA kernels are tested against in tests/gpu) draw exactly what the Sampler draws for
// requests without top logprobs: the same token for the same uniform draw, and the same reported
// logprob, over random rows, temperatures, top-k, top-p, min-p, greedy rows, penalties over a
// token history and logit bias.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "ops/ops.h"
#include "sampling/rng.h"
#include "sampling/sample_params.h"
#include "sampling/sampler.h"
#include "test_util.h"

namespace tachyon {
namespace {

constexpr int64_t kCols = ops::kSampleParams;

void set_params(float* p, const SamplingParams& sp, double u) { fill_sample_params(p, sp, u); }

struct Config {
  float temperature, min_p;
  int top_k;
  float top_p;
};

TEST(OpsSample, DrawsWhatTheSamplerDraws) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (TACHYON_TEST_SEED=" << seed << " reproduces)");
  std::mt19937 rng(seed);
  constexpr int kVocab = 1000;
  constexpr int kRows = 64;
  const std::vector<Config> configs = {
      {1.0f, 0.0f, 0, 1.0f},   {0.7f, 0.0f, 0, 1.0f},   {1.3f, 0.05f, 0, 1.0f}, {0.0f, 0.0f, 0, 1.0f},
      {0.9f, 0.2f, 0, 1.0f},   {1.0f, 0.0f, 40, 1.0f},  {0.8f, 0.0f, 1, 1.0f},  {1.0f, 0.0f, 0, 0.9f},
      {0.6f, 0.0f, 0, 0.3f},   {1.0f, 0.0f, 50, 0.8f},  {1.2f, 0.1f, 20, 0.95f}, {1.0f, 0.0f, 999, 0.999f},
      {1.0f, 0.0f, 5000, 1.0f}};
  int mismatches = 0, total = 0;
  for (const Config& cfg : configs) {
    Tensor x = testing::random_tensor({kRows, kVocab}, rng);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= 4.0f;
    x.data<float>()[3 * kVocab + 7] = std::numeric_limits<float>::quiet_NaN();  // excluded like -inf
    // Exact ties at the top, so that a top-k or top-p boundary falls inside a run of equal values.
    for (int j = 100; j < 110; ++j) x.data<float>()[5 * kVocab + j] = 8.0f;
    SamplingParams sp;
    sp.temperature = cfg.temperature;
    sp.min_p = cfg.min_p;
    sp.top_k = cfg.top_k;
    sp.top_p = cfg.top_p;
    sp.seed = seed + static_cast<uint64_t>(total);
    Sampler sampler(sp);
    Rng draws(*sp.seed);
    Tensor params = Tensor::empty({kRows, kCols}, DType::kF32);
    for (int r = 0; r < kRows; ++r) {
      set_params(params.data<float>() + kCols * r, sp, sp.greedy() ? 0.0 : draws.next_double());
    }
    Tensor ids = Tensor::empty({kRows}, DType::kI32), lps = Tensor::empty({kRows}, DType::kF32);
    Tensor probs = Tensor::empty({kRows, kVocab}, DType::kF32);
    ops::sample(x, params, ids, lps, &probs);
    std::vector<float> q;
    for (int r = 0; r < kRows; ++r) {
      // The law of the draw is the Sampler's q (its kept set and weights).
      ASSERT_TRUE(sampler.probabilities(x.data<float>() + r * kVocab, kVocab, TokenCounts(), q).ok());
      for (int j = 0; j < kVocab; ++j) {
        ASSERT_NEAR(probs.data<float>()[r * kVocab + j], q[static_cast<size_t>(j)], 1e-6 + 1e-5 * q[static_cast<size_t>(j)])
            << "T " << cfg.temperature << " top_k " << cfg.top_k << " top_p " << cfg.top_p << " row " << r << " id " << j;
      }
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
          << "T " << cfg.temperature << " top_k " << cfg.top_k << " top_p " << cfg.top_p << " row " << r;
    }
  }
  EXPECT_LE(mismatches, 2) << "of " << total << " draws";
}

// top-k and top-p keep what they should: over many draws of one row, every drawn token is in the
// kept set and the set's most likely tokens are all drawn.
TEST(OpsSample, TruncationKeepsTheRankedPrefix) {
  constexpr int kVocab = 64;
  Tensor x = Tensor::empty({1, kVocab}, DType::kF32);
  for (int j = 0; j < kVocab; ++j) x.data<float>()[j] = static_cast<float>((j * 37) % kVocab) * 0.1f;
  // Ranks: token j has value ((37 j) mod 64) / 10; the largest is 6.3.
  const auto value = [&](int j) { return x.data<float>()[j]; };
  Rng rng(7);
  for (auto [top_k, top_p] : std::vector<std::pair<int, float>>{{5, 1.0f}, {0, 0.5f}, {10, 0.6f}}) {
    std::map<int32_t, int> seen;
    Tensor params = Tensor::empty({1, kCols}, DType::kF32);
    Tensor ids = Tensor::empty({1}, DType::kI32), lps = Tensor::empty({1}, DType::kF32);
    SamplingParams sp;
    sp.top_k = top_k;
    sp.top_p = top_p;
    for (int i = 0; i < 2000; ++i) {
      set_params(params.data<float>(), sp, rng.next_double());
      ops::sample(x, params, ids, lps);
      ++seen[ids.data<int32_t>()[0]];
    }
    // The expected kept set from the definition: rank, cut by k, then by mass.
    std::vector<int> ranked(kVocab);
    for (int j = 0; j < kVocab; ++j) ranked[j] = j;
    std::sort(ranked.begin(), ranked.end(), [&](int a, int b) { return value(a) > value(b); });
    size_t keep = top_k > 0 ? static_cast<size_t>(top_k) : ranked.size();
    double mass = 0.0;
    for (size_t i = 0; i < keep; ++i) mass += std::exp(value(ranked[i]) - 6.3f);
    double cumulative = 0.0;
    size_t nucleus = 0;
    while (nucleus < keep && cumulative < top_p * mass * (1 - 1e-6)) cumulative += std::exp(value(ranked[nucleus++]) - 6.3f);
    std::set<int32_t> kept(ranked.begin(), ranked.begin() + static_cast<ptrdiff_t>(nucleus));
    for (const auto& [token, count] : seen) EXPECT_TRUE(kept.count(token)) << "token " << token << " drawn " << count;
    EXPECT_EQ(seen.size(), kept.size()) << "top_k " << top_k << " top_p " << top_p;
  }
}

// Penalties over a history and logit bias through adjust_logits, then sample: the Sampler's draws.
TEST(OpsSample, AdjustedLogitsDrawWhatTheSamplerDraws) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (TACHYON_TEST_SEED=" << seed << " reproduces)");
  std::mt19937 rng(seed);
  constexpr int kVocab = 500;
  constexpr int kRows = 48;
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  int mismatches = 0;
  Tensor x = testing::random_tensor({kRows, kVocab}, rng);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= 3.0f;
  const Tensor original = x.to_f32();  // a copy
  Tensor params = Tensor::empty({kRows, kCols}, DType::kF32);
  std::vector<float> edits;
  std::vector<Sampler> samplers;
  for (int r = 0; r < kRows; ++r) {
    SamplingParams sp;
    sp.temperature = r % 4 == 0 ? 0.0f : 0.9f;
    sp.top_k = r % 3 == 0 ? 30 : 0;
    sp.top_p = r % 5 == 0 ? 0.85f : 1.0f;
    sp.repetition_penalty = r % 2 == 0 ? 1.3f : 1.0f;
    sp.frequency_penalty = r % 3 == 1 ? 0.5f : 0.0f;
    sp.presence_penalty = r % 3 == 2 ? -0.7f : 0.4f;
    sp.logit_bias = {{token(rng), 5.0f}, {token(rng), -100.0f}};
    if (sp.logit_bias[0].first == sp.logit_bias[1].first) sp.logit_bias.pop_back();
    sp.seed = seed + static_cast<uint64_t>(r);
    Sampler sampler(sp);
    std::vector<int32_t> prompt(20);
    for (auto& t : prompt) t = token(rng);
    sampler.set_prompt(prompt);
    for (int i = 0; i < 30; ++i) sampler.accept(token(rng) % 60);  // repeats: counts above 1
    // The edits the engine builds: one per token, bias then penalties.
    std::map<int32_t, std::array<float, 3>> per_token;
    for (const auto& [t, b] : sp.logit_bias) per_token.try_emplace(t, std::array<float, 3>{0, 1, 0}).first->second[0] += b;
    for (const auto& [t, e] : sampler.history().entries()) {
      auto& v = per_token.try_emplace(t, std::array<float, 3>{0, 1, 0}).first->second;
      if (e.in_prompt || e.output_count > 0) v[1] = sp.repetition_penalty;
      if (e.output_count > 0) v[2] = sp.frequency_penalty * static_cast<float>(e.output_count) + sp.presence_penalty;
    }
    for (const auto& [t, v] : per_token) edits.insert(edits.end(), {static_cast<float>(r), static_cast<float>(t), v[0], v[1], v[2]});
    Rng draws(*sp.seed);
    set_params(params.data<float>() + kCols * r, sp, sp.greedy() ? 0.0 : draws.next_double());
    samplers.push_back(std::move(sampler));
  }
  Tensor e = Tensor::empty({static_cast<int64_t>(edits.size()) / ops::kLogitEditColumns, ops::kLogitEditColumns},
                           DType::kF32);
  std::copy(edits.begin(), edits.end(), e.data<float>());
  ops::adjust_logits(x, e);
  Tensor ids = Tensor::empty({kRows}, DType::kI32), lps = Tensor::empty({kRows}, DType::kF32);
  ops::sample(x, params, ids, lps);
  for (int r = 0; r < kRows; ++r) {
    auto expected = samplers[static_cast<size_t>(r)].sample(original.data<float>() + r * kVocab, kVocab);
    ASSERT_TRUE(expected.ok()) << expected.status().to_string();
    if (ids.data<int32_t>()[r] != expected->token) {
      ++mismatches;
      continue;
    }
    EXPECT_NEAR(lps.data<float>()[r], expected->logprob, 1e-4 * (1.0 + std::fabs(expected->logprob))) << "row " << r;
  }
  EXPECT_LE(mismatches, 1) << "of " << kRows << " draws";
}

// mask_logits against its definition, bit by bit: the named rows lose exactly the tokens whose
// bit is clear, the other rows keep every value.
TEST(OpsMaskLogits, ClearsExactlyTheDisallowedTokens) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (TACHYON_TEST_SEED=" << seed << " reproduces)");
  std::mt19937 rng(seed);
  constexpr int64_t kVocab = 1000;  // the last word is partly used
  const Tensor original = testing::random_tensor({3, kVocab}, rng);
  Tensor x = original.to_f32();  // a copy
  const int64_t columns = ops::token_mask_columns(kVocab);
  ASSERT_EQ(columns, 1 + 32);
  Tensor masks = Tensor::empty({2, columns}, DType::kI32);
  std::vector<std::vector<bool>> allowed(2, std::vector<bool>(kVocab));
  std::bernoulli_distribution keep(0.3);
  for (int m = 0; m < 2; ++m) {
    int32_t* mask = masks.data<int32_t>() + m * columns;
    std::fill(mask, mask + columns, 0);
    mask[0] = m == 0 ? 2 : 0;
    for (int64_t t = 0; t < kVocab; ++t) {
      allowed[m][t] = keep(rng);
      if (!allowed[m][t]) continue;
      mask[1 + t / 32] = static_cast<int32_t>(static_cast<uint32_t>(mask[1 + t / 32]) | (1u << (t % 32)));
    }
  }
  ops::mask_logits(x, masks);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t t = 0; t < kVocab; ++t) {
      const float want = r == 1 || allowed[r == 2 ? 0 : 1][t] ? original.data<float>()[r * kVocab + t]
                                                              : -std::numeric_limits<float>::infinity();
      ASSERT_EQ(x.data<float>()[r * kVocab + t], want) << "row " << r << " token " << t;
    }
  }
}

TEST(OpsSample, RowsWithoutAFiniteValue) {
  Tensor x = Tensor::empty({1, 8}, DType::kF32);
  for (int i = 0; i < 8; ++i) x.data<float>()[i] = -std::numeric_limits<float>::infinity();
  Tensor params = Tensor::empty({1, kCols}, DType::kF32);
  const float p[kCols] = {1.0f, 0.0f, 0.5f, 0.0f, 3.0f, 0.9f};
  std::copy(p, p + kCols, params.data<float>());
  Tensor ids = Tensor::empty({1}, DType::kI32), lps = Tensor::empty({1}, DType::kF32);
  ops::sample(x, params, ids, lps);
  EXPECT_EQ(ids.data<int32_t>()[0], 0);
  EXPECT_EQ(lps.data<float>()[0], -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace tachyon
