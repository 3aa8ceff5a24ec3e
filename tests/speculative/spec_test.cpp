// Speculative-decoding building blocks: lossless verification (greedy: exactly the target's
// tokens; sampled: exactly the target's distribution, checked by chi-square over many seeded
// trials), n-gram lookup, and the dynamic draft-length controller.
#include <algorithm>
#include <utility>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "sampling/gbnf_parser.h"
#include "sampling/grammar_test_util.h"
#include "speculative/draft_length.h"
#include "speculative/proposer.h"
#include "speculative/ngram_proposer.h"
#include "speculative/rejection_sampler.h"
#include "speculative/verifier.h"
#include "test_util.h"

namespace tachyon {
namespace {

std::vector<float> random_distribution(std::mt19937& rng, int vocab, double sparsity) {
  std::vector<float> p(static_cast<size_t>(vocab));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double sum = 0.0;
  for (auto& x : p) {
    x = u(rng) < sparsity ? 0.0f : static_cast<float>(std::pow(u(rng), 3.0));
    sum += x;
  }
  if (sum == 0.0) {
    p[0] = 1.0f;
    sum = 1.0;
  }
  for (auto& x : p) x = static_cast<float>(x / sum);
  return p;
}

// Pearson's chi-square p-value of token counts (n draws) against the distribution p; a token of
// probability 0 must never have been drawn.
double chi2(const std::vector<int64_t>& counts, const std::vector<float>& p, int64_t n) {
  // Bins of at least kMinExpected expected draws: far in the tail (the p-value 1e-6 the tests
  // ask for) a count's Poisson tail is heavier than the chi-square's normal approximation unless
  // the bin is large (at 5 expected, 17 draws has probability 2e-5, where chi-square says 8e-8;
  // with 5 as the threshold the test failed once in ~500 runs). Tokens expected fewer times are
  // pooled, and a pool still below it joins the largest bin.
  constexpr double kMinExpected = 100.0;
  std::vector<std::pair<double, double>> bins;  // (expected, observed)
  double pooled_e = 0.0, pooled_count = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * static_cast<double>(n);
    if (e == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has target probability 0";
      continue;
    }
    if (e < kMinExpected) {
      pooled_e += e;
      pooled_count += static_cast<double>(counts[i]);
      continue;
    }
    bins.emplace_back(e, static_cast<double>(counts[i]));
  }
  if (pooled_e >= kMinExpected || (pooled_e > 0.0 && bins.empty())) {
    bins.emplace_back(pooled_e, pooled_count);
  } else if (pooled_e > 0.0) {
    auto largest = std::max_element(bins.begin(), bins.end());
    largest->first += pooled_e;
    largest->second += pooled_count;
  }
  double stat = 0.0;
  for (const auto& [e, count] : bins) stat += (count - e) * (count - e) / e;
  return testing::chi_square_p_value(stat, std::max(static_cast<int>(bins.size()) - 1, 1));
}

TEST(VerifyGreedy, KeepsTheLongestAgreeingPrefixAndOneTargetToken) {
  EXPECT_EQ(verify_greedy(std::vector<int32_t>{5, 6, 7}, std::vector<int32_t>{5, 6, 9, 1}).tokens,
            (std::vector<int32_t>{5, 6, 9}));
  const VerifyResult all = verify_greedy(std::vector<int32_t>{5, 6}, std::vector<int32_t>{5, 6, 8});
  EXPECT_EQ(all.num_accepted, 2);
  EXPECT_EQ(all.tokens, (std::vector<int32_t>{5, 6, 8}));  // the bonus token
  const VerifyResult none = verify_greedy(std::vector<int32_t>{4}, std::vector<int32_t>{5, 6});
  EXPECT_EQ(none.num_accepted, 0);
  EXPECT_EQ(none.tokens, (std::vector<int32_t>{5}));
  EXPECT_EQ(verify_greedy({}, std::vector<int32_t>{3}).tokens, (std::vector<int32_t>{3}));
}

// The first emitted token of verify_sampled is distributed as p[0], whatever q is (including a
// one-hot draft, and q with mass where p has none); the second, given the first was an accepted
// draft, as p[1]. Checked by Pearson's chi-square over 200k trials at p-value 1e-6.
TEST(VerifySampled, EmittedTokensHaveTheTargetDistribution) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr int kVocab = 12;
  constexpr int kTrials = 200000;
  for (int config = 0; config < 4; ++config) {
    const auto p0 = random_distribution(rng, kVocab, config == 2 ? 0.5 : 0.0);
    const auto p1 = random_distribution(rng, kVocab, 0.3);
    const auto p2 = random_distribution(rng, kVocab, 0.0);
    const auto q0 = random_distribution(rng, kVocab, config == 3 ? 0.6 : 0.1);
    const auto q1 = random_distribution(rng, kVocab, 0.0);
    std::vector<float> target(p0);
    target.insert(target.end(), p1.begin(), p1.end());
    target.insert(target.end(), p2.begin(), p2.end());
    std::vector<float> draft(q0);
    draft.insert(draft.end(), q1.begin(), q1.end());
    const bool one_hot = config == 1;
    std::discrete_distribution<int32_t> dq0(q0.begin(), q0.end()), dq1(q1.begin(), q1.end());
    Rng r(seed + static_cast<uint64_t>(config));
    std::mt19937 draft_rng(seed ^ 0x5bd1e995u);
    std::vector<int64_t> first(kVocab, 0), second(kVocab, 0);
    int64_t second_total = 0, accepted_first = 0;
    for (int t = 0; t < kTrials; ++t) {
      // One-hot drafts: a fixed guess (token 3), as an n-gram proposer would make.
      const std::vector<int32_t> d = one_hot ? std::vector<int32_t>{3, 4}
                                             : std::vector<int32_t>{dq0(draft_rng), dq1(draft_rng)};
      const VerifyResult v = verify_sampled(d, one_hot ? nullptr : draft.data(), target.data(), kVocab, r);
      ASSERT_EQ(v.tokens.size(), static_cast<size_t>(v.num_accepted + 1));
      ++first[static_cast<size_t>(v.tokens[0])];
      if (v.num_accepted >= 1) {
        ++accepted_first;
        ++second[static_cast<size_t>(v.tokens[1])];
        ++second_total;
      }
    }
    EXPECT_GT(chi2(first, p0, kTrials), 1e-6) << "config " << config;
    if (second_total > 1000) {
      EXPECT_GT(chi2(second, p1, second_total), 1e-6) << "config " << config;
    }
    // The first draft is accepted with probability sum_t min(p0[t], q0[t]) (p0[3] for the
    // one-hot guess): the observed rate must agree (5 sigma of a binomial).
    double accept_prob = 0.0;
    for (int t = 0; t < kVocab; ++t) {
      accept_prob += one_hot ? (t == 3 ? p0[3] : 0.0f) : std::min(p0[static_cast<size_t>(t)], q0[static_cast<size_t>(t)]);
    }
    const double sigma = std::sqrt(kTrials * accept_prob * (1.0 - accept_prob)) + 1.0;
    EXPECT_NEAR(static_cast<double>(accepted_first), kTrials * accept_prob, 5.0 * sigma) << "config " << config;
  }
}

