// The structured-output fields of a request body: what grammar each asks for (checked on strings in
// and out of its language), that requests asking alike share one compiled grammar, and the 400 (its
// param) for each mistake. The outputs themselves are tests/engine/structured_output_test.cpp's and
// structured_output_test.py's.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "sampling/grammar_test_util.h"
#include "server/structured_output.h"

namespace tachyon::server {
namespace {

using grammar_test::accepts;
using ojson = nlohmann::ordered_json;

std::shared_ptr<const Grammar> grammar_of(const std::string& body, GrammarCache& cache) {
  GenerationParams p;
  const auto error = read_structured_output(ojson::parse(body), &cache, p);
  EXPECT_FALSE(error.has_value()) << body << ": " << (error ? error->message : "");
  return p.grammar;
}

std::optional<ApiError> error_of(const std::string& body, GrammarCache* cache) {
  GenerationParams p;
  return read_structured_output(ojson::parse(body), cache, p);
}

TEST(StructuredOutputFields, EachFieldAsksForItsLanguage) {
  GrammarCache cache;
  EXPECT_EQ(grammar_of(R"({"response_format": {"type": "text"}})", cache), nullptr);
  EXPECT_EQ(grammar_of(R"({"temperature": 0})", cache), nullptr);

  auto g = grammar_of(R"({"response_format": {"type": "json_object"}})", cache);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, R"({"a": 1})"));
  EXPECT_FALSE(accepts(g, "[1]"));

  const char* schema = R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})";
  g = grammar_of(fmt::format(R"({{"response_format": {{"type": "json_schema", "json_schema": {{"name": "x",
      "strict": true, "schema": {}}}}}}})", schema), cache);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, R"({"n": 3})"));
  EXPECT_FALSE(accepts(g, R"({"n": 3, "m": 4})"));  // strict
  g = grammar_of(fmt::format(R"({{"response_format": {{"type": "json_schema", "json_schema": {{"name": "x",
      "schema": {}}}}}}})", schema), cache);
  EXPECT_TRUE(accepts(g, R"({"n": 3, "m": 4})"));  // not strict: extra properties allowed
  g = grammar_of(fmt::format(R"({{"guided_json": {}}})", schema), cache);
  EXPECT_TRUE(accepts(g, R"({"n": 3, "m": 4})"));
  EXPECT_FALSE(accepts(g, R"({"m": 4})"));
  g = grammar_of(fmt::format(R"({{"guided_json": {}}})", ojson(schema).dump()), cache);  // the schema as text
  EXPECT_TRUE(accepts(g, R"({"n": 3})"));

  g = grammar_of(R"({"guided_regex": "[0-9]{3}"})", cache);
  EXPECT_TRUE(accepts(g, "123"));
  EXPECT_FALSE(accepts(g, "12"));
  g = grammar_of(R"({"guided_grammar": "root ::= \"a\" | \"bb\""})", cache);
  EXPECT_TRUE(accepts(g, "bb"));
  EXPECT_FALSE(accepts(g, "b"));
  g = grammar_of(R"({"guided_choice": ["red", "green"], "guided_decoding_backend": "xgrammar"})", cache);
  EXPECT_TRUE(accepts(g, "green"));
  EXPECT_FALSE(accepts(g, "blue"));
  g = grammar_of(R"({"structured_outputs": {"choice": ["up", "down"]}})", cache);
  EXPECT_TRUE(accepts(g, "down"));
  g = grammar_of(R"({"structured_outputs": {"regex": "x+"}})", cache);
  EXPECT_TRUE(accepts(g, "xxx"));
  g = grammar_of(R"({"structured_outputs": {"json": {"type": "boolean"}}})", cache);
  EXPECT_TRUE(accepts(g, "false"));
}

TEST(StructuredOutputFields, RequestsAskingAlikeShareOneGrammar) {
  GrammarCache cache;
  const std::string body = R"({"guided_json": {"type": "object", "properties": {"a": {"type": "string"}}}})";
  auto first = grammar_of(body, cache);
  EXPECT_EQ(grammar_of(body, cache), first);
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.hits(), 1);
  // Another order of the properties is another grammar (properties are written in schema order).
  EXPECT_NE(grammar_of(R"({"guided_json": {"properties": {"a": {"type": "string"}}, "type": "object"}})", cache),
            first);
}

TEST(StructuredOutputFields, MistakesAre400sNamingTheField) {
  GrammarCache cache;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"response_format": "json"})", "response_format"},
      {R"({"response_format": {"type": "yaml"}})", "response_format"},
      {R"({"response_format": {"type": "json_schema"}})", "response_format"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})", "response_format"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}})",
       "response_format"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}})",
       "response_format"},
      {R"({"response_format": {"type": "json_object", "extra": 1}})", "response_format"},
      {R"({"guided_json": 3})", "guided_json"},
      {R"({"guided_json": "{not json"})", "guided_json"},
      {R"({"guided_regex": "(a"})", "guided_regex"},
      {R"({"guided_regex": 5})", "guided_regex"},
      {R"({"guided_grammar": "root ::= undefined"})", "guided_grammar"},
      {R"({"guided_choice": []})", "guided_choice"},
      {R"({"guided_choice": ["a", 1]})", "guided_choice"},
      {R"({"guided_regex": "a", "guided_choice": ["a"]})", "guided_choice"},
      {R"({"response_format": {"type": "json_object"}, "guided_json": {}})", "guided_json"},
      {R"({"structured_outputs": {"regex": "a", "choice": ["a"]}})", "structured_outputs"},
      {R"({"structured_outputs": {"xml": "a"}})", "structured_outputs"},
      {R"({"guided_decoding_backend": 1})", "guided_decoding_backend"},
  };
  for (const auto& [body, param] : cases) {
    const auto error = error_of(body, &cache);
    ASSERT_TRUE(error.has_value()) << body;
    EXPECT_EQ(error->status, 400) << body;
    EXPECT_EQ(error->param, param) << body << ": " << error->message;
    EXPECT_NE(error->message.find("'" + param + "'"), std::string::npos) << body << ": " << error->message;
  }
  // A server without structured output refuses what asks for it, and nothing else.
  EXPECT_EQ(error_of(R"({"guided_regex": "a"})", nullptr)->param, "guided_regex");
  EXPECT_FALSE(error_of(R"({"response_format": {"type": "text"}})", nullptr).has_value());
}

}  // namespace
}  // namespace tachyon::server
