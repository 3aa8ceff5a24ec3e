// tools/upscale: the bundled models written at larger shapes compute their own function. The
// script runs under a python3 that has numpy (skipped where there is none); the engine loads both
// models and compares their logits on held-out prose: exactly (up to summation order) for f32
// output with an untied, padded LM head, up to the softmax's shift with a tied one, and up to
// bf16 rounding (the query weights absorb sqrt(hd_large / hd_small)) for bf16 output, where greedy
// continuations must agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "../quant/quant_test_util.h"
#include "core/mapped_file.h"
#include "model/model_loader.h"
#include "speculative/head_proposer.h"
#include "../speculative/random_heads.h"
#include "test_util.h"

namespace tachyon {
namespace {

// A python3 with numpy, or nothing.
std::optional<std::string> python_with_numpy() {
  for (const char* python : {"/usr/bin/python3", "python3"}) {
    const std::string probe = std::string(python) + " -c 'import numpy' > /dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return std::string(python);
  }
  return std::nullopt;
}

// Runs tools/upscale on models/SRC with `args` into a fresh directory; returns it (empty on failure).
std::string upscale(const std::string& python, const std::string& src, const std::string& args) {
  const std::string out = testing::scratch_dir("upscale");
  const std::string cmd = python + " " + testing::source_dir() + "/tools/upscale --src " + testing::source_dir() +
                          "/models/" + src + " --out " + out + " " + args + " > " + out + "/log.txt 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    auto log = read_text_file(out + "/log.txt");
    ADD_FAILURE() << cmd << ": " << (log.ok() ? *log : "no log");
    return "";
  }
  return out;
}

std::vector<int32_t> prose_tokens(const LoadedModel& m, size_t n) {
  auto text = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
  EXPECT_TRUE(text.ok());
  std::vector<int32_t> ids = m.tokenizer->encode(text->substr(2000, 4000));
  ids.resize(std::min(ids.size(), n));
  return ids;
}

struct Comparison {
  double max_rel_error = 0.0;    // over positions: max |a - b| over the real tokens / max |b|
  double max_padded = -INFINITY; // the largest padded token's logit minus the row's largest real one
};

// big [t, vocab_big] against small [t, vocab_small]: the real tokens' logits (less each row's
// mean difference when `shift`: a tied head adds the same amount to every real token) and how far
// below the real ones the padded tokens stay.
Comparison compare(const Tensor& big, const Tensor& small, bool shift) {
  const int64_t t = small.size(0), vs = small.size(1), vb = big.size(1);
  Comparison c;
  for (int64_t i = 0; i < t; ++i) {
    const float* a = big.data<float>() + i * vb;
    const float* b = small.data<float>() + i * vs;
    double offset = 0.0;
    if (shift) {
      for (int64_t v = 0; v < vs; ++v) offset += (static_cast<double>(a[v]) - b[v]) / static_cast<double>(vs);
    }
    double diff = 0.0, scale = 0.0, real_max = -INFINITY;
    for (int64_t v = 0; v < vs; ++v) {
      diff = std::max(diff, std::fabs(a[v] - offset - b[v]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[v])));
      real_max = std::max(real_max, static_cast<double>(a[v]));
    }
    c.max_rel_error = std::max(c.max_rel_error, diff / scale);
    for (int64_t v = vs; v < vb; ++v) c.max_padded = std::max(c.max_padded, a[v] - real_max);
  }
  return c;
}

// compare() of the two models' logits over 48 tokens of held-out prose.
Comparison compare_on_prose(const LoadedModel& big, const LoadedModel& small, bool shift) {
  const std::vector<int32_t> ids = prose_tokens(small, 48);
  return compare(testing::prompt_logits(*big.model, ids), testing::prompt_logits(*small.model, ids), shift);
}

