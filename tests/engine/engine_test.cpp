// The engine under concurrency, on the bundled model: 32 prompts of mixed lengths run together
// must produce, token for token, what each produces alone — with chunked prefill on and off,
// with a KV cache small enough to force preemptions, with prefix-cache hits, with staggered
// arrivals and aborts — and every KV block must be back in the pool afterwards. Batch-invariant
// linear layers make "the same" exact (without them a batched GEMM sums in another order).
#include <algorithm>
#include <cstdio>
#include <map>

#include <gtest/gtest.h>

#include "core/mapped_file.h"
#include "engine/engine.h"
#include "engine/request_text.h"
#include "model/forward_batch.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace tachyon {
namespace {

struct Case {
  std::vector<int32_t> prompt;
  GenerationParams params;
};

struct Result1 {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::kLength;
  StopCause stop;
};

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LoadOptions o;
    o.path = testing::source_dir() + "/models/tachyon-demo";
    auto m = load_model(o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = new LoadedModel(std::move(m).value());
    auto code = read_text_file(testing::source_dir() + "/tests/data/eval/code.txt");
    auto prose = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
    ASSERT_TRUE(code.ok() && prose.ok());
    // 32 prompts of 1 to ~130 tokens; the last eight share a 300-byte prefix.
    const std::string shared_prefix = code->substr(50000, 300);
    for (int i = 0; i < 32; ++i) {
      const std::string& src = i % 2 == 0 ? *code : *prose;
      const size_t len = static_cast<size_t>(i == 0 ? 1 : (i * 97) % 420 + 5);
      std::string text = src.substr(static_cast<size_t>(i) * 4099 % (src.size() - 1000), len);
      if (i >= 24) text = shared_prefix + text.substr(0, static_cast<size_t>(i * 7));
      Case c;
      c.prompt = model_->tokenizer->encode(text);
      c.params.sampling.temperature = 0.0f;
      c.params.max_tokens = 6 + (i * 5) % 15;
      cases_.push_back(c);
    }
    alone_ = new std::vector<Result1>();
    for (const Case& c : cases_) alone_->push_back(run_alone(c));
  }
  static void TearDownTestSuite() {
    delete alone_;
    delete model_;
    cases_.clear();
  }

  static EngineOptions base_options() {
    EngineOptions o;
    o.max_model_len = 512;
    o.kv.num_blocks = 512 / 16 * 32;
    o.scheduler.max_batched_tokens = 256;
    o.scheduler.max_seqs = 32;
    o.batch_invariant = true;
    return o;
  }

  static std::unique_ptr<Engine> make(const EngineOptions& o) {
    auto e = Engine::create(*model_->model, model_->tokenizer.get(), model_->eos_token_ids, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  }

  static Result1 run_alone(const Case& c) {
    EngineOptions o = base_options();
    o.scheduler.max_seqs = 1;
    o.kv.num_blocks = 512 / 16;
    o.kv.prefix_caching = false;
    auto e = make(o);
    std::map<RequestId, Result1> out;
    auto id = e->add_request(c.prompt, c.params);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    drain(*e, out);
    return out[*id];
  }

  // Steps until idle, collecting every request's tokens and text; checks per-step invariants.
  // `between_steps(engine, step)` runs before every step and returns whether more requests are
  // still to come (the loop ends when none are and the engine is idle).
  static void drain(Engine& e, std::map<RequestId, Result1>& out,
                    const std::function<bool(Engine&, int)>& between_steps = nullptr) {
    int step = 0;
    bool more = true;
    while (more || e.has_unfinished()) {
      more = between_steps ? between_steps(e, step) : false;
      auto outputs = e.step();
      ASSERT_TRUE(outputs.ok()) << outputs.status().to_string();
      for (const RequestOutput& o : *outputs) {
        Result1& r = out[o.id];
        r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        r.text += o.text;
        EXPECT_EQ(o.logprobs.size(), o.new_token_ids.size());
        if (o.finished) {
          r.reason = o.finish_reason;
          r.stop = o.stop;
          const RequestTiming& t = o.timing;
          if (o.finish_reason != FinishReason::kAbort) {
            EXPECT_LE(t.arrival, t.first_scheduled);
            EXPECT_LE(t.first_scheduled, t.first_token);
            EXPECT_LE(t.first_token, t.finished);
            EXPECT_EQ(t.token_times.size(), static_cast<size_t>(o.num_generated_tokens));
            EXPECT_TRUE(std::is_sorted(t.token_times.begin(), t.token_times.end()));
          }
        }
      }
      ASSERT_LT(++step, 100000) << "the engine does not finish";
    }
    const Status leaks = e.check_no_leaks();
    EXPECT_TRUE(leaks.ok()) << leaks.to_string();
    EXPECT_EQ(e.stats().kv_blocks_used, 0);
  }

  // All cases at once; returns results in case order.
  static std::vector<Result1> run_together(Engine& e, const std::vector<Case>& cases) {
    std::vector<RequestId> ids;
    for (const Case& c : cases) {
      auto id = e.add_request(c.prompt, c.params);
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(*id);
    }
    std::map<RequestId, Result1> out;
    drain(e, out);
    std::vector<Result1> r;
    for (RequestId id : ids) r.push_back(out[id]);
    return r;
  }

  // Runs `cases` batched on `e` to the end and returns each one's tokens. Before every step, each
  // decoding sequence must hold at most the window's blocks and one more (window and block in
  // tokens); `per_step` sees the engine then too. Returns how many decoding sequences were checked
  // in `decoding_seen`.
  static std::vector<std::vector<int32_t>> run_checking_the_window(Engine& e, const std::vector<Case>& cases,
                                                                   int window, int block,
                                                                   const std::function<void(Engine&)>& per_step,
                                                                   int& decoding_seen) {
    std::vector<RequestId> ids;
    for (const Case& c : cases) {
      auto id = e.add_request(c.prompt, c.params);
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      if (id.ok()) ids.push_back(*id);
    }
    std::map<RequestId, Result1> out;
    decoding_seen = 0;
    drain(e, out, [&](Engine& engine, int) {
      per_step(engine);
      for (RequestId id : ids) {
        const Sequence* seq = engine.find_sequence(id);
        if (seq == nullptr || seq->state() != SequenceState::kDecoding) continue;
        ++decoding_seen;
        EXPECT_LE(seq->block_table().num_resident(), (window + block - 2) / block + 2) << "request " << id;
      }
      return false;
    });
    std::vector<std::vector<int32_t>> tokens;
    for (RequestId id : ids) tokens.push_back(out[id].tokens);
    return tokens;
  }

  static void expect_same_as_alone(const std::vector<Result1>& got, const char* what) {
    ASSERT_EQ(got.size(), alone_->size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, (*alone_)[i].tokens) << what << ": prompt " << i;
      EXPECT_EQ(got[i].text, (*alone_)[i].text) << what << ": prompt " << i;
      EXPECT_EQ(got[i].reason, (*alone_)[i].reason) << what << ": prompt " << i;
    }
  }

