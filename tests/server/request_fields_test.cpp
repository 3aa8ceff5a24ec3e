// The known-field policy and vLLM's extra fields of the OpenAI API, against the bundled model's
// tokenizer and chat template: every field is honoured (what it becomes in the engine's
// parameters) or refused with a 400 whose param names it; nothing is silently ignored. Also
// /tokenize and /detokenize, and the API key and CORS decisions.
#include <gtest/gtest.h>

#include "server/access_policy.h"
#include "server/chat_prompt.h"
#include "server/openai_api.h"
#include "server/request_fields.h"
#include "server/tokenize_api.h"
#include "test_util.h"

namespace tachyon::server {
namespace {

class RequestFields : public ::testing::Test {
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
  static ServingContext context() {
    ServingContext c;
    c.model_name = "demo";
    c.tokenizer = tokenizer_;
    c.chat_template = template_;
    c.template_extras = chat_template_extras(*tokenizer_);
    c.max_model_len = 512;
    c.vocab_size = tokenizer_->vocab_size();
    c.max_choices = 64;
    c.grammars = &grammars_;
    return c;
  }
  // `fields`: JSON members (without braces) added to a minimal valid body of the endpoint.
  static std::string body(Endpoint e, const std::string& fields) {
    const std::string base = e == Endpoint::kChatCompletions ? R"("messages": [{"role": "user", "content": "hi"}])"
                                                             : R"("prompt": "hello world")";
    return "{" + base + (fields.empty() ? "" : ", " + fields) + "}";
  }
  static std::optional<ApiError> parse(Endpoint e, const std::string& fields, ApiRequest& out) {
    const ServingContext c = context();
    return parse_api_request(e, body(e, fields), c, out);
  }
  static ApiRequest ok(Endpoint e, const std::string& fields) {
    ApiRequest r;
    auto error = parse(e, fields, r);
    EXPECT_FALSE(error.has_value()) << fields << ": " << (error ? error->message : "");
    return r;
  }
  static void refused(Endpoint e, const std::string& fields, const std::string& param,
                      const std::string& message_has = "") {
    ApiRequest r;
    auto error = parse(e, fields, r);
    ASSERT_TRUE(error.has_value()) << fields;
    EXPECT_EQ(error->status, 400) << fields << ": " << error->message;
    EXPECT_EQ(error->type, "invalid_request_error") << fields;
    EXPECT_EQ(error->param, param) << fields << ": " << error->message;
    EXPECT_NE(error->message.find("'" + param), std::string::npos) << "the message names the field: " << error->message;
    if (!message_has.empty()) {
      EXPECT_NE(error->message.find(message_has), std::string::npos) << error->message;
    }
  }

  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ChatTemplate* template_ = nullptr;
  static inline GrammarCache grammars_;
};

constexpr Endpoint C = Endpoint::kCompletions;
constexpr Endpoint X = Endpoint::kChatCompletions;

TEST_F(RequestFields, UnknownFieldsAreRefusedByName) {
  for (const Endpoint e : {C, X}) {
    refused(e, R"("temprature": 0.5)", "temprature", "is not supported");
    refused(e, R"("use_beam_search": true)", "use_beam_search");
    refused(e, R"("bad_words": ["x"])", "bad_words");
    refused(e, R"("allowed_token_ids": [1])", "allowed_token_ids");
    refused(e, R"("foo": null)", "foo");  // unknown, even when null
  }
  // Fields of the other endpoint.
  refused(C, R"("messages": [])", "messages");
  refused(C, R"("top_logprobs": 2)", "top_logprobs");
  refused(C, R"("tools": [])", "tools");
  refused(C, R"("metadata": {})", "metadata");
  refused(X, R"("echo": true)", "echo");
  refused(X, R"("best_of": 1)", "best_of");
  refused(X, R"("suffix": "")", "suffix");
}

// Structured output and tools are honoured (server/structured_output_test.cpp and tool_calls_test.cpp
// hold what each asks for); what is still refused is refused in one place.
TEST_F(RequestFields, StructuredOutputAndToolFieldsAreHonoured) {
  for (const Endpoint e : {C, X}) {
    EXPECT_NE(ok(e, R"("guided_json": {"type": "object"})").params.grammar, nullptr);
    EXPECT_NE(ok(e, R"("response_format": {"type": "json_object"})").params.grammar, nullptr);
    EXPECT_NE(ok(e, R"("guided_choice": ["a", "b"], "guided_decoding_backend": "xgrammar")").params.grammar, nullptr);
    EXPECT_EQ(ok(e, R"("response_format": {"type": "text"})").params.grammar, nullptr);
    EXPECT_EQ(ok(e, R"("guided_json": null)").params.grammar, nullptr);  // null is absent
    refused(e, R"("guided_whitespace_pattern": "[ ]*")", "guided_whitespace_pattern", "is not supported");
    refused(e, R"("response_format": "text")", "response_format");
    refused(e, R"("guided_regex": "(a")", "guided_regex");
  }
  const std::string tool = R"("tools": [{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"x": {"type": "integer"}}}}}])";
  ApiRequest r = ok(X, tool);
  ASSERT_TRUE(r.tools.has_value());
  EXPECT_EQ(r.tools->request.choice, ToolChoiceMode::kAuto);
  EXPECT_EQ(r.params.grammar, nullptr);  // "auto": the model decides, the output is parsed
  r = ok(X, tool + R"(, "tool_choice": "required")");
  ASSERT_TRUE(r.tools.has_value());
  EXPECT_NE(r.params.grammar, nullptr);
  r = ok(X, tool + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})");
  EXPECT_NE(r.params.grammar, nullptr);
  EXPECT_FALSE(ok(X, tool + R"(, "tool_choice": "none")").tools.has_value());
  EXPECT_FALSE(ok(X, R"("tools": [], "tool_choice": "none", "functions": [], "function_call": "none")").tools);
  refused(X, tool + R"(, "tool_choice": {"type": "function", "function": {"name": "g"}})", "tool_choice");
  refused(X, tool + R"(, "tool_choice": "required", "guided_json": {})", "tool_choice");
  refused(X, R"("tools": [{"type": "function", "function": {"name": "bad name"}}])", "tools");
  refused(X, R"("tools": {})", "tools");
  // The refusal comes from refuse_structured_output() alone.
  const auto body = nlohmann::ordered_json::parse(R"({"guided_whitespace_pattern": "x"})");
  auto error = refuse_structured_output(C, body);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->param, "guided_whitespace_pattern");
}

TEST_F(RequestFields, NoOpFieldsAreAcceptedWithTheirNoOpValues) {
  ok(C, R"("user": "u1")");
  ok(X, R"("user": "u1", "metadata": {"k": "v"}, "store": false, "service_tier": "auto",
           "parallel_tool_calls": true, "modalities": ["text"])");  // parallel_tool_calls: no tools, no effect
  ok(X, R"("service_tier": "default")");
  ok(C, R"("stream": true, "stream_options": {"include_usage": true, "include_obfuscation": false})");
  refused(C, R"("user": 3)", "user");
  refused(X, R"("metadata": {"k": 1})", "metadata");
  refused(X, R"("metadata": [])", "metadata");
  refused(X, R"("store": "yes")", "store");
  refused(X, R"("service_tier": "flex")", "service_tier");
  refused(X, R"("service_tier": "priority")", "service_tier");
  refused(X, R"("modalities": ["text", "audio"])", "modalities");
  refused(X, R"("parallel_tool_calls": 1)", "parallel_tool_calls");
  refused(C, R"("stream": true, "stream_options": {"continuous_usage_stats": true})", "stream_options");
  refused(C, R"("stream_options": {"include_usage": 1})", "stream_options");
  // The fields of today keep their meaning.
  const ApiRequest r = ok(C, R"("n": 2, "seed": 7, "logprobs": 1, "top_k": 5, "min_p": 0.1,
                                "repetition_penalty": 1.2, "ignore_eos": true)");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.params.sampling.seed, 7u);
  EXPECT_EQ(r.params.sampling.top_k, 5);
  EXPECT_TRUE(r.params.ignore_eos);
}

TEST_F(RequestFields, MinTokens) {
  for (const Endpoint e : {C, X}) {
    EXPECT_EQ(ok(e, "").params.min_tokens, 0);
    EXPECT_EQ(ok(e, R"("min_tokens": 5, "max_tokens": 10)").params.min_tokens, 5);
    EXPECT_EQ(ok(e, R"("min_tokens": 10, "max_tokens": 10)").params.min_tokens, 10);
    refused(e, R"("min_tokens": 11, "max_tokens": 10)", "min_tokens", "max_tokens = 10");
    refused(e, R"("min_tokens": -1)", "min_tokens");
    refused(e, R"("min_tokens": "3")", "min_tokens");
  }
  // Completions default to 16 tokens: min_tokens is checked against that default too.
  refused(C, R"("min_tokens": 17)", "min_tokens");
  EXPECT_EQ(ok(X, R"("min_tokens": 3, "max_completion_tokens": 3)").params.min_tokens, 3);
}

TEST_F(RequestFields, StopTokenIds) {
  const int vocab = tokenizer_->vocab_size();
  for (const Endpoint e : {C, X}) {
    EXPECT_TRUE(ok(e, "").params.stop_token_ids.empty());
    EXPECT_EQ(ok(e, R"("stop_token_ids": [3, 17])").params.stop_token_ids, (std::vector<int32_t>{3, 17}));
    EXPECT_EQ(ok(e, R"("stop_token_ids": [])").params.stop_token_ids, std::vector<int32_t>{});
    refused(e, R"("stop_token_ids": [)" + std::to_string(vocab) + "]", "stop_token_ids", std::to_string(vocab));
    refused(e, R"("stop_token_ids": [-1])", "stop_token_ids");
    refused(e, R"("stop_token_ids": [1.5])", "stop_token_ids");
    refused(e, R"("stop_token_ids": ["3"])", "stop_token_ids");
    refused(e, R"("stop_token_ids": 3)", "stop_token_ids");
    refused(e, R"("stop_token_ids": [18446744073709551615])", "stop_token_ids");
  }
  std::string many = R"("stop_token_ids": [1)";
  for (size_t i = 0; i < kMaxStopTokenIds; ++i) many += ",1";
  refused(C, many + "]", "stop_token_ids");
}

TEST_F(RequestFields, IncludeStopStrSpecialTokensAndTokenIds) {
  for (const Endpoint e : {C, X}) {
    const ApiRequest plain = ok(e, "");
    EXPECT_FALSE(plain.params.include_stop_str_in_output);
    EXPECT_TRUE(plain.params.skip_special_tokens);
    const ApiRequest r = ok(e, R"("include_stop_str_in_output": true, "stop": ["x"], "skip_special_tokens": false)");
    EXPECT_TRUE(r.params.include_stop_str_in_output);
    EXPECT_FALSE(r.params.skip_special_tokens);
    refused(e, R"("include_stop_str_in_output": 1)", "include_stop_str_in_output");
    EXPECT_FALSE(plain.tokens_as_ids);
    EXPECT_TRUE(ok(e, R"("return_tokens_as_token_ids": true)").tokens_as_ids);
    refused(e, R"("return_tokens_as_token_ids": "yes")", "return_tokens_as_token_ids");
    refused(e, R"("skip_special_tokens": "no")", "skip_special_tokens");
  }
}

TEST_F(RequestFields, AddSpecialTokens) {
  const int bos = tokenizer_->bos_id();
  ASSERT_GE(bos, 0);
  ASSERT_TRUE(tokenizer_->add_bos_by_default());
  EXPECT_EQ(ok(C, "").prompts[0].ids.front(), bos);
  EXPECT_EQ(ok(C, R"("add_special_tokens": true)").prompts[0].ids.front(), bos);
  const ApiRequest without = ok(C, R"("add_special_tokens": false)");
  EXPECT_NE(without.prompts[0].ids.front(), bos);
  EXPECT_EQ(without.prompts[0].ids, tokenizer_->encode("hello world", EncodeOptions{false, true}));
  // Chat: the bundled template writes the BOS itself, so both ways it is there once.
  EXPECT_EQ(ok(X, R"("add_special_tokens": false)").prompts[0].ids, ok(X, "").prompts[0].ids);
  refused(C, R"("add_special_tokens": 0)", "add_special_tokens");
}

TEST_F(RequestFields, PromptLogprobs) {
  for (const Endpoint e : {C, X}) {
    EXPECT_FALSE(ok(e, "").prompt_logprobs.has_value());
    EXPECT_EQ(ok(e, R"("prompt_logprobs": 0)").prompt_logprobs, 0);
    EXPECT_EQ(ok(e, R"("prompt_logprobs": 20)").prompt_logprobs, 20);
    EXPECT_FALSE(ok(e, R"("prompt_logprobs": null)").prompt_logprobs.has_value());
    refused(e, R"("prompt_logprobs": 21)", "prompt_logprobs", "[0, 20]");
    refused(e, R"("prompt_logprobs": -1)", "prompt_logprobs");
    refused(e, R"("prompt_logprobs": true)", "prompt_logprobs");
    refused(e, R"("prompt_logprobs": 2, "stream": true)", "prompt_logprobs", "stream");
  }
  // The engine's parameter is set per choice by the job (its first choice only), not here.
  EXPECT_FALSE(ok(C, R"("prompt_logprobs": 3)").params.prompt_logprobs.has_value());
  // echo with logprobs stays refused, pointing at prompt_logprobs.
  refused(C, R"("echo": true, "logprobs": 1)", "echo", "prompt_logprobs");
}

TEST_F(RequestFields, KnownFieldListsHaveNoDuplicates) {
  for (const Endpoint e : {C, X}) {
    std::vector<std::string_view> names(known_fields(e).begin(), known_fields(e).end());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
    EXPECT_NE(std::find(names.begin(), names.end(), "model"), names.end());
  }
}

// ---- /tokenize and /detokenize ----

TEST_F(RequestFields, TokenizeAPromptOrMessages) {
  const ServingContext c = context();
  JsonReply r = tokenize_reply(R"({"prompt": "hello world"})", c);
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = nlohmann::json::parse(r.body);
  const std::vector<int32_t> expected = tokenizer_->encode("hello world", EncodeOptions{std::nullopt, true});
  EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), expected);
  EXPECT_EQ(j.at("count"), expected.size());
  EXPECT_EQ(j.at("max_model_len"), 512);
  EXPECT_FALSE(j.contains("token_strs"));

  r = tokenize_reply(R"({"prompt": "hello world", "add_special_tokens": false, "return_token_strs": true,
                         "model": "demo"})", c);
  ASSERT_EQ(r.status, 200) << r.body;
  j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), tokenizer_->encode("hello world", EncodeOptions{false, true}));
  EXPECT_EQ(j.at("token_strs").size(), j.at("tokens").size());

  // Messages: the tokens /v1/chat/completions runs.
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  r = tokenize_reply("{" + messages + "}", c);
  ASSERT_EQ(r.status, 200) << r.body;
  ApiRequest chat;
  ASSERT_FALSE(parse_api_request(X, "{" + messages + "}", c, chat));
  EXPECT_EQ(nlohmann::json::parse(r.body).at("tokens").get<std::vector<int32_t>>(), chat.prompts[0].ids);
  r = tokenize_reply("{" + messages + R"(, "add_generation_prompt": false})", c);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_LT(nlohmann::json::parse(r.body).at("count").get<size_t>(), chat.prompts[0].ids.size());
}

