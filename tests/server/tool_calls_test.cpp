// Tool calling (server/tool_calls.h): the request's tools and tool_choice and their 400s, the call format read off
// real chat templates, messages prepared for the template (and rendered through real ones), the output parser per
// format, the streaming parser against it on random splits, and the forcing grammar: what it accepts, what it
// refuses, and that every string it can produce parses back into calls with no content.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "sampling/grammar_test_util.h"
#include "server/tool_calls.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

namespace tachyon::server {
namespace {

using ojson = nlohmann::ordered_json;

ojson parse(std::string_view text) { return ojson::parse(text); }

const char* kWeatherTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                  "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time"}}
])";

ToolRequest weather_request(std::string_view choice = R"("auto")") {
  const ojson body = parse(fmt::format(R"({{"tools": {}, "tool_choice": {}}})", kWeatherTools, choice));
  Result<ToolRequest> request = parse_tool_request(body);
  EXPECT_TRUE(request.ok()) << request.status().to_string();
  return request.ok() ? *request : ToolRequest{};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fixture_template(const std::string& name) {
  return read_file(testing::source_dir() + "/tests/fixtures/chat_templates/templates/" + name);
}

// ---- Request fields ----------------------------------------------------------------------------------------------

TEST(ToolRequest, ParsesToolsAndDefaultsToAuto) {
  Result<ToolRequest> r = parse_tool_request(parse(fmt::format(R"({{"tools": {}}})", kWeatherTools)));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tools.size(), 2u);
  EXPECT_EQ(r->tools[0].name, "get_weather");
  EXPECT_EQ(r->tools[0].description, "Current weather in a city");
  EXPECT_EQ(r->tools[0].parameters["required"], parse(R"(["city"])"));
  EXPECT_EQ(r->tools[1].name, "get_time");
  EXPECT_TRUE(r->tools[1].parameters.is_null());
  EXPECT_EQ(r->choice, ToolChoiceMode::kAuto);
  EXPECT_TRUE(r->parallel_tool_calls);
  EXPECT_FALSE(r->legacy_functions);
  EXPECT_TRUE(r->active());
  EXPECT_FALSE(r->forced());

  const ojson for_template = tools_template_json(r->tools);
  EXPECT_EQ(for_template[1], parse(R"({"type": "function", "function": {"name": "get_time"}})"));
  EXPECT_EQ(for_template[0]["function"]["parameters"]["properties"]["city"], parse(R"({"type": "string"})"));
  EXPECT_FALSE(for_template[0]["function"].contains("strict"));
}

TEST(ToolRequest, NoToolsMeansNone) {
  for (const char* body : {R"({})", R"({"tools": null})", R"({"tools": []})", R"({"tools": [], "tool_choice": "none"})",
                           R"({"tools": [], "tool_choice": "auto"})"}) {
    Result<ToolRequest> r = parse_tool_request(parse(body));
    ASSERT_TRUE(r.ok()) << body << ": " << r.status().to_string();
    EXPECT_FALSE(r->active()) << body;
    EXPECT_FALSE(r->forced()) << body;
  }
}

TEST(ToolRequest, ToolChoiceModes) {
  EXPECT_EQ(weather_request(R"("none")").choice, ToolChoiceMode::kNone);
  EXPECT_FALSE(weather_request(R"("none")").active());
  EXPECT_EQ(weather_request(R"("auto")").choice, ToolChoiceMode::kAuto);
  const ToolRequest required = weather_request(R"("required")");
  EXPECT_EQ(required.choice, ToolChoiceMode::kRequired);
  EXPECT_TRUE(required.forced());
  const ToolRequest named = weather_request(R"({"type": "function", "function": {"name": "get_time"}})");
  EXPECT_EQ(named.choice, ToolChoiceMode::kNamed);
  EXPECT_EQ(named.named_tool, "get_time");
  EXPECT_TRUE(named.forced());

  Result<ToolRequest> serial =
      parse_tool_request(parse(fmt::format(R"({{"tools": {}, "parallel_tool_calls": false}})", kWeatherTools)));
  ASSERT_TRUE(serial.ok());
  EXPECT_FALSE(serial->parallel_tool_calls);
}

TEST(ToolRequest, LegacyFunctionsMapOntoTools) {
  const char* functions = R"([{"name": "get_weather", "parameters": {"type": "object"}}, {"name": "get_time"}])";
  Result<ToolRequest> r = parse_tool_request(parse(fmt::format(R"({{"functions": {}}})", functions)));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->legacy_functions);
  ASSERT_EQ(r->tools.size(), 2u);
  EXPECT_EQ(r->tools[0].parameters, parse(R"({"type": "object"})"));
  EXPECT_EQ(r->choice, ToolChoiceMode::kAuto);

  r = parse_tool_request(parse(fmt::format(R"({{"functions": {}, "function_call": {{"name": "get_weather"}}}})",
                                           functions)));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->choice, ToolChoiceMode::kNamed);
  EXPECT_EQ(r->named_tool, "get_weather");

  r = parse_tool_request(parse(fmt::format(R"({{"functions": {}, "function_call": "none"}})", functions)));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->active());
}

