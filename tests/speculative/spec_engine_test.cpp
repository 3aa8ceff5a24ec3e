// Speculative decoding through the engine, on real models: the bundled pair tachyon-demo (target)
// and tachyon-demo-draft (draft), and stories260K from ../shared (its own draft). Oracles:
//   greedy   token for token (and text, finish reason, logprobs) what plain greedy decoding gives,
//            for every proposer and K = 1..8 and the dynamic K, stop strings and max_tokens
//            falling inside a verified draft, in a batch that mixes speculative decodes with
//            prompt chunks and plain decodes, under preemption;
//   sampling the joint law of the first generated tokens is the target's own, computed exactly
//            from the model (chi-square at a fixed seed);
//   KV       after every step the request's block table and K/V equal those of a plain run at
//            the same tokens (rejected positions rolled back, nothing left of them); the draft
//            model's cache after a rejection drafts what a fresh one does;
// and every KV block is back after each run (check_no_leaks, the draft cache included).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "core/mapped_file.h"
#include "engine/engine.h"
#include "model/forward_batch.h"
#include "model/model_loader.h"
#include "model/synthetic.h"
#include "server/metrics.h"
#include "speculative/domain_classifier.h"
#include "speculative/draft_model_proposer.h"
#include "random_heads.h"
#include "test_util.h"

namespace tachyon {
namespace {

struct Case {
  std::vector<int32_t> prompt;
  GenerationParams params;
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  FinishReason reason = FinishReason::kLength;
};

EngineOptions small_options(int max_seqs = 8) {
  EngineOptions o;
  o.max_model_len = 512;
  o.kv.num_blocks = 512 / 16 * max_seqs;
  o.scheduler.max_batched_tokens = 256;
  o.scheduler.max_seqs = max_seqs;
  o.batch_invariant = true;
  return o;
}

SpecDecodeOptions spec_options(SpecMethod method, const LlamaModel* draft, int k) {
  SpecDecodeOptions s;
  s.method = method;
  if (draft != nullptr) s.drafts = {{"", draft}};
  s.k = k;
  s.k_max = 8;
  return s;
}

std::unique_ptr<Engine> make_engine(const LoadedModel& m, const EngineOptions& o) {
  auto e = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Steps until idle; `before_step(engine, step)` may add requests and returns whether more come.
std::map<RequestId, Outcome> drain(Engine& e, const std::function<bool(Engine&, int)>& before_step = nullptr) {
  std::map<RequestId, Outcome> out;
  bool more = true;
  for (int step = 0; more || e.has_unfinished(); ++step) {
    more = before_step ? before_step(e, step) : false;
    auto outputs = e.step();
    EXPECT_TRUE(outputs.ok()) << outputs.status().to_string();
    if (!outputs.ok()) break;
    for (const RequestOutput& o : *outputs) {
      Outcome& r = out[o.id];
      EXPECT_EQ(o.logprobs.size(), o.new_token_ids.size());
      r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      for (const TokenLogprob& lp : o.logprobs) r.logprobs.push_back(lp.logprob);
      r.text += o.text;
      if (o.finished) {
        r.reason = o.finish_reason;
        EXPECT_EQ(o.num_generated_tokens, static_cast<int>(r.tokens.size()));
        EXPECT_EQ(o.timing.token_times.size(), r.tokens.size());
      }
    }
    if (step > 100000) {
      ADD_FAILURE() << "the engine does not finish";
      break;
    }
  }
  const Status leaks = e.check_no_leaks();
  EXPECT_TRUE(leaks.ok()) << leaks.to_string();
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  return out;
}

std::vector<Outcome> run_all(Engine& e, const std::vector<Case>& cases) {
  std::vector<RequestId> ids;
  for (const Case& c : cases) {
    auto id = e.add_request(c.prompt, c.params);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  auto out = drain(e);
  std::vector<Outcome> r;
  for (RequestId id : ids) r.push_back(out[id]);
  return r;
}

void expect_same(const std::vector<Outcome>& got, const std::vector<Outcome>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ": request " << i;
    EXPECT_EQ(got[i].text, want[i].text) << what << ": request " << i;
    EXPECT_EQ(got[i].reason, want[i].reason) << what << ": request " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << what << ": request " << i;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], 1e-3) << what << ": request " << i << " token " << t;
    }
  }
}

class SpecEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_ = new LoadedModel(testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo"));
    draft_ = new LoadedModel(testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo-draft"));
    auto code = read_text_file(testing::source_dir() + "/tests/data/eval/code.txt");
    auto prose = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
    ASSERT_TRUE(code.ok() && prose.ok());
    cases_ = new std::vector<Case>();
    for (int i = 0; i < 5; ++i) {
      const std::string& src = i % 2 == 0 ? *code : *prose;
      Case c;
      c.prompt = target_->tokenizer->encode(src.substr(static_cast<size_t>(i) * 7919 % (src.size() - 600),
                                                       static_cast<size_t>(60 + 45 * i)));
      c.params.sampling.temperature = 0.0f;
      c.params.max_tokens = 17 + 5 * i;  // rarely a multiple of K + 1: max_tokens cuts a verified draft
      cases_->push_back(c);
    }
    plain_ = new std::vector<Outcome>(run_plain(*cases_));
    // A stop string from inside request 1's plain output: generation must end at the same token
    // and text whichever step's draft the string falls in.
    ASSERT_GE((*plain_)[1].tokens.size(), 12u);
    const std::string& text = (*plain_)[1].text;
    const size_t at = text.size() / 2;
    Case stopped = (*cases_)[1];
    stopped.params.stop = {text.substr(at, 3)};
    cases_->push_back(stopped);
    plain_->push_back(run_plain({stopped})[0]);
    ASSERT_EQ(plain_->back().reason, FinishReason::kStop);
  }
  static void TearDownTestSuite() {
    delete plain_;
    delete cases_;
    delete draft_;
    delete target_;
  }

  static std::vector<Outcome> run_plain(const std::vector<Case>& cases) {
    auto e = make_engine(*target_, small_options());
    return run_all(*e, cases);
  }

  static LoadedModel* target_;
  static LoadedModel* draft_;
  static std::vector<Case>* cases_;
  static std::vector<Outcome>* plain_;
};

LoadedModel* SpecEngineTest::target_ = nullptr;
LoadedModel* SpecEngineTest::draft_ = nullptr;
std::vector<Case>* SpecEngineTest::cases_ = nullptr;
std::vector<Outcome>* SpecEngineTest::plain_ = nullptr;