  static LoadedModel* model_;
  static std::vector<Case> cases_;
  static std::vector<Result1>* alone_;
};

LoadedModel* EngineTest::model_ = nullptr;
std::vector<Case> EngineTest::cases_;
std::vector<Result1>* EngineTest::alone_ = nullptr;

TEST_F(EngineTest, PromptsAreMixedLengths) {
  size_t shortest = 1 << 20, longest = 0;
  for (const Case& c : cases_) {
    shortest = std::min(shortest, c.prompt.size());
    longest = std::max(longest, c.prompt.size());
  }
  EXPECT_LE(shortest, 2u);
  EXPECT_GE(longest, 100u);
  for (const Result1& r : *alone_) EXPECT_FALSE(r.tokens.empty());
}

TEST_F(EngineTest, BatchedWithChunkedPrefillEqualsAlone) {
  auto e = make(base_options());
  expect_same_as_alone(run_together(*e, cases_), "chunked");
  EXPECT_EQ(e->stats().num_preemptions, 0);
}

// Quantized KV caches on the bundled model: greedy continuations of 32 tokens from the 32 prompts
// against a bf16 cache's. The share of prompts whose first 32 tokens all agree is printed, with
// an f32 cache's share as the yardstick (bf16 itself rounds K/V); i8 must keep most of them,
// f8e4m3 (3 mantissa bits) at least 40 %. Batching, prefix hits and
// preemption keep a quantized cache's outputs exactly (the codes of a token do not depend on
// what else is in the batch).
TEST_F(EngineTest, QuantizedKvCachesKeepGreedyOutputs) {
  std::vector<Case> cases = cases_;
  for (Case& c : cases) c.params.max_tokens = 32;
  const auto run = [&](DType dtype, bool small_cache) {
    EngineOptions o = base_options();
    o.kv.dtype = dtype;
    if (small_cache) {
      o.max_model_len = 320;
      o.kv.num_blocks = 24;  // far less than the 32 requests need: preemptions
      o.scheduler.max_batched_tokens = 96;
    }
    auto e = make(o);
    std::vector<Result1> r = run_together(*e, cases);
    if (small_cache) EXPECT_GT(e->stats().num_preemptions, 0);
    return r;
  };
  const std::vector<Result1> bf16 = run(DType::kBF16, false);
  for (auto [dtype, min_share] : {std::pair{DType::kF32, 0.5}, std::pair{DType::kI8, 0.5}, std::pair{DType::kF8E4M3, 0.4}}) {
    const std::vector<Result1> q = run(dtype, false);
    int agree = 0, eligible = 0;
    for (size_t i = 0; i < q.size(); ++i) {
      if (bf16[i].tokens.size() < 32) continue;  // ended early (end of text): not a 32-token comparison
      ++eligible;
      agree += q[i].tokens == bf16[i].tokens;
    }
    ASSERT_GT(eligible, 16);
    const double share = static_cast<double>(agree) / eligible;
    std::printf("kv %s: %d of %d prompts agree with the bf16 cache on all of their first 32 greedy tokens (%.0f%%)\n",
                dtype_name(dtype), agree, eligible, 100.0 * share);
    RecordProperty(fmt::format("agree_32_{}", dtype_name(dtype)), fmt::format("{}/{}", agree, eligible));
    EXPECT_GE(share, min_share) << dtype_name(dtype);
    if (dtype == DType::kF32) continue;
    const std::vector<Result1> preempted = run(dtype, true);
    for (size_t i = 0; i < q.size(); ++i) {
      EXPECT_EQ(preempted[i].tokens, q[i].tokens) << dtype_name(dtype) << " prompt " << i << " under preemption";
    }
  }
}

