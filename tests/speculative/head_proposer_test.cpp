// Proposal heads over the target's features (speculative/spec_heads.h, head_proposer.h): the file
// is checked on load; the proposer's drafts follow a plain double-precision reference of the heads;
// greedy decoding with heads equals plain greedy decoding, token for token, and returns every block.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "core/mapped_file.h"
#include "engine/engine.h"
#include "io/safetensors_writer.h"
#include "model/model_loader.h"
#include "speculative/head_proposer.h"
#include "random_heads.h"
#include "test_util.h"

namespace tachyon {
namespace {

using testing::HeadsSpec;
using testing::heads_metadata;
using testing::random_heads;
using testing::write_heads;

class HeadProposerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_ = new LoadedModel(testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo"));
  }
  static void TearDownTestSuite() {
    delete target_;
    target_ = nullptr;
  }
  // Random heads for the target, written to a file named `name` and loaded on the host.
  static std::shared_ptr<const SpecHeads> random_loaded(const HeadsSpec& spec, std::mt19937& rng,
                                                        const std::string& name) {
    auto heads = load_spec_heads(write_heads(name, random_heads(spec, rng), heads_metadata(spec)),
                                 target_->model->config(), Device::cpu());
    EXPECT_TRUE(heads.ok()) << heads.status().to_string();
    return heads.ok() ? std::make_shared<const SpecHeads>(std::move(heads).value()) : nullptr;
  }
  static LoadedModel* target_;
};
LoadedModel* HeadProposerTest::target_ = nullptr;

TEST_F(HeadProposerTest, TheFileIsCheckedOnLoad) {
  std::mt19937 rng(testing::fresh_seed());
  const HeadsSpec spec;
  const ModelConfig& c = target_->model->config();
  const auto good = random_heads(spec, rng);
  auto loaded = load_spec_heads(write_heads("good", good, heads_metadata(spec)), c, Device::cpu());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->heads.size(), 3u);

  const auto expect_error = [&](const std::string& name, std::vector<NamedTensor> tensors,
                                std::map<std::string, std::string> meta, const std::string& needle) {
    auto r = load_spec_heads(write_heads(name, tensors, meta), c, Device::cpu());
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << name << ": " << r.status().to_string();
    EXPECT_NE(r.status().to_string().find(name), std::string::npos) << "the error names the file";
  };
  HeadsSpec other = spec;
  other.hidden = 128;
  expect_error("other_target", random_heads(other, rng), heads_metadata(other), "hidden size 128");
  auto meta = heads_metadata(spec);
  meta["format"] = "pt";
  expect_error("not_heads", good, meta, "not a heads file");
  meta = heads_metadata(spec);
  meta["num_heads"] = "4";
  expect_error("missing", good, meta, "heads.3.in_norm.weight is missing");
  meta = heads_metadata(spec);
  meta["version"] = "2";
  expect_error("version", good, meta, "version 2");
  auto bad = good;
  bad[1].tensor = testing::random_tensor({2 * spec.ffn, spec.hidden + 1}, rng);
  expect_error("shape", bad, heads_metadata(spec), "has shape");
  bad = good;  // tensors share storage: the NaN goes into a fresh one
  bad[2].tensor = testing::random_tensor({2 * spec.ffn, spec.hidden}, rng);
  bad[2].tensor.data<float>()[7] = std::nanf("");
  expect_error("nan", bad, heads_metadata(spec), "NaN");
  bad = good;
  bad.push_back({"heads.0.extra.weight", testing::random_tensor({4}, rng)});
  expect_error("extra", bad, heads_metadata(spec), "unexpected tensor heads.0.extra.weight");
  // A truncated file: a clear error, no crash.
  const std::string path = write_heads("truncated", good, heads_metadata(spec));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  auto r = load_spec_heads(path, c, Device::cpu());
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(load_spec_heads("/nonexistent/heads", c, Device::cpu()).ok());
}

