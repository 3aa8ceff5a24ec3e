// Request parsing of the OpenAI API against the bundled model's tokenizer and chat template:
// defaults, what each field becomes, and the error (status, param) for each mistake.
#include <gtest/gtest.h>

#include "server/chat_prompt.h"
#include "server/openai_api.h"
#include "test_util.h"

namespace tachyon::server {
namespace {

class OpenAiApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = testing::source_dir() + "/models/tachyon-demo";
    auto tok = Tokenizer::from_hf_json(dir + "/tokenizer.json", dir + "/tokenizer_config.json");
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = std::move(*tok).release();
    auto tpl = load_chat_template(*tokenizer_);
    ASSERT_TRUE(tpl.ok()) << tpl.status().to_string();
    template_ = new ChatTemplate(std::move(*tpl));
  }
  static void TearDownTestSuite() {
    delete template_;
    delete tokenizer_;
  }
  ServingContext context() const {
    ServingContext c;
    c.model_name = "demo";
    c.tokenizer = tokenizer_;
    c.chat_template = template_;
    c.template_extras = chat_template_extras(*tokenizer_);
    c.max_model_len = 512;
    c.vocab_size = tokenizer_->vocab_size();
    c.max_choices = 64;
    return c;
  }
  std::optional<ApiError> parse(Endpoint e, const std::string& body, ApiRequest& out) const {
    const ServingContext c = context();
    return parse_api_request(e, body, c, out);
  }
  void expect_error(Endpoint e, const std::string& body, int status, const std::string& param) const {
    ApiRequest r;
    auto error = parse(e, body, r);
    ASSERT_TRUE(error.has_value()) << body;
    EXPECT_EQ(error->status, status) << body << ": " << error->message;
    EXPECT_EQ(error->param, param) << body << ": " << error->message;
    EXPECT_FALSE(error->message.empty());
  }

  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ChatTemplate* template_ = nullptr;
};

TEST_F(OpenAiApi, CompletionDefaultsAndFields) {
  ApiRequest r;
  ASSERT_FALSE(parse(Endpoint::kCompletions, R"({"prompt": "hello world"})", r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].ids, tokenizer_->encode("hello world", EncodeOptions{std::nullopt, true}));
  EXPECT_EQ(r.prompts[0].text, "hello world");
  EXPECT_EQ(r.params.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.params.sampling.seed.has_value());

  ASSERT_FALSE(parse(Endpoint::kCompletions,
                     R"({"model": "demo", "prompt": [[1, 2, 3], "x"], "max_tokens": 7, "temperature": 0.5,
                         "top_p": 0.9, "top_k": 40, "min_p": 0.1, "n": 2, "stop": "END", "seed": 9,
                         "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
                         "logprobs": 2, "stream": true, "stream_options": {"include_usage": true},
                         "logit_bias": {"5": -100}, "ignore_eos": true})",
                     r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.sampling.top_p, 0.9f);
  EXPECT_EQ(r.params.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.params.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.params.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.params.sampling.seed, 9u);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.params.sampling.logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.params.ignore_eos);
  ASSERT_EQ(r.params.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(r.params.sampling.logit_bias[0].first, 5);
}

TEST_F(OpenAiApi, ChatRendersTheTemplateWithOneBos) {
  ApiRequest r;
  ASSERT_FALSE(parse(Endpoint::kChatCompletions,
                     R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 3})", r));
  ASSERT_EQ(r.prompts.size(), 1u);
  const std::string bos = tokenizer_->token_to_piece(tokenizer_->bos_id());
  EXPECT_EQ(r.prompts[0].text, bos + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  const auto& ids = r.prompts[0].ids;
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], tokenizer_->bos_id());
  EXPECT_NE(ids[1], tokenizer_->bos_id());
  EXPECT_EQ(ids, tokenizer_->encode(r.prompts[0].text, EncodeOptions{false, true}));
  EXPECT_EQ(r.params.max_tokens, 512 - static_cast<int>(ids.size()));  // the rest of the context
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.params.sampling.logprobs, 3);
  ASSERT_FALSE(parse(Endpoint::kChatCompletions,
                     R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,
                         "max_completion_tokens": 4})", r));
  EXPECT_EQ(r.params.max_tokens, 4);  // the newer name wins
}

