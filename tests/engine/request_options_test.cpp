// The engine's per-request options beyond sampling, on the bundled model: min_tokens (EOS and stop
// ids masked, stop strings held off until that many tokens are out), stop_token_ids,
// include_stop_str_in_output, and prompt_logprobs, which must equal the log-softmax of a plain
// forward's logits over the prompt (computed here, independently of the engine) at every position,
// whatever the chunking, the batch and the prefix cache.
#include <algorithm>
#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/forward_batch.h"
#include "model/model_loader.h"
#include "plain_forward.h"
#include "test_util.h"

namespace tachyon {
namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  std::string text;
  FinishReason reason = FinishReason::kLength;
  StopCause stop;
  std::vector<PromptLogprob> prompt_logprobs;
  int num_prompt_logprob_outputs = 0;  // outputs that carried prompt logprobs
  int num_cached_tokens = 0;
};

class RequestOptions : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LoadOptions o;
    o.path = testing::source_dir() + "/models/tachyon-demo";
    auto m = load_model(o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = new LoadedModel(std::move(m).value());
  }
  static void TearDownTestSuite() { delete model_; }

  static EngineOptions options() {
    EngineOptions o;
    o.max_model_len = 512;
    o.kv.num_blocks = 256;
    o.scheduler.max_batched_tokens = 64;
    o.scheduler.max_seqs = 8;
    o.batch_invariant = true;
    return o;
  }
  static std::unique_ptr<Engine> make(const EngineOptions& o, std::optional<std::vector<int32_t>> eos = std::nullopt) {
    auto e = Engine::create(*model_->model, model_->tokenizer.get(), eos.value_or(model_->eos_token_ids), o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static std::vector<int32_t> encode(const std::string& text) { return model_->tokenizer->encode(text); }
  static GenerationParams greedy(int max_tokens) {
    GenerationParams p;
    p.sampling.temperature = 0.0f;
    p.max_tokens = max_tokens;
    return p;
  }
  // Steps `e` until idle; each request's run.
  static std::map<RequestId, Outcome> drain(Engine& e) {
    std::map<RequestId, Outcome> out;
    while (e.has_unfinished()) {
      auto outputs = e.step();
      EXPECT_TRUE(outputs.ok()) << outputs.status().to_string();
      if (!outputs.ok()) break;
      for (RequestOutput& o : *outputs) {
        Outcome& r = out[o.id];
        r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
        r.text += o.text;
        if (!o.prompt_logprobs.empty()) {
          ++r.num_prompt_logprob_outputs;
          r.prompt_logprobs = std::move(o.prompt_logprobs);
        }
        if (o.finished) {
          r.reason = o.finish_reason;
          r.stop = o.stop;
          r.num_cached_tokens = o.num_cached_tokens;
          EXPECT_NE(o.finish_reason, FinishReason::kError) << o.error.to_string();
        }
      }
    }
    EXPECT_TRUE(e.check_no_leaks().ok());
    return out;
  }
  static Outcome run_one(const std::vector<int32_t>& prompt, const GenerationParams& p,
                         const EngineOptions& o = options(), std::optional<std::vector<int32_t>> eos = std::nullopt) {
    auto e = make(o, eos);
    auto id = e->add_request(prompt, p);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    return drain(*e)[*id];
  }

  // The logits of every prompt position from one forward over the whole prompt on a fresh cache:
  // [prompt.size(), vocab] f32, the oracle for prompt logprobs.
  static std::vector<float> reference_logits(const std::vector<int32_t>& prompt) {
    return testing::plain_forward_logits(*model_->model, prompt);
  }

  static inline LoadedModel* model_ = nullptr;
};

const char* kPrompt = "func (b *Buffer) Len() int { return len(b.buf) - b.off }\nfunc (b *Buffer) Cap() int {";

// ---- stop_token_ids and min_tokens ----

TEST_F(RequestOptions, StopTokenIdsEndLikeEos) {
  const std::vector<int32_t> prompt = encode(kPrompt);
  GenerationParams p = greedy(12);
  p.ignore_eos = true;
  const Outcome unstopped = run_one(prompt, p);
  ASSERT_EQ(unstopped.tokens.size(), 12u);
  const int32_t third = unstopped.tokens[2];
  p.stop_token_ids = {third};
  const Outcome stopped = run_one(prompt, p);
  const size_t first_at = std::find(unstopped.tokens.begin(), unstopped.tokens.end(), third) - unstopped.tokens.begin();
  ASSERT_EQ(stopped.tokens.size(), first_at + 1);  // the stop token is the last one out
  EXPECT_TRUE(std::equal(stopped.tokens.begin(), stopped.tokens.end(), unstopped.tokens.begin()));
  EXPECT_EQ(stopped.reason, FinishReason::kStop);
  EXPECT_EQ(stopped.stop.kind, StopCause::Kind::kToken);
  EXPECT_EQ(stopped.stop.token, third);
  // Its text is not part of the output unless asked for.
  std::vector<int32_t> before(unstopped.tokens.begin(), unstopped.tokens.begin() + static_cast<ptrdiff_t>(first_at));
  std::vector<int32_t> with(unstopped.tokens.begin(), unstopped.tokens.begin() + static_cast<ptrdiff_t>(first_at) + 1);
  const auto text_of = [&](const std::vector<int32_t>& gen) {
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end());
    return model_->tokenizer->decode(all, true).substr(model_->tokenizer->decode(prompt, true).size());
  };
  EXPECT_EQ(stopped.text, text_of(before));
  p.include_stop_str_in_output = true;
  const Outcome kept = run_one(prompt, p);
  EXPECT_EQ(kept.tokens, stopped.tokens);
  EXPECT_EQ(kept.text, text_of(with));
  // Ids outside the vocabulary are the caller's mistake.
  auto e = make(options());
  GenerationParams bad = greedy(4);
  bad.stop_token_ids = {model_->model->config().vocab_size};
  EXPECT_FALSE(e->add_request(prompt, bad).ok());
}

