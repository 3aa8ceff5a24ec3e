// Chat templates against transformers: every real template under tests/fixtures/chat_templates
// rendered over every conversation of the fixture must equal, byte for byte, what transformers'
// apply_chat_template(tokenize=False) rendered (or fail where it raised). The fixtures come from
// tools/reference/make_chat_template_fixtures.py, with strftime_now() at a fixed time.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace tachyon::testing {
namespace {

std::string chat_fixture_dir() { return source_dir() + "/tests/fixtures/chat_templates"; }

const nlohmann::ordered_json& renders_fixture() {
  static const nlohmann::ordered_json json =
      nlohmann::ordered_json::parse(read_file_bytes(chat_fixture_dir() + "/expected_renders.json"));
  return json;
}

// The fixture's clock: reference.now = "2025-03-07T09:05:02".
std::tm fixture_now() {
  std::tm t{};
  t.tm_year = 2025 - 1900;
  t.tm_mon = 2;
  t.tm_mday = 7;
  t.tm_hour = 9;
  t.tm_min = 5;
  t.tm_sec = 2;
  return t;
}

const ChatTemplate& template_named(const std::string& name) {
  static std::map<std::string, ChatTemplate> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    if (name == "chatml-fallback") {
      it = cache.emplace(name, ChatTemplate::chatml()).first;
    } else {
      Result<ChatTemplate> tpl = ChatTemplate::parse(read_file_bytes(chat_fixture_dir() + "/templates/" + name));
      EXPECT_TRUE(tpl.ok()) << name << ": " << tpl.status().to_string();
      if (!tpl.ok()) tpl = ChatTemplate::chatml();
      it = cache.emplace(name, std::move(tpl).value()).first;
    }
  }
  return it->second;
}

Result<std::string> render_case(const nlohmann::ordered_json& c) {
  const nlohmann::ordered_json& conversation = renders_fixture()["conversations"][c["conversation"].get<std::string>()];
  ChatTemplateExtras extras;
  if (!c["bos_token"].is_null()) extras.bos_token = c["bos_token"].get<std::string>();
  if (!c["eos_token"].is_null()) extras.eos_token = c["eos_token"].get<std::string>();
  if (conversation.contains("tools")) extras.tools = conversation["tools"];
  if (c.contains("extra")) extras.variables = c["extra"];
  extras.render.now = fixture_now();
  return apply_chat_template(template_named(c["template"].get<std::string>()), conversation["messages"],
                             c["add_generation_prompt"].get<bool>(), extras);
}

std::string case_name(const nlohmann::ordered_json& c) {
  std::string name = c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>() +
                     (c["add_generation_prompt"].get<bool>() ? " / generation prompt" : "");
  if (c.contains("extra")) name += " / " + c["extra"].dump();
  return name;
}

TEST(ChatTemplateRenders, MatchTransformersByteForByte) {
  const auto& cases = renders_fixture()["cases"];
  ASSERT_GT(cases.size(), 250u);
  size_t outputs = 0, errors = 0;
  std::map<std::string, int> per_template;
  for (const auto& c : cases) {
    const Result<std::string> out = render_case(c);
    ++per_template[c["template"].get<std::string>()];
    if (c.contains("error")) {
      ++errors;
      EXPECT_FALSE(out.ok()) << case_name(c) << ": transformers raised " << c["error"].get<std::string>()
                             << " but we rendered:\n"
                             << (out.ok() ? *out : "");
      // raise_exception() messages come through verbatim.
      const std::string expected_error = c["error"].get<std::string>();
      if (!out.ok() && expected_error.rfind("TemplateError: ", 0) == 0) {
        EXPECT_NE(out.status().message().find(expected_error.substr(15)), std::string::npos)
            << case_name(c) << ": " << out.status().to_string();
      }
      continue;
    }
    ++outputs;
    ASSERT_TRUE(out.ok()) << case_name(c) << ": " << out.status().to_string();
    EXPECT_EQ(*out, c["expected"].get<std::string>()) << case_name(c);
  }
  std::string summary;
  for (const auto& [name, n] : per_template) summary += "  " + name + ": " + std::to_string(n) + "\n";
  std::printf("%zu renderings equal to transformers', %zu errors where it raised, per template:\n%s", outputs, errors,
              summary.c_str());
}