TEST_F(SpecEngineTest, GreedyWithTheDraftModelEqualsPlainForEveryK) {
  for (int k = 0; k <= 8; ++k) {  // 0: the controller's dynamic K
    EngineOptions o = small_options();
    o.spec = spec_options(SpecMethod::kDraftModel, draft_->model.get(), k);
    auto e = make_engine(*target_, o);
    ASSERT_NE(e, nullptr);
    expect_same(run_all(*e, *cases_), *plain_, "draft K " + std::to_string(k));
    const SpecStats s = e->stats().spec;
    EXPECT_EQ(s.proposer, "draft");
    EXPECT_GT(s.num_verify_steps, 0) << "K " << k;
    EXPECT_GT(s.num_accepted, 0) << "K " << k;                // the pair was trained to agree
    EXPECT_LT(s.num_accepted, s.num_proposed) << "K " << k;   // and rejections happen
    EXPECT_LE(s.num_emitted, s.num_accepted + s.num_verify_steps);
  }
}

// Long context with a draft model: the draft's cache keeps the target's tiers (a dropped window,
// or int4 history), so drafts keep coming on sequences far longer than its full-precision blocks
// hold, and greedy speculative decoding still equals plain greedy decoding with the same tiers.
// With int4 history a verify step retires blocks only after it, so its K + 1 queries read keys the
// window passed within the step at full precision where plain decoding read them as int4: the
// logprobs are not bit for bit (held to 0.2 nats while the texts agree), and a near-tie may pick
// another greedy token, after which the two texts go their own ways. Decode steps of one
// token see exactly what plain decoding sees.
TEST_F(SpecEngineTest, GreedyWithTheDraftModelEqualsPlainUnderKvTiers) {
  std::vector<Case> cases;
  for (size_t i = 0; i < 3; ++i) {
    Case c = (*cases_)[i];
    c.params.max_tokens = 260;
    c.params.ignore_eos = true;
    cases.push_back(c);
  }
  for (KvHistory history : {KvHistory::kDrop, KvHistory::kInt4}) {
    EngineOptions o = small_options();
    o.max_model_len = 512;
    o.kv.num_blocks = 24;  // 384 positions for three requests of ~300: the window must pass them
    o.kv.num_history_blocks = 96;
    o.kv.tiers = KvTierOptions{64, history};
    auto plain_engine = make_engine(*target_, o);
    ASSERT_NE(plain_engine, nullptr);
    const std::vector<Outcome> plain = run_all(*plain_engine, cases);
    o.spec = spec_options(SpecMethod::kDraftModel, draft_->model.get(), 4);
    auto e = make_engine(*target_, o);
    ASSERT_NE(e, nullptr);
    const std::string what = std::string("draft K 4, history ") + kv_history_name(history);
    const std::vector<Outcome> got = run_all(*e, cases);
    if (history == KvHistory::kDrop) {
      expect_same(got, plain, what);
    } else {
      ASSERT_EQ(got.size(), plain.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].tokens.size(), plain[i].tokens.size()) << what << ": request " << i;
        ASSERT_EQ(got[i].logprobs.size(), plain[i].logprobs.size()) << what << ": request " << i;
        size_t t = 0;  // the common prefix: logprobs close (the same text, keys read a little apart)
        double gap = 0.0;
        for (; t < got[i].tokens.size() && got[i].tokens[t] == plain[i].tokens[t]; ++t) {
          EXPECT_NEAR(got[i].logprobs[t], plain[i].logprobs[t], 0.2) << what << ": request " << i << " token " << t;
          gap = std::max(gap, std::fabs(static_cast<double>(got[i].logprobs[t]) - plain[i].logprobs[t]));
        }
        std::printf("%s: request %zu, %zu tokens alike, logprobs %.3f nats apart at most\n", what.c_str(), i, t, gap);
        if (t == got[i].tokens.size()) continue;
        // Where they part, it is a near-tie: neither run was sure of its pick (p < 0.6), and the
        // two picks were about as likely (a confident pick cannot flip under keys this close).
        EXPECT_LT(got[i].logprobs[t], std::log(0.6)) << what << ": request " << i << " parts at token " << t;
        EXPECT_LT(plain[i].logprobs[t], std::log(0.6)) << what << ": request " << i << " parts at token " << t;
        EXPECT_NEAR(got[i].logprobs[t], plain[i].logprobs[t], 0.1)
            << what << ": request " << i << " parts at token " << t;
        std::printf("%s: request %zu parts from plain at token %zu (a near-tie: logprobs %.4f / %.4f)\n",
                    what.c_str(), i, t, got[i].logprobs[t], plain[i].logprobs[t]);
      }
    }
    const SpecStats s = e->stats().spec;
    std::printf("history %s: %lld drafts proposed, %lld accepted\n", kv_history_name(history),
                static_cast<long long>(s.num_proposed), static_cast<long long>(s.num_accepted));
    // Drafts all along: 570-594 accepted (measured); a draft cache without the tiers fills a third
    // of the way in and accepts about 205.
    EXPECT_GT(s.num_accepted, 400) << kv_history_name(history);
    EXPECT_EQ(e->stats().num_failed_proposals, 0) << kv_history_name(history);
  }
}

// The bundled draft without its last rows, as a draft whose matrices are padded to a smaller
// vocabulary than the target's: `rows` tokens (its LM head is the tied embedding).
std::unique_ptr<LlamaModel> truncated_draft(const LlamaModel& draft, int rows) {
  ModelConfig c = draft.config();
  EXPECT_TRUE(c.tie_word_embeddings);
  c.vocab_size = rows;
  ModelWeights w = draft.weights();
  w.embed_tokens = w.embed_tokens.slice(0, 0, rows).contiguous();
  w.lm_head.dense = w.embed_tokens;
  return std::make_unique<LlamaModel>(c, std::move(w));
}

// Prompts and outputs that reach past the draft's rows get no draft from there on and stay exact;
// the others speculate as with the whole draft.
TEST_F(SpecEngineTest, GreedyWithADraftLackingTheTargetsLastRowsEqualsPlain) {
  constexpr int kRows = 6000;  // the prompts' largest ids: 4901 to 7507
  const std::unique_ptr<LlamaModel> small = truncated_draft(*draft_->model, kRows);
  int beyond = 0;  // prompts holding a token the small draft lacks
  for (const Case& c : *cases_) beyond += std::any_of(c.prompt.begin(), c.prompt.end(), [](int32_t t) { return t >= kRows; });
  EXPECT_GT(beyond, 0);
  EXPECT_LT(beyond, static_cast<int>(cases_->size()));
  for (int k : {0, 4}) {
    EngineOptions o = small_options();
    o.spec = spec_options(SpecMethod::kDraftModel, small.get(), k);
    auto e = make_engine(*target_, o);
    ASSERT_NE(e, nullptr);
    expect_same(run_all(*e, *cases_), *plain_, fmt::format("draft of {} rows, K {}", kRows, k));
    EXPECT_GT(e->stats().spec.num_accepted, 0) << "K " << k;
  }
}