TEST_F(EngineTest, BatchedWithoutChunkedPrefillEqualsAlone) {
  EngineOptions o = base_options();
  o.scheduler.chunked_prefill = false;
  o.scheduler.max_batched_tokens = 512;
  auto e = make(o);
  expect_same_as_alone(run_together(*e, cases_), "unchunked");
}

TEST_F(EngineTest, PreemptionUnderASmallCacheKeepsOutputs) {
  for (bool chunked : {true, false}) {
    EngineOptions o = base_options();
    o.max_model_len = 320;
    o.kv.num_blocks = 20;  // 320 tokens for 32 requests that need ~2900
    o.scheduler.chunked_prefill = chunked;
    o.scheduler.max_batched_tokens = chunked ? 96 : 320;
    o.kv.prefix_caching = false;
    auto e = make(o);
    expect_same_as_alone(run_together(*e, cases_), chunked ? "preempted, chunked" : "preempted, unchunked");
    EXPECT_GT(e->stats().num_preemptions, 0);
  }
}

TEST_F(EngineTest, PrefixCacheHitsOnASecondRunAndKeepsOutputs) {
  EngineOptions o = base_options();
  o.kv.num_blocks = 1024;
  auto e = make(o);
  expect_same_as_alone(run_together(*e, cases_), "prefix cache, first run");
  const PrefixCacheStats first = e->stats().prefix;
  EXPECT_GT(first.hit_tokens, 0);  // the shared 300-byte prefix
  expect_same_as_alone(run_together(*e, cases_), "prefix cache, second run");
  const PrefixCacheStats both = e->stats().prefix;
  const int64_t second_hits = both.hit_tokens - first.hit_tokens;
  const int64_t second_queries = both.query_tokens - first.query_tokens;
  EXPECT_GT(static_cast<double>(second_hits), 0.8 * static_cast<double>(second_queries - 16 * 32));
}

TEST_F(EngineTest, PrefixCacheWithEvictionAndPreemption) {
  EngineOptions o = base_options();
  o.kv.num_blocks = 48;
  o.scheduler.max_batched_tokens = 128;
  auto e = make(o);
  expect_same_as_alone(run_together(*e, cases_), "small cache with prefix caching, first run");
  expect_same_as_alone(run_together(*e, cases_), "small cache with prefix caching, second run");
  EXPECT_GT(e->stats().prefix.evictions, 0);
}

TEST_F(EngineTest, StaggeredArrivalsAndAbortsKeepOutputs) {
  auto e = make(base_options());
  std::map<RequestId, size_t> index_of;
  std::map<RequestId, Result1> out;
  std::vector<RequestId> aborted;
  size_t next = 0;
  drain(*e, out, [&](Engine& eng, int step) {
    // A new request every other step; abort a few mid-prefill or mid-decode.
    if (next < cases_.size() && step % 2 == 0) {
      auto id = eng.add_request(cases_[next].prompt, cases_[next].params);
      EXPECT_TRUE(id.ok());
      index_of[*id] = next++;
    }
    if (step == 5 || step == 9 || step == 20 || step == 41) {
      const RequestId victim = index_of.rbegin()->first;  // the newest: often mid-prefill
      if (eng.abort(victim)) aborted.push_back(victim);
    }
    if (step == 30 && !index_of.empty()) {
      const RequestId victim = index_of.begin()->first + 3;  // an older one: mid-decode or done
      if (eng.abort(victim)) aborted.push_back(victim);
    }
    return next < cases_.size();
  });
  EXPECT_EQ(next, cases_.size());
  EXPECT_GE(aborted.size(), 3u);
  for (const auto& [id, i] : index_of) {
    const bool was_aborted = std::find(aborted.begin(), aborted.end(), id) != aborted.end();
    if (was_aborted) {
      EXPECT_EQ(out[id].reason, FinishReason::kAbort);
      // What it produced before the abort is a prefix of its solo output.
      const auto& full = (*alone_)[i].tokens;
      ASSERT_LE(out[id].tokens.size(), full.size());
      EXPECT_TRUE(std::equal(out[id].tokens.begin(), out[id].tokens.end(), full.begin()));
    } else {
      EXPECT_EQ(out[id].tokens, (*alone_)[i].tokens) << "prompt " << i;
      EXPECT_EQ(out[id].text, (*alone_)[i].text) << "prompt " << i;
    }
  }
  EXPECT_FALSE(e->abort(12345));
}

