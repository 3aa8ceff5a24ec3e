// Structured output through the engine, on the bundled models (tachyon-demo, and tachyon-demo-draft
// as its draft): a request with a grammar emits only what the grammar allows and ends at EOS once the
// grammar is complete. Oracles, independent of the engine's masks:
//   greedy    each token is the argmax of a plain forward's logits over the tokens the grammar
//             allows after the output so far, found by accepting every vocabulary token in turn
//             (EOS where the grammar may end);
//   sampling  every output of random sampling under a JSON Schema parses and validates (a validator
//             written from the specification, tests/sampling/json_schema_checker.h), and a regex's
//             outputs match it (std::regex);
//   speculation  greedy with n-gram, draft-model and tree drafts gives the tokens of plain greedy
//             under the same grammar; sampled speculative outputs validate;
// and constrained requests batch with unconstrained ones, which are unchanged by them.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <regex>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "model/forward_batch.h"
#include "model/model_loader.h"
#include "sampling/gbnf_parser.h"
#include "sampling/json_schema.h"
#include "sampling/json_schema_checker.h"
#include "sampling/regex_grammar.h"
#include "plain_forward.h"
#include "test_util.h"

namespace tachyon {
namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::kLength;
  Status error;
};

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    "active": {"type": "boolean"}
  },
  "required": ["name", "age"]
})";

class StructuredOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (auto [slot, name] : {std::pair{&model_, "tachyon-demo"}, std::pair{&draft_, "tachyon-demo-draft"}}) {
      LoadOptions o;
      o.path = testing::source_dir() + "/models/" + name;
      auto m = load_model(o);
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      *slot = new LoadedModel(std::move(m).value());
    }
    JsonSchemaOptions jo;
    jo.max_whitespace = 1;  // a weak model's random draws would otherwise spend their tokens on blanks
    schema_ = new std::shared_ptr<const Grammar>(std::make_shared<const Grammar>(json_schema_to_grammar(
        std::string_view(kSchema), jo).value()));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete draft_;
    delete schema_;
  }

  static EngineOptions options() {
    EngineOptions o;
    o.max_model_len = 512;
    o.kv.num_blocks = 320;
    o.scheduler.max_batched_tokens = 128;
    o.scheduler.max_seqs = 10;
    o.batch_invariant = true;
    return o;
  }
  static std::unique_ptr<Engine> make(const EngineOptions& o) {
    auto e = Engine::create(*model_->model, model_->tokenizer.get(), model_->eos_token_ids, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static std::vector<int32_t> encode(const std::string& text) { return model_->tokenizer->encode(text); }
  static GenerationParams params(std::shared_ptr<const Grammar> grammar, float temperature, uint64_t seed,
                                 int max_tokens = 300) {
    GenerationParams p;
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    p.max_tokens = max_tokens;
    p.grammar = std::move(grammar);
    return p;
  }
  // Runs every request to its end in one engine.
  static std::vector<Outcome> run(Engine& e, const std::vector<std::pair<std::vector<int32_t>, GenerationParams>>& rs) {
    std::vector<RequestId> ids;
    for (const auto& [prompt, p] : rs) {
      auto id = e.add_request(prompt, p);
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(id.ok() ? *id : 0);
    }
    std::map<RequestId, Outcome> out;
    for (int step = 0; e.has_unfinished() && step < 20000; ++step) {
      auto outputs = e.step();
      EXPECT_TRUE(outputs.ok()) << outputs.status().to_string();
      if (!outputs.ok()) break;
      for (RequestOutput& o : *outputs) {
        Outcome& r = out[o.id];
        r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (o.finished) {
          r.reason = o.finish_reason;
          r.error = o.error;
        }
      }
    }
    EXPECT_FALSE(e.has_unfinished());
    const Status leaks = e.check_no_leaks();
    EXPECT_TRUE(leaks.ok()) << leaks.to_string();
    std::vector<Outcome> result;
    for (RequestId id : ids) {
      Outcome r = out[id];
      std::vector<int32_t> text_ids = r.tokens;
      std::erase_if(text_ids, [](int32_t t) { return model_->tokenizer->is_eos(t); });
      r.text = model_->tokenizer->decode(text_ids);
      result.push_back(std::move(r));
    }
    return result;
  }
  // The logits of every position of `tokens` from one forward on a fresh cache: [n, vocab].
  static std::vector<float> reference_logits(const std::vector<int32_t>& tokens) {
    return testing::plain_forward_logits(*model_->model, tokens);
  }
  // The vocabulary as the engine sees it, for matchers of the oracle.
  static std::shared_ptr<const TokenTrie> vocabulary() {
    const Tokenizer& t = *model_->tokenizer;
    const int vocab = model_->model->config().vocab_size;
    std::vector<std::string> bytes(static_cast<size_t>(vocab));
    std::vector<int32_t> special;
    for (int32_t id = 0; id < std::min(vocab, t.vocab_size()); ++id) {
      if (t.is_special(id)) {
        special.push_back(id);
      } else {
        bytes[static_cast<size_t>(id)] = t.token_to_piece(id);
      }
    }
    return TokenTrie::build(std::move(bytes), model_->eos_token_ids, special).value();
  }
  // The greedy oracle: every token of `out` is a best allowed one after the tokens before it.
  static void expect_masked_argmax(const std::vector<int32_t>& prompt, const std::shared_ptr<const Grammar>& grammar,
                                   const std::vector<int32_t>& out) {
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), out.begin(), out.end());
    const std::vector<float> logits = reference_logits(all);
    const int vocab = model_->model->config().vocab_size;
    GrammarMatcher m = GrammarMatcher::create(grammar, vocabulary()).value();
    for (size_t i = 0; i < out.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "output token " << i);
      const float* row = logits.data() + (prompt.size() - 1 + i) * static_cast<size_t>(vocab);
      float best = -std::numeric_limits<float>::infinity();
      for (int32_t t = 0; t < vocab; ++t) {
        if (row[t] <= best) continue;
        if (m.accept(t).ok()) {
          best = row[t];
          ASSERT_TRUE(m.rollback(1).ok());
        }
      }
      ASSERT_TRUE(m.accept(out[i]).ok()) << "token " << out[i] << " is not allowed here";
      EXPECT_GE(row[out[i]], best - 1e-4f) << "token " << out[i] << " is not the best allowed one";
    }
  }

  static inline LoadedModel* model_ = nullptr;
  static inline LoadedModel* draft_ = nullptr;
  static inline std::shared_ptr<const Grammar>* schema_ = nullptr;
};

