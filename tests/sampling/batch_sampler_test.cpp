// BatchSampler on the host: each row drawn as its request's own Sampler would draw it, draft rows
// left to the verifier, one draw per non-greedy row, and a logits shape that disagrees is an
// error, not an abort; grammar rows masked at the right parser state, draft rows included.
// (tests/gpu/sampling_gpu_test.cpp holds the device places against these.)
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "grammar_test_util.h"
#include "sampling/batch_sampler.h"
#include "sampling/gbnf_parser.h"
#include "sampling/mixed_requests.h"
#include "test_util.h"

namespace tachyon {
namespace {

constexpr int kVocab = 300;

TEST(BatchSampler, HostRowsDrawAsTheirSamplersWouldAndLeaveDraftsToTheVerifier) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  const std::vector<SamplingParams> ps = testing::mixed_sampling_params(1000);
  std::vector<Sampler> batch = testing::samplers_with_history(ps), alone = testing::samplers_with_history(ps);
  // Entry 1 verifies a draft of 3 tokens: 4 rows.
  std::vector<SampleRow> rows;
  for (size_t i = 0; i < batch.size(); ++i) rows.push_back({&batch[i], i == 1 ? 3 : 0});
  const int64_t num_rows = 1 + 4 + 1 + 1 + 1;

  BatchSampler sampler(Device::cpu(), kVocab);
  auto place = sampler.begin(rows);
  ASSERT_TRUE(place.ok()) << place.status().to_string();
  EXPECT_EQ(*place, BatchSampler::Place::kHost);
  const Tensor logits = testing::random_tensor({num_rows, kVocab}, rng, -4.0f, 4.0f);
  sampler.logits() = logits;
  ASSERT_TRUE(sampler.finish(rows).ok());

  int row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(fmt::format("entry {}", i));
    EXPECT_EQ(sampler.host_logits(row), logits.data<float>() + row * kVocab);
    if (rows[i].num_draft == 0) {
      auto got = sampler.host_sample(i);
      auto want = alone[i].sample(logits.data<float>() + row * kVocab, kVocab);
      ASSERT_TRUE(got.ok() && want.ok());
      EXPECT_EQ(got->token, want->token);
      EXPECT_EQ(got->logprob, want->logprob);
      // One draw per non-greedy row, none for greedy ones: the streams stay in step.
      EXPECT_EQ(batch[i].rng().next_u64(), alone[i].rng().next_u64());
    }
    row += rows[i].num_rows();
  }
}

TEST(BatchSampler, LogitsOfTheWrongShapeAreAnError) {
  const std::vector<SamplingParams> ps = testing::mixed_sampling_params(1000);
  std::vector<Sampler> batch = testing::samplers_with_history(ps);
  std::vector<SampleRow> rows;
  for (Sampler& s : batch) rows.push_back({&s, 0});
  BatchSampler sampler(Device::cpu(), kVocab);
  ASSERT_TRUE(sampler.begin(rows).ok());
  sampler.logits() = Tensor::zeros({static_cast<int64_t>(rows.size()) - 1, kVocab}, DType::kF32);
  const Status s = sampler.finish(rows);
  EXPECT_EQ(s.code(), ErrorCode::kInternal) << s.to_string();
}