TEST(VerifySampled, IdenticalDistributionsAcceptEverything) {
  std::mt19937 rng(7);
  const auto p = random_distribution(rng, 9, 0.0);
  std::vector<float> target(p), draft(p);
  for (int i = 0; i < 3; ++i) {
    target.insert(target.end(), p.begin(), p.end());
    draft.insert(draft.end(), p.begin(), p.end());
  }
  Rng r(1);
  for (int t = 0; t < 1000; ++t) {
    const VerifyResult v = verify_sampled(std::vector<int32_t>{1, 2, 3}, draft.data(), target.data(), 9, r);
    ASSERT_EQ(v.num_accepted, 3);  // p/q == 1 everywhere
    ASSERT_EQ(v.tokens.size(), 4u);
  }
}

TEST(NgramProposer, ProposesWhatFollowedTheLongestRecentMatch) {
  NgramProposer p({1, 3, 4096});
  // "... 7 8 9 | 1 2 ... 7 8 9" → after the suffix 7 8 9 came 1 2 3.
  const std::vector<int32_t> t = {4, 7, 8, 9, 1, 2, 3, 5, 6, 7, 8, 9};
  EXPECT_EQ(p.propose(t, 3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(p.propose(t, 10), (std::vector<int32_t>{1, 2, 3, 5, 6, 7, 8, 9}));  // up to the end
  EXPECT_TRUE(p.propose(t, 0).empty());
  // The most recent occurrence wins: 1 → (2 then 5) → 5.
  EXPECT_EQ(p.propose(std::vector<int32_t>{1, 2, 0, 1, 5, 0, 1}, 1), (std::vector<int32_t>{5}));
  // Longer matches beat shorter ones: suffix "2 1" occurred once, followed by 9.
  EXPECT_EQ(p.propose(std::vector<int32_t>{2, 1, 9, 3, 1, 4, 2, 1}, 1), (std::vector<int32_t>{9}));
  EXPECT_TRUE(p.propose(std::vector<int32_t>{1, 2, 3, 4}, 2).empty());  // nothing recurs
  EXPECT_TRUE(p.propose(std::vector<int32_t>{1}, 2).empty());
  NgramProposer two({2, 3, 4096});
  EXPECT_TRUE(two.propose(std::vector<int32_t>{5, 1, 6, 1}, 2).empty());  // only 1-gram repeats
  NgramProposer near({1, 2, 3});
  EXPECT_TRUE(near.propose(std::vector<int32_t>{1, 9, 9, 9, 9, 1}, 2).empty());  // beyond the lookback
}

// The n-gram tree: every earlier occurrence of the longest recurring suffix, then of shorter
// ones, merged into a trie, the most recent match first, cut at the node budget.
TEST(NgramProposer, TreesMergeTheContinuationsOfEveryMatch) {
  NgramProposer p({1, 3, 4096});
  std::vector<int32_t> nodes, parents;
  // "1 2" occurred at 4 (then 7 8 3) and at 0 (then 9 4 1).
  const std::vector<int32_t> t = {1, 2, 9, 4, 1, 2, 7, 8, 3, 1, 2};
  p.propose_tree(t, 3, 16, nodes, parents);
  EXPECT_EQ(nodes, (std::vector<int32_t>{7, 8, 3, 9, 4, 1}));
  EXPECT_EQ(parents, (std::vector<int32_t>{-1, 0, 1, -1, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(nodes.begin(), nodes.begin() + 3), p.propose(t, 3));  // the first branch
  p.propose_tree(t, 3, 4, nodes, parents);  // the budget cuts the second branch
  EXPECT_EQ(nodes, (std::vector<int32_t>{7, 8, 3, 9}));
  EXPECT_EQ(parents, (std::vector<int32_t>{-1, 0, 1, -1}));
  // Shared prefixes are one node: both continuations start with 7.
  p.propose_tree(std::vector<int32_t>{1, 2, 7, 5, 1, 2, 7, 8, 3, 1, 2}, 3, 16, nodes, parents);
  EXPECT_EQ(nodes, (std::vector<int32_t>{7, 8, 3, 5, 1}));
  EXPECT_EQ(parents, (std::vector<int32_t>{-1, 0, 1, 0, 3}));
  // Shorter suffixes add their matches after the longer ones: "3 1 2" never recurred, "1 2" and
  // "2" lead to the same places, "x 2" is new only through the 1-gram.
  p.propose_tree(std::vector<int32_t>{6, 2, 5, 1, 2, 7, 3, 1, 2}, 2, 16, nodes, parents);
  EXPECT_EQ(nodes, (std::vector<int32_t>{7, 3, 5, 1}));
  EXPECT_EQ(parents, (std::vector<int32_t>{-1, 0, -1, 2}));
  p.propose_tree(std::vector<int32_t>{1, 2, 3, 4}, 2, 16, nodes, parents);
  EXPECT_TRUE(nodes.empty() && parents.empty());  // nothing recurs
}

// Rows of log-probabilities: logits of which the Sampler's softmax at temperature 1 gives p.
std::vector<float> log_rows(const std::vector<std::vector<float>>& ps) {
  std::vector<float> out;
  for (const auto& p : ps) {
    for (float x : p) out.push_back(x > 0.0f ? std::log(x) : -std::numeric_limits<float>::infinity());
  }
  return out;
}

// Greedy tree walks: from the root, the child holding the row's argmax, until none does; the
// emitted tokens are the path's and the target's token after it.
TEST(VerifyTree, GreedyFollowsTheTargetsArgmaxThroughTheTree) {
  constexpr int kVocab = 8;
  const auto peaked = [](int token) {
    std::vector<float> p(kVocab, 0.02f);
    p[static_cast<size_t>(token)] = 1.0f - 0.02f * (kVocab - 1);
    return p;
  };
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler sampler(greedy);
  // Branches 3 -> 5 and 4 -> 6 (nodes 0, 1 and 2, 3); rows: root, then after each node.
  const std::vector<int32_t> draft = {3, 5, 4, 6}, parents = {-1, 0, -1, 2};
  auto v = verify_draft_tree(draft, parents, log_rows({peaked(4), peaked(0), peaked(0), peaked(6), peaked(1)}).data(),
                             kVocab, sampler);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->path, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(v->num_accepted, 2);
  ASSERT_EQ(v->tokens.size(), 3u);
  EXPECT_EQ(v->tokens[0].token, 4);
  EXPECT_EQ(v->tokens[1].token, 6);
  EXPECT_EQ(v->tokens[2].token, 1);  // the bonus token after node 3
  // No child holds the root's argmax: one token, nothing accepted.
  v = verify_draft_tree(draft, parents, log_rows({peaked(7), peaked(0), peaked(0), peaked(0), peaked(0)}).data(),
                        kVocab, sampler);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->path.empty());
  ASSERT_EQ(v->tokens.size(), 1u);
  EXPECT_EQ(v->tokens[0].token, 7);
  // Malformed trees are errors.
  const std::vector<float> flat = log_rows({peaked(0), peaked(0), peaked(0), peaked(0), peaked(0)});
  EXPECT_FALSE(verify_draft_tree(draft, std::vector<int32_t>{-1, 1, -1, 2}, flat.data(), kVocab, sampler).ok());
  EXPECT_FALSE(verify_draft_tree(draft, std::vector<int32_t>{-1, 0}, nullptr, kVocab, sampler).ok());
}

// A chain given as a tree verifies as the chain does, greedily: same tokens, logprobs and path.
TEST(VerifyTree, AChainVerifiesAsVerifyDraft) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr int kVocab = 16;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = 3;
  for (int trial = 0; trial < 200; ++trial) {
    const int k = std::uniform_int_distribution<int>(1, 6)(rng);
    std::vector<std::vector<float>> rows;
    std::vector<int32_t> draft, parents;
    for (int i = 0; i <= k; ++i) rows.push_back(random_distribution(rng, kVocab, 0.0));
    for (int i = 0; i < k; ++i) {
      // Mostly the row's argmax, so that chains are often accepted far.
      const auto& p = rows[static_cast<size_t>(i)];
      const int32_t best = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
      draft.push_back(std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? (best + 1) % kVocab : best);
      parents.push_back(i - 1);
    }
    const std::vector<float> logits = log_rows(rows);
    Sampler a(greedy), b(greedy);
    auto chain = verify_draft(draft, nullptr, logits.data(), kVocab, a);
    auto tree = verify_draft_tree(draft, parents, logits.data(), kVocab, b);
    ASSERT_TRUE(chain.ok() && tree.ok());
    EXPECT_EQ(tree->path, chain->path);
    ASSERT_EQ(tree->tokens.size(), chain->tokens.size());
    for (size_t i = 0; i < tree->tokens.size(); ++i) {
      EXPECT_EQ(tree->tokens[i].token, chain->tokens[i].token);
      EXPECT_FLOAT_EQ(tree->tokens[i].logprob, chain->tokens[i].logprob);
      EXPECT_EQ(tree->tokens[i].top_logprobs.size(), 3u);
    }
  }
}

// Greedy verification from each row's argmax and logprob alone (as the device hands them over)
// gives what the walk over the full logits gives, for chains and random trees.
TEST(VerifyTree, GreedyRowsEqualTheWalkOverLogits) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr int kVocab = 12;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = std::uniform_int_distribution<int>(0, 10)(rng);
    const bool chain = trial % 3 == 0;
    std::vector<std::vector<float>> rows;
    for (int i = 0; i <= n; ++i) rows.push_back(random_distribution(rng, kVocab, 0.2));
    std::vector<int32_t> draft, parents;
    for (int i = 0; i < n; ++i) {
      parents.push_back(chain ? i - 1 : std::uniform_int_distribution<int>(-1, i - 1)(rng));
      // Often the parent row's argmax, so that walks go deep.
      const auto& p = rows[static_cast<size_t>(parents.back() + 1)];
      const int32_t best = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
      draft.push_back(std::uniform_int_distribution<int>(0, 2)(rng) == 0
                          ? std::uniform_int_distribution<int32_t>(0, kVocab - 1)(rng)
                          : best);
    }
    const std::vector<float> logits = log_rows(rows);
    std::vector<int32_t> ids;
    std::vector<float> logprobs;
    for (const auto& p : rows) {
      const int32_t best = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
      double sum = 0.0;
      for (float x : p) sum += x;
      ids.push_back(best);
      logprobs.push_back(static_cast<float>(std::log(p[static_cast<size_t>(best)] / sum)));
    }
    Sampler sampler(greedy);
    auto walked = verify_draft_tree(draft, parents, logits.data(), kVocab, sampler);
    auto from_ids = verify_greedy_rows(draft, chain ? std::vector<int32_t>{} : parents, ids, logprobs);
    ASSERT_TRUE(walked.ok() && from_ids.ok()) << from_ids.status().to_string();
    EXPECT_EQ(from_ids->path, walked->path);
    ASSERT_EQ(from_ids->tokens.size(), walked->tokens.size());
    for (size_t i = 0; i < walked->tokens.size(); ++i) {
      EXPECT_EQ(from_ids->tokens[i].token, walked->tokens[i].token);
      EXPECT_NEAR(from_ids->tokens[i].logprob, walked->tokens[i].logprob, 1e-4);
    }
  }
  EXPECT_FALSE(verify_greedy_rows(std::vector<int32_t>{1, 2}, {}, std::vector<int32_t>{1, 2},
                                  std::vector<float>{0.0f, 0.0f}).ok());  // one row short
}