const char* kPrompt = "The user record as JSON: ";

void expect_valid_json(const Outcome& r) {
  ASSERT_EQ(r.reason, FinishReason::kStop) << r.error.to_string() << " after: " << r.text;
  std::string error;
  const grammar_test::ojson value = grammar_test::parse_json(r.text, error);
  ASSERT_EQ(error, "") << r.text;
  const grammar_test::ojson schema = grammar_test::ojson::parse(kSchema);
  EXPECT_EQ(grammar_test::SchemaChecker(schema).check(value, schema), "") << r.text;
}

TEST_F(StructuredOutput, GreedyTakesTheBestAllowedTokenAndEndsAtEos) {
  auto e = make(options());
  const std::vector<int32_t> prompt = encode(kPrompt);
  const std::vector<Outcome> out = run(*e, {{prompt, params(*schema_, 0.0f, 1)}});
  expect_valid_json(out[0]);
  EXPECT_TRUE(model_->tokenizer->is_eos(out[0].tokens.back()));
  expect_masked_argmax(prompt, *schema_, out[0].tokens);
}

// Sixteen sampled requests, batched with unconstrained ones (whose tokens equal a run without
// them): every constrained output validates, the regex ones match.
TEST_F(StructuredOutput, SampledOutputsValidateInABatch) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (TACHYON_TEST_SEED=" << seed << " reproduces)");
  auto regex = std::make_shared<const Grammar>(regex_to_grammar("(yes|no), [0-9]{1,3} (apples|pears)").value());
  const std::vector<int32_t> prompt = encode(kPrompt);
  std::vector<std::pair<std::vector<int32_t>, GenerationParams>> batch, plain;
  for (int i = 0; i < 16; ++i) {
    const bool json = i % 4 != 3;
    batch.emplace_back(prompt, params(json ? *schema_ : regex, i % 2 == 0 ? 1.0f : 0.7f, seed + i));
    batch.back().second.sampling.top_k = i % 3 == 0 ? 20 : 0;
    if (i % 5 == 0) {
      plain.emplace_back(encode("Once upon a time"), params(nullptr, 1.0f, seed + 100 + i, 24));
      batch.push_back(plain.back());
    }
  }
  auto e = make(options());
  const std::vector<Outcome> out = run(*e, batch);
  const std::vector<Outcome> alone = run(*make(options()), plain);
  size_t p = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i << ": " << out[i].text);
    if (!batch[i].second.grammar) {
      EXPECT_EQ(out[i].tokens, alone[p++].tokens);
    } else if (batch[i].second.grammar == *schema_) {
      expect_valid_json(out[i]);
    } else {
      EXPECT_EQ(out[i].reason, FinishReason::kStop);
      EXPECT_TRUE(std::regex_match(out[i].text, std::regex("(yes|no), [0-9]{1,3} (apples|pears)")));
    }
  }
  EXPECT_GT(e->stats().grammar_mask_seconds, 0.0);
}