TEST(ToolRequest, MistakesNameTheField) {
  const std::string tool = R"({"type": "function", "function": {"name": "f"}})";
  const std::string long_name(65, 'a');
  struct Case {
    std::string body;
    std::string param;  // the message's first word
    std::string has;
  };
  const std::vector<Case> cases = {
      {R"({"tools": {}})", "tools", "must be a list"},
      {R"({"tools": [5]})", "tools[0]", "must be an object"},
      {R"({"tools": [{"function": {"name": "f"}}]})", "tools[0].type", "must be 'function'"},
      {R"({"tools": [{"type": "retrieval", "function": {"name": "f"}}]})", "tools[0].type", "\"retrieval\""},
      {R"({"tools": [{"type": "function"}]})", "tools[0].function", "is required"},
      {R"({"tools": [{"type": "function", "function": {}}]})", "tools[0].function.name", "is required"},
      {R"({"tools": [{"type": "function", "function": {"name": 7}}]})", "tools[0].function.name", "must be a string"},
      {R"({"tools": [{"type": "function", "function": {"name": "get weather"}}]})", "tools[0].function.name",
       "'get weather' must be 1 to 64 characters"},
      {R"({"tools": [{"type": "function", "function": {"name": "caf\u00e9"}}]})", "tools[0].function.name",
       "a-z, A-Z, 0-9"},
      {R"({"tools": [{"type": "function", "function": {"name": ""}}]})", "tools[0].function.name", "1 to 64"},
      {R"({"tools": [{"type": "function", "function": {"name": ")" + long_name + R"("}}]})", "tools[0].function.name",
       "1 to 64"},
      {R"({"tools": [)" + tool + ", " + tool + "]}", "tools[1].function.name", "is the name of tools[0] too"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]})",
       "tools[0].function.parameters", "must be a JSON Schema object"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]})",
       "tools[0].function.parameters", "must describe an object"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]})",
       "tools[0].function.description", "must be a string"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]})",
       "tools[0].function.strict", "must be a boolean"},
      {R"({"tools": [)" + tool + R"(], "tool_choice": "always"})", "tool_choice", "'always'"},
      {R"({"tools": [)" + tool + R"(], "tool_choice": 3})", "tool_choice", "must be a string or an object"},
      {R"({"tools": [)" + tool + R"(], "tool_choice": {"function": {"name": "f"}}})", "tool_choice.type",
       "must be 'function'"},
      {R"({"tools": [)" + tool + R"(], "tool_choice": {"type": "function"}})", "tool_choice.function",
       "must be an object"},
      {R"({"tools": [)" + tool + R"(], "tool_choice": {"type": "function", "function": {}}})",
       "tool_choice.function.name", "must be a string"},
      {R"({"tools": [)" + tool + R"(], "tool_choice": {"type": "function", "function": {"name": "g"}}})", "tool_choice",
       "names function 'g', which is not in 'tools'"},
      {R"({"tool_choice": "required"})", "tool_choice", "needs a non-empty 'tools' list"},
      {R"({"tools": [], "tool_choice": "required"})", "tool_choice", "needs a non-empty 'tools' list"},
      {R"({"tool_choice": {"type": "function", "function": {"name": "f"}}})", "tool_choice", "not in 'tools'"},
      {R"({"tools": [)" + tool + R"(], "functions": [{"name": "f"}]})", "functions", "together with 'tools'"},
      {R"({"functions": [{"name": "f"}], "tool_choice": "auto"})", "tool_choice", "use 'function_call'"},
      {R"({"tools": [)" + tool + R"(], "function_call": "auto"})", "function_call", "use 'tool_choice'"},
      {R"({"tools": [)" + tool + R"(], "tool_choice": "auto", "function_call": "auto"})", "function_call",
       "together with 'tool_choice'"},
      {R"({"functions": [{"name": "f"}], "function_call": "required"})", "function_call", "'required'"},
      {R"({"functions": [{"name": "f"}], "function_call": {"name": "g"}})", "function_call", "not in 'functions'"},
      {R"({"functions": [{"name": "f g"}]})", "functions[0].name", "must be 1 to 64"},
      {R"({"functions": [{"name": "f"}, {"name": "f"}]})", "functions[1].name", "is the name of functions[0]"},
      {R"({"tools": [)" + tool + R"(], "parallel_tool_calls": "yes"})", "parallel_tool_calls", "must be a boolean"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    Result<ToolRequest> r = parse_tool_request(parse(c.body));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    const std::string& message = r.status().message();
    EXPECT_EQ(message.substr(0, message.find(' ')), c.param) << message;
    EXPECT_NE(message.find(c.has), std::string::npos) << message;
  }
  // The longest name allowed.
  const std::string name64(64, 'z');
  EXPECT_TRUE(parse_tool_request(parse(R"({"tools": [{"type": "function", "function": {"name": ")" + name64 +
                                       R"("}}]})"))
                  .ok());
}

// ---- Templates ---------------------------------------------------------------------------------------------------

TEST(ToolTemplates, FormatCues) {
  EXPECT_EQ(detect_tool_call_format("{{ '[TOOL_CALLS][' }}{{ '<tool_call>' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format("{{- '<tool_call>\\n{\"name\": \"' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format("{{ '<|python_tag|>' }}"), ToolCallFormat::kLlamaJson);
  EXPECT_EQ(detect_tool_call_format("{{- '\"parameters\": ' }}"), ToolCallFormat::kLlamaJson);
  EXPECT_EQ(detect_tool_call_format("Given the following functions, please respond"), ToolCallFormat::kLlamaJson);
  EXPECT_EQ(detect_tool_call_format("{% for m in messages %}{{ m.content }}{% endfor %}"), ToolCallFormat::kHermes);
  EXPECT_EQ(tool_call_format_name(ToolCallFormat::kHermes), "hermes");
  EXPECT_EQ(tool_call_format_name(ToolCallFormat::kLlamaJson), "llama3_json");
  EXPECT_EQ(tool_call_format_name(ToolCallFormat::kMistral), "mistral");
}

TEST(ToolTemplates, RendersToolsOnlyWhenTheVariableIsRead) {
  for (const char* yes : {"{{ tools }}", "{%- if tools %}x{% endif %}", "{% for t in tools %}{{ t }}{% endfor %}",
                          "{% set tools = custom_tools %}", "{{ x }}{%- if not tools is defined -%}{%- endif %}",
                          "{{ 'a}}' }}{{ tools|tojson }}", "{{ (tools) }}"}) {
    EXPECT_TRUE(template_renders_tools(yes)) << yes;
  }
  for (const char* no : {"", "tools outside any block", "{{ custom_tools }}", "{{ message.tools }}",
                          "{{ message . tools }}", "{{ 'tools' }}", "{{ \"the tools\" }}", "{# {{ tools }} #}",
                          "{{ tools_in_user_message }}", "{{ 'it''s' }} tools", "{% if x %}tools{% endif %}",
                          "{{ unclosed 'tools"}) {
    EXPECT_FALSE(template_renders_tools(no)) << no;
  }
}

TEST(ToolTemplates, RealTemplates) {
  struct Case {
    const char* file;
    ToolCallFormat format;
    bool renders_tools;
  };
  const Case cases[] = {
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallFormat::kLlamaJson, true},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolCallFormat::kLlamaJson, true},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::kHermes, true},
      {"Qwen-Qwen3-0.6B.jinja", ToolCallFormat::kHermes, true},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolCallFormat::kHermes, true},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::kMistral, true},
      {"llama3-8b-instruct.jinja", ToolCallFormat::kHermes, false},
      {"tachyon-demo.jinja", ToolCallFormat::kHermes, false},
      {"microsoft-Phi-3.5-mini-instruct.jinja", ToolCallFormat::kHermes, false},
      {"google-gemma-2-2b-it.jinja", ToolCallFormat::kHermes, false},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ToolCallFormat::kHermes, false},
  };
  for (const Case& c : cases) {
    const std::string source = fixture_template(c.file);
    ASSERT_FALSE(source.empty()) << c.file;
    EXPECT_EQ(detect_tool_call_format(source), c.format) << c.file;
    EXPECT_EQ(template_renders_tools(source), c.renders_tools) << c.file;
  }
}