TEST(Upscale, F32TargetWithAnUntiedPaddedHeadGivesTheSameLogits) {
  const auto python = python_with_numpy();
  if (!python) GTEST_SKIP() << "no python3 with numpy (scripts/setup installs python3-numpy)";
  const std::string dir = upscale(*python, "tachyon-demo",
                                  "--hidden 512 --layers 12 --heads 8 --kv-heads 4 --head-dim 128 --intermediate 1024 "
                                  "--vocab 8256 --tie no --dtype f32");
  ASSERT_FALSE(dir.empty());
  const LoadedModel small = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo");
  const LoadedModel big = testing::load_model_or_fail(dir);
  ASSERT_EQ(big.model->config().hidden_size, 512);
  ASSERT_EQ(big.model->config().num_layers, 12);
  ASSERT_EQ(big.model->config().vocab_size, 8256);
  const Comparison c = compare_on_prose(big, small, /*shift=*/false);
  std::printf("f32, untied: max relative logit error %.3g, padded tokens at most %.1f from the best\n",
              c.max_rel_error, c.max_padded);
  // Measured (2026-12-06): 1.31e-06, padded tokens 1.2e6 below the best. The same function; only
  // the order of f32 sums differs.
  EXPECT_LT(c.max_rel_error, 1e-5);
  EXPECT_LT(c.max_padded, -1000.0);
}

TEST(Upscale, TiedHeadShiftsEveryRealLogitAlike) {
  const auto python = python_with_numpy();
  if (!python) GTEST_SKIP() << "no python3 with numpy (scripts/setup installs python3-numpy)";
  const std::string dir = upscale(*python, "tachyon-demo-draft",
                                  "--hidden 256 --layers 9 --heads 8 --kv-heads 4 --head-dim 64 --intermediate 768 "
                                  "--vocab 8256 --tie yes --dtype f32");
  ASSERT_FALSE(dir.empty());
  const LoadedModel small = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo-draft");
  const LoadedModel big = testing::load_model_or_fail(dir);
  const Comparison c = compare_on_prose(big, small, /*shift=*/true);
  std::printf("f32, tied: max relative logit error after the shift %.3g, padded tokens at most %.1f from the best\n",
              c.max_rel_error, c.max_padded);
  EXPECT_LT(c.max_rel_error, 1e-5);
  EXPECT_LT(c.max_padded, -1000.0);
}

TEST(Upscale, Bf16TargetAgreesUpToRoundingAndInGreedy) {
  const auto python = python_with_numpy();
  if (!python) GTEST_SKIP() << "no python3 with numpy (scripts/setup installs python3-numpy)";
  const std::string dir = upscale(*python, "tachyon-demo",
                                  "--hidden 512 --layers 12 --heads 8 --kv-heads 4 --head-dim 128 --intermediate 1024 "
                                  "--vocab 8256 --tie no");
  ASSERT_FALSE(dir.empty());
  const LoadedModel small = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo");
  const LoadedModel big = testing::load_model_or_fail(dir);
  const Comparison c = compare_on_prose(big, small, /*shift=*/false);
  int same = 0, total = 0;
  for (const char* prompt : {"Once upon a time", "func (b *Buffer) Len() int {", "The king said to his people"}) {
    const std::vector<int32_t> p = small.tokenizer->encode(prompt);
    const std::vector<int32_t> a = testing::greedy_ids(*small.model, p, 32), b = testing::greedy_ids(*big.model, p, 32);
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    same += static_cast<int>(n);
    total += static_cast<int>(a.size());
  }
  std::printf("bf16: max relative logit error %.3g; greedy agrees for %d of %d tokens\n", c.max_rel_error, same, total);
  // Measured (2026-12-06): 0.00589 and 96 of 96. Each query weight is rounded once more (times
  // sqrt(2)): 2^-9 of itself at most.
  EXPECT_LT(c.max_rel_error, 2e-2);
  EXPECT_LT(c.max_padded, -1000.0);
  EXPECT_GE(same * 10, total * 9);
}

TEST(Upscale, RefusesAShapeThatCannotHoldTheModel) {
  const auto python = python_with_numpy();
  if (!python) GTEST_SKIP() << "no python3 with numpy (scripts/setup installs python3-numpy)";
  const std::string out = testing::scratch_dir("upscale-refused");
  for (const std::string args : {"--hidden 128", "--hidden 512 --head-dim 96", "--hidden 512 --layers 4"}) {
    const std::string cmd = *python + " " + testing::source_dir() + "/tools/upscale --src " + testing::source_dir() +
                            "/models/tachyon-demo --out " + out + " " + args + " > /dev/null 2>&1";
    EXPECT_NE(std::system(cmd.c_str()), 0) << args;
  }
}