TEST_F(SpecEngineTest, GreedyWithNgramLookupEqualsPlainForEveryK) {
  for (int k = 0; k <= 8; ++k) {
    EngineOptions o = small_options();
    o.spec = spec_options(SpecMethod::kNgram, nullptr, k);
    auto e = make_engine(*target_, o);
    ASSERT_NE(e, nullptr);
    expect_same(run_all(*e, *cases_), *plain_, "ngram K " + std::to_string(k));
    const SpecStats s = e->stats().spec;
    EXPECT_EQ(s.proposer, "ngram");
    EXPECT_GT(s.num_proposed, 0) << "K " << k;
    EXPECT_LE(s.num_accepted, s.num_proposed);
  }
}

// Token trees through the engine: greedy output equals plain greedy for both proposers, for fixed
// and dynamic K and several node budgets; trees were verified, and some accepted paths left the
// first branch (their K/V moved into place).
TEST_F(SpecEngineTest, GreedyWithTokenTreesEqualsPlain) {
  for (SpecMethod method : {SpecMethod::kDraftModel, SpecMethod::kNgram}) {
    int64_t off_branch = 0;
    for (auto [k, nodes] : std::vector<std::pair<int, int>>{{1, 4}, {3, 10}, {0, 16}, {8, 40}}) {
      const std::string what = fmt::format("{} K {} tree {}", spec_method_name(method), k, nodes);
      EngineOptions o = small_options();
      o.spec = spec_options(method, draft_->model.get(), k);
      o.spec.tree_nodes = nodes;
      auto e = make_engine(*target_, o);
      ASSERT_NE(e, nullptr);
      expect_same(run_all(*e, *cases_), *plain_, what);
      const SpecStats s = e->stats().spec;
      EXPECT_GT(s.num_tree_steps, 0) << what;
      EXPECT_GT(s.num_accepted, 0) << what;
      EXPECT_LE(s.num_emitted, s.num_accepted + s.num_verify_steps) << what;
      off_branch += s.num_off_first_branch;
    }
    EXPECT_GT(off_branch, 0) << spec_method_name(method) << ": no accepted path ever left the first branch";
  }
}

// A tree verified in one forward gives, at every node, the logits of its root-to-node path run
// as a plain chunk: the tree's masks, depth positions and cache placement at work.
TEST_F(SpecEngineTest, TreeForwardEqualsEachPathRunAsAChain) {
  const LlamaModel& model = *target_->model;
  const ModelConfig& c = model.config();
  KvCacheConfig kc;
  kc.num_layers = c.num_layers;
  kc.num_kv_heads = c.num_kv_heads;
  kc.head_dim = c.head_dim;
  kc.num_blocks = 64;
  KvCache cache = *KvCache::create(kc);
  BlockManager blocks(BlockManagerOptions{kc.num_blocks, kc.block_size, false, {}});
  const std::vector<int32_t>& prompt = (*cases_)[2].prompt;
  ASSERT_GE(prompt.size(), 30u);
  // The last prompt token is the root; 20 nodes with random parents.
  std::mt19937 rng(testing::fresh_seed());
  std::vector<int32_t> tokens = {prompt.back()}, parents = {-1};
  for (int i = 1; i <= 20; ++i) {
    tokens.push_back(std::uniform_int_distribution<int32_t>(0, c.vocab_size - 1)(rng));
    parents.push_back(std::uniform_int_distribution<int32_t>(0, i - 1)(rng));
  }
  BlockTable table(kc.block_size);
  ASSERT_TRUE(blocks.grow_to(table, static_cast<int>(prompt.size()) - 1 + static_cast<int>(tokens.size())).ok());
  const std::vector<int32_t> head(prompt.begin(), prompt.end() - 1);
  Tensor logits;
  const Status prefill = model.forward(build_forward_batch({SequenceChunk{&table, 0, head, LogitsWanted::kLast}}), cache, logits);
  ASSERT_TRUE(prefill.ok()) << prefill.to_string();
  SequenceChunk tree{&table, static_cast<int>(head.size()), tokens, LogitsWanted::kAll};
  tree.tree_parents = parents;
  Tensor tree_logits;
  ASSERT_TRUE(model.forward(build_forward_batch({tree}), cache, tree_logits).ok());
  blocks.free(table);
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<int32_t> path;
    for (int32_t n = static_cast<int32_t>(i); n >= 0; n = parents[static_cast<size_t>(n)]) path.push_back(tokens[static_cast<size_t>(n)]);
    std::vector<int32_t> chain = head;
    chain.insert(chain.end(), path.rbegin(), path.rend());
    BlockTable t(kc.block_size);
    ASSERT_TRUE(blocks.grow_to(t, static_cast<int>(chain.size())).ok());
    Tensor chain_logits;
    ASSERT_TRUE(model.forward(build_forward_batch({SequenceChunk{&t, 0, chain, LogitsWanted::kLast}}), cache, chain_logits).ok());
    blocks.free(t);
    const float* a = tree_logits.data<float>() + static_cast<int64_t>(i) * c.vocab_size;
    const float* b = chain_logits.data<float>();
    float worst = 0.0f;
    for (int v = 0; v < c.vocab_size; ++v) worst = std::max(worst, std::fabs(a[v] - b[v]));
    EXPECT_LT(worst, 1e-3f) << "node " << i << " at depth " << path.size() - 1;
  }
}

// New requests arrive every step, so prompt chunks share steps with verify chunks; a request with
// max_tokens 1 or 2 never speculates (plain decodes in the same batch); a cache too small for all
// of them preempts sequences that hold drafts. Outputs stay those of plain greedy decoding.
TEST_F(SpecEngineTest, MixedBatchOfSpeculativeAndPlainRequestsUnderPreemption) {
  std::vector<Case> cases = *cases_;
  for (int i = 0; i < 6; ++i) {
    Case c = (*cases_)[static_cast<size_t>(i) % cases_->size()];
    c.params.max_tokens = i % 3 == 0 ? 1 : i % 3 == 1 ? 2 : 30;
    c.prompt.resize(c.prompt.size() - static_cast<size_t>(i));
    cases.push_back(c);
  }
  const std::vector<Outcome> want = [&] {
    auto e = make_engine(*target_, small_options(16));
    return run_all(*e, cases);
  }();
  for (bool small_cache : {false, true}) {
    EngineOptions o = small_options(16);
    if (small_cache) {
      o.max_model_len = 192;
      o.kv.num_blocks = 12;  // 192 tokens for 12 requests that need ~1300
      o.scheduler.max_batched_tokens = 64;
      o.kv.prefix_caching = false;
    }
    o.spec = spec_options(SpecMethod::kDraftModel, draft_->model.get(), 0);
    auto e = make_engine(*target_, o);
    ASSERT_NE(e, nullptr);
    std::vector<RequestId> ids;
    int mixed_steps = 0;
    int64_t verify_before = 0, prompt_before = 0;
    auto out = drain(*e, [&](Engine& eng, int step) {
      const EngineStats st = eng.stats();
      if (st.spec.num_verify_steps > verify_before && st.prompt_tokens_computed > prompt_before) ++mixed_steps;
      verify_before = st.spec.num_verify_steps;
      prompt_before = st.prompt_tokens_computed;
      if (static_cast<size_t>(step) < cases.size()) {
        auto id = eng.add_request(cases[static_cast<size_t>(step)].prompt, cases[static_cast<size_t>(step)].params);
        EXPECT_TRUE(id.ok()) << id.status().to_string();
        ids.push_back(*id);
      }
      return ids.size() < cases.size();
    });
    std::vector<Outcome> got;
    for (RequestId id : ids) got.push_back(out[id]);
    expect_same(got, want, small_cache ? "mixed, small cache" : "mixed");
    EXPECT_GT(mixed_steps, 0) << "no step verified drafts while running prompt chunks";
    if (small_cache) {
      EXPECT_GT(e->stats().num_preemptions, 0);
    }
  }
}