// The heads in double, teacher-forced on the proposer's own tokens: at each depth the proposed
// token's logit is the largest (within float rounding).
TEST_F(HeadProposerTest, DraftsFollowTheScalarReference) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  HeadsSpec spec;
  spec.num_heads = 4;
  spec.scale = 0.2f;
  const ModelConfig& c = target_->model->config();
  auto shared = random_loaded(spec, rng, "reference");
  ASSERT_NE(shared, nullptr);
  HeadProposer proposer(*target_->model, shared);
  const int d = c.hidden_size, m = spec.ffn, vocab = c.vocab_size;
  const Tensor embed = target_->model->weights().embed_tokens.to_f32();
  const Tensor lm_head = target_->model->weights().lm_head.dense.to_f32();
  std::vector<std::vector<float>> features(3, std::vector<float>(static_cast<size_t>(d)));
  std::vector<std::vector<int32_t>> tokens = {{5, 17}, {99}, {1000, 2, 3}};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t s = 0; s < features.size(); ++s) {
    for (float& v : features[s]) v = normal(rng);
    proposer.observe_features(s + 1, features[s]);
  }
  std::vector<DraftRequest> requests;
  for (size_t s = 0; s < features.size(); ++s) requests.push_back({s + 1, tokens[s], s == 1 ? 2 : 4, nullptr, 0});
  requests.push_back({77, tokens[0], 4, nullptr, 0});  // no features: no draft
  std::vector<Draft> drafts;
  ASSERT_TRUE(proposer.propose(requests, drafts).ok());
  ASSERT_EQ(drafts.size(), 4u);
  EXPECT_TRUE(drafts[3].tokens.empty());
  const auto rms_norm = [&](const std::vector<double>& x, const Tensor& w) {
    double ss = 0.0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / d + shared->rms_norm_eps);
    std::vector<double> y(x.size());
    for (int j = 0; j < d; ++j) y[static_cast<size_t>(j)] = x[static_cast<size_t>(j)] * inv * w.to_f32().data<float>()[j];
    return y;
  };
  const auto matvec = [](const Tensor& w, const std::vector<double>& x) {
    const Tensor f = w.to_f32();
    std::vector<double> y(static_cast<size_t>(f.size(0)));
    for (int64_t r = 0; r < f.size(0); ++r) {
      double acc = 0.0;
      for (int64_t j = 0; j < f.size(1); ++j) acc += f.data<float>()[r * f.size(1) + j] * x[static_cast<size_t>(j)];
      y[static_cast<size_t>(r)] = acc;
    }
    return y;
  };
  for (size_t s = 0; s < features.size(); ++s) {
    ASSERT_EQ(drafts[s].tokens.size(), static_cast<size_t>(requests[s].k)) << s;
    EXPECT_TRUE(drafts[s].probs.empty());
    std::vector<double> x(features[s].begin(), features[s].end());
    int32_t prev = tokens[s].back();
    for (size_t i = 0; i < drafts[s].tokens.size(); ++i) {
      const SpecHead& h = shared->heads[i];
      std::vector<double> e(static_cast<size_t>(d));
      for (int j = 0; j < d; ++j) e[static_cast<size_t>(j)] = embed.data<float>()[static_cast<int64_t>(prev) * d + j];
      const std::vector<double> gx = matvec(h.x_proj, rms_norm(x, h.in_norm)), ge = matvec(h.e_proj, e);
      std::vector<double> act(static_cast<size_t>(m));
      for (int j = 0; j < m; ++j) {
        const double g = gx[static_cast<size_t>(j)] + ge[static_cast<size_t>(j)];
        const double u = gx[static_cast<size_t>(j + m)] + ge[static_cast<size_t>(j + m)];
        act[static_cast<size_t>(j)] = g / (1.0 + std::exp(-g)) * u;
      }
      const std::vector<double> delta = matvec(h.down_proj, act);
      for (int j = 0; j < d; ++j) x[static_cast<size_t>(j)] += delta[static_cast<size_t>(j)];
      const std::vector<double> logits = matvec(lm_head, rms_norm(x, h.out_norm));
      const double best = *std::max_element(logits.begin(), logits.end());
      const int32_t t = drafts[s].tokens[i];
      ASSERT_TRUE(t >= 0 && t < vocab);
      EXPECT_GE(logits[static_cast<size_t>(t)], best - 1e-3 * (std::abs(best) + 1.0)) << "sequence " << s << " depth " << i;
      prev = t;
    }
  }
  for (uint64_t id = 1; id <= 3; ++id) proposer.release(id);
  EXPECT_TRUE(proposer.check_no_leaks().ok());
}