TEST(ToolTemplates, SharedLlama3Template) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const std::string path = shared + "/tokenizers/llama3/tokenizer_config.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  const ojson config = ojson::parse(read_file(path));
  ASSERT_TRUE(config.contains("chat_template") && config["chat_template"].is_string());
  const std::string source = config["chat_template"].get<std::string>();
  // Llama 3 (before 3.1) has no tool section: the generic format, told through the system prompt.
  EXPECT_EQ(detect_tool_call_format(source), ToolCallFormat::kHermes);
  EXPECT_FALSE(template_renders_tools(source));
}

TEST(ToolTemplates, SystemPromptPerFormat) {
  const ToolRequest r = weather_request();
  const std::string hermes = tools_system_prompt(r.tools, ToolCallFormat::kHermes);
  EXPECT_NE(hermes.find("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"),
            std::string::npos);
  EXPECT_NE(hermes.find(R"({"type":"function","function":{"name":"get_time"}})"), std::string::npos);
  EXPECT_NE(hermes.find(R"("description":"Current weather in a city")"), std::string::npos);
  const std::string llama = tools_system_prompt(r.tools, ToolCallFormat::kLlamaJson);
  EXPECT_NE(llama.find(R"({"name": function name, "parameters": dictionary)"), std::string::npos);
  EXPECT_NE(llama.find("get_weather"), std::string::npos);
  const std::string mistral = tools_system_prompt(r.tools, ToolCallFormat::kMistral);
  EXPECT_NE(mistral.find(R"([TOOL_CALLS] [{"name": function name, "arguments": )"), std::string::npos);
  EXPECT_NE(mistral.find("get_weather"), std::string::npos);
}

TEST(ToolTemplates, SystemPromptGoesBeforeTheFirstSystemMessage) {
  const ToolRequest r = weather_request();
  const std::string prompt = tools_system_prompt(r.tools, ToolCallFormat::kHermes);
  const ojson with_system = parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])");
  Result<ojson> out = add_tools_system_prompt(with_system, r.tools, ToolCallFormat::kHermes);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0]["content"], prompt + "\n\nBe brief.");
  EXPECT_EQ((*out)[1], with_system[1]);

  const ojson without = parse(R"([{"role": "user", "content": "hi"}])");
  out = add_tools_system_prompt(without, r.tools, ToolCallFormat::kHermes);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0], (ojson{{"role", "system"}, {"content", prompt}}));
  EXPECT_EQ((*out)[1], without[0]);

  const ojson null_content = parse(R"([{"role": "system", "content": null}, {"role": "user", "content": "hi"}])");
  out = add_tools_system_prompt(null_content, r.tools, ToolCallFormat::kHermes);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0]["content"], prompt);
}

// ---- Messages ----------------------------------------------------------------------------------------------------

TEST(ToolMessages, ArgumentsStringsBecomeObjects) {
  const ojson messages = parse(R"([
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
      {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "not json"}},
      {"id": "call_3", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "UTC"}}},
      {"id": "call_4", "type": "function", "function": {"name": "get_time", "arguments": "[1, 2]"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
  ])");
  Result<ojson> out = messages_for_template(messages);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const ojson& calls = (*out)[1]["tool_calls"];
  EXPECT_EQ(calls[0]["function"]["arguments"], parse(R"({"city": "Paris"})"));
  EXPECT_EQ(calls[1]["function"]["arguments"], "not json");
  EXPECT_EQ(calls[2]["function"]["arguments"], parse(R"({"tz": "UTC"})"));
  EXPECT_EQ(calls[3]["function"]["arguments"], "[1, 2]");
  EXPECT_EQ(calls[0]["id"], "call_1");
  EXPECT_EQ((*out)[2], messages[2]);
  EXPECT_EQ((*out)[0], messages[0]);
  // The input is not changed.
  EXPECT_TRUE(messages[1]["tool_calls"][0]["function"]["arguments"].is_string());
}

TEST(ToolMessages, LegacyFunctionMessages) {
  const ojson messages = parse(R"([
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": null,
     "function_call": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
    {"role": "function", "name": "get_weather", "content": "snow"}
  ])");
  Result<ojson> out = messages_for_template(messages);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_FALSE((*out)[1].contains("function_call"));
  EXPECT_EQ((*out)[1]["tool_calls"],
            parse(R"([{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}])"));
  EXPECT_EQ((*out)[2], parse(R"({"role": "tool", "name": "get_weather", "content": "snow"})"));
}

TEST(ToolMessages, MistakesNameTheMessage) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([{"content": "x"}])", "messages[0].role must be a string"},
      {R"([3])", "messages[0] must be an object"},
      {R"([{"role": "assistant", "tool_calls": {}}])", "messages[0].tool_calls must be a list"},
      {R"([{"role": "assistant", "tool_calls": [1]}])", "messages[0].tool_calls[0] must be an object"},
      {R"([{"role": "assistant", "tool_calls": [{"type": "function"}]}])",
       "messages[0].tool_calls[0].function must be an object"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])",
       "messages[0].tool_calls[0].function.name must be a string"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}])",
       "messages[0].tool_calls[0].function.arguments must be a string"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}])",
       "messages[0].tool_calls[0].function.arguments must be a string"},
      {R"([{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f", "arguments": "{}"}}]}])",
       "messages[0].tool_calls[0].type must be 'function'"},
      {R"([{"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f", "arguments": "{}"}}]}])",
       "messages[0].tool_calls[0].id must be a string"},
      {R"([{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}])", "messages[1].tool_call_id must be"},
      {R"([{"role": "function", "content": "r"}])", "messages[0].name must be a string"},
  };
  for (const auto& [messages, message] : cases) {
    Result<ojson> out = messages_for_template(parse(messages));
    ASSERT_FALSE(out.ok()) << messages;
    EXPECT_EQ(out.status().message().rfind(message, 0), 0u) << out.status().message();
  }
}