TEST_F(EngineTest, SeededSamplingSurvivesPreemption) {
  std::vector<Case> sampled = cases_;
  for (size_t i = 0; i < sampled.size(); ++i) {
    sampled[i].params.sampling.temperature = 0.9f;
    sampled[i].params.sampling.top_p = 0.95f;
    sampled[i].params.sampling.repetition_penalty = 1.1f;
    sampled[i].params.sampling.seed = 1000 + i;
  }
  std::vector<Result1> alone;
  for (const Case& c : sampled) alone.push_back(run_alone(c));
  EngineOptions o = base_options();
  o.max_model_len = 320;
  o.kv.num_blocks = 20;
  o.scheduler.max_batched_tokens = 96;
  auto e = make(o);
  const auto got = run_together(*e, sampled);
  EXPECT_GT(e->stats().num_preemptions, 0);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tokens, alone[i].tokens) << "prompt " << i;
}

TEST_F(EngineTest, StopStringsSplitAcrossTokensEndTheTextBeforeThem) {
  // Find a solo output whose text has a boundary between two tokens with text on both sides.
  int tested = 0;
  for (size_t i = 0; i < cases_.size() && tested < 6; ++i) {
    const Result1& solo = (*alone_)[i];
    if (solo.tokens.size() < 4) continue;
    std::string before;  // text of the first two tokens
    for (size_t k = 0; k < 2; ++k) before += model_->tokenizer->decode({solo.tokens[k]});
    if (before.size() < 2 || solo.text.size() < before.size() + 2 || solo.text.compare(0, before.size(), before) != 0) {
      continue;
    }
    const std::string stop = solo.text.substr(before.size() - 1, 3);  // straddles tokens 2 and 3
    const size_t first = solo.text.find(stop);
    Case c = cases_[i];
    c.params.stop = {"\x01never", stop};
    auto e = make(base_options());
    auto id = e->add_request(c.prompt, c.params);
    ASSERT_TRUE(id.ok());
    std::map<RequestId, Result1> out;
    StopCause stop_cause;
    while (e->has_unfinished()) {
      auto outputs = e->step();
      ASSERT_TRUE(outputs.ok());
      for (const auto& o : *outputs) {
        out[o.id].text += o.text;
        // Nothing after the first possible start of the stop string is ever shown.
        EXPECT_LE(out[o.id].text.size(), first);
        if (o.finished) {
          out[o.id].reason = o.finish_reason;
          stop_cause = o.stop;
        }
      }
    }
    EXPECT_EQ(out[*id].text, solo.text.substr(0, first)) << "stop '" << stop << "'";
    EXPECT_EQ(out[*id].reason, FinishReason::kStop);
    EXPECT_EQ(stop_cause.kind, StopCause::Kind::kString);
    EXPECT_EQ(stop_cause.text, stop);
    EXPECT_TRUE(e->check_no_leaks().ok());
    ++tested;
  }
  EXPECT_GE(tested, 3);
}

TEST_F(EngineTest, FinishReasons) {
  auto e = make(base_options());
  const Case& c = cases_[3];
  const Result1& solo = (*alone_)[3];
  ASSERT_GE(solo.tokens.size(), 3u);
  // A stop token: generation ends with it (its id reported, no text for it).
  GenerationParams p = c.params;
  p.stop_token_ids = {solo.tokens[2]};
  auto id = e->add_request(c.prompt, p);
  ASSERT_TRUE(id.ok());
  std::map<RequestId, Result1> out;
  drain(*e, out);
  const size_t first_at = static_cast<size_t>(std::find(solo.tokens.begin(), solo.tokens.end(), solo.tokens[2]) -
                                              solo.tokens.begin());
  EXPECT_EQ(out[*id].tokens, std::vector<int32_t>(solo.tokens.begin(), solo.tokens.begin() + first_at + 1));
  EXPECT_EQ(out[*id].reason, FinishReason::kStop);
  EXPECT_EQ(out[*id].stop.kind, StopCause::Kind::kToken);
  EXPECT_EQ(out[*id].stop.token, solo.tokens[2]);
  // The context: a 500-token limit on a 512-token model stops a long generation.
  EngineOptions o = base_options();
  o.max_model_len = c.prompt.size() + 4;
  auto small = make(o);
  GenerationParams q = c.params;
  q.max_tokens = 50;
  q.ignore_eos = true;
  auto id2 = small->add_request(c.prompt, q);
  ASSERT_TRUE(id2.ok());
  std::map<RequestId, Result1> out2;
  drain(*small, out2);
  EXPECT_EQ(out2[*id2].tokens.size(), 4u);
  EXPECT_EQ(out2[*id2].reason, FinishReason::kContext);
}