// Sampling through a tree is lossless: with three candidates under the root (one with a child of
// its own), the first emitted token follows the root row's p and, when it is the candidate with a
// child, the second follows that child's row — chi-square over 200k seeded trials; candidates
// the target gives no mass are never emitted.
TEST(VerifyTree, SampledTokensHaveTheTargetDistribution) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr int kVocab = 10;
  constexpr int kTrials = 200000;
  for (int config = 0; config < 3; ++config) {
    std::vector<std::vector<float>> rows;
    for (int i = 0; i < 5; ++i) rows.push_back(random_distribution(rng, kVocab, config == 1 ? 0.4 : 0.0));
    // Root candidates 2, 5 (child 7 at node 3) and 8; config 2 makes one of them impossible.
    if (config == 2) {
      rows[0][8] = 0.0f;
      double sum = 0.0;
      for (float x : rows[0]) sum += x;
      for (float& x : rows[0]) x = static_cast<float>(x / sum);
    }
    const std::vector<int32_t> draft = {2, 5, 8, 7}, parents = {-1, -1, -1, 1};
    const std::vector<float> logits = log_rows(rows);
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.seed = seed + static_cast<uint64_t>(config);
    Sampler sampler(sp);
    std::vector<int64_t> first(kVocab, 0), second(kVocab, 0);
    int64_t second_total = 0;
    for (int t = 0; t < kTrials; ++t) {
      auto v = verify_draft_tree(draft, parents, logits.data(), kVocab, sampler);
      ASSERT_TRUE(v.ok()) << v.status().to_string();
      ASSERT_EQ(v->tokens.size(), v->path.size() + 1);
      ++first[static_cast<size_t>(v->tokens[0].token)];
      if (v->tokens[0].token == 5) {
        // Node 1 accepted: the next token follows row 2 (after node 1), whatever the draft says.
        ASSERT_EQ(v->path[0], 1);
        ++second[static_cast<size_t>(v->tokens[1].token)];
        ++second_total;
      }
    }
    EXPECT_GT(chi2(first, rows[0], kTrials), 1e-6) << "config " << config;
    if (second_total > 1000) EXPECT_GT(chi2(second, rows[2], second_total), 1e-6) << "config " << config;
  }
}