TEST(ToolMessages, PreparedChatRendersThroughRealTemplates) {
  const ojson messages = parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_abc", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"}
  ])");
  const ToolRequest request = weather_request();

  // Qwen2.5 renders the tools itself, and the call as {"name": ..., "arguments": <object>}.
  const std::string qwen_source = fixture_template("Qwen-Qwen2.5-7B-Instruct.jinja");
  Result<ToolChatInput> qwen = prepare_tool_chat(messages, request, qwen_source);
  ASSERT_TRUE(qwen.ok()) << qwen.status().to_string();
  EXPECT_EQ(qwen->format, ToolCallFormat::kHermes);
  EXPECT_EQ(qwen->tools, tools_template_json(request.tools));
  EXPECT_EQ(qwen->messages.size(), messages.size());
  Result<ChatTemplate> qwen_template = ChatTemplate::parse(qwen_source);
  ASSERT_TRUE(qwen_template.ok());
  ChatTemplateExtras extras;
  extras.tools = qwen->tools;
  Result<std::string> text = apply_chat_template(*qwen_template, qwen->messages, true, extras);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_NE(text->find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
            std::string::npos)
      << *text;
  EXPECT_NE(text->find("\"name\": \"get_time\""), std::string::npos) << *text;

  // Llama 3.2 writes the call with "parameters".
  const std::string llama_source = fixture_template("meta-llama-Llama-3.2-3B-Instruct.jinja");
  Result<ToolChatInput> llama = prepare_tool_chat(messages, request, llama_source);
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->format, ToolCallFormat::kLlamaJson);
  Result<ChatTemplate> llama_template = ChatTemplate::parse(llama_source);
  ASSERT_TRUE(llama_template.ok());
  extras.tools = llama->tools;
  extras.variables = ojson{{"date_string", "07 Mar 2025"}};
  text = apply_chat_template(*llama_template, llama->messages, true, extras);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_NE(text->find(R"({"name": "get_weather", "parameters": {"city": "Paris"}})"), std::string::npos) << *text;

  // The bundled model's plain ChatML template gets the tools in a system message of their own.
  const std::string demo_source = fixture_template("tachyon-demo.jinja");
  Result<ToolChatInput> demo = prepare_tool_chat(messages, request, demo_source);
  ASSERT_TRUE(demo.ok());
  EXPECT_TRUE(demo->tools.is_null());
  ASSERT_EQ(demo->messages.size(), messages.size() + 1);
  EXPECT_EQ(demo->messages[0]["role"], "system");
  Result<ChatTemplate> demo_template = ChatTemplate::parse(demo_source);
  ASSERT_TRUE(demo_template.ok());
  // (ChatML concatenates every message's content, so only the question is rendered here.)
  Result<ToolChatInput> question = prepare_tool_chat(ojson::array({messages[0]}), request, demo_source);
  ASSERT_TRUE(question.ok());
  text = apply_chat_template(*demo_template, question->messages, true, {});
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(text->rfind("<|im_start|>system\n# Tools\n", 0), 0u) << *text;
  EXPECT_NE(text->find("<tool_call>"), std::string::npos);

  // tool_choice "none": no tools anywhere, history still prepared.
  Result<ToolChatInput> none = prepare_tool_chat(messages, weather_request(R"("none")"), demo_source);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->tools.is_null());
  ASSERT_EQ(none->messages.size(), messages.size());
  EXPECT_TRUE(none->messages[1]["tool_calls"][0]["function"]["arguments"].is_object());
}

// Templates that never mention tool_calls get earlier calls as text in the format the system prompt
// teaches, and no null contents.
TEST(ToolMessages, CallsAsTextForTemplatesWithoutToolCalls) {
  const ojson messages = ojson::parse(R"([
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
      {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])");
  Result<ojson> prepared = messages_for_template(messages);
  ASSERT_TRUE(prepared.ok()) << prepared.status().to_string();
  ojson hermes = calls_as_text(*prepared, ToolCallFormat::kHermes);
  EXPECT_EQ(hermes[1]["content"], "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n"
                                  "</tool_call>\n<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>");
  EXPECT_FALSE(hermes[1].contains("tool_calls"));
  EXPECT_EQ(hermes[2]["content"], "sunny");
  EXPECT_EQ(hermes[2]["tool_call_id"], "call_1");
  EXPECT_EQ(calls_as_text(*prepared, ToolCallFormat::kLlamaJson)[1]["content"],
            R"({"name":"get_weather","parameters":{"city":"Paris"}}; {"name":"get_time","parameters":{}})");
  EXPECT_EQ(calls_as_text(*prepared, ToolCallFormat::kMistral)[1]["content"],
            R"([TOOL_CALLS] [{"name":"get_weather","arguments":{"city":"Paris"}}, )"
            R"({"name":"get_time","arguments":{}}])");
  EXPECT_TRUE(template_renders_tool_calls("{% for call in message.tool_calls %}"));
  EXPECT_FALSE(template_renders_tool_calls("{{ message['content'] }}"));
}

// ---- Output parsing ----------------------------------------------------------------------------------------------

TEST(ToolParse, CallIds) {
  std::mt19937_64 rng(7);
  const std::string a = new_tool_call_id(rng);
  const std::string b = new_tool_call_id(rng);
  for (const std::string& id : {a, b}) {
    ASSERT_EQ(id.size(), 5u + 24u) << id;
    EXPECT_EQ(id.substr(0, 5), "call_");
    for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
  }
  EXPECT_NE(a, b);
  std::mt19937_64 again(7);
  EXPECT_EQ(new_tool_call_id(again), a);
  const std::string m = new_tool_call_id(again, ToolCallFormat::kMistral);  // Mistral's templates want 9
  ASSERT_EQ(m.size(), 9u) << m;
  for (char c : m) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << m;
}