// min_tokens masks the stop ids (and EOS) from the draw until that many tokens are out: the token
// drawn instead is the best other one, and the request runs at least min_tokens + 1 tokens when
// a stop id ends it.
TEST_F(RequestOptions, MinTokensMasksStopIdsAndEos) {
  const std::vector<int32_t> prompt = encode(kPrompt);
  GenerationParams p = greedy(10);
  p.ignore_eos = true;
  p.sampling.logprobs = 2;
  const Outcome unstopped = run_one(prompt, p);
  const int32_t first = unstopped.tokens[0];
  const int32_t runner_up = unstopped.logprobs[0].top.at(1).first;

  for (const bool as_eos : {false, true}) {
    SCOPED_TRACE(as_eos ? "as EOS" : "as a stop id");
    GenerationParams q = greedy(10);
    std::optional<std::vector<int32_t>> eos;
    if (as_eos) {
      eos = std::vector<int32_t>{first};  // an engine whose EOS is the greedy first token
    } else {
      q.ignore_eos = true;
      q.stop_token_ids = {first};
    }
    const Outcome ends = run_one(prompt, q, options(), eos);
    ASSERT_EQ(ends.tokens, std::vector<int32_t>{first});
    EXPECT_EQ(ends.reason, FinishReason::kStop);
    q.min_tokens = 4;
    const Outcome held = run_one(prompt, q, options(), eos);
    ASSERT_GE(held.tokens.size(), 4u);
    EXPECT_EQ(held.tokens[0], runner_up);  // the best token but the masked one
    for (size_t i = 0; i < 4; ++i) EXPECT_NE(held.tokens[i], first) << i;
    if (held.reason == FinishReason::kStop) {
      EXPECT_GE(held.tokens.size(), 5u);
      EXPECT_EQ(held.tokens.back(), first);
    } else {
      EXPECT_EQ(held.tokens.size(), 10u);
    }
  }
  // ignore_eos with min_tokens: EOS is not masked (it ends nothing anyway).
  GenerationParams q = greedy(3);
  q.ignore_eos = true;
  q.min_tokens = 3;
  EXPECT_EQ(run_one(prompt, q, options(), std::vector<int32_t>{first}).tokens[0], first);
  // min_tokens past max_tokens is the caller's mistake.
  auto e = make(options());
  GenerationParams bad = greedy(4);
  bad.min_tokens = 5;
  EXPECT_FALSE(e->add_request(prompt, bad).ok());
  bad.min_tokens = -1;
  EXPECT_FALSE(e->add_request(prompt, bad).ok());
}