// K/V storage of one position of a sequence, every layer, K then V.
std::vector<float> kv_at(Engine& e, const BlockTable& table, int position) {
  KvCache& cache = e.kv_cache();
  const KvCacheConfig& c = cache.config();
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  std::vector<float> out;
  for (int l = 0; l < c.num_layers; ++l) {
    for (Tensor* t : {&cache.layer(l).k, &cache.layer(l).v}) {
      const float* p = t->data<float>() + static_cast<int64_t>(table.slot(position)) * row;
      out.insert(out.end(), p, p + row);
    }
  }
  return out;
}

// After every speculative step, the request's table and K/V are those of a plain run at the same
// tokens: same number of positions and blocks, the same K/V at every position; the rejected
// drafts' positions are gone. With token trees, accepted side branches' K/V moved into place.
TEST_F(SpecEngineTest, RejectedPositionsAreRolledBackToWhatAPlainRunHolds) {
  for (auto [method, tree_nodes] : std::vector<std::pair<SpecMethod, int>>{
           {SpecMethod::kDraftModel, 0}, {SpecMethod::kNgram, 0}, {SpecMethod::kDraftModel, 12}, {SpecMethod::kNgram, 12}}) {
    SCOPED_TRACE(fmt::format("{} tree {}", spec_method_name(method), tree_nodes));
    EngineOptions o = small_options(1);
    o.kv.prefix_caching = false;
    EngineOptions so = o;
    so.spec = spec_options(method, draft_->model.get(), 4);
    so.spec.tree_nodes = tree_nodes;
    auto spec = make_engine(*target_, so);
    auto plain = make_engine(*target_, o);
    Case c = (*cases_)[2];
    c.params.max_tokens = 60;
    const RequestId a = *spec->add_request(c.prompt, c.params);
    const RequestId b = *plain->add_request(c.prompt, c.params);
    int compared = 0;
    while (spec->has_unfinished()) {
      ASSERT_TRUE(spec->step().ok());
      const Sequence* sa = spec->find_sequence(a);
      if (sa == nullptr || sa->state() != SequenceState::kDecoding) continue;
      const Sequence* sb = plain->find_sequence(b);
      while (sb != nullptr && sb->num_tokens() < sa->num_tokens()) {
        ASSERT_TRUE(plain->step().ok());
        sb = plain->find_sequence(b);
      }
      ASSERT_NE(sb, nullptr);
      ASSERT_TRUE(std::equal(sa->tokens().begin(), sa->tokens().end(), sb->tokens().begin(), sb->tokens().end()));
      ASSERT_EQ(sa->num_computed(), sb->num_computed());
      ASSERT_EQ(sa->block_table().num_tokens(), sb->block_table().num_tokens());
      ASSERT_EQ(sa->block_table().blocks().size(), sb->block_table().blocks().size());
      ASSERT_EQ(sa->block_table().num_tokens(), sa->num_computed());
      for (int p = 0; p < sa->num_computed(); ++p) {
        const std::vector<float> ka = kv_at(*spec, sa->block_table(), p), kb = kv_at(*plain, sb->block_table(), p);
        float worst = 0.0f;
        for (size_t i = 0; i < ka.size(); ++i) worst = std::max(worst, std::fabs(ka[i] - kb[i]));
        ASSERT_LE(worst, 1e-4f) << "position " << p << " of " << sa->num_computed();
      }
      ++compared;
      const Status leaks = spec->check_no_leaks();
      ASSERT_TRUE(leaks.ok()) << leaks.to_string();
    }
    const SpecStats s = spec->stats().spec;
    EXPECT_GT(compared, 3);
    EXPECT_LT(s.num_accepted, s.num_proposed) << "no draft token was ever rejected: nothing rolled back";
    while (plain->has_unfinished()) ASSERT_TRUE(plain->step().ok());
    for (Engine* e : {spec.get(), plain.get()}) {
      const Status leaks = e->check_no_leaks();
      EXPECT_TRUE(leaks.ok()) << leaks.to_string();
      EXPECT_EQ(e->stats().kv_blocks_used, 0);
    }
  }
}

// The draft model's own cache: after the target rejected its drafts, it keeps only what agrees
// with the sequence and drafts exactly what a fresh proposer (which never saw them) drafts.
TEST_F(SpecEngineTest, DraftModelCacheCatchesUpWithoutTheRejectedTokens) {
  DraftModelOptions o;
  o.num_kv_blocks = 64;
  o.block_size = kDefaultBlockSize;
  o.max_model_len = 512;
  o.linear_mode = ops::LinearMode::kBatchInvariant;
  auto used = DraftModelProposer::create(*draft_->model, o);
  ASSERT_TRUE(used.ok()) << used.status().to_string();
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const int vocab = target_->model->config().vocab_size;
  Sampler sampler = *Sampler::create(greedy, vocab);
  std::vector<int32_t> seq = (*cases_)[0].prompt;
  std::vector<Draft> drafts;
  DraftRequest r{7, seq, 5, &sampler};
  ASSERT_TRUE((*used)->propose({&r, 1}, drafts).ok());
  ASSERT_EQ(drafts[0].tokens.size(), 5u);
  EXPECT_EQ((*used)->num_cached_tokens(7), static_cast<int>(seq.size()) + 4);
  // The target kept two drafts and chose another token than the third.
  seq.insert(seq.end(), drafts[0].tokens.begin(), drafts[0].tokens.begin() + 2);
  seq.push_back((drafts[0].tokens[2] + 1) % vocab);
  r.tokens = seq;
  ASSERT_TRUE((*used)->propose({&r, 1}, drafts).ok());
  auto fresh = DraftModelProposer::create(*draft_->model, o);
  ASSERT_TRUE(fresh.ok());
  std::vector<Draft> fresh_drafts;
  ASSERT_TRUE((*fresh)->propose({&r, 1}, fresh_drafts).ok());
  EXPECT_EQ(drafts[0].tokens, fresh_drafts[0].tokens);
  EXPECT_EQ((*used)->num_cached_tokens(7), static_cast<int>(seq.size()) + 4);
  (*used)->release(7);
  (*fresh)->release(7);
  EXPECT_TRUE((*used)->check_no_leaks().ok());
  EXPECT_TRUE((*fresh)->check_no_leaks().ok());
  EXPECT_EQ((*used)->num_cached_tokens(7), -1);
}