TEST(DraftLength, FollowsAcceptanceAndBatchSize) {
  DraftLengthOptions o;
  o.k_max = 8;
  DraftLengthController good(o);
  for (int i = 0; i < 20; ++i) good.update(4, 4);
  const int k_alone = good.next_k(1);
  EXPECT_GE(k_alone, 4);
  EXPECT_LE(k_alone, 8);
  // A batch that is already compute-bound gains less from long drafts.
  EXPECT_LE(good.next_k(256), k_alone);
  DraftLengthController bad(o);
  for (int i = 0; i < 40; ++i) bad.update(4, 0);
  EXPECT_EQ(bad.next_k(1), 0);
  EXPECT_FALSE(bad.speculating());
  // Off: probes with K = 1 every probe_interval steps; a good probe turns it back on.
  int probes = 0;
  for (int i = 0; i < o.probe_interval; ++i) probes += bad.next_k(1) == 1;
  EXPECT_EQ(probes, 1);
  for (int i = 0; i < 10; ++i) bad.update(1, 1);
  EXPECT_TRUE(bad.speculating());
  EXPECT_GE(bad.next_k(1), 1);
  DraftLengthOptions fixed = o;
  fixed.fixed_k = 3;
  DraftLengthController f(fixed);
  f.update(4, 0);
  EXPECT_EQ(f.next_k(64), 3);
  // More acceptance never asks for fewer tokens (batch fixed).
  int last = 0;
  for (double a : {0.1, 0.3, 0.5, 0.7, 0.9}) {
    DraftLengthOptions oa = o;
    oa.initial_acceptance = a;
    DraftLengthController c(oa);
    const int k = c.next_k(1);
    EXPECT_GE(k, last) << "acceptance " << a;
    last = k;
  }
}