TEST(ChatTemplateRenders, RaiseExceptionIsAClearError) {
  const ChatTemplate& mistral = template_named("mistralai-Mistral-Nemo-Instruct-2407.jinja");
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  const Result<std::string> out = apply_chat_template(mistral, messages, true);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::kInvalidArgument);
  const std::string& message = out.status().message();
  EXPECT_NE(message.find("chat template: line 18, column 17: "), std::string::npos) << message;
  EXPECT_NE(message.find("the template raised an error: After the optional system message, conversation roles must "
                         "alternate user/assistant/user/assistant/..."),
            std::string::npos)
      << message;
}

TEST(ChatTemplateRenders, StrftimeNowUsesTheGivenTimeOrTheClock) {
  Result<ChatTemplate> tpl = ChatTemplate::parse("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(tpl.ok());
  ChatTemplateRenderOptions options;
  options.now = fixture_now();
  EXPECT_EQ(*tpl->render(nlohmann::ordered_json::object(), options), "07 Mar 2025");
  // The real clock: some date of the form "DD Mon YYYY".
  const Result<std::string> today = tpl->render(nlohmann::ordered_json::object());
  ASSERT_TRUE(today.ok());
  EXPECT_EQ(today->size(), 11u) << *today;
}

TEST(ChatTemplateRenders, MessagesMustBeAListOfObjects) {
  const ChatTemplate chatml = ChatTemplate::chatml();
  EXPECT_FALSE(apply_chat_template(chatml, nlohmann::ordered_json::array(), true).ok());
  EXPECT_FALSE(apply_chat_template(chatml, nlohmann::ordered_json::object(), true).ok());
  EXPECT_FALSE(apply_chat_template(chatml, nlohmann::ordered_json::parse(R"(["hello"])"), true).ok());
  const auto ok = apply_chat_template(chatml, nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])"), true);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(*ok, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateRenders, NullFieldsAreDroppedAndReasoningIsAliased) {
  Result<ChatTemplate> tpl = ChatTemplate::parse(
      "{% for m in messages %}{{ m | tojson }}|{{ m.content is defined }}|{{ m.reasoning_content }}\n{% endfor %}");
  ASSERT_TRUE(tpl.ok());
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "assistant", "content": null, "reasoning": "because"}, {"role": "user", "content": "x"}])");
  const Result<std::string> out = apply_chat_template(*tpl, messages, false);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out,
            "{\"thinking\": \"because\", \"role\": \"assistant\", \"reasoning\": \"because\", \"reasoning_content\": "
            "\"because\"}|False|because\n"
            "{\"role\": \"user\", \"content\": \"x\"}|True|\n");
}

TEST(ChatTemplateRenders, PlainJsonSortsKeysOrderedJsonKeepsThem) {
  Result<ChatTemplate> tpl = ChatTemplate::parse("{{ d | tojson }}");
  ASSERT_TRUE(tpl.ok());
  const char* text = R"({"d": {"zeta": 1, "alpha": 2}})";
  EXPECT_EQ(*tpl->render(nlohmann::ordered_json::parse(text)), R"({"zeta": 1, "alpha": 2})");
  EXPECT_EQ(*tpl->render(nlohmann::json::parse(text)), R"({"alpha": 2, "zeta": 1})");
  EXPECT_FALSE(tpl->render(nlohmann::ordered_json::array()).ok());
}

// ------------------------------------------------------------------------------------------------
// Templates as the tokenizer loaders find them.