// The draft's chain of decode steps (one read-back per call) drafts what one forward and a host
// round trip per position draft: greedy chains and trees, requests of different K in one batch
// (the chain runs them all K_max deep), over calls that accept part of the draft, a sampled tree,
// and a sampled chain (the same draws from the same uniforms, and the same q).
TEST_F(SpecEngineTest, DraftChainDraftsWhatStepwiseDrafting) {
  DraftModelOptions o;
  o.num_kv_blocks = 96;
  o.block_size = kDefaultBlockSize;
  o.max_model_len = 512;
  o.linear_mode = ops::LinearMode::kBatchInvariant;
  DraftModelOptions stepwise_options = o;
  stepwise_options.device_chain = false;
  auto chain = DraftModelProposer::create(*draft_->model, o);
  auto stepwise = DraftModelProposer::create(*draft_->model, stepwise_options);
  ASSERT_TRUE(chain.ok() && stepwise.ok());
  const int vocab = target_->model->config().vocab_size;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams warm;
  warm.temperature = 0.8f;
  warm.seed = 3;
  SamplingParams truncated = warm;
  truncated.top_k = 40;
  truncated.top_p = 0.9f;
  std::vector<Sampler> samplers{*Sampler::create(greedy, vocab), *Sampler::create(greedy, vocab),
                                *Sampler::create(greedy, vocab), *Sampler::create(warm, vocab),
                                *Sampler::create(truncated, vocab)};
  std::vector<std::vector<int32_t>> seqs;
  for (int i = 0; i < 5; ++i) seqs.push_back((*cases_)[static_cast<size_t>(i % cases_->size())].prompt);
  seqs[1].push_back(5);  // two requests of one prompt would share its cached blocks
  seqs[4].push_back(6);
  const int ks[] = {5, 2, 4, 3, 4};
  const int nodes[] = {0, 0, 9, 7, 0};  // requests 2 and 3 draft trees, 4 is a sampled chain
  for (int round = 0; round < 4; ++round) {
    std::vector<DraftRequest> requests;
    for (size_t i = 0; i < seqs.size(); ++i) {
      requests.push_back({100 + i, seqs[i], ks[i] + round % 2, &samplers[i], nodes[i]});
    }
    std::vector<Draft> a, b;
    ASSERT_TRUE((*chain)->propose(requests, a).ok());
    ASSERT_TRUE((*stepwise)->propose(requests, b).ok());
    for (size_t i = 0; i < seqs.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "round " << round << " request " << i);
      ASSERT_FALSE(a[i].tokens.empty());
      if (samplers[i].params().greedy() || nodes[i] == 0) {
        EXPECT_EQ(a[i].tokens, b[i].tokens);
        EXPECT_EQ(a[i].parents, b[i].parents);
      } else {
        // A sampled tree's side branches are ranked at temperature 1 on the device and under the
        // request's temperature on the host: the first branch (the argmax chain) agrees.
        const auto branch = [](const Draft& d) {
          std::vector<int32_t> out;
          for (size_t n = 0; n < d.tokens.size() && d.parents[n] == static_cast<int32_t>(n) - 1; ++n) {
            out.push_back(d.tokens[n]);
          }
          return out;
        };
        EXPECT_EQ(branch(a[i]), branch(b[i]));
        EXPECT_EQ(a[i].tokens.size(), b[i].tokens.size());
      }
      if (nodes[i] == 0 && !samplers[i].params().greedy()) {  // q of each drafted position
        ASSERT_EQ(a[i].probs.size(), b[i].probs.size());
        ASSERT_EQ(a[i].probs.size(), a[i].tokens.size() * static_cast<size_t>(vocab));
        for (size_t j = 0; j < a[i].probs.size(); ++j) ASSERT_NEAR(a[i].probs[j], b[i].probs[j], 1e-6) << j;
      } else {
        EXPECT_TRUE(a[i].probs.empty() && b[i].probs.empty());
      }
      EXPECT_EQ((*chain)->num_cached_tokens(100 + i), (*stepwise)->num_cached_tokens(100 + i));
      // The target keeps part of the chain and then picks a token of its own.
      const size_t depth = std::min<size_t>(a[i].tokens.size(), static_cast<size_t>(ks[i]));
      const size_t kept = (static_cast<size_t>(round) + i) % (depth + 1);
      seqs[i].insert(seqs[i].end(), a[i].tokens.begin(), a[i].tokens.begin() + static_cast<ptrdiff_t>(kept));
      seqs[i].push_back(static_cast<int32_t>((seqs[i].back() * 7 + 11) % vocab));
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    (*chain)->release(100 + i);
    (*stepwise)->release(100 + i);
  }
  EXPECT_TRUE((*chain)->check_no_leaks().ok());
  EXPECT_TRUE((*stepwise)->check_no_leaks().ok());
}

// The exact law of the first `depth` generated tokens of `prompt` under `params`, from one forward
// per prefix: outcome (t1, ..., t_depth) -> probability.
std::map<std::vector<int32_t>, double> exact_law(const LlamaModel& model, const std::vector<int32_t>& prompt,
                                                 const SamplingParams& params, int depth) {
  const int vocab = model.config().vocab_size;
  KvCacheConfig kc;
  kc.num_layers = model.config().num_layers;
  kc.num_kv_heads = model.config().num_kv_heads;
  kc.head_dim = model.config().head_dim;
  kc.num_blocks = 64;
  KvCache cache = *KvCache::create(kc);
  BlockManager blocks(BlockManagerOptions{kc.num_blocks, kc.block_size, false, {}});
  Sampler sampler(params);
  std::map<std::vector<int32_t>, double> law{{{}, 1.0}};
  Tensor logits;
  std::vector<float> p;
  for (int d = 0; d < depth; ++d) {
    std::map<std::vector<int32_t>, double> next;
    for (const auto& [prefix, mass] : law) {
      std::vector<int32_t> tokens = prompt;
      tokens.insert(tokens.end(), prefix.begin(), prefix.end());
      BlockTable table(kc.block_size);
      EXPECT_TRUE(blocks.grow_to(table, static_cast<int>(tokens.size())).ok());
      SequenceChunk c{&table, 0, tokens, LogitsWanted::kLast};
      EXPECT_TRUE(model.forward(build_forward_batch({c}), cache, logits).ok());
      blocks.free(table);
      TokenCounts history;
      history.add_prompt(prompt);
      for (int32_t t : prefix) history.add_output(t);
      EXPECT_TRUE(sampler.probabilities(logits.data<float>(), vocab, history, p).ok());
      for (int t = 0; t < vocab; ++t) {
        if (p[static_cast<size_t>(t)] <= 0.0f) continue;
        std::vector<int32_t> longer = prefix;
        longer.push_back(t);
        next[longer] = mass * p[static_cast<size_t>(t)];
      }
    }
    law = std::move(next);
  }
  return law;
}