struct ExpectedCall {
  std::string name;
  std::string arguments;
};

struct ParseCase {
  ToolCallFormat format;
  std::string text;
  std::string content;
  std::vector<ExpectedCall> calls;
};

const std::string kParis = R"({"name": "get_weather", "arguments": {"city": "Paris"}})";
const std::string kTime = R"({"name": "get_time", "arguments": {}})";

std::vector<ParseCase> parse_cases() {
  const ExpectedCall paris{"get_weather", R"({"city":"Paris"})"};
  const ExpectedCall time{"get_time", "{}"};
  const auto hermes = [](const std::string& json) { return "<tool_call>\n" + json + "\n</tool_call>"; };
  using F = ToolCallFormat;
  return {
      // Hermes.
      {F::kHermes, "Just text, no calls.\n", "Just text, no calls.\n", {}},
      {F::kHermes, "", "", {}},
      {F::kHermes, "  \n", "  \n", {}},
      {F::kHermes, hermes(kParis), "", {paris}},
      {F::kHermes, "Let me check.\n" + hermes(kParis), "Let me check.", {paris}},
      {F::kHermes, hermes(kParis) + "\n" + hermes(kTime) + "\n", "", {paris, time}},
      {F::kHermes, hermes(kParis) + "\nDone.", "Done.", {paris}},
      {F::kHermes, "<tool_call>" + kParis, "", {paris}},  // the end tag is optional
      {F::kHermes, "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>", "", {time}},
      {F::kHermes, R"(<tool_call>{"name": "get_time", "parameters": {"a": [1, {"b": null}]}}</tool_call>)", "",
       {{"get_time", R"({"a":[1,{"b":null}]})"}}},
      {F::kHermes, R"(<tool_call>{"name": "get_weather", "arguments": {"city": "<tool_call>}\"{"}}</tool_call>)", "",
       {{"get_weather", R"({"city":"<tool_call>}\"{"})"}}},
      {F::kHermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\u00fcrich \U0001F600\"}}", "",
       {{"get_weather", "{\"city\":\"Z\u00fcrich \U0001F600\"}"}}},
      // Not calls: the text stays content.
      {F::kHermes, hermes(R"({"name": "launch_rockets", "arguments": {}})"),
       hermes(R"({"name": "launch_rockets", "arguments": {}})"), {}},
      {F::kHermes, hermes(R"({"name": "get_weather", "arguments": {"city": }})"),
       hermes(R"({"name": "get_weather", "arguments": {"city": }})"), {}},
      {F::kHermes, hermes(R"({"name": "get_weather", "arguments": "Paris"})"),
       hermes(R"({"name": "get_weather", "arguments": "Paris"})"), {}},
      {F::kHermes, hermes(R"(["get_weather"])"), hermes(R"(["get_weather"])"), {}},
      {F::kHermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci", {}},
      {F::kHermes, "See <tool_call> tags.", "See <tool_call> tags.", {}},
      {F::kHermes, "a <tool_ca", "a <tool_ca", {}},
      {F::kHermes, hermes(kParis) + "\n" + hermes("{oops}"), "<tool_call>\n{oops}\n</tool_call>", {paris}},
      {F::kHermes, "<tool_call><tool_call>" + kTime, "<tool_call>", {time}},
      {F::kHermes, hermes(kTime) + "</tool_", "</tool_", {time}},
      // Llama 3 JSON.
      {F::kLlamaJson, R"({"name": "get_weather", "parameters": {"city": "Paris"}})", "", {paris}},
      {F::kLlamaJson, R"(<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}})", "", {paris}},
      {F::kLlamaJson, "\n " + kParis + "; " + kTime, "", {paris, time}},
      {F::kLlamaJson, kParis + ";" + kTime + "\n\nAnything else?", "Anything else?", {paris, time}},
      {F::kLlamaJson, R"({"answer": 42})", R"({"answer": 42})", {}},
      {F::kLlamaJson, "Here: " + kParis, "Here: " + kParis, {}},
      {F::kLlamaJson, "Here: <|python_tag|>" + kParis, "Here:", {paris}},
      {F::kLlamaJson, "The weather is fine.", "The weather is fine.", {}},
      {F::kLlamaJson, R"({"name": "get_weather", "parameters": {"city": "Paris"})",
       R"({"name": "get_weather", "parameters": {"city": "Paris"})", {}},
      // Mistral.
      {F::kMistral, "[TOOL_CALLS] [" + kParis + ", " + kTime + "]", "", {paris, time}},
      {F::kMistral, "[TOOL_CALLS][" + kParis + "]", "", {paris}},
      {F::kMistral, "[" + kParis + "]", "", {paris}},
      {F::kMistral, "Sure. [TOOL_CALLS] [" + kTime + "]", "Sure.", {time}},
      {F::kMistral, "[" + kParis + R"(, {"name": "nope", "arguments": {}}])",
       "[" + kParis + R"(, {"name": "nope", "arguments": {}}])", {}},
      {F::kMistral, "[]", "[]", {}},
      {F::kMistral, "[1, 2] are numbers", "[1, 2] are numbers", {}},
      {F::kMistral, "Numbers: [" + kTime + "]", "Numbers: [" + kTime + "]", {}},
      {F::kMistral, "[TOOL_CALLS] nothing", "[TOOL_CALLS] nothing", {}},
  };
}

std::vector<ToolCall> with_ids(const std::vector<ExpectedCall>& calls, uint64_t seed, ToolCallFormat format) {
  std::mt19937_64 rng(seed);
  std::vector<ToolCall> out;
  for (const ExpectedCall& c : calls) out.push_back(ToolCall{new_tool_call_id(rng, format), c.name, c.arguments});
  return out;
}

TEST(ToolParse, EachFormat) {
  const ToolRequest request = weather_request();
  for (const ParseCase& c : parse_cases()) {
    SCOPED_TRACE(fmt::format("{}: {}", tool_call_format_name(c.format), grammar_test::escape_for_trace(c.text)));
    std::mt19937_64 rng(11);
    const ToolCallParse parsed = parse_tool_calls(c.text, c.format, request.tools, rng);
    EXPECT_EQ(parsed.content, c.content);
    EXPECT_EQ(parsed.calls, with_ids(c.calls, 11, c.format));
  }
}