TEST_F(RequestFields, TokenizeAndDetokenizeMistakes) {
  const ServingContext c = context();
  const auto expect = [](const JsonReply& r, int status, const std::string& param) {
    EXPECT_EQ(r.status, status) << r.body;
    const auto j = nlohmann::json::parse(r.body);
    if (param.empty()) {
      EXPECT_TRUE(j.at("error").at("param").is_null()) << r.body;
    } else {
      EXPECT_EQ(j.at("error").at("param"), param) << r.body;
    }
  };
  expect(tokenize_reply("{", c), 400, "");
  expect(tokenize_reply("{}", c), 400, "prompt");
  expect(tokenize_reply(R"({"prompt": 3})", c), 400, "prompt");
  expect(tokenize_reply(R"({"prompt": "x", "foo": 1})", c), 400, "foo");
  expect(tokenize_reply(R"({"prompt": "x", "add_generation_prompt": true})", c), 400, "add_generation_prompt");
  expect(tokenize_reply(R"({"prompt": "x", "model": "other"})", c), 404, "model");
  expect(tokenize_reply(R"({"messages": "x"})", c), 400, "messages");
  const int vocab = tokenizer_->vocab_size();
  expect(detokenize_reply(R"({"tokens": [1, )" + std::to_string(vocab) + "]}", c), 400, "tokens");
  expect(detokenize_reply(R"({"tokens": [-1]})", c), 400, "tokens");
  expect(detokenize_reply(R"({"tokens": ["a"]})", c), 400, "tokens");
  expect(detokenize_reply(R"({"tokens": 5})", c), 400, "tokens");
  expect(detokenize_reply(R"({})", c), 400, "tokens");
  expect(detokenize_reply(R"({"tokens": [1], "prompt": "x"})", c), 400, "prompt");
}