// --spec-heads: proposal heads written for the small target and padded by the script propose on the
// large target what they propose on the small one, from each model's own features.
TEST(Upscale, PaddedHeadsProposeWhatTheyProposedOnTheSmallTarget) {
  const auto python = python_with_numpy();
  if (!python) GTEST_SKIP() << "no python3 with numpy (scripts/setup installs python3-numpy)";
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  testing::HeadsSpec spec;
  spec.num_heads = 4;
  spec.scale = 0.2f;
  const std::string heads_path =
      testing::write_heads("small", testing::random_heads(spec, rng), testing::heads_metadata(spec));
  const std::string dir = upscale(*python, "tachyon-demo",
                                  "--hidden 512 --layers 12 --heads 8 --kv-heads 4 --head-dim 128 --intermediate 1024 "
                                  "--vocab 8256 --tie no --dtype f32 --spec-heads " + heads_path);
  ASSERT_FALSE(dir.empty());
  const LoadedModel small = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo");
  const LoadedModel big = testing::load_model_or_fail(dir);
  auto heads_small = load_spec_heads(heads_path, small.model->config(), Device::cpu());
  auto heads_big = load_spec_heads(dir + "/heads.safetensors", big.model->config(), Device::cpu());
  ASSERT_TRUE(heads_small.ok()) << heads_small.status().to_string();
  ASSERT_TRUE(heads_big.ok()) << heads_big.status().to_string();
  EXPECT_EQ(heads_big->hidden_size, 512);
  EXPECT_EQ(heads_big->vocab_size, 8256);
  HeadProposer p_small(*small.model, std::make_shared<const SpecHeads>(std::move(heads_small).value()));
  HeadProposer p_big(*big.model, std::make_shared<const SpecHeads>(std::move(heads_big).value()));

  const std::vector<int32_t> ids = prose_tokens(small, 48);
  Tensor h_small, h_big;
  testing::prompt_logits(*small.model, ids, &h_small);
  testing::prompt_logits(*big.model, ids, &h_big);
  ASSERT_EQ(h_big.size(1), 512);
  // Position i's row produced token i + 1, which the heads continue.
  std::vector<DraftRequest> requests;
  for (int i = 8; i + 1 < static_cast<int>(ids.size()); ++i) {
    const uint64_t id = static_cast<uint64_t>(i);
    p_small.observe_features(id, std::span<const float>(h_small.data<float>() + i * h_small.size(1),
                                                        static_cast<size_t>(h_small.size(1))));
    p_big.observe_features(id, std::span<const float>(h_big.data<float>() + i * h_big.size(1),
                                                      static_cast<size_t>(h_big.size(1))));
    requests.push_back({id, std::span<const int32_t>(ids.data(), static_cast<size_t>(i) + 2), 4, nullptr, 0});
  }
  std::vector<Draft> d_small, d_big;
  ASSERT_TRUE(p_small.propose(requests, d_small).ok());
  ASSERT_TRUE(p_big.propose(requests, d_big).ok());
  ASSERT_EQ(d_small.size(), requests.size());
  ASSERT_EQ(d_big.size(), requests.size());
  int same = 0, total = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    ASSERT_EQ(d_small[r].tokens.size(), 4u);
    ASSERT_EQ(d_big[r].tokens.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_LT(d_big[r].tokens[i], 8192) << "a padded token was proposed";
      // a chain: past the first difference the inputs differ
      if (d_big[r].tokens[i] != d_small[r].tokens[i]) break;
      ++same;
    }
    total += 4;
  }
  std::printf("padded heads: %d of %d proposals as on the small target\n", same, total);
  // Measured (2026-12-07): all of them. The constant dimension enters the heads' norms by a
  // relative 1e-4 or less, which moves a pick only at a near tie.
  EXPECT_GE(same * 100, total * 95);
  for (const DraftRequest& r : requests) {
    p_small.release(r.id);
    p_big.release(r.id);
  }
}

}  // namespace
}  // namespace tachyon