// Sampling stays lossless through the engine: over many seeded requests the first four generated
// tokens (one plain sample, then drafts verified with K up to 2 and the bonus token) follow the
// target's exact joint law. top-k 2 keeps the outcome space at 16; a frequency penalty makes
// the verifier's per-row history matter. With two named drafts, requests alternating between
// them, each request's draft distribution q must be its own draft's.
TEST_F(SpecEngineTest, SampledOutputKeepsTheTargetDistribution) {
  // Code that repeats itself, so that n-gram lookup finds drafts too; cut to 49 tokens, so that
  // after the first request only the last one is not in the prefix caches (cost stays low).
  std::vector<int32_t> prompt = target_->tokenizer->encode(
      "for (int i = 0; i < n; ++i) {\n  a[i] = b[i] + c[i];\n}\nfor (int i = 0; i < n; ++i) {\n  a[i] = b[i]");
  ASSERT_GE(prompt.size(), 49u);
  prompt.resize(49);
  SamplingParams penalized;
  penalized.temperature = 2.0f;  // flat enough that every outcome is seen
  penalized.top_k = 2;
  penalized.frequency_penalty = 1.0f;
  // Without penalties the draft model's chain draws on the device (ops::sample and its q).
  SamplingParams plain = penalized;
  plain.frequency_penalty = 0.0f;
  constexpr int kDepth = 4;
  std::map<std::vector<int32_t>, double> laws[2];
  for (int i = 0; i < 2; ++i) {
    laws[i] = exact_law(*target_->model, prompt, i == 0 ? penalized : plain, kDepth);
    double total = 0.0;
    for (const auto& [o, pr] : laws[i]) total += pr;
    ASSERT_NEAR(total, 1.0, 1e-4);
  }
  // The last cases: a draft without the target's last rows, whose q the verifier sees padded with zeros.
  const std::unique_ptr<LlamaModel> small = truncated_draft(*draft_->model, 7900);
  // Proposal heads of random weights: their one-hot guesses are rarely in the top 2, so this
  // checks the law through rejections (the residual draws) more than through acceptances.
  std::mt19937 rng(testing::fresh_seed());
  auto heads = load_spec_heads(testing::write_heads("law", testing::random_heads({}, rng), testing::heads_metadata({})),
                               target_->model->config(), Device::cpu());
  ASSERT_TRUE(heads.ok()) << heads.status().to_string();
  const auto shared_heads = std::make_shared<const SpecHeads>(std::move(heads).value());
  struct Run {
    SpecMethod method;
    int tree_nodes;
    const LlamaModel* draft;
    bool penalty;
    bool named = false;  // two named drafts (the bundled one and `small`), requests alternating
  };
  for (auto [method, tree_nodes, draft, penalty, named] :
       std::vector<Run>{{SpecMethod::kDraftModel, 0, draft_->model.get(), true},
                        {SpecMethod::kNgram, 0, nullptr, true},
                        {SpecMethod::kDraftModel, 4, draft_->model.get(), true},
                        {SpecMethod::kNgram, 6, nullptr, true},
                        {SpecMethod::kDraftModel, 0, small.get(), true},
                        {SpecMethod::kDraftModel, 0, draft_->model.get(), false},
                        {SpecMethod::kDraftModel, 4, draft_->model.get(), false},
                        {SpecMethod::kDraftModel, 0, small.get(), false},
                        {SpecMethod::kHeads, 0, nullptr, true},
                        {SpecMethod::kHeads, 0, nullptr, false},
                        {SpecMethod::kDraftModel, 0, draft_->model.get(), true, true},
                        {SpecMethod::kDraftModel, 0, draft_->model.get(), false, true}}) {
    SCOPED_TRACE(fmt::format("{} tree {}{}{}{}", spec_method_name(method), tree_nodes,
                             draft == small.get() ? ", a draft of 7900 rows" : "",
                             penalty ? ", frequency penalty" : ", no penalty", named ? ", two named drafts" : ""));
    const SamplingParams& sp = penalty ? penalized : plain;
    const auto& law = laws[penalty ? 0 : 1];
    EngineOptions o = small_options(64);
    o.max_model_len = 64;
    o.kv.num_blocks = 5 * 64;
    o.scheduler.max_batched_tokens = 2048;
    o.batch_invariant = false;  // not needed for a law, and faster
    // K fixed: the controller would turn speculation off for a batch this large.
    o.spec = spec_options(method, draft, 2);
    o.spec.tree_nodes = tree_nodes;
    o.spec.heads = shared_heads;
    if (named) o.spec.drafts = {{"full", draft}, {"small", small.get()}};
    auto e = make_engine(*target_, o);
    ASSERT_NE(e, nullptr);
    constexpr int kRequests = 800;
    std::vector<Case> cases(kRequests);
    for (int i = 0; i < kRequests; ++i) {
      cases[static_cast<size_t>(i)].prompt = prompt;
      GenerationParams& g = cases[static_cast<size_t>(i)].params;
      g.sampling = sp;
      g.sampling.seed = 1000 + static_cast<uint64_t>(i);
      g.max_tokens = kDepth;
      g.ignore_eos = true;
      g.detokenize = false;
      if (named) g.draft = i % 2 == 0 ? "full" : "small";
    }
    std::map<std::vector<int32_t>, int64_t> counts;
    for (const Outcome& r : run_all(*e, cases)) {
      ASSERT_EQ(r.tokens.size(), static_cast<size_t>(kDepth));
      ASSERT_TRUE(law.count(r.tokens)) << "an outcome the target cannot produce";
      ++counts[r.tokens];
    }
    const SpecStats s = e->stats().spec;
    EXPECT_GT(method == SpecMethod::kHeads ? s.num_proposed : s.num_accepted, 0);
    EXPECT_LT(s.num_accepted, s.num_proposed);
    if (named) {
      EXPECT_GT(s.by_proposer.at("draft:full").num_accepted, 0);
      EXPECT_GT(s.by_proposer.at("draft:small").num_accepted, 0);
    }
    // Pearson's chi-square over outcomes expected at least 5 times, the rest pooled.
    double stat = 0.0, pooled_e = 0.0;
    int64_t pooled_n = 0;
    int cells = 0;
    for (const auto& [outcome, pr] : law) {
      const double expected = pr * kRequests;
      const int64_t n = counts.count(outcome) ? counts[outcome] : 0;
      if (expected < 5.0) {
        pooled_e += expected;
        pooled_n += n;
        continue;
      }
      stat += (n - expected) * (n - expected) / expected;
      ++cells;
    }
    if (pooled_e >= 5.0) {
      stat += (pooled_n - pooled_e) * (pooled_n - pooled_e) / pooled_e;
      ++cells;
    }
    ASSERT_GE(cells, 4);
    EXPECT_GT(testing::chi_square_p_value(stat, cells - 1), 1e-4) << "chi2 " << stat << " over " << cells << " cells";
  }
}