// Greedy requests with heads (K fixed and dynamic, chains and trees) emit what plain greedy
// decoding emits; the heads propose and some of it is verified.
TEST_F(HeadProposerTest, GreedyWithHeadsEqualsPlainGreedy) {
  std::mt19937 rng(testing::fresh_seed());
  HeadsSpec spec;
  auto shared = random_loaded(spec, rng, "engine");
  ASSERT_NE(shared, nullptr);
  auto prose = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
  ASSERT_TRUE(prose.ok());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(target_->tokenizer->encode(prose->substr(static_cast<size_t>(i) * 3001, 200 + 40 * i)));
  }
  GenerationParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = 40;
  const auto run = [&](const SpecDecodeOptions& spec_options, SpecStats* stats) {
    EngineOptions o;
    o.max_model_len = 512;
    o.kv.num_blocks = 512 / 16 * 4;
    o.batch_invariant = true;
    o.spec = spec_options;
    auto e = Engine::create(*target_->model, target_->tokenizer.get(), target_->eos_token_ids, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    std::map<RequestId, std::vector<int32_t>> out;
    std::vector<RequestId> ids;
    for (const auto& prompt : prompts) ids.push_back((*e)->add_request(prompt, p).value());
    while ((*e)->has_unfinished()) {
      auto outputs = (*e)->step();
      EXPECT_TRUE(outputs.ok()) << outputs.status().to_string();
      if (!outputs.ok()) break;
      for (const RequestOutput& r : *outputs) out[r.id].insert(out[r.id].end(), r.new_token_ids.begin(), r.new_token_ids.end());
    }
    EXPECT_TRUE((*e)->check_no_leaks().ok());
    if (stats != nullptr) *stats = (*e)->stats().spec;
    std::vector<std::vector<int32_t>> tokens;
    for (RequestId id : ids) tokens.push_back(out[id]);
    return tokens;
  };
  const auto plain = run(SpecDecodeOptions{}, nullptr);
  // Chains, then trees (each level's runners-up beside the chain, verified with tree attention).
  for (int tree_nodes : {0, 8}) {
    for (int k : {3, 0}) {
      SpecDecodeOptions s;
      s.method = SpecMethod::kHeads;
      s.heads = shared;
      s.k = k;
      s.k_max = 3;
      s.tree_nodes = tree_nodes;
      SpecStats stats;
      EXPECT_EQ(run(s, &stats), plain) << "K " << (k > 0 ? std::to_string(k) : "dynamic") << ", tree " << tree_nodes;
      EXPECT_EQ(stats.proposer, "heads");
      EXPECT_GT(stats.num_proposed, 0);
      if (tree_nodes > 0) EXPECT_GT(stats.num_tree_steps, 0);
    }
  }
}

// The population prior (SpecDecodeOptions::population_prior): requests run one after another with
// heads that are almost never right. Without the prior every request starts from the controller's
// guess and drafts until its own rates fall; with it, the requests after the first few start from
// what their population measured and draft far less. The output is plain greedy's either way.
TEST_F(HeadProposerTest, NewRequestsStartFromWhatTheirPopulationMeasured) {
  std::mt19937 rng(testing::fresh_seed());
  HeadsSpec spec;
  spec.num_heads = 4;
  auto shared = random_loaded(spec, rng, "prior");
  ASSERT_NE(shared, nullptr);
  auto prose = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
  ASSERT_TRUE(prose.ok());
  GenerationParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = 24;
  const auto run = [&](bool prior, bool spec, std::vector<std::vector<int32_t>>& outputs) {
    EngineOptions o;
    o.max_model_len = 512;
    o.kv.num_blocks = 64;
    if (spec) {
      o.spec.method = SpecMethod::kHeads;
      o.spec.heads = shared;
      o.spec.k_max = 4;
      o.spec.population_prior = prior;
    }
    auto e = Engine::create(*target_->model, target_->tokenizer.get(), target_->eos_token_ids, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    for (int i = 0; i < 24; ++i) {  // one at a time, prompts of one length class (64 to 255 tokens)
      auto ids = target_->tokenizer->encode(prose->substr(static_cast<size_t>(i) * 1931, 400));
      ids.resize(std::min<size_t>(ids.size(), 100));
      auto id = (*e)->add_request(ids, p);
      EXPECT_TRUE(id.ok());
      std::vector<int32_t> out;
      while ((*e)->has_unfinished()) {
        auto step = (*e)->step();
        EXPECT_TRUE(step.ok());
        if (!step.ok()) break;
        for (const RequestOutput& r : *step) out.insert(out.end(), r.new_token_ids.begin(), r.new_token_ids.end());
      }
      outputs.push_back(out);
    }
    EXPECT_TRUE((*e)->check_no_leaks().ok());
    return (*e)->stats().spec.num_proposed;
  };
  std::vector<std::vector<int32_t>> plain, with_prior, without;
  run(false, false, plain);
  const int64_t proposed_with = run(true, true, with_prior);
  const int64_t proposed_without = run(false, true, without);
  EXPECT_EQ(with_prior, plain);
  EXPECT_EQ(without, plain);
  std::printf("proposed: %lld with the prior, %lld without\n", static_cast<long long>(proposed_with),
              static_cast<long long>(proposed_without));
  EXPECT_LT(proposed_with * 2, proposed_without);
}

}  // namespace
}  // namespace tachyon