// One set of text rules (engine/request_text.h): text a consumer makes from the engine's outputs
// with RequestText::append (what the server does for requests without stop strings) equals the
// text the engine makes itself, for requests that end at their length, at a stop token (which has
// no text) and at EOS, run together.
TEST_F(EngineTest, TextMadeFromOutputsEqualsTheEnginesText) {
  std::vector<Case> cases(cases_.begin(), cases_.begin() + 12);
  for (size_t i = 0; i < cases.size(); i += 3) {
    const Result1& solo = (*alone_)[i];
    if (solo.tokens.size() > 2) cases[i].params.stop_token_ids = {solo.tokens[2]};
  }
  const auto run = [&](bool engine_text, std::map<RequestId, Result1>& out, std::vector<RequestId>& ids) {
    auto e = make(base_options());
    std::map<RequestId, std::unique_ptr<RequestText>> texts;
    for (const Case& c : cases) {
      GenerationParams p = c.params;
      p.detokenize = engine_text;
      auto id = e->add_request(c.prompt, p);
      ASSERT_TRUE(id.ok());
      ids.push_back(*id);
      if (!engine_text) texts[*id] = std::make_unique<RequestText>(*model_->tokenizer, p, c.prompt);
    }
    while (e->has_unfinished()) {
      auto outputs = e->step();
      ASSERT_TRUE(outputs.ok());
      for (RequestOutput& o : *outputs) {
        if (!engine_text) {
          ASSERT_TRUE(o.text.empty());
          texts[o.id]->append(o);
        }
        out[o.id].text += o.text;
        out[o.id].tokens.insert(out[o.id].tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (o.finished) out[o.id].reason = o.finish_reason;
      }
    }
  };
  std::map<RequestId, Result1> engine_out, consumer_out;
  std::vector<RequestId> engine_ids, consumer_ids;
  run(true, engine_out, engine_ids);
  run(false, consumer_out, consumer_ids);
  int stopped_by_token = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Result1& a = engine_out[engine_ids[i]];
    const Result1& b = consumer_out[consumer_ids[i]];
    EXPECT_EQ(a.tokens, b.tokens) << i;
    EXPECT_EQ(a.text, b.text) << i;
    EXPECT_FALSE(a.text.empty()) << i;
    stopped_by_token += a.reason == FinishReason::kStop;
  }
  EXPECT_GE(stopped_by_token, 2);
}

// The disaggregation hook (engine/kv_hook.h) without disagg/'s copies: a held request's blocks go
// back whatever its read returns, and an adoption whose fill fails leaves nothing behind.
TEST_F(EngineTest, TransferHookFreesBlocksWhateverTheCopyReturns) {
  auto e = make(base_options());
  const Case& c = cases_[5];
  GenerationParams p = c.params;
  p.prefill_only = true;
  auto id = e->add_request(c.prompt, p);
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  while (e->has_unfinished()) ASSERT_TRUE(e->step().ok());
  EXPECT_GT(e->stats().kv_blocks_used, 0);  // held for the transfer
  std::vector<int32_t> tokens;
  TransferredSequence held;
  const Status read = e->release_transfer(*id, [&](const TransferredSequence& seq, const SequenceBlocks& blocks) {
    tokens.assign(seq.tokens.begin(), seq.tokens.end());
    held = seq;
    EXPECT_EQ(blocks.cache, &e->kv_cache());
    EXPECT_EQ(blocks.begin, 0);
    EXPECT_EQ(blocks.end, seq.num_computed);
    EXPECT_GE(static_cast<int>(blocks.block_table.size()) * e->options().kv.block_size, seq.num_computed);
    return make_error(ErrorCode::kIo, "the copy failed");
  });
  EXPECT_EQ(read.code(), ErrorCode::kIo) << read.to_string();
  EXPECT_EQ(tokens.size(), c.prompt.size() + 1);
  EXPECT_EQ(held.num_prompt_tokens, static_cast<int>(c.prompt.size()));
  EXPECT_EQ(held.num_computed, static_cast<int>(c.prompt.size()));
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
  EXPECT_TRUE(e->check_no_leaks().ok());
  const auto never = [](const TransferredSequence&, const SequenceBlocks&) {
    ADD_FAILURE() << "read a request no longer held";
    return Status::Ok();
  };
  EXPECT_EQ(e->release_transfer(*id, never).code(), ErrorCode::kNotFound);

  held.tokens = tokens;
  int filled_from = -1;
  auto adopted = e->adopt_sequence(held, c.params, [&](const SequenceBlocks& blocks) {
    filled_from = blocks.begin;
    EXPECT_EQ(blocks.end, held.num_computed);
    return make_error(ErrorCode::kIo, "the copy failed");
  });
  EXPECT_EQ(adopted.status().code(), ErrorCode::kIo) << adopted.status().to_string();
  EXPECT_GE(filled_from, 0);
  EXPECT_FALSE(e->has_unfinished());
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
  EXPECT_TRUE(e->check_no_leaks().ok());
}