TEST(ChatTemplateTokenizer, BundledModelTemplateMatchesTheFixture) {
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_hf_json(
      source_dir() + "/models/tachyon-demo/tokenizer.json", source_dir() + "/models/tachyon-demo/tokenizer_config.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->chat_template(), read_file_bytes(chat_fixture_dir() + "/templates/tachyon-demo.jinja"));
  Result<ChatTemplate> tpl = load_chat_template(**tok);
  ASSERT_TRUE(tpl.ok()) << tpl.status().to_string();
  const ChatTemplateExtras extras = chat_template_extras(**tok);
  ASSERT_TRUE(extras.bos_token.has_value());
  EXPECT_EQ(*extras.bos_token, "<|begin_of_text|>");
  ASSERT_TRUE(extras.eos_token.has_value());
  EXPECT_EQ(*extras.eos_token, "<|end_of_text|>");
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hello!"}])");
  const Result<std::string> out = apply_chat_template(*tpl, messages, true, extras);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, "<|begin_of_text|><|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  // The rendered prompt tokenizes with the chat markers as single special tokens.
  const std::vector<int32_t> ids = (*tok)->encode(*out, EncodeOptions(false, true));
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), (*tok)->bos_id());
}

TEST(ChatTemplateTokenizer, SharedTokenizersCarryTheFixtureTemplates) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  // The llama3 directory has a tiktoken file, not a tokenizer.json: compare with its config directly.
  const auto config = nlohmann::json::parse(read_file_bytes(shared + "/tokenizers/llama3/tokenizer_config.json"));
  EXPECT_EQ(config["chat_template"].get<std::string>(),
            read_file_bytes(chat_fixture_dir() + "/templates/llama3-8b-instruct.jinja"));
  const Tokenizer* phi3 = shared_tokenizer("phi-3-gguf");
  ASSERT_NE(phi3, nullptr);
  EXPECT_EQ(phi3->chat_template(), read_file_bytes(chat_fixture_dir() + "/templates/phi-3-gguf.jinja"));
  Result<ChatTemplate> tpl = load_chat_template(*phi3);
  ASSERT_TRUE(tpl.ok()) << tpl.status().to_string();
  const ChatTemplateExtras extras = chat_template_extras(*phi3);
  EXPECT_EQ(extras.bos_token.value_or(""), "<s>");
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(*apply_chat_template(*tpl, messages, true, extras), "<s><|user|>\nHi<|end|>\n<|assistant|>\n");
}

TEST(ChatTemplateTokenizer, TokenizerWithoutTemplateFallsBackToChatMl) {
  const Tokenizer* tok = shared_tokenizer("tiny-metaspace-hf");
  ASSERT_NE(tok, nullptr);
  ASSERT_TRUE(tok->chat_template().empty());
  Result<ChatTemplate> tpl = load_chat_template(*tok);
  ASSERT_TRUE(tpl.ok());
  EXPECT_EQ(tpl->source(), chatml_template_source());
}

// ------------------------------------------------------------------------------------------------
// Speed: typical templates render in microseconds to a millisecond.

TEST(ChatTemplateRenders, RenderingTime) {
  const auto& cases = renders_fixture()["cases"];
  for (const char* name : {"meta-llama-Llama-3.3-70B-Instruct.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
                           "mistralai-Mistral-Nemo-Instruct-2407.jinja"}) {
    for (const auto& c : cases) {
      if (c["template"] != name || c["conversation"] != "tool_call_and_result" || !c["add_generation_prompt"].get<bool>() ||
          c.contains("extra")) {
        continue;
      }
      constexpr int kRuns = 200;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kRuns; ++i) ASSERT_TRUE(render_case(c).ok());
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kRuns;
      std::printf("%-45s tool conversation: %.1f us per rendering (%zu bytes)\n", name, us,
                  c["expected"].get<std::string>().size());
    }
  }
  const ChatTemplate& parse_once = template_named("meta-llama-Llama-3.3-70B-Instruct.jinja");
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(ChatTemplate::parse(parse_once.source()).ok());
  std::printf("parsing the Llama 3.3 template: %.1f us\n",
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / 200);
}

}  // namespace
}  // namespace tachyon::testing