// Grammar rows over the byte vocabulary: each sampled row holds -inf exactly where the brute-force
// mask of its state refuses (a chain's row i after its first i tokens, a tree node's after its path),
// a row after a refused draft token is left whole, the matchers end where they began, and the drawn
// tokens are allowed ones. Rows without a grammar are untouched.
TEST(BatchSampler, GrammarRowsAreMaskedAtTheirDraftsStates) {
  using namespace grammar_test;
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  auto grammar = share(parse_gbnf(R"(root ::= [a-c] [a-c] "x" | "ab" [yz]+)").value());
  const int32_t vocab = byte_vocabulary()->vocab_size();
  GrammarMatcher chain = make_matcher(grammar), tree = make_matcher(grammar), plain = make_matcher(grammar);
  ASSERT_TRUE(plain.accept('a').ok());
  const std::vector<int32_t> chain_draft = {'a', 'b', 'q', 'y'};  // 'q' is refused: the rows after it are never read
  const std::vector<int32_t> tree_draft = {'a', 'b', 'c', 'y', 'x'};
  const std::vector<int32_t> tree_parents = {-1, 0, -1, 1, 3};  // "a", "ab", "c", "aby", "abyx" (refused)
  std::vector<SamplingParams> ps(4);
  for (SamplingParams& p : ps) p.seed = rng();
  ps[2].temperature = 0.0f;
  std::vector<Sampler> samplers;
  for (const SamplingParams& p : ps) samplers.emplace_back(p);
  std::vector<SampleRow> rows(4);
  for (size_t i = 0; i < 4; ++i) rows[i].sampler = &samplers[i];
  rows[1].num_draft = 4, rows[1].grammar = &chain, rows[1].draft = chain_draft;
  rows[2].num_draft = 5, rows[2].grammar = &tree, rows[2].draft = tree_draft, rows[2].draft_parents = tree_parents;
  rows[3].grammar = &plain;
  const int64_t num_rows = 1 + 5 + 6 + 1;

  BatchSampler sampler(Device::cpu(), vocab);
  ASSERT_TRUE(sampler.begin(rows).ok());
  const Tensor logits = testing::random_tensor({num_rows, vocab}, rng, -4.0f, 4.0f);
  sampler.logits() = logits.to_f32();
  ASSERT_TRUE(sampler.finish(rows).ok());

  // The expected mask of each row: the state after `prefix`, or none (every token kept).
  const auto state_mask = [&](const std::string& prefix) {
    GrammarMatcher m = make_matcher(grammar);
    EXPECT_TRUE(m.accept_bytes(prefix).ok()) << prefix;
    return brute_force_mask(m);
  };
  const std::vector<std::optional<std::string>> expected = {
      std::nullopt,                                                    // entry 0: no grammar
      std::string(""), std::string("a"), std::string("ab"), std::nullopt, std::nullopt,  // the chain
      std::string(""), std::string("a"), std::string("ab"), std::string("c"), std::string("aby"), std::nullopt,
      std::string("a")};                                               // entry 3
  ASSERT_EQ(static_cast<int64_t>(expected.size()), num_rows);
  for (int64_t r = 0; r < num_rows; ++r) {
    SCOPED_TRACE(fmt::format("row {}", r));
    const float* got = sampler.host_logits(static_cast<int>(r));
    const float* raw = logits.data<float>() + r * vocab;
    std::vector<uint32_t> mask(grammar_mask_words(vocab), ~0u);
    if (expected[static_cast<size_t>(r)]) mask = state_mask(*expected[static_cast<size_t>(r)]);
    for (int32_t t = 0; t < vocab; ++t) {
      const float want = grammar_mask_test(mask, t) ? raw[t] : -std::numeric_limits<float>::infinity();
      ASSERT_EQ(got[t], want) << "token " << t;
    }
  }
  for (GrammarMatcher* m : {&chain, &tree}) EXPECT_EQ(mask_of(*m), state_mask(""));
  EXPECT_EQ(mask_of(plain), state_mask("a"));
  for (size_t i : {size_t{0}, size_t{3}}) {
    EXPECT_TRUE(sampler.row_status(i).ok());
    auto got = sampler.host_sample(i);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    if (i == 3) EXPECT_TRUE(grammar_mask_test(state_mask("a"), got->token)) << got->token;
  }
}

// A grammar that allows no token at all is that row's error, not the step's; its rows stay whole.
TEST(BatchSampler, AGrammarRowWithNoTokenIsThatRowsError) {
  using namespace grammar_test;
  auto grammar = share(parse_gbnf(R"(root ::= "ab")").value());
  // A vocabulary that cannot spell "b": nothing may follow "a".
  std::vector<std::string> tokens = {"a", "c", "</s>"};
  const int32_t eos[] = {2};
  GrammarMatcher stuck = make_matcher(grammar, TokenTrie::build(tokens, eos).value());
  ASSERT_TRUE(stuck.accept(0).ok());
  SamplingParams p;
  p.seed = 7;
  Sampler s1(p), s2(p);
  std::vector<SampleRow> rows(2);
  rows[0].sampler = &s1;
  rows[1].sampler = &s2;
  rows[1].grammar = &stuck;
  BatchSampler sampler(Device::cpu(), 3);
  ASSERT_TRUE(sampler.begin(rows).ok());
  sampler.logits() = Tensor::zeros({2, 3}, DType::kF32);
  ASSERT_TRUE(sampler.finish(rows).ok());
  EXPECT_TRUE(sampler.row_status(0).ok());
  EXPECT_FALSE(sampler.row_status(1).ok());
  EXPECT_TRUE(sampler.host_sample(0).ok());
  for (int t = 0; t < 3; ++t) EXPECT_EQ(sampler.host_logits(1)[t], 0.0f);
}

}  // namespace
}  // namespace tachyon