// seed(): a new controller starts from a population's rates (its depth reached too), not from the
// initial guess; once it has learnt from a step, seeding changes nothing.
TEST(DraftLength, SeedStartsFromThePopulationsRates) {
  DraftLengthOptions o;
  o.k_max = 8;
  DraftLengthController poor(o), rich(o);
  for (int i = 0; i < 40; ++i) {
    poor.update(4, 0);
    rich.update(6, 6);
  }
  DraftLengthController fresh(o);
  const int k_guess = fresh.next_k(1);
  EXPECT_GE(k_guess, 2);  // the initial guess, 0.6 per position
  DraftLengthController a(o), b(o);
  a.seed(poor);
  EXPECT_EQ(a.updates(), 0);
  EXPECT_NEAR(a.acceptance(0), poor.acceptance(0), 1e-12);
  EXPECT_EQ(a.next_k(1), 0);  // what the population measured: drafts do not pay
  b.seed(rich);
  EXPECT_NEAR(b.acceptance(7), rich.acceptance(7), 1e-12);
  EXPECT_GT(b.next_k(1), k_guess);
  DraftLengthController c(o);
  c.update(4, 4);
  const double before = c.acceptance(0);
  c.seed(poor);
  EXPECT_EQ(c.acceptance(0), before);
  EXPECT_EQ(c.updates(), 1);
}