TEST_F(EngineTest, BadRequestsAreErrors) {
  auto e = make(base_options());
  GenerationParams p;
  EXPECT_EQ(e->add_request(std::vector<int32_t>{}, p).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e->add_request(std::vector<int32_t>(512, 5), p).status().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(e->add_request(std::vector<int32_t>{1, 99999}, p).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e->add_request(std::vector<int32_t>{1, -1}, p).status().code(), ErrorCode::kInvalidArgument);
  GenerationParams zero = p;
  zero.max_tokens = 0;
  EXPECT_FALSE(e->add_request(std::vector<int32_t>{1, 2}, zero).ok());
  GenerationParams hot = p;
  hot.sampling.temperature = -3.0f;
  EXPECT_FALSE(e->add_request(std::vector<int32_t>{1, 2}, hot).ok());
  GenerationParams nan = p;
  nan.sampling.top_p = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(e->add_request(std::vector<int32_t>{1, 2}, nan).ok());
  GenerationParams stops = p;
  stops.stop.assign(100, "x");
  EXPECT_FALSE(e->add_request(std::vector<int32_t>{1, 2}, stops).ok());
  // Invalid UTF-8 in a text prompt is repaired by the tokenizer, not an error.
  EXPECT_TRUE(e->add_request(std::string_view("\xff\xfe hello \xc3"), p).ok());
  std::map<RequestId, Result1> out;
  drain(*e, out);
  EXPECT_FALSE(e->has_unfinished());
  // Engine options that cannot work.
  EngineOptions o = base_options();
  o.kv.num_blocks = 4;  // 64 tokens < max_model_len 512, set explicitly
  EXPECT_EQ(Engine::create(*model_->model, nullptr, {}, o).status().code(), ErrorCode::kOutOfMemory);
  o = base_options();
  o.scheduler.chunked_prefill = false;
  o.scheduler.max_batched_tokens = 100;
  EXPECT_FALSE(Engine::create(*model_->model, nullptr, {}, o).ok());
  o = base_options();
  o.max_model_len = 100000;
  EXPECT_FALSE(Engine::create(*model_->model, nullptr, {}, o).ok());
  // No tokenizer: text prompts and stop strings are errors, ids work.
  auto bare = Engine::create(*model_->model, nullptr, {}, base_options());
  ASSERT_TRUE(bare.ok());
  EXPECT_FALSE((*bare)->add_request(std::string_view("hello"), p).ok());
  GenerationParams with_stop = p;
  with_stop.stop = {"x"};
  EXPECT_FALSE((*bare)->add_request(std::vector<int32_t>{1, 2}, with_stop).ok());
}



// A greedy decode of one prompt alone, forward by forward (the prompt in one, then one per token),
// in batch-invariant linear mode over a cache with `tiers`. The block manager applies `retire` (its
// own tiers, e.g. none: windowed attention over a cache that frees nothing) after each forward and
// the cache runs the compressions that queues. `sparse_budget` > 0: the decode forwards attend
// block-sparse with that budget (the prompt's, like any chunk of several tokens, densely).
::testing::AssertionResult greedy_alone_with_tiers(const LlamaModel& model, const std::vector<int32_t>& prompt,
                                                   int max_tokens, const KvTierOptions& tiers,
                                                   const KvTierOptions& retire, std::vector<int32_t>& out,
                                                   int* num_history = nullptr, int sparse_budget = 0) {
  constexpr int kBlock = 16;
  KvCacheConfig kv;
  kv.num_layers = model.config().num_layers;
  kv.num_kv_heads = model.config().num_kv_heads;
  kv.head_dim = model.config().head_dim;
  kv.block_size = kBlock;
  kv.num_blocks = 512 / kBlock;
  kv.tiers = tiers;
  kv.num_history_blocks = tiers.history_bits() != 0 ? kv.num_blocks : 0;
  kv.key_bounds = sparse_budget > 0;
  auto cache = KvCache::create(kv);
  if (!cache.ok()) return ::testing::AssertionFailure() << cache.status().to_string();
  BlockManager blocks({kv.num_blocks, kBlock, false, retire, retire.history_bits() != 0 ? kv.num_history_blocks : 0});
  BlockTable table(kBlock);
  ForwardOptions fo;
  fo.linear_mode = ops::LinearMode::kBatchInvariant;
  const int vocab = model.config().vocab_size;
  std::vector<int32_t> run = prompt;
  int start = 0;
  out.clear();
  while (static_cast<int>(out.size()) < max_tokens) {
    if (!blocks.grow_to(table, start + static_cast<int>(run.size())).ok()) {
      return ::testing::AssertionFailure() << "no block at position " << start;
    }
    SequenceChunk chunk{&table, start, run, LogitsWanted::kLast, {}, sparse_budget};
    Tensor logits;
    const Status st = model.forward(build_forward_batch({chunk}), *cache, logits, fo);
    if (!st.ok()) return ::testing::AssertionFailure() << st.to_string();
    const float* row = logits.data<float>();
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    start += static_cast<int>(run.size());
    blocks.retire(table, start);
    cache->compress_blocks(blocks.take_compressions());
    out.push_back(next);
    run = {next};
  }
  if (num_history != nullptr) *num_history = table.num_history();
  return ::testing::AssertionSuccess();
}

// Every fourth of the suite's prompts (eight at most, starting at `first`), generating 150-170
// tokens each whatever they sample.
std::vector<Case> long_cases(const std::vector<Case>& all, size_t first, int base_tokens) {
  std::vector<Case> cases;
  for (size_t i = first; i < all.size() && cases.size() < 8; i += 4) {
    Case c = all[i];
    c.params.max_tokens = base_tokens + static_cast<int>(i);
    c.params.ignore_eos = true;
    cases.push_back(c);
  }
  return cases;
}

// --kv-window 64 --kv-history drop: eight requests of ~300 tokens each in a cache of 48 blocks
// (768 tokens, a third of what they hold together) run batched, each holding about its window's
// blocks, and give token for token what windowed attention over a cache that frees nothing gives
// (a greedy decode of each prompt alone, forward by forward). Every block comes back.
TEST_F(EngineTest, KvWindowDropEqualsWindowedAttentionAndHoldsOnlyTheWindow) {
  constexpr int kWindow = 64, kBlock = 16;
  const std::vector<Case> cases = long_cases(cases_, 0, 160);
  const KvTierOptions drop{kWindow, KvHistory::kDrop};
  // The oracle: windowed attention (the cache's tiers) with a block manager that never releases.
  std::vector<std::vector<int32_t>> expected(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(greedy_alone_with_tiers(*model_->model, cases[i].prompt, cases[i].params.max_tokens, drop, {},
                                        expected[i]));
  }

  EngineOptions o = base_options();
  o.kv.tiers = drop;
  o.kv.num_blocks = 48;
  auto e = make(o);
  ASSERT_NE(e, nullptr);
  int decoding_seen = 0;
  const auto got = run_checking_the_window(*e, cases, kWindow, kBlock, [](Engine&) {}, decoding_seen);
  EXPECT_GT(decoding_seen, 100);
  int64_t total = 0;
  ASSERT_EQ(got.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i], expected[i]) << "prompt " << i;
    total += static_cast<int64_t>(cases[i].prompt.size()) + cases[i].params.max_tokens;
  }
  EXPECT_GT(total, 2 * 48 * kBlock);  // the requests hold far more positions than the cache
  EXPECT_EQ(e->stats().kv_blocks_free + e->stats().kv_blocks_cached, 48);
}