TEST(ToolParse, OnlyRequestedToolsAreCalls) {
  std::mt19937_64 rng(1);
  const std::vector<ToolSpec> none;
  const std::string text = "<tool_call>\n" + kParis + "\n</tool_call>";
  const ToolCallParse parsed = parse_tool_calls(text, ToolCallFormat::kHermes, none, rng);
  EXPECT_EQ(parsed.content, text);
  EXPECT_TRUE(parsed.calls.empty());
}

TEST(ToolParse, LongOutputsTakeLinearTime) {
  const ToolRequest request = weather_request();
  std::string prose;
  for (int i = 0; i < 200000; ++i) prose += "word < { [ ";
  const std::string city(1 << 20, 'x');
  const std::string call = R"(<tool_call>{"name": "get_weather", "arguments": {"city": ")" + city + "\"}}</tool_call>";
  std::mt19937_64 rng(2);
  const ToolCallParse parsed = parse_tool_calls(prose + call, ToolCallFormat::kHermes, request.tools, rng);
  EXPECT_TRUE(parsed.content == prose.substr(0, prose.size() - 1));  // (not printed: megabytes)
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_TRUE(parsed.calls[0].arguments == R"({"city":")" + city + "\"}");
  ToolCallStreamParser parser(ToolCallFormat::kHermes, request.tools, std::mt19937_64(2));
  size_t content = 0;
  for (size_t pos = 0; pos < call.size(); pos += 7) {
    content += parser.feed(std::string_view(call).substr(pos, 7)).content.size();
  }
  EXPECT_EQ(content, 0u);
  EXPECT_EQ(parser.finish().content, "");
  EXPECT_EQ(parser.num_calls(), 1u);
}

TEST(ToolParse, ResponseJson) {
  const std::vector<ToolCall> calls = {{"call_a", "get_weather", R"({"city":"Paris"})"}, {"call_b", "get_time", "{}"}};
  EXPECT_EQ(tool_calls_json(calls), parse(R"([
    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
    {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}])"));
  EXPECT_EQ(function_call_json(calls[1]), parse(R"({"name": "get_time", "arguments": "{}"})"));
  ToolStreamDelta delta;
  delta.calls = {calls[1]};
  delta.first_index = 3;
  EXPECT_EQ(tool_calls_delta_json(delta), parse(R"([
    {"index": 3, "id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}])"));
}

// ---- Streaming ---------------------------------------------------------------------------------------------------

TEST(ToolStream, ContentFlowsAndCallsWaitForTheirJson) {
  const ToolRequest request = weather_request();
  ToolCallStreamParser parser(ToolCallFormat::kHermes, request.tools, std::mt19937_64(5));
  EXPECT_EQ(parser.feed("Let me").content, "Let me");
  EXPECT_EQ(parser.feed(" check").content, " check");  // the space waited for a non-blank
  EXPECT_EQ(parser.feed(".\n<tool").content, ".");     // "\n" and "<tool" are held
  ToolStreamDelta d = parser.feed("_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par");
  EXPECT_TRUE(d.empty());
  d = parser.feed("is\"}");
  EXPECT_TRUE(d.empty());
  d = parser.feed("}\n</tool_call>");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.first_index, 0u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, R"({"city":"Paris"})");
  std::mt19937_64 rng(5);
  EXPECT_EQ(d.calls[0].id, new_tool_call_id(rng));
  d = parser.feed("\n<tool_call>" + kTime);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.first_index, 1u);
  EXPECT_EQ(tool_calls_delta_json(d)[0]["index"], 1);
  EXPECT_TRUE(parser.finish().empty());
  EXPECT_EQ(parser.num_calls(), 2u);
}

TEST(ToolStream, HeldTextComesBackAtTheEnd) {
  const ToolRequest request = weather_request();
  ToolCallStreamParser parser(ToolCallFormat::kHermes, request.tools, std::mt19937_64(5));
  EXPECT_EQ(parser.feed("Bye <tool_call>{\"name\"").content, "Bye");
  const ToolStreamDelta d = parser.finish();
  EXPECT_EQ(d.content, " <tool_call>{\"name\"");
  EXPECT_TRUE(d.calls.empty());
}

// Random outputs built from pieces that stress the parser: calls valid and not, markers and their prefixes,
// blanks, separators, prose, multi-byte characters.
std::string random_output(ToolCallFormat format, std::mt19937& rng) {
  const std::vector<std::string> common = {
      "Sure", " ", "\n", "\t", "ok.", "caf\u00e9", "\U0001F600", "{", "}", "[", "]", "\"", "\\", ";", ",", "<", ">",
      "{\"name\": \"get_time\"}", kParis, kTime, R"({"name": "nope", "arguments": {}})", R"({"answer": [1, 2]})",
      R"({"name": "get_weather", "arguments": {"city": "a\"}{[b"}})", "<tool_call>", "</tool_call>", "<tool_",
      "</tool_", "<|python_tag|>", "<|python", "[TOOL_CALLS]", "[TOOL_", "{\"name\": \"get_weather\", \"arg"};
  std::vector<std::string> pieces = common;
  switch (format) {
    case ToolCallFormat::kHermes:
      pieces.insert(pieces.end(), {"<tool_call>\n" + kParis + "\n</tool_call>", "<tool_call>" + kTime + "</tool_call>",
                                   "<tool_call>\n" + kTime});
      break;
    case ToolCallFormat::kLlamaJson:
      pieces.insert(pieces.end(),
                    {kParis + "; ", "<|python_tag|>" + kTime, R"({"name": "get_time", "parameters": {}})"});
      break;
    case ToolCallFormat::kMistral:
      pieces.insert(pieces.end(), {"[TOOL_CALLS] [" + kParis + ", " + kTime + "]", "[" + kTime + "]",
                                   "[TOOL_CALLS][" + kParis + "]"});
      break;
  }
  std::uniform_int_distribution<size_t> count(0, 12);
  std::uniform_int_distribution<size_t> pick(0, pieces.size() - 1);
  std::string out;
  for (size_t n = count(rng); n > 0; --n) out += pieces[pick(rng)];
  return out;
}