TEST_F(RequestFields, DetokenizeInvertsTokenize) {
  const ServingContext c = context();
  const std::vector<int32_t> ids = tokenizer_->encode("func main() { return 42 }", EncodeOptions{false, true});
  nlohmann::json body = {{"tokens", ids}};
  const JsonReply r = detokenize_reply(body.dump(), c);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(nlohmann::json::parse(r.body).at("prompt"), tokenizer_->decode(ids, false));
}

// ---- API key and CORS ----

TEST(AccessPolicy, ApiKeyGuardsV1Only) {
  const AccessPolicy open;
  EXPECT_TRUE(open.authorized("/v1/completions", ""));
  const AccessPolicy policy(AccessOptions{"sk-secret", {}});
  EXPECT_FALSE(policy.authorized("/v1/completions", ""));
  EXPECT_FALSE(policy.authorized("/v1/models", "Bearer wrong"));
  EXPECT_FALSE(policy.authorized("/v1/chat/completions", "sk-secret"));
  EXPECT_FALSE(policy.authorized("/v1/chat/completions", "Bearer sk-secre"));
  EXPECT_FALSE(policy.authorized("/v1", "Basic sk-secret"));
  EXPECT_TRUE(policy.authorized("/v1/chat/completions", "Bearer sk-secret"));
  EXPECT_TRUE(policy.authorized("/v1/models", "bearer sk-secret"));
  for (const char* open_path : {"/health", "/metrics", "/tokenize", "/detokenize", "/internal/v1/load", "/v1x"}) {
    EXPECT_TRUE(policy.authorized(open_path, "")) << open_path;
  }
  const auto j = nlohmann::json::parse(AccessPolicy::unauthorized_body(false));
  EXPECT_EQ(j.at("error").at("code"), "invalid_api_key");
  EXPECT_EQ(j.at("error").at("type"), "invalid_request_error");
}