// Acceptance that comes in stretches (a draft right at its first position is right for the whole
// draft; wrong otherwise, half the time each): an average rate of a half would ask for K of 2 or 3,
// while the rates per position (first 0.5, the others ~1) show that long drafts pay.
TEST(DraftLength, AcceptanceInStretchesAsksForLongDrafts) {
  DraftLengthOptions o;
  o.k_max = 8;
  DraftLengthController c(o);
  int k = c.next_k(1);
  for (int step = 0; step < 40; ++step) {
    ASSERT_GE(k, 1);
    c.update(k, step % 2 == 0 ? k : 0);
    k = c.next_k(1);
  }
  EXPECT_NEAR(c.acceptance(0), 0.5, 0.15);
  EXPECT_GT(c.acceptance(3), 0.95);
  EXPECT_EQ(k, 8);
  // Independent positions at a half each ask for a short draft.
  DraftLengthController flat(o);
  for (int step = 0; step < 40; ++step) {
    const int kk = std::max(1, flat.next_k(1));
    flat.update(kk, step % 2 == 0 ? 1 : 0);  // every other step the first accepted, the second not
  }
  EXPECT_LE(flat.next_k(1), 3);
}

// The measured gate: plain steps first, then speculating ones to compare; it keeps whichever is
// faster at that batch size, re-measures the other for min_samples steps every refresh interval
// (doubling while the loser stays the loser), follows a change of the measured rates, and keeps
// batch-size classes apart.
TEST(SpeculationGate, KeepsSpeculatingOnlyWhereItIsMeasuredFaster) {
  SpeculationGateOptions o;
  o.min_samples = 2;
  o.refresh_interval = 8;
  o.ema_weight = 1.0;  // the newest step decides
  SpeculationGate g(o);
  // Batch 32: speculating steps emit 96 tokens in 16 ms, plain ones 32 tokens in 6 ms.
  const auto step = [&](SpeculationGate& gate, int batch, double spec_rate, double plain_rate) {
    const bool spec = gate.allow(batch);
    gate.record(batch, spec, 100, 100.0 / (spec ? spec_rate : plain_rate));
    return spec;
  };
  EXPECT_FALSE(step(g, 32, 6000.0, 5333.0));  // plain first
  EXPECT_FALSE(step(g, 32, 6000.0, 5333.0));
  EXPECT_TRUE(step(g, 32, 6000.0, 5333.0));   // then speculation, to measure it
  EXPECT_TRUE(step(g, 32, 6000.0, 5333.0));
  EXPECT_TRUE(step(g, 32, 6000.0, 5333.0));   // speculation measured faster: it stays on
  EXPECT_DOUBLE_EQ(g.rate(32, true), 6000.0);
  EXPECT_DOUBLE_EQ(g.rate(40, false), 5333.0);  // 32..63 is one class
  int spec_steps = 0, steps = 0;
  for (; steps < 32; ++steps) spec_steps += step(g, 32, 3000.0, 5333.0);  // it turns slower
  // Speculation now loses: it runs only in re-measurements, min_samples steps at growing
  // intervals (plus the step that saw the change).
  EXPECT_LE(spec_steps, 1 + o.min_samples * 3);
  EXPECT_GE(spec_steps, o.min_samples);
  // Over a long run the re-measurements back off to max_refresh_interval.
  SpeculationGateOptions lo = o;
  lo.max_refresh_interval = 64;
  SpeculationGate slow(lo);
  int long_spec = 0;
  for (int i = 0; i < 1000; ++i) long_spec += step(slow, 32, 3000.0, 5333.0);
  EXPECT_LE(long_spec, 2 + o.min_samples * (4 + 1000 / 64));  // against ~250 at a fixed interval of 8
  EXPECT_GE(long_spec, o.min_samples * (1000 / 64) / 2);
  // And come back to the first interval when speculation wins again.
  int after = 0;
  for (int i = 0; i < 200; ++i) after += step(slow, 32, 9000.0, 5333.0);
  EXPECT_GE(after, 200 - 64 - 2 * o.min_samples - 8);
  // A clear loss ends the first measurement of speculation early: 2 speculating steps, not 8.
  SpeculationGateOptions eo;
  eo.min_samples = 8;
  eo.ema_weight = 1.0;
  SpeculationGate early(eo);
  int first = 0;
  for (int i = 0; i < 40; ++i) first += step(early, 8, 2000.0, 5333.0);
  EXPECT_EQ(first, eo.early_samples);
  // A larger class then starts plain (batch 8 lost), speculating only at its first refresh.
  int larger = 0;
  for (int i = 0; i < eo.refresh_interval; ++i) larger += step(early, 32, 2000.0, 5333.0);
  EXPECT_EQ(larger, 0);
  EXPECT_EQ(early.rate(32, true), 0.0);
  for (int i = 0; i < eo.min_samples; ++i) larger += step(early, 32, 2000.0, 5333.0);
  EXPECT_EQ(larger, eo.min_samples);
  // Rates are tokens over seconds of the weighted sums: a one-token step weighs what it costs.
  SpeculationGateOptions w;
  w.ema_weight = 0.5;
  SpeculationGate h(w);
  h.record(8, true, 1, 0.004);
  h.record(8, true, 9, 0.006);
  EXPECT_NEAR(h.rate(8, true), (0.5 * 1 + 9) / (0.5 * 0.004 + 0.006), 1e-9);
  // Batch 4 is its own class and starts over, plain first (only a smaller class's loss carries).
  EXPECT_FALSE(g.allow(4));
  EXPECT_EQ(g.rate(4, true), 0.0);
  // Batch 1 is below min_batch: always allowed, never measured.
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(g.allow(1));
    g.record(1, i % 2 == 0, 1, 1.0);
  }
  EXPECT_EQ(g.rate(1, true), 0.0);
}