// Splits `text` at random points (sometimes every byte) and feeds the pieces; the deltas joined.
ToolCallParse stream_in_pieces(const std::string& text, ToolCallFormat format, std::span<const ToolSpec> tools,
                               uint64_t id_seed, std::mt19937& rng) {
  ToolCallStreamParser parser(format, tools, std::mt19937_64(id_seed));
  ToolCallParse joined;
  const auto take = [&](ToolStreamDelta d) {
    EXPECT_EQ(d.first_index, joined.calls.size());
    joined.content += d.content;
    joined.calls.insert(joined.calls.end(), d.calls.begin(), d.calls.end());
  };
  const size_t max_piece = std::uniform_int_distribution<size_t>(1, 16)(rng);
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = std::min(text.size() - pos, std::uniform_int_distribution<size_t>(0, max_piece)(rng));
    take(parser.feed(std::string_view(text).substr(pos, n)));
    pos += n;
  }
  take(parser.finish());
  EXPECT_EQ(parser.num_calls(), joined.calls.size());
  return joined;
}

TEST(ToolStream, AnySplitGivesTheWholeTextsParse) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED reproduces it)", seed));
  std::mt19937 rng(seed);
  const ToolRequest request = weather_request();
  std::vector<std::pair<ToolCallFormat, std::string>> texts;
  for (const ParseCase& c : parse_cases()) texts.emplace_back(c.format, c.text);
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlamaJson, ToolCallFormat::kMistral}) {
    for (int i = 0; i < 300; ++i) texts.emplace_back(format, random_output(format, rng));
  }
  size_t with_calls = 0;
  for (const auto& [format, text] : texts) {
    SCOPED_TRACE(fmt::format("{}: {}", tool_call_format_name(format), grammar_test::escape_for_trace(text)));
    std::mt19937_64 id_rng(seed);
    const ToolCallParse whole = parse_tool_calls(text, format, request.tools, id_rng);
    with_calls += whole.calls.empty() ? 0 : 1;
    for (int split = 0; split < 4; ++split) {
      const ToolCallParse streamed = stream_in_pieces(text, format, request.tools, seed, rng);
      ASSERT_EQ(streamed.content, whole.content);
      ASSERT_EQ(streamed.calls, whole.calls);
    }
  }
  EXPECT_GT(with_calls, texts.size() / 10);  // the generator does produce calls
}

// ---- Grammar -----------------------------------------------------------------------------------------------------

std::shared_ptr<const Grammar> grammar_for(const ToolRequest& request, ToolCallFormat format) {
  Result<Grammar> g = tool_call_grammar(request, format);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? grammar_test::share(std::move(*g)) : nullptr;
}

struct GrammarCase {
  ToolCallFormat format;
  std::vector<std::string> accepted;
  std::vector<std::string> refused;
};

TEST(ToolGrammar, RequiredAcceptsCallsInTheFormat) {
  const ToolRequest request = weather_request(R"("required")");
  const auto tagged = [](std::string_view json) { return "<tool_call>\n" + std::string(json) + "\n</tool_call>"; };
  const std::string weather = R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}})";
  const std::string llama_weather = R"({"name": "get_weather", "parameters": {"city": "Paris"}})";
  const std::string any = R"({"name": "get_time", "arguments": {"tz": ["UTC", 1, null], "x": {}}})";
  const std::vector<GrammarCase> cases = {
      {ToolCallFormat::kHermes,
       {tagged(weather), tagged(kTime),
        tagged(any),
        "<tool_call>\n" + weather + "\n</tool_call>\n<tool_call>\n" + kTime + "\n</tool_call>",
        "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>"},
       {"", weather, "<tool_call>\n" + weather, "<tool_call>\n" + weather + "\n</tool_call>\n",
        "Sure. <tool_call>\n" + weather + "\n</tool_call>",
        tagged(R"({"name": "get_weather", "arguments": {"unit": "c"}})"),
        tagged(R"({"name": "get_weather", "arguments": {"city": 5}})"),
        tagged(R"({"name": "get_weather", "arguments": {"city": "P", "unit": "k"}})"),
        tagged(R"({"name": "get_weather", "arguments": {"city": "P", "extra": 1}})"),
        tagged(R"({"name": "launch", "arguments": {}})"),
        tagged(R"({"name": "get_time", "parameters": {}})"),
        tagged(R"({"name": "get_time", "arguments": []})"),
        tagged(R"({"arguments": {}, "name": "get_time"})")}},
      {ToolCallFormat::kLlamaJson,
       {llama_weather, R"({"name": "get_time", "parameters": {}})",
        llama_weather + R"(; {"name": "get_time", "parameters": {"a": 1}})"},
       {"", weather, "<|python_tag|>" + llama_weather, llama_weather + ";",
        R"({"name": "get_weather", "parameters": {}})", R"({"name": "get_time", "parameters": 1})"}},
      {ToolCallFormat::kMistral,
       {"[" + weather + "]", "[" + weather + ", " + kTime + "]", "[ " + kTime + " ]", "[" + any + "]"},
       {"", "[]", weather, "[TOOL_CALLS] [" + weather + "]", "[" + weather + ",]", "[" + llama_weather + "]"}},
  };
  for (const GrammarCase& c : cases) {
    SCOPED_TRACE(tool_call_format_name(c.format));
    const std::shared_ptr<const Grammar> grammar = grammar_for(request, c.format);
    ASSERT_NE(grammar, nullptr);
    for (const std::string& text : c.accepted) {
      EXPECT_TRUE(grammar_test::accepts(grammar, text)) << text;
      // What the grammar accepts is calls and nothing else to the parser.
      std::mt19937_64 rng(3);
      const ToolCallParse parsed = parse_tool_calls(text, c.format, request.tools, rng);
      EXPECT_EQ(parsed.content, "") << text;
      EXPECT_FALSE(parsed.calls.empty()) << text;
    }
    for (const std::string& text : c.refused) EXPECT_FALSE(grammar_test::accepts(grammar, text)) << text;
  }
}