TEST(AccessPolicy, CorsHeadersOnlyForAllowedOrigins) {
  const AccessPolicy off;
  EXPECT_FALSE(off.cors_enabled());
  EXPECT_EQ(off.cors_headers("https://a.example"), "");
  const AccessPolicy list(AccessOptions{"", {"https://a.example", "http://localhost:3000"}});
  EXPECT_TRUE(list.cors_enabled());
  EXPECT_EQ(list.cors_headers("https://a.example"),
            "Access-Control-Allow-Origin: https://a.example\r\nVary: Origin\r\n");
  EXPECT_EQ(list.cors_headers("https://evil.example"), "");
  EXPECT_EQ(list.cors_headers(""), "");
  const std::string pre = list.preflight_headers("http://localhost:3000", "authorization, content-type");
  EXPECT_NE(pre.find("Access-Control-Allow-Origin: http://localhost:3000\r\n"), std::string::npos) << pre;
  EXPECT_NE(pre.find("Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n"), std::string::npos) << pre;
  EXPECT_NE(pre.find("Access-Control-Allow-Headers: authorization, content-type\r\n"), std::string::npos) << pre;
  // Requested headers that are not plain names are not echoed.
  const std::string odd = list.preflight_headers("http://localhost:3000", "x\r\nSet-Cookie: a");
  EXPECT_EQ(odd.find("Set-Cookie"), std::string::npos) << odd;
  const AccessPolicy any(AccessOptions{"", {"*"}});
  EXPECT_EQ(any.cors_headers("https://whatever.example"), "Access-Control-Allow-Origin: *\r\n");
}

TEST(AccessPolicy, ParseAllowedOrigins) {
  EXPECT_TRUE(parse_allowed_origins("")->empty());
  EXPECT_EQ(*parse_allowed_origins(" https://a.example , http://b:8080"),
            (std::vector<std::string>{"https://a.example", "http://b:8080"}));
  EXPECT_EQ(*parse_allowed_origins("*"), std::vector<std::string>{"*"});
  EXPECT_FALSE(parse_allowed_origins("a,,b").ok());
  EXPECT_FALSE(parse_allowed_origins("a b").ok());
}

}  // namespace
}  // namespace tachyon::server