// A stop string cannot end the output before min_tokens tokens: the match must end in the text of
// token min_tokens or later.
TEST_F(RequestOptions, MinTokensHoldsOffStopStrings) {
  const std::vector<int32_t> prompt = encode(kPrompt);
  GenerationParams p = greedy(16);
  p.ignore_eos = true;
  const Outcome unstopped = run_one(prompt, p);
  ASSERT_GE(unstopped.text.size(), 4u);
  const std::string stop = unstopped.text.substr(0, 2);  // in the first tokens' text
  p.stop = {stop};
  const Outcome early = run_one(prompt, p);
  EXPECT_EQ(early.reason, FinishReason::kStop);
  EXPECT_EQ(early.text, "");
  EXPECT_LE(early.tokens.size(), 2u);
  p.min_tokens = 6;
  const Outcome late = run_one(prompt, p);
  ASSERT_GE(late.tokens.size(), 6u);
  EXPECT_TRUE(std::equal(late.tokens.begin(), late.tokens.end(), unstopped.tokens.begin()));
  // What it shows is the unstopped text up to the first match that ends past the first five tokens' text.
  std::vector<int32_t> five = prompt;
  five.insert(five.end(), unstopped.tokens.begin(), unstopped.tokens.begin() + 5);
  const size_t five_end =
      model_->tokenizer->decode(five, true).size() - model_->tokenizer->decode(prompt, true).size();
  size_t at = unstopped.text.find(stop, five_end >= stop.size() ? five_end - stop.size() + 1 : 0);
  if (late.reason == FinishReason::kStop) {
    ASSERT_NE(at, std::string::npos);
    EXPECT_EQ(late.text, unstopped.text.substr(0, at));
    p.include_stop_str_in_output = true;
    EXPECT_EQ(run_one(prompt, p).text, unstopped.text.substr(0, at + stop.size()));
  } else {
    EXPECT_EQ(late.text, unstopped.text);
  }
}

TEST_F(RequestOptions, IncludeStopStrInOutputKeepsTheMatch) {
  const std::vector<int32_t> prompt = encode(kPrompt);
  GenerationParams p = greedy(24);
  p.ignore_eos = true;
  const Outcome unstopped = run_one(prompt, p);
  ASSERT_GE(unstopped.text.size(), 10u);
  const std::string stop = unstopped.text.substr(unstopped.text.size() / 2, 3);
  const size_t at = unstopped.text.find(stop);
  p.stop = {stop};
  const Outcome cut = run_one(prompt, p);
  EXPECT_EQ(cut.reason, FinishReason::kStop);
  EXPECT_EQ(cut.text, unstopped.text.substr(0, at));
  p.include_stop_str_in_output = true;
  const Outcome kept = run_one(prompt, p);
  EXPECT_EQ(kept.reason, FinishReason::kStop);
  EXPECT_EQ(kept.text, unstopped.text.substr(0, at + stop.size()));
  EXPECT_EQ(kept.stop.text, stop);
  EXPECT_EQ(kept.tokens, cut.tokens);
}

// ---- prompt logprobs ----

// Each entry against the log-softmax of the reference logits (double precision) at the position
// before its token, within 1e-4; ranks and top lists up to near ties.
void expect_prompt_logprobs(const std::vector<int32_t>& prompt, const std::vector<float>& logits, int vocab, int top_n,
                            const std::vector<PromptLogprob>& got) {
  ASSERT_EQ(got.size(), prompt.size() - 1);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "prompt token " << i + 1);
    const float* row = logits.data() + i * static_cast<size_t>(vocab);
    const double max = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
    const auto ref = [&](int32_t id) { return static_cast<double>(row[id]) - max - std::log(sum); };
    const int32_t token = prompt[i + 1];
    const PromptLogprob& lp = got[i];
    EXPECT_EQ(lp.token, token);
    EXPECT_NEAR(lp.logprob, ref(token), 1e-4);
    int64_t surely_ahead = 0, maybe_ahead = 0;
    for (int v = 0; v < vocab; ++v) {
      if (v == token) continue;
      surely_ahead += row[v] > row[token] + 1e-4f;
      maybe_ahead += row[v] >= row[token] - 1e-4f;
    }
    EXPECT_GE(lp.rank, surely_ahead + 1);
    EXPECT_LE(lp.rank, maybe_ahead + 1);
    ASSERT_EQ(static_cast<int>(lp.top.size()), top_n);
    std::vector<double> sorted(vocab);
    for (int v = 0; v < vocab; ++v) sorted[v] = ref(v);
    std::partial_sort(sorted.begin(), sorted.begin() + top_n, sorted.end(), std::greater<>());
    for (int k = 0; k < top_n; ++k) {
      EXPECT_NEAR(lp.top[k].second, ref(lp.top[k].first), 1e-4) << "top " << k;
      EXPECT_NEAR(lp.top[k].second, sorted[k], 1e-4) << "top " << k;
      if (k > 0) {
        EXPECT_GE(lp.top[k - 1].second, lp.top[k].second);
      }
    }
  }
}