TEST(ToolGrammar, NamedAndSerialAllowExactlyOneCall) {
  const std::string time_call = "<tool_call>\n" + kTime + "\n</tool_call>";
  const std::string weather_call = "<tool_call>\n" + kParis + "\n</tool_call>";
  const ToolRequest named = weather_request(R"({"type": "function", "function": {"name": "get_time"}})");
  std::shared_ptr<const Grammar> g = grammar_for(named, ToolCallFormat::kHermes);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(grammar_test::accepts(g, time_call));
  EXPECT_FALSE(grammar_test::accepts(g, weather_call));
  EXPECT_FALSE(grammar_test::accepts(g, time_call + "\n" + time_call));
  g = grammar_for(named, ToolCallFormat::kMistral);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(grammar_test::accepts(g, "[" + kTime + "]"));
  EXPECT_FALSE(grammar_test::accepts(g, "[" + kTime + ", " + kTime + "]"));

  Result<ToolRequest> serial = parse_tool_request(parse(fmt::format(
      R"({{"tools": {}, "tool_choice": "required", "parallel_tool_calls": false}})", kWeatherTools)));
  ASSERT_TRUE(serial.ok());
  g = grammar_for(*serial, ToolCallFormat::kHermes);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(grammar_test::accepts(g, weather_call));
  EXPECT_FALSE(grammar_test::accepts(g, weather_call + "\n" + time_call));
}

TEST(ToolGrammar, EverySampledStringIsCallsOnly) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED reproduces it)", seed));
  std::mt19937 rng(seed);
  const ToolRequest request = weather_request(R"("required")");
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlamaJson, ToolCallFormat::kMistral}) {
    SCOPED_TRACE(tool_call_format_name(format));
    const std::shared_ptr<const Grammar> grammar = grammar_for(request, format);
    ASSERT_NE(grammar, nullptr);
    int sampled = 0;
    for (int i = 0; i < 40; ++i) {
      std::optional<std::string> text = grammar_test::sample_string(grammar, rng, 0, 600, 0.3);
      if (!text) continue;
      ++sampled;
      SCOPED_TRACE(grammar_test::escape_for_trace(*text));
      std::mt19937_64 id_rng(seed);
      const ToolCallParse parsed = parse_tool_calls(*text, format, request.tools, id_rng);
      EXPECT_EQ(parsed.content, "");
      ASSERT_FALSE(parsed.calls.empty());
      for (const ToolCall& call : parsed.calls) {
        const ojson arguments = ojson::parse(call.arguments);
        EXPECT_TRUE(arguments.is_object());
        if (call.name == "get_weather") {
          EXPECT_TRUE(arguments.contains("city")) << call.arguments;
        }
      }
    }
    EXPECT_GT(sampled, 5);
  }
}

TEST(ToolGrammar, ParametersCompileAgainstTheirOwnRoot) {
  // A $ref resolves inside the tool's own parameters, even with another tool's schema in the same grammar.
  const ojson body = parse(R"({"tools": [
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object",
     "properties": {"n": {"type": "integer"}}, "required": ["n"]}}},
    {"type": "function", "function": {"name": "move", "parameters": {
      "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                          "required": ["x", "y"]}},
      "properties": {"to": {"$ref": "#/$defs/point"}}, "required": ["to"]}}}],
    "tool_choice": "required"})");
  Result<ToolRequest> request = parse_tool_request(body);
  ASSERT_TRUE(request.ok()) << request.status().to_string();
  const std::shared_ptr<const Grammar> g = grammar_for(*request, ToolCallFormat::kHermes);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(grammar_test::accepts(
      g, "<tool_call>\n{\"name\": \"move\", \"arguments\": {\"to\": {\"x\": 1, \"y\": -2}}}\n</tool_call>"));
  EXPECT_TRUE(grammar_test::accepts(g, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"n\": 3}}\n</tool_call>"));
  EXPECT_FALSE(grammar_test::accepts(
      g, "<tool_call>\n{\"name\": \"move\", \"arguments\": {\"to\": {\"x\": 1}}}\n</tool_call>"));
  EXPECT_FALSE(grammar_test::accepts(g, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"to\": 1}}\n</tool_call>"));
}

TEST(ToolGrammar, Errors) {
  EXPECT_FALSE(tool_call_grammar(weather_request(R"("auto")"), ToolCallFormat::kHermes).ok());
  const ojson body = parse(R"({"tools": [{"type": "function", "function": {"name": "f",
    "parameters": {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}],
    "tool_choice": "required"})");
  Result<ToolRequest> request = parse_tool_request(body);
  ASSERT_TRUE(request.ok());
  Result<Grammar> g = tool_call_grammar(*request, ToolCallFormat::kHermes);
  ASSERT_FALSE(g.ok());
  const std::string expected = "tools[0].function.parameters cannot be enforced: json schema at '#/properties/x'";
  EXPECT_EQ(g.status().message().rfind(expected, 0), 0u)
      << g.status().message();
}

TEST(ToolGrammar, JsonSchemaRulesUnderAName) {
  // add_json_schema_rules: the same schema wrapped in literal text, twice in one builder.
  GrammarBuilder builder;
  const ojson schema = parse(R"({"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]})");
  ASSERT_TRUE(add_json_schema_rules(schema, builder, "first").ok());
  ASSERT_TRUE(add_json_schema_rules(schema, builder, "second").ok());
  EXPECT_FALSE(add_json_schema_rules(schema, builder, "first").ok());  // taken
  EXPECT_FALSE(add_json_schema_rules(schema, builder, "not a name").ok());
  ASSERT_TRUE(builder
                  .add_rule("root", GrammarExpr::sequence({GrammarExpr::literal("<a>"), GrammarExpr::rule("first"),
                                                           GrammarExpr::literal("|"), GrammarExpr::rule("second")}))
                  .ok());
  Result<Grammar> g = builder.build("root");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const auto grammar = grammar_test::share(std::move(*g));
  EXPECT_TRUE(grammar_test::accepts(grammar, R"(<a>{"k": true}|{"k":false})"));
  EXPECT_FALSE(grammar_test::accepts(grammar, R"(<a>{"k": true})"));
  EXPECT_FALSE(grammar_test::accepts(grammar, R"({"k": true}|{"k":false})"));
}

}  // namespace
}  // namespace tachyon::server