TEST_F(OpenAiApi, MistakesGetStatusAndParam) {
  const auto C = Endpoint::kCompletions;
  const auto X = Endpoint::kChatCompletions;
  expect_error(C, "{", 400, "");
  expect_error(C, "\xff", 400, "");
  expect_error(C, "[]", 400, "");
  expect_error(C, R"({"model": "other", "prompt": "x"})", 404, "model");
  expect_error(C, R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens");
  expect_error(C, R"({"prompt": "x", "max_tokens": 513})", 400, "max_tokens");
  expect_error(C, R"({"prompt": "x", "max_tokens": "3"})", 400, "max_tokens");
  expect_error(C, R"({"prompt": "x", "temperature": -0.5})", 400, "temperature");
  expect_error(C, R"({"prompt": "x", "top_k": -2})", 400, "top_k");
  expect_error(C, R"({"prompt": "x", "n": 0})", 400, "n");
  expect_error(C, R"({"prompt": ["a", "b"], "n": 40})", 400, "n");  // 80 choices > 64
  expect_error(C, R"({"prompt": "x", "stop": [1]})", 400, "stop");
  // Stop strings past the engine's bounds are refused here, before a stream could start.
  std::string many_stops = R"({"prompt": "x", "stream": true, "stop": ["s0")";
  for (int i = 1; i <= 64; ++i) many_stops += ",\"s" + std::to_string(i) + "\"";
  expect_error(C, many_stops + "]}", 400, "stop");
  expect_error(C, R"({"prompt": "x", "stream": true, "stop": ")" + std::string(1025, 'x') + "\"}", 400, "stop");
  expect_error(X, R"({"messages": [{"role": "user", "content": "x"}], "stream": true, "stop": ")" +
                      std::string(1025, 'x') + "\"}",
               400, "stop");
  // A huge wrongly typed value is described, not dumped.
  expect_error(C, R"({"prompt": "x", "max_tokens": [)" + std::string(60, '[') + std::string(60, ']') + "]}", 400,
               "max_tokens");
  expect_error(C, R"({"prompt": "x", "best_of": 3})", 400, "best_of");
  expect_error(C, R"({"prompt": "x", "logit_bias": {"99999": 1}})", 400, "logit_bias");
  expect_error(C, R"({"prompt": [1, 99999]})", 400, "prompt");
  expect_error(C, R"({"prompt": []})", 400, "prompt");
  expect_error(C, R"({"prompt": [[]]})", 400, "prompt");
  expect_error(C, R"({})", 400, "prompt");
  std::string long_prompt = R"({"prompt": [1)";
  for (int i = 0; i < 600; ++i) long_prompt += ",5";
  expect_error(C, long_prompt + "]}", 400, "prompt");
  expect_error(C, std::string(100000, '[') + std::string(100000, ']'), 400, "");
  expect_error(X, R"({"messages": [{"role": "user", "content": "x", "extra": )" + std::string(70, '[') +
                      std::string(70, ']') + "}]}",
               400, "");
  expect_error(X, R"({"messages": "hi"})", 400, "messages");
  expect_error(X, R"({"messages": [{"role": 1, "content": "x"}]})", 400, "messages");
  expect_error(X, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", 400,
               "tools");
  expect_error(X, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400, "top_logprobs");
  expect_error(X, R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3})", 400,
               "max_completion_tokens");
  // "draft" names a loaded draft model; this context has none.
  expect_error(C, R"({"prompt": "x", "draft": "code"})", 400, "draft");
}

// "draft": one of the server's named draft models (--draft-model NAME=PATH), or an error naming them.
TEST_F(OpenAiApi, DraftPicksANamedDraftModel) {
  ServingContext c = context();
  c.drafts = {"code", "prose"};
  ApiRequest r;
  ASSERT_FALSE(parse_api_request(Endpoint::kCompletions, R"({"prompt": "x", "draft": "prose"})", c, r));
  EXPECT_EQ(r.params.draft, "prose");
  ApiRequest none;
  ASSERT_FALSE(parse_api_request(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}]})", c,
                                 none));
  EXPECT_EQ(none.params.draft, "");
  for (const char* body : {R"({"prompt": "x", "draft": "poetry"})", R"({"prompt": "x", "draft": 3})"}) {
    ApiRequest bad;
    auto error = parse_api_request(Endpoint::kCompletions, body, c, bad);
    ASSERT_TRUE(error.has_value()) << body;
    EXPECT_EQ(error->status, 400);
    EXPECT_EQ(error->param, "draft");
    if (std::string(body).find("poetry") != std::string::npos) {
      EXPECT_NE(error->message.find("'code', 'prose'"), std::string::npos) << error->message;
    }
  }
}

// "sparse_budget": block-sparse decode attention per request, where the server keeps key bounds
// (--sparse-budget); 0 asks for dense attention anywhere.
TEST_F(OpenAiApi, SparseBudgetIsOptInPerRequest) {
  ServingContext c = context();
  ApiRequest dense;
  ASSERT_FALSE(parse_api_request(Endpoint::kCompletions, R"({"prompt": "x", "sparse_budget": 0})", c, dense));
  EXPECT_EQ(dense.params.sparse_budget, 0);
  ApiRequest unset;
  ASSERT_FALSE(parse_api_request(Endpoint::kCompletions, R"({"prompt": "x"})", c, unset));
  EXPECT_FALSE(unset.params.sparse_budget.has_value());
  auto off = parse_api_request(Endpoint::kCompletions, R"({"prompt": "x", "sparse_budget": 512})", c, dense);
  ASSERT_TRUE(off.has_value());
  EXPECT_EQ(off->status, 400);
  EXPECT_EQ(off->param, "sparse_budget");
  c.sparse_attention = true;
  ApiRequest r;
  ASSERT_FALSE(parse_api_request(Endpoint::kChatCompletions,
                                 R"({"messages": [{"role": "user", "content": "x"}], "sparse_budget": 512})", c, r));
  EXPECT_EQ(r.params.sparse_budget, 512);
  for (const char* body : {R"({"prompt": "x", "sparse_budget": -1})", R"({"prompt": "x", "sparse_budget": "many"})",
                           R"({"prompt": "x", "sparse_budget": 1e12})"}) {
    ApiRequest bad;
    auto error = parse_api_request(Endpoint::kCompletions, body, c, bad);
    ASSERT_TRUE(error.has_value()) << body;
    EXPECT_EQ(error->status, 400) << body;
    EXPECT_EQ(error->param, "sparse_budget") << body;
  }
}

TEST_F(OpenAiApi, ErrorBodyIsOpenAiShaped) {
  ApiError e;
  e.status = 404;
  e.message = "nope";
  e.param = "model";
  const auto j = nlohmann::json::parse(error_body(e));
  EXPECT_EQ(j.at("error").at("message"), "nope");
  EXPECT_EQ(j.at("error").at("type"), "invalid_request_error");
  EXPECT_EQ(j.at("error").at("param"), "model");
  EXPECT_TRUE(j.at("error").at("code").is_null());
}

}  // namespace
}  // namespace tachyon::server