// Chunked prefill (chunks of 16 and 64 tokens), batched with other requests, after the same prompt
// filled the prefix cache: the prompt is recomputed (no cached tokens) and every entry matches the
// plain forward. The generated tokens are those of a request without prompt logprobs.
TEST_F(RequestOptions, PromptLogprobsEqualAPlainForward) {
  const std::string text =
      std::string(kPrompt) + " return cap(b.buf) }\nfunc (b *Buffer) Reset() { b.buf = b.buf[:0] }";
  const std::vector<int32_t> prompt = encode(text);
  ASSERT_GT(prompt.size(), 40u);
  const int vocab = model_->model->config().vocab_size;
  const std::vector<float> logits = reference_logits(prompt);
  for (const int chunk : {16, 64}) {
    SCOPED_TRACE(::testing::Message() << "max_batched_tokens " << chunk);
    EngineOptions o = options();
    o.scheduler.max_batched_tokens = chunk;
    auto e = make(o);
    GenerationParams plain = greedy(6);
    plain.ignore_eos = true;
    // Fill the prefix cache with the prompt first.
    auto warm = e->add_request(prompt, plain);
    ASSERT_TRUE(warm.ok());
    const Outcome warmed = drain(*e)[*warm];
    GenerationParams with = plain;
    with.prompt_logprobs = 5;
    auto id = e->add_request(prompt, with);
    auto other = e->add_request(encode("Once upon a time there was"), plain);
    auto again = e->add_request(prompt, plain);
    ASSERT_TRUE(id.ok() && other.ok() && again.ok());
    std::map<RequestId, Outcome> runs = drain(*e);
    const Outcome& r = runs[*id];
    EXPECT_EQ(r.num_cached_tokens, 0);  // recomputed: cached positions have no logits
    EXPECT_EQ(r.num_prompt_logprob_outputs, 1);
    EXPECT_EQ(r.tokens, warmed.tokens);
    expect_prompt_logprobs(prompt, logits, vocab, 5, r.prompt_logprobs);
    EXPECT_TRUE(runs[*other].prompt_logprobs.empty());
    EXPECT_GT(runs[*again].num_cached_tokens, 0);  // the others still use the cache
    EXPECT_EQ(runs[*again].tokens, warmed.tokens);
  }
}

TEST_F(RequestOptions, PromptLogprobsEdges) {
  // One prompt token: nothing before it, no entry (the server shows [null]).
  GenerationParams p = greedy(2);
  p.prompt_logprobs = 0;
  const Outcome one = run_one({model_->tokenizer->bos_id()}, p);
  EXPECT_TRUE(one.prompt_logprobs.empty());
  EXPECT_EQ(one.tokens.size(), 2u);
  // N = 0: the prompt token alone.
  const std::vector<int32_t> prompt = encode("Once upon a time");
  const Outcome zero = run_one(prompt, p);
  ASSERT_EQ(zero.prompt_logprobs.size(), prompt.size() - 1);
  for (const PromptLogprob& lp : zero.prompt_logprobs) EXPECT_TRUE(lp.top.empty());
  expect_prompt_logprobs(prompt, reference_logits(prompt), model_->model->config().vocab_size, 0,
                         zero.prompt_logprobs);
  // Out of range, or with prefill-only (its prompt is handed over), is the caller's mistake.
  auto e = make(options());
  p.prompt_logprobs = SamplingParams::kMaxLogprobs + 1;
  EXPECT_FALSE(e->add_request(prompt, p).ok());
  p.prompt_logprobs = 2;
  p.prefill_only = true;
  EXPECT_FALSE(e->add_request(prompt, p).ok());
}

// A cache too small for everything at once preempts (the newest running sequence, which may be
// mid-prefill); recomputed chunks do not duplicate entries, and a sequence preempted after its
// first token does not compute them again.
TEST_F(RequestOptions, PromptLogprobsSurvivePreemption) {
  EngineOptions o = options();
  o.kv.num_blocks = 12;  // 192 tokens for four requests of ~100
  o.max_model_len = 192;
  o.scheduler.max_batched_tokens = 32;
  o.kv.prefix_caching = false;
  auto e = make(o);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestId> ids;
  for (int i = 0; i < 4; ++i) {
    std::string text = std::string(kPrompt) + " // " + std::to_string(i) + " " + std::string(kPrompt);
    prompts.push_back(encode(text));
    GenerationParams p = greedy(40);  // decodes that cross block boundaries preempt the newest
    p.ignore_eos = true;
    p.prompt_logprobs = 3;
    auto id = e->add_request(prompts.back(), p);
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  std::map<RequestId, Outcome> runs = drain(*e);
  EXPECT_GT(e->stats().num_preemptions, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(runs[ids[i]].num_prompt_logprob_outputs, 1);
    expect_prompt_logprobs(prompts[i], reference_logits(prompts[i]), model_->model->config().vocab_size, 3,
                           runs[ids[i]].prompt_logprobs);
  }
}

}  // namespace
}  // namespace tachyon