// --kv-window 64 --kv-history int4: eight requests of ~300 tokens each run batched, their blocks
// moving into int4 history as the window passes them, and give token for token what the same
// steps give one request at a time (its prompt in one forward, then one forward per token, the
// block manager retiring after each and the cache compressing). The reference attention tests tie
// attention over history blocks to the scalar reference; this ties the engine's bookkeeping to
// that. Every block and history block comes back.
TEST_F(EngineTest, KvHistoryInt4BatchedEqualsOneAtATimeAndFreesEverything) {
  constexpr int kWindow = 64, kBlock = 16;
  const std::vector<Case> cases = long_cases(cases_, 1, 150);
  const KvTierOptions int4{kWindow, KvHistory::kInt4};
  std::vector<std::vector<int32_t>> expected(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    int num_history = 0;
    ASSERT_TRUE(greedy_alone_with_tiers(*model_->model, cases[i].prompt, cases[i].params.max_tokens, int4, int4,
                                        expected[i], &num_history));
    EXPECT_GT(num_history, 3);
  }

  EngineOptions o = base_options();
  o.kv.tiers = int4;
  o.kv.num_blocks = 200;
  o.kv.num_history_blocks = 200;
  o.scheduler.max_batched_tokens = 2048;  // every prompt in one chunk, as above
  auto e = make(o);
  ASSERT_NE(e, nullptr);
  int history_peak = 0, decoding_seen = 0;
  const auto got = run_checking_the_window(
      *e, cases, kWindow, kBlock,
      [&](Engine& engine) { history_peak = std::max(history_peak, engine.stats().kv_history_blocks_used); },
      decoding_seen);
  EXPECT_EQ(e->stats().num_preemptions, 0);
  EXPECT_GT(history_peak, 60);
  ASSERT_EQ(got.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "prompt " << i;
  EXPECT_EQ(e->stats().kv_history_blocks_used, 0);
  EXPECT_EQ(e->stats().kv_blocks_free + e->stats().kv_blocks_cached, 200);
}

// --kv-window 64 --kv-history int4 --sparse-budget 32: eight requests of ~300 tokens decode
// batched, each decode query attending to the first history block, the two whose key bounds
// score highest and the window, and give token for token what the same steps give one request at
// a time. Prompts arrive in chunks of a 256-token step beside other requests' decode rows, which
// stay sparse there. Sparse attention changes the tokens (it is not dense in disguise), and every
// block and history block comes back.
TEST_F(EngineTest, SparseAttentionBatchedEqualsOneAtATime) {
  constexpr int kWindow = 64, kBlock = 16, kBudget = 32;
  const std::vector<Case> cases = long_cases(cases_, 2, 150);
  const KvTierOptions int4{kWindow, KvHistory::kInt4};
  std::vector<std::vector<int32_t>> expected(cases.size());
  int differing = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(greedy_alone_with_tiers(*model_->model, cases[i].prompt, cases[i].params.max_tokens, int4, int4,
                                        expected[i], nullptr, kBudget));
    std::vector<int32_t> dense;
    ASSERT_TRUE(greedy_alone_with_tiers(*model_->model, cases[i].prompt, cases[i].params.max_tokens, int4, int4, dense));
    differing += dense != expected[i];
  }
  EXPECT_GT(differing, 0) << "sparse attention changed no request's tokens";

  EngineOptions o = base_options();
  o.kv.tiers = int4;
  o.kv.num_blocks = 200;
  o.kv.num_history_blocks = 200;
  o.sparse_budget = kBudget;
  auto e = make(o);
  ASSERT_NE(e, nullptr);
  int decoding_seen = 0;
  const auto got = run_checking_the_window(*e, cases, kWindow, kBlock, [](Engine&) {}, decoding_seen);
  EXPECT_GT(decoding_seen, 100);
  ASSERT_EQ(got.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "prompt " << i;
  EXPECT_EQ(e->stats().kv_history_blocks_used, 0);
  EXPECT_EQ(e->stats().kv_blocks_free + e->stats().kv_blocks_cached, 200);
}

// A request's sparse_budget overrides the engine's: 0 on a sparse engine is dense attention, as
// an engine without a budget gives it; on an engine without key bounds a budget is an error, as
// are negative budgets and a budget without int8 / int4 history.
TEST_F(EngineTest, SparseBudgetsAreOptInAndChecked) {
  const KvTierOptions int4{64, KvHistory::kInt4};
  EngineOptions o = base_options();
  o.kv.tiers = int4;
  o.kv.num_blocks = 200;
  o.kv.num_history_blocks = 200;
  o.scheduler.max_batched_tokens = 2048;
  auto dense = make(o);
  ASSERT_NE(dense, nullptr);
  o.sparse_budget = 32;
  auto sparse = make(o);
  ASSERT_NE(sparse, nullptr);
  Case c = long_cases(cases_, 3, 120)[0];
  const auto want = run_together(*dense, {c});
  c.params.sparse_budget = 0;
  const auto got = run_together(*sparse, {c});
  EXPECT_EQ(got[0].tokens, want[0].tokens);

  GenerationParams p = c.params;
  p.sparse_budget = 64;
  const auto on_dense = dense->add_request(c.prompt, p);
  ASSERT_FALSE(on_dense.ok());
  EXPECT_NE(on_dense.status().message().find("block-sparse attention is off"), std::string::npos)
      << on_dense.status().message();
  p.sparse_budget = -1;
  EXPECT_FALSE(sparse->add_request(c.prompt, p).ok());

  EngineOptions bad = base_options();
  bad.sparse_budget = 64;  // no history: nothing to select from
  auto e = Engine::create(*model_->model, model_->tokenizer.get(), model_->eos_token_ids, bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--kv-history int8 or int4"), std::string::npos) << e.status().message();
}

// A mixture of experts: stats(true) reads the model's routing counters: every token each sparse
// layer ran counted once per chosen expert, one call per sparse layer per forward, and the
// distinct experts of each call; /metrics renders them from these fields.
TEST(EngineMoe, StatsCountTheRoutedTokens) {
  LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/tests/fixtures/models/qwen3-moe");
  const ModelConfig& c = m.model->config();
  EngineOptions o;
  o.max_model_len = 128;
  o.kv.num_blocks = 64;
  o.scheduler.max_seqs = 4;
  o.scheduler.max_batched_tokens = 64;
  auto engine = Engine::create(*m.model, nullptr, {}, o);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Engine& e = **engine;
  GenerationParams params;
  params.sampling.temperature = 0.0f;
  params.max_tokens = 5;
  params.ignore_eos = true;
  int64_t tokens_run = 0;  // each prompt token, and each generated token but the last, is fed once
  for (const int len : {7, 3, 11}) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < len; ++i) prompt.push_back(3 + (i * 37 + len) % 200);
    ASSERT_TRUE(e.add_request(prompt, params).ok());
    tokens_run += len + params.max_tokens - 1;
  }
  while (e.has_unfinished()) ASSERT_TRUE(e.step().ok());
  const EngineStats s = e.stats(/*fresh_experts=*/true);
  int sparse = 0;
  for (int l = 0; l < c.num_layers; ++l) sparse += c.is_moe_layer(l) ? 1 : 0;
  ASSERT_EQ(sparse, 2);
  ASSERT_EQ(s.expert_tokens.size(), static_cast<size_t>(c.num_experts));
  int64_t routed = 0;
  for (const int64_t t : s.expert_tokens) routed += t;
  EXPECT_EQ(routed, tokens_run * c.num_experts_per_tok * sparse);
  EXPECT_EQ(s.moe_layer_calls, s.num_steps * sparse);
  EXPECT_GE(s.moe_distinct_experts, s.moe_layer_calls * c.num_experts_per_tok);
  EXPECT_LE(s.moe_distinct_experts, s.moe_layer_calls * c.num_experts);
  EXPECT_GE(s.moe_load_imbalance, 1.0);
  EXPECT_LE(s.moe_load_imbalance, c.num_experts);
}

}  // namespace
}  // namespace tachyon