// Drafts trimmed to a grammar: a one-hot chain is cut before its first refused token, a tree keeps
// the nodes whose whole path the grammar takes (parents renumbered), a draft with q stays whole, and
// the matcher ends where it began.
TEST(TrimToGrammar, DropsWhatTheGrammarRefuses) {
  using namespace grammar_test;
  auto grammar = share(parse_gbnf(R"(root ::= [a-c] [a-c] "x" | "ab" [yz]+)").value());
  GrammarMatcher m = make_matcher(grammar);
  ASSERT_TRUE(m.accept('a').ok());
  const std::vector<uint32_t> before = mask_of(m);

  Draft chain{{'b', 'y', 'q', 'z'}, {}, {}};
  trim_to_grammar(chain, m);
  EXPECT_EQ(chain.tokens, (std::vector<int32_t>{'b', 'y'}));
  Draft refused{{'q', 'b'}, {}, {}};
  trim_to_grammar(refused, m);
  EXPECT_TRUE(refused.tokens.empty());
  Draft with_q{{'q', 'b'}, std::vector<float>(2 * 258, 1.0f / 258), {}};
  trim_to_grammar(with_q, m);
  EXPECT_EQ(with_q.tokens, (std::vector<int32_t>{'q', 'b'}));

  // After "a": "b" (ok), "bx" (ok), "q" (no), "qb" (no: under q), "c" (ok), "by" (ok), "cy" (no).
  Draft tree{{'b', 'x', 'q', 'b', 'c', 'y', 'y'}, {}, {-1, 0, -1, 2, -1, 0, 4}};
  trim_to_grammar(tree, m);
  EXPECT_EQ(tree.tokens, (std::vector<int32_t>{'b', 'x', 'c', 'y'}));
  EXPECT_EQ(tree.parents, (std::vector<int32_t>{-1, 0, -1, 0}));
  EXPECT_EQ(mask_of(m), before);
}

}  // namespace
}  // namespace tachyon