TEST_F(SpecEngineTest, BadOptionsAreClearErrors) {
  const auto error_of = [&](const SpecDecodeOptions& s) {
    EngineOptions o = small_options();
    o.spec = s;
    auto e = Engine::create(*target_->model, target_->tokenizer.get(), target_->eos_token_ids, o);
    EXPECT_FALSE(e.ok());
    return e.ok() ? std::string() : e.status().to_string();
  };
  SpecDecodeOptions s = spec_options(SpecMethod::kNgram, nullptr, 9);
  EXPECT_NE(error_of(s).find("--spec-k 9"), std::string::npos) << error_of(s);
  s = spec_options(SpecMethod::kNgram, nullptr, -1);
  EXPECT_NE(error_of(s).find("--spec-k -1"), std::string::npos);
  s = spec_options(SpecMethod::kNgram, nullptr, 0);
  s.k_max = 0;
  EXPECT_NE(error_of(s).find("--spec-k-max 0"), std::string::npos);
  s = spec_options(SpecMethod::kDraftModel, nullptr, 2);
  EXPECT_NE(error_of(s).find("no draft model"), std::string::npos);
  s = spec_options(SpecMethod::kNgram, nullptr, 2);
  s.tree_nodes = 64;
  EXPECT_NE(error_of(s).find("--spec-tree 64"), std::string::npos) << error_of(s);
  // A draft may lack the target's last rows (truncated_draft below), not have more.
  ModelConfig wide = *synthetic_config("tiny");
  wide.vocab_size = 9000;
  SyntheticOptions so;
  so.weight_dtype = DType::kF32;
  auto wide_weights = make_synthetic_weights(wide, so);
  ASSERT_TRUE(wide_weights.ok()) << wide_weights.status().to_string();
  const LlamaModel other(wide, std::move(wide_weights).value());
  s = spec_options(SpecMethod::kDraftModel, &other, 2);
  EXPECT_NE(error_of(s).find("vocabulary has 9000 tokens, the target's 8192"), std::string::npos) << error_of(s);
  // Several drafts: each named, no name twice.
  s = spec_options(SpecMethod::kDraftModel, draft_->model.get(), 2);
  s.drafts.push_back({"prose", draft_->model.get()});
  EXPECT_NE(error_of(s).find("name each (--draft-model NAME=PATH)"), std::string::npos) << error_of(s);
  s.drafts[0].name = "prose";
  EXPECT_NE(error_of(s).find("two draft models are named 'prose'"), std::string::npos) << error_of(s);
}

// Named drafts: a request drafts with the draft it names, else with the draft named after its
// prompt's kind (the bundled profiles), else with the first; greedy output stays plain greedy's;
// the stats, bench's and /metrics' figures are kept per draft and per kind; an unknown name is a
// clear error.
TEST_F(SpecEngineTest, NamedDraftsDraftForTheRequestsThatPickThem) {
  auto classifier = DomainClassifier::load(testing::source_dir() + "/models/tachyon-demo/domains.safetensors",
                                           target_->model->config().vocab_size);
  ASSERT_TRUE(classifier.ok()) << classifier.status().to_string();
  auto shared = std::make_shared<const DomainClassifier>(std::move(classifier).value());
  // Two draft models: the bundled one and the same without its last rows (past every prompt's ids).
  const std::unique_ptr<LlamaModel> small = truncated_draft(*draft_->model, 7900);
  const auto options = [&](bool with_classifier) {
    EngineOptions o = small_options();
    o.spec = spec_options(SpecMethod::kDraftModel, nullptr, 0);
    o.spec.drafts = {{"code", draft_->model.get()}, {"prose", small.get()}};
    if (with_classifier) o.spec.classifier = shared;
    return o;
  };
  // Cases 0, 2, 4 are code prompts, 1, 3 and the stop-string case 5 prose.
  std::vector<Case> cases = *cases_;
  cases[0].params.draft = "prose";  // against its kind
  cases[3].params.draft = "code";
  auto e = make_engine(*target_, options(true));
  ASSERT_NE(e, nullptr);
  expect_same(run_all(*e, cases), *plain_, "named drafts");
  const SpecStats s = e->stats().spec;
  EXPECT_EQ(s.proposer, "draft:code,draft:prose");
  ASSERT_EQ(s.by_proposer.size(), 2u);
  EXPECT_GT(s.by_proposer.at("draft:code").num_verify_steps, 0);
  EXPECT_GT(s.by_proposer.at("draft:prose").num_verify_steps, 0);
  EXPECT_GT(s.by_proposer.at("draft:code").propose_seconds, 0.0);
  ASSERT_EQ(s.by_kind.size(), 2u);
  int64_t steps = 0, proposed = 0, accepted = 0;
  for (const auto& [label, c] : s.by_proposer) steps += c.num_verify_steps, proposed += c.num_proposed, accepted += c.num_accepted;
  EXPECT_EQ(steps, s.num_verify_steps);
  EXPECT_EQ(proposed, s.num_proposed);
  EXPECT_EQ(accepted, s.num_accepted);
  EXPECT_EQ(s.by_kind.at("code").num_verify_steps + s.by_kind.at("prose").num_verify_steps, s.num_verify_steps);

  // Who drafts for whom, one request at a time: the named draft, else the prompt's kind, else
  // (no classifier) the first.
  const auto drafted_by = [&](const Case& c, bool with_classifier) {
    auto one = make_engine(*target_, options(with_classifier));
    run_all(*one, {c});
    std::string who;
    for (const auto& [label, counts] : one->stats().spec.by_proposer) {
      if (counts.num_verify_steps > 0) who += (who.empty() ? "" : "+") + label;
    }
    return who;
  };
  EXPECT_EQ(drafted_by(cases[0], true), "draft:prose");
  EXPECT_EQ(drafted_by((*cases_)[0], true), "draft:code");
  EXPECT_EQ(drafted_by((*cases_)[1], true), "draft:prose");
  EXPECT_EQ(drafted_by(cases[3], true), "draft:code");
  EXPECT_EQ(drafted_by((*cases_)[1], false), "draft:code");

  // /metrics carries the breakdown.
  server::ServerMetrics metrics;
  metrics.set_engine_stats(e->stats());
  const std::string text = metrics.render();
  EXPECT_NE(text.find("tachyon_spec_proposer_verify_steps_total{proposer=\"draft:prose\"} " +
                      std::to_string(s.by_proposer.at("draft:prose").num_verify_steps)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tachyon_spec_kind_accepted_tokens_total{kind=\"code\"} " +
                      std::to_string(s.by_kind.at("code").num_accepted)),
            std::string::npos)
      << text;

  // A name not loaded, or a name without named drafts.
  GenerationParams bad = cases[1].params;
  bad.draft = "poetry";
  auto id = e->add_request(cases[1].prompt, bad);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("named drafts: code, prose"), std::string::npos) << id.status().to_string();
  auto plain = make_engine(*target_, small_options());
  bad.draft = "code";
  id = plain->add_request(cases[1].prompt, bad);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("no named draft"), std::string::npos) << id.status().to_string();
}