// Speculative decoding under a grammar: greedy tokens equal plain greedy's with the same grammar,
// for n-gram lookup, the draft model (chains and trees) and a fixed or dynamic K; sampled outputs
// validate.
TEST_F(StructuredOutput, SpeculationKeepsTheGrammar) {
  // A prompt whose JSON the n-gram proposer finds again.
  const std::vector<int32_t> prompt =
      encode(R"(Records: {"name": "ann", "age": 31, "tags": ["red"], "active": true} and {"name": "bo", "age": 4)");
  auto gbnf = std::make_shared<const Grammar>(
      parse_gbnf(R"(root ::= "{\"name\": \"" [a-z]{1,8} "\", \"age\": " [0-9]{1,2} "}")").value());
  std::vector<std::pair<std::vector<int32_t>, GenerationParams>> greedy;
  for (const auto& g : {*schema_, gbnf}) greedy.emplace_back(prompt, params(g, 0.0f, 1));
  const std::vector<Outcome> plain = run(*make(options()), greedy);
  expect_valid_json(plain[0]);
  struct Setup {
    SpecMethod method;
    int k;
    int tree_nodes;
  };
  for (const Setup s : {Setup{SpecMethod::kNgram, 4, 0}, Setup{SpecMethod::kDraftModel, 3, 0},
                        Setup{SpecMethod::kDraftModel, 0, 0}, Setup{SpecMethod::kDraftModel, 3, 8}}) {
    SCOPED_TRACE(::testing::Message() << spec_method_name(s.method) << " K " << s.k << " tree " << s.tree_nodes);
    EngineOptions o = options();
    o.spec.method = s.method;
    if (s.method == SpecMethod::kDraftModel) o.spec.drafts = {{"", draft_->model.get()}};
    o.spec.k = s.k;
    o.spec.tree_nodes = s.tree_nodes;
    auto e = make(o);
    const std::vector<Outcome> got = run(*e, greedy);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tokens, plain[i].tokens) << "request " << i;
    EXPECT_GT(e->stats().spec.num_proposed, 0);
    if (s.tree_nodes > 0) continue;
    std::vector<std::pair<std::vector<int32_t>, GenerationParams>> sampled;
    for (int i = 0; i < 4; ++i) sampled.emplace_back(prompt, params(*schema_, 1.0f, 77 + i));
    for (const Outcome& r : run(*e, sampled)) expect_valid_json(r);
  }
}

TEST_F(StructuredOutput, Refusals) {
  // No tokenizer: the engine cannot know what tokens spell.
  auto bare = Engine::create(*model_->model, nullptr, model_->eos_token_ids, options());
  ASSERT_TRUE(bare.ok());
  auto refused = (*bare)->add_request(encode(kPrompt), params(*schema_, 0.0f, 1));
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument) << refused.status().to_string();
  // min_tokens past the grammar's end: the request fails with a clear error; others go on.
  auto e = make(options());
  auto digit = std::make_shared<const Grammar>(parse_gbnf(R"(root ::= [0-9])").value());
  GenerationParams p = params(digit, 0.0f, 1, 8);
  p.min_tokens = 4;
  const std::vector<Outcome> out = run(*e, {{encode(kPrompt), p}, {encode(kPrompt), params(digit, 0.0f, 1)}});
  EXPECT_EQ(out[0].reason, FinishReason::kError);
  EXPECT_NE(out[0].error.message().find("min_tokens"), std::string::npos) << out[0].error.to_string();
  EXPECT_EQ(out[1].reason, FinishReason::kStop);
  EXPECT_EQ(out[1].tokens.size(), 2u);
}

}  // namespace
}  // namespace tachyon