// A memory budget pays for the target's cache and the draft's (as many blocks each).
TEST_F(SpecEngineTest, KvBudgetPaysForTheDraftCacheToo) {
  EngineOptions o = small_options();
  o.kv.num_blocks = 0;
  o.kv.dtype = DType::kF32;
  const ModelConfig& t = target_->model->config();
  const ModelConfig& d = draft_->model->config();
  const size_t target_block = 2ull * t.num_layers * t.num_kv_heads * t.head_dim * 4 * 16;
  const size_t draft_block = 2ull * d.num_layers * d.num_kv_heads * d.head_dim * 4 * 16;
  o.kv.bytes = 100 * (target_block + draft_block) + target_block / 2;
  auto plain = make_engine(*target_, o);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->stats().kv_blocks_total, static_cast<int>(o.kv.bytes / target_block));
  o.spec = spec_options(SpecMethod::kDraftModel, draft_->model.get(), 2);
  auto spec = make_engine(*target_, o);
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->stats().kv_blocks_total, 100);
  // Two named drafts: each has its own cache of as many blocks.
  o.kv.bytes = 100 * (target_block + 2 * draft_block) + target_block / 2;
  o.spec.drafts = {{"a", draft_->model.get()}, {"b", draft_->model.get()}};
  auto two = make_engine(*target_, o);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->stats().kv_blocks_total, 100);
}

TEST_F(SpecEngineTest, MetricsExportTheAcceptanceFigures) {
  EngineOptions o = small_options();
  o.spec = spec_options(SpecMethod::kDraftModel, draft_->model.get(), 3);
  auto e = make_engine(*target_, o);
  run_all(*e, {(*cases_)[0]});
  const SpecStats s = e->stats().spec;
  ASSERT_GT(s.num_proposed, 0);
  server::ServerMetrics metrics;
  metrics.set_engine_stats(e->stats());
  const std::string text = metrics.render();
  EXPECT_NE(text.find("tachyon_spec_proposed_tokens_total{proposer=\"draft\"} " + std::to_string(s.num_proposed)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tachyon_spec_accepted_tokens_total{proposer=\"draft\"} " + std::to_string(s.num_accepted)),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE tachyon_spec_acceptance_rate gauge"), std::string::npos);
  EXPECT_NE(text.find("tachyon_spec_mean_accepted_length{proposer=\"draft\"}"), std::string::npos);
  EXPECT_NE(text.find("tachyon_spec_tree_steps_total{proposer=\"draft\"} 0"), std::string::npos);
  server::ServerMetrics off;
  off.set_engine_stats(EngineStats{});
  EXPECT_EQ(off.render().find("tachyon_spec_"), std::string::npos);
}

// stories260K (../shared): the model drafts for itself (every draft accepted) and n-gram lookup;
// greedy output equals plain greedy for K = 1..8.
TEST(SpecEngineStories, GreedyEqualsPlainWithSelfDraftAndNgram) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  LoadedModel m = testing::load_model_or_fail(shared + "/models/stories260K");
  std::vector<Case> cases;
  for (const char* text : {"Once upon a time", "Lily and Ben went to the park. Lily and Ben", "The sun"}) {
    Case c;
    c.prompt = m.tokenizer->encode(text);
    c.params.sampling.temperature = 0.0f;
    c.params.max_tokens = 45;
    cases.push_back(c);
  }
  EngineOptions base = small_options();
  const std::vector<Outcome> want = [&] {
    auto e = make_engine(m, base);
    return run_all(*e, cases);
  }();
  for (SpecMethod method : {SpecMethod::kDraftModel, SpecMethod::kNgram}) {
    for (int k = 1; k <= 8; ++k) {
      EngineOptions o = base;
      o.spec = spec_options(method, m.model.get(), k);
      auto e = make_engine(m, o);
      ASSERT_NE(e, nullptr);
      expect_same(run_all(*e, cases), want, std::string(spec_method_name(method)) + " K " + std::to_string(k));
      const SpecStats s = e->stats().spec;
      if (method == SpecMethod::kDraftModel) {
        EXPECT_EQ(s.num_accepted, s.num_proposed) << "a self-draft is always right";
      }
    }
  }
}

}  // namespace
}  // namespace tachyon

namespace tachyon {
namespace {

// Every family of the transformers conformance fixtures (GQA, QKV bias, q/k norm, sliding window,
// tied embeddings, llama3 rope scaling, mixtures of experts): speculative greedy output equals plain
// greedy, with the n-gram proposer (whose drafts are often rejected) and the model as its own
// draft, K 1..8.
TEST(SpecEngineFixtures, GreedyEqualsPlainOnEveryFamily) {
  for (const char* name : {"llama", "llama3-scaled", "llama-tied", "qwen2", "qwen3", "mistral", "qwen3-moe",
                           "qwen2-moe", "mixtral"}) {
    LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/tests/fixtures/models/" + name);
    const int vocab = m.model->config().vocab_size;
    std::vector<Case> cases;
    for (int variant = 0; variant < 2; ++variant) {
      Case c;
      for (int i = 0; i < 24; ++i) c.prompt.push_back(3 + (i % (5 + variant)) * 7 % (vocab - 3));  // repeats
      c.params.sampling.temperature = 0.0f;
      c.params.max_tokens = 24;
      c.params.ignore_eos = true;
      c.params.detokenize = false;
      cases.push_back(c);
    }
    EngineOptions base = small_options();
    base.max_model_len = std::min(base.max_model_len, m.model->config().max_position_embeddings);
    auto plain = make_engine(m, base);
    ASSERT_NE(plain, nullptr) << name;
    const std::vector<Outcome> want = run_all(*plain, cases);
    for (SpecMethod method : {SpecMethod::kNgram, SpecMethod::kDraftModel}) {
      for (int k : {1, 2, 5, 8}) {
        EngineOptions o = base;
        o.spec = spec_options(method, m.model.get(), k);
        auto e = make_engine(m, o);
        ASSERT_NE(e, nullptr) << name;
        expect_same(run_all(*e, cases), want,
                    std::string(name) + " " + spec_method_name(method) + " K " + std::to_string(k));
        EXPECT_GT(e->stats().spec.num_proposed, 0) << name << " proposed nothing";
        EXPECT_TRUE(e->check_no_leaks().ok()) << name;
      }
    }
  }
}

}  // namespace
}  // namespace tachyon
