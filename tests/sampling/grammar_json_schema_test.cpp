// JSON Schema -> grammar: known schemas accept and refuse what they should; unsupported keywords are errors
// that name them; numeric ranges are exact (brute force over a window); and ~200 random schemas, sampled
// token by token under the mask with a JSON-ish vocabulary, always produce documents that a validator accepts
// (the C++ checker of json_schema_checker.h, and Python's jsonschema when the test venv has it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "grammar_test_util.h"
#include "json_schema_checker.h"
#include "sampling/json_schema.h"
#include "sampling/number_range_grammar.h"
#include "test_util.h"

namespace tachyon {
namespace {

using grammar_test::accepts;
using grammar_test::ojson;
using grammar_test::share;
using ::testing::HasSubstr;

std::shared_ptr<const Grammar> schema_grammar(std::string_view schema, JsonSchemaOptions options = {}) {
  Result<Grammar> g = json_schema_to_grammar(schema, options);
  EXPECT_TRUE(g.ok()) << g.status().to_string() << "\n" << schema;
  if (!g.ok()) return share(json_object_grammar().value());
  return share(std::move(g).value());
}

void expect_schema_error(std::string_view schema, std::vector<std::string> parts) {
  Result<Grammar> g = json_schema_to_grammar(schema);
  ASSERT_FALSE(g.ok()) << "compiled, but should not: " << schema;
  EXPECT_EQ(g.status().code(), ErrorCode::kInvalidArgument);
  for (const std::string& part : parts) EXPECT_THAT(g.status().message(), HasSubstr(part)) << schema;
}

TEST(GrammarJsonSchema, ObjectPropertiesInOrderWithOptionalOnes) {
  auto g = schema_grammar(R"js({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name"]})js");
  EXPECT_TRUE(accepts(g, R"js({"name": "Ann"})js"));
  EXPECT_TRUE(accepts(g, R"js({"name":"Ann","age":3,"tags":["a","b"]})js"));
  EXPECT_TRUE(accepts(g, "{\n  \"name\": \"Ann\",\n  \"tags\": []\n}"));
  EXPECT_FALSE(accepts(g, R"js({"age": 3})js"));                 // required missing
  EXPECT_FALSE(accepts(g, R"js({"age": 3, "name": "Ann"})js"));  // out of schema order
  EXPECT_FALSE(accepts(g, R"js({"name": "Ann", "age": 3.5})js"));
  EXPECT_FALSE(accepts(g, R"js({"name": "Ann", "extra": 1})js"));  // strict: no extra properties
  EXPECT_FALSE(accepts(g, R"js({"name": "Ann",})js"));
  EXPECT_FALSE(accepts(g, R"js({"name": "Ann"} )js"));
}

TEST(GrammarJsonSchema, AdditionalPropertiesWhenNotStrict) {
  JsonSchemaOptions options;
  options.strict = false;
  auto g = schema_grammar(R"js({"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "null"}}})js",
                          options);
  EXPECT_TRUE(accepts(g, R"js({"a": 1, "b": "x", "c": [true]})js"));
  EXPECT_TRUE(accepts(g, R"js({"abc": "x", "": 2})js"));
  EXPECT_TRUE(accepts(g, R"js({"a": 1, "ab": null, "a\n": 1})js"));
  EXPECT_FALSE(accepts(g, R"js({"a": 1, "a": "x"})js"));  // an extra key may not repeat a declared one
  EXPECT_FALSE(accepts(g, R"js({"b": 1, "ab": "x"})js"));
  EXPECT_FALSE(accepts(g, R"js({"\u0061": "x"})js"));  // ... not even spelled with an escape
  EXPECT_TRUE(accepts(g, R"js({"b\u0061": "x"})js"));  // \u escapes once off the declared keys' paths
  // An explicit schema for extra values, in strict mode too.
  auto typed = schema_grammar(R"js({"type": "object", "properties": {"a": {"type": "string"}},
                                  "additionalProperties": {"type": "integer"}, "required": ["a", "n"]})js");
  EXPECT_TRUE(accepts(typed, R"js({"a": "x", "n": 1, "m": 2})js"));
  EXPECT_FALSE(accepts(typed, R"js({"a": "x", "n": 1, "m": "y"})js"));
  EXPECT_FALSE(accepts(typed, R"js({"a": "x"})js"));
}

TEST(GrammarJsonSchema, ScalarsEnumsConstsAndCombinators) {
  auto g = schema_grammar(R"js({"type": "array", "prefixItems": [
      {"enum": ["red", "gr\"een", 3, null, {"k": [1]}]},
      {"const": "x"},
      {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
      {"type": ["number", "string"]},
      {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "maxLength": 1}]}], "items": false})js");
  EXPECT_TRUE(accepts(g, R"js(["red", "x", true, -1.5e3, 7])js"));
  EXPECT_TRUE(accepts(g, R"js(["gr\"een", "x", null, "s", "z"])js"));
  EXPECT_TRUE(accepts(g, R"js([{"k":[1]}, "x", false, 0, ""])js"));
  EXPECT_FALSE(accepts(g, R"js(["blue", "x", true, 1, 7])js"));
  EXPECT_FALSE(accepts(g, R"js(["red", "y", true, 1, 7])js"));
  EXPECT_FALSE(accepts(g, R"js(["red", "x", true, 1, -7])js"));
  EXPECT_FALSE(accepts(g, R"js(["red", "x", true, 1, "zz"])js"));
  EXPECT_FALSE(accepts(g, R"js(["red", "x", true, 1, 7, 8])js"));
  // enum filtered by type.
  auto typed = schema_grammar(R"js({"type": "string", "enum": ["a", 1]})js");
  EXPECT_TRUE(accepts(typed, R"js("a")js"));
  EXPECT_FALSE(accepts(typed, "1"));
}

TEST(GrammarJsonSchema, RefsDefsAndRecursion) {
  auto g = schema_grammar(R"js({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
      "$ref": "#/$defs/node"})js");
  EXPECT_TRUE(accepts(g, R"js({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})js"));
  EXPECT_FALSE(accepts(g, R"js({"v": 1, "kids": [{"w": 2}]})js"));
  auto definitions = schema_grammar(R"js({"definitions": {"a b": {"type": "boolean"}}, "type": "object",
      "properties": {"x": {"$ref": "#/definitions/a b"}, "y": {"allOf": [{"$ref": "#/definitions/a b"}]}}})js");
  EXPECT_TRUE(accepts(definitions, R"js({"x": true, "y": false})js"));
}

TEST(GrammarJsonSchema, StringsLengthsPatternsFormats) {
  auto lengths = schema_grammar(R"js({"type": "string", "minLength": 2, "maxLength": 3})js");
  EXPECT_TRUE(accepts(lengths, R"js("ab")js"));
  EXPECT_TRUE(accepts(lengths, R"js("é\n😀")js"));
  EXPECT_FALSE(accepts(lengths, R"js("a")js"));
  EXPECT_FALSE(accepts(lengths, R"js("abcd")js"));
  EXPECT_FALSE(accepts(lengths, R"js("\ud83d\ude00")js"));  // no surrogate escapes: a pair would count as two
  auto pattern = schema_grammar(R"js({"type": "string", "pattern": "^[a-z]+\"\\d$"})js");
  EXPECT_TRUE(accepts(pattern, R"js("ab\"1")js"));
  EXPECT_FALSE(accepts(pattern, R"js("ab"1")js"));
  EXPECT_FALSE(accepts(pattern, R"js("ab\"x")js"));
  auto search = schema_grammar(R"js({"type": "string", "pattern": "b+c"})js");
  EXPECT_TRUE(accepts(search, R"js("xx\nbbc\t")js"));
  EXPECT_FALSE(accepts(search, R"js("xxbx")js"));
  const std::vector<std::tuple<std::string, std::string, std::string>> formats = {
      {"date", "2024-02-29", "2024-02-30"},
      {"time", "23:59:59Z", "24:00:00Z"},
      {"date-time", "2024-01-31T10:20:30.5+01:00", "2024-01-31 10:20:30Z"},
      {"uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456-42661417400"},
      {"email", "a.b+c@example.co.uk", "a@b"},
      {"ipv4", "192.168.0.255", "192.168.0.256"},
  };
  for (const auto& [format, good, bad] : formats) {
    auto g = schema_grammar(fmt::format(R"js({{"type": "string", "format": "{}"}})js", format));
    EXPECT_TRUE(accepts(g, "\"" + good + "\"")) << format;
    EXPECT_FALSE(accepts(g, "\"" + bad + "\"")) << format;
  }
}

TEST(GrammarJsonSchema, NumbersAndBounds) {
  auto any_number = schema_grammar(R"js({"type": "number"})js");
  for (const char* ok : {"0", "-0", "1.5", "-12e3", "1E+2", "0.001"}) EXPECT_TRUE(accepts(any_number, ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "NaN", "12345678901234567"}) {
    EXPECT_FALSE(accepts(any_number, bad)) << bad;
  }
  auto draft4 = schema_grammar(R"js({"type": "integer", "minimum": 0, "exclusiveMinimum": true, "maximum": 10})js");
  EXPECT_FALSE(accepts(draft4, "0"));
  EXPECT_TRUE(accepts(draft4, "1"));
  EXPECT_TRUE(accepts(draft4, "10"));
  EXPECT_FALSE(accepts(draft4, "11"));
  auto unit = schema_grammar(R"js({"type": "number", "minimum": 0, "maximum": 1})js");
  for (const char* ok : {"0", "0.25", "1", "1.000", "0.0"}) EXPECT_TRUE(accepts(unit, ok)) << ok;
  for (const char* bad : {"-0.5", "1.01", "2", "1e-1", "-1"}) EXPECT_FALSE(accepts(unit, bad)) << bad;
  auto exclusive = schema_grammar(R"js({"type": "number", "exclusiveMinimum": -2, "exclusiveMaximum": 0})js");
  for (const char* ok : {"-1.999", "-1", "-0.5", "-0.001"}) EXPECT_TRUE(accepts(exclusive, ok)) << ok;
  for (const char* bad : {"-2", "-2.0", "0", "-0", "-0.000", "0.5", "-2.5"})
    EXPECT_FALSE(accepts(exclusive, bad)) << bad;
}

TEST(GrammarJsonSchema, IntegerRangesAreExactByBruteForce) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> value(-1200, 1200);
  for (int trial = 0; trial < 40; ++trial) {
    std::optional<int64_t> lo, hi;
    if (trial % 4 != 1) lo = value(rng);
    if (trial % 4 != 2) hi = value(rng);
    if (lo && hi && *lo > *hi) std::swap(lo, hi);
    SCOPED_TRACE(::testing::Message() << "[" << (lo ? std::to_string(*lo) : "-inf") << ", "
                                      << (hi ? std::to_string(*hi) : "inf") << "]");
    GrammarBuilder b;
    ASSERT_TRUE(b.add_rule("root", integer_range_expr(lo, hi).value()).ok());
    auto g = share(b.build().value());
    for (int n = -1500; n <= 1500; n += 1 + trial % 3) {
      const bool expected = (!lo || n >= *lo) && (!hi || n <= *hi);
      ASSERT_EQ(accepts(g, std::to_string(n)), expected) << n;
    }
    EXPECT_FALSE(accepts(g, "-0"));
    EXPECT_FALSE(accepts(g, "007"));
  }
  EXPECT_TRUE(integer_range_expr(INT64_MIN, INT64_MAX).ok());
  EXPECT_FALSE(integer_range_expr(5, 4).ok());
}

TEST(GrammarJsonSchema, DecimalRangesAreExactOnSampledNumbers) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> bound(-30, 30);
  for (int trial = 0; trial < 30; ++trial) {
    std::optional<NumberBound> lo, hi;
    if (trial % 3 != 1) lo = NumberBound{bound(rng), std::bernoulli_distribution(0.5)(rng)};
    if (trial % 3 != 2) hi = NumberBound{bound(rng), std::bernoulli_distribution(0.5)(rng)};
    if (lo && hi && lo->value > hi->value) std::swap(lo->value, hi->value);
    if (lo && hi && lo->value == hi->value) hi->value += 1;
    SCOPED_TRACE(::testing::Message() << (lo ? (lo->exclusive ? "(" : "[") + std::to_string(lo->value) : "(-inf")
                                      << ", "
                                      << (hi ? std::to_string(hi->value) + (hi->exclusive ? ")" : "]") : "inf)"));
    GrammarBuilder b;
    ASSERT_TRUE(b.add_rule("root", decimal_range_expr(lo, hi).value()).ok());
    auto g = share(b.build().value());
    for (int i = 0; i < 300; ++i) {
      // Decimals with 0-3 fraction digits around the bounds, some with trailing zeros.
      const int scaled = std::uniform_int_distribution<int>(-40000, 40000)(rng);
      const int places = std::uniform_int_distribution<int>(0, 3)(rng);
      std::string text = fmt::format("{:.{}f}", scaled / 1000.0, places);
      if (std::bernoulli_distribution(0.1)(rng)) text = std::to_string(scaled / 1000);
      const double x = std::stod(text);
      const bool expected = (!lo || (lo->exclusive ? x > lo->value : x >= lo->value)) &&
                            (!hi || (hi->exclusive ? x < hi->value : x <= hi->value)) &&
                            !(text[0] == '-' && x == 0);  // "-0", "-0.00": never produced
      EXPECT_EQ(accepts(g, text), expected) << text;
    }
  }
}

TEST(GrammarJsonSchema, UnsupportedKeywordsAreNamedAndAnnotationsIgnored) {
  expect_schema_error(R"js({"type": "string", "not": {"const": "a"}})js", {"'not'", "not supported", "'#'"});
  expect_schema_error(R"js({"type": "integer", "multipleOf": 3})js", {"'multipleOf'"});
  expect_schema_error(R"js({"type": "object", "properties": {"a": {"type": "object", "patternProperties": {}}}})js",
                      {"'patternProperties'", "#/properties/a"});
  expect_schema_error(R"js({"type": "array", "uniqueItems": true})js", {"'uniqueItems'"});
  expect_schema_error(R"js({"type": "object", "minProperties": 1})js", {"'minProperties'"});
  expect_schema_error(R"js({"if": {}, "then": {}})js", {"'if'"});
  expect_schema_error(R"js({"$ref": "#/$defs/missing"})js", {"does not resolve"});
  expect_schema_error(R"js({"$ref": "http://example.com/s.json"})js", {"only references inside the schema"});
  expect_schema_error(R"js({"type": "strin"})js", {"unknown type 'strin'"});
  expect_schema_error(R"js({"type": "string", "format": "uri"})js", {"format 'uri' is not supported"});
  expect_schema_error(R"js({"type": "number", "maximum": 0.5})js", {"fractional upper bound"});
  expect_schema_error(R"js({"type": "string", "pattern": "a", "maxLength": 3})js",
                      {"together with minLength/maxLength"});
  expect_schema_error(R"js({"type": "string", "pattern": "(?=a)"})js", {"lookahead", "#"});
  expect_schema_error(R"js({"type": "string", "minLength": 3, "maxLength": 2})js",
                      {"minLength 3 is above maxLength 2"});
  expect_schema_error(R"js({"type": "object", "anyOf": [{}, {}]})js", {"'type' together with 'anyOf'"});
  expect_schema_error(R"js({"allOf": [{}, {}]})js", {"'allOf'"});
  expect_schema_error(R"js({"type": "integer", "minimum": 5, "maximum": 4})js", {"empty"});
  expect_schema_error(R"js({"type": "object", "required": ["x"], "additionalProperties": false})js",
                      {"required property 'x'"});
  expect_schema_error(R"js(false)js", {"accepts no value"});
  expect_schema_error(R"js({"type": "array", "items": [{}]})js", {"prefixItems"});
  expect_schema_error(R"js({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})js", {"left-recursive"});
  expect_schema_error(R"js({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]})js",
                      {"can never finish"});
  expect_schema_error(R"js({"type": "string",)js", {"not valid JSON"});
  expect_schema_error(R"js({"type": "string", "maxLength": 1000000})js", {"maxLength"});
  // Annotations and unknown keywords change nothing.
  auto g = schema_grammar(R"js({"title": "T", "description": "d", "examples": [1], "default": 2, "$schema": "x",
      "$id": "y", "$comment": "c", "deprecated": true, "x-custom": 5, "type": "integer"})js");
  EXPECT_TRUE(accepts(g, "12"));
  EXPECT_FALSE(accepts(g, "\"a\""));
}

TEST(GrammarJsonSchema, JsonObjectAndBoundedWhitespace) {
  auto g = share(json_object_grammar().value());
  EXPECT_TRUE(accepts(g, R"js({"a": [1, 2.5e3, "x", null, true, {"b": {}}], "c": "\u00e9\n"})js"));
  EXPECT_TRUE(accepts(g, "{ }"));
  EXPECT_FALSE(accepts(g, "[1]"));
  EXPECT_FALSE(accepts(g, "\"x\""));
  EXPECT_FALSE(accepts(g, "{\"a\":1} "));
  EXPECT_TRUE(accepts(g, "{" + std::string(20, ' ') + "}"));
  EXPECT_FALSE(accepts(g, "{" + std::string(21, ' ') + "}"));
  JsonSchemaOptions compact;
  compact.max_whitespace = 0;
  auto c = share(json_object_grammar(compact).value());
  EXPECT_TRUE(accepts(c, R"js({"a":[1,2]})js"));
  EXPECT_FALSE(accepts(c, R"js({"a": [1,2]})js"));
  // nlohmann::json input (sorted keys) works too.
  EXPECT_TRUE(
      json_schema_to_grammar(nlohmann::json::parse(R"js({"type": "object", "properties": {"b": {}, "a": {}}})js"))
          .ok());
}

// ---- Random schemas, sampled under the mask -----------------------------------------------------------

class SchemaGenerator {
 public:
  explicit SchemaGenerator(std::mt19937& rng) : rng_(rng) {}

  ojson generate() {
    defs_ = ojson::object();
    ojson root = chance(0.8) ? object_schema(0) : value_schema(0);
    if (!defs_.empty()) root["$defs"] = defs_;
    return root;
  }

 private:
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  template <typename T>
  const T& one_of(const std::vector<T>& v) {
    return v[static_cast<size_t>(pick(static_cast<int>(v.size())))];
  }

  ojson value_schema(int depth) {
    const int kinds = depth >= 3 ? 6 : 12;
    switch (pick(kinds)) {
      case 0: return string_schema();
      case 1: return integer_schema();
      case 2: return number_schema();
      case 3: return ojson{{"type", one_of<std::string>({"boolean", "null"})}};
      case 4: return enum_schema();
      case 5:
        return ojson{{"type", one_of<std::vector<std::string>>(
                                  {{"string", "null"}, {"integer", "boolean"}, {"number", "string"}})}};
      case 6:
      case 7: return object_schema(depth + 1);
      case 8: return array_schema(depth + 1);
      case 9: {
        // anyOf / oneOf with branches of different types (oneOf's exclusivity then holds).
        ojson a = chance(0.5) ? string_schema() : ojson{{"type", "null"}};
        ojson b = chance(0.5) ? integer_schema() : object_schema(depth + 1);
        return ojson{{chance(0.5) ? "anyOf" : "oneOf", ojson::array({a, b})}};
      }
      case 10: {
        const std::string name = "def" + std::to_string(defs_.size());
        defs_[name] = nullptr;  // reserves the name: the subschema may add definitions of its own
        defs_[name] = value_schema(depth + 1);
        return ojson{{"$ref", "#/$defs/" + name}};
      }
      default: {
        if (!defs_.contains("node")) {
          defs_["node"] = ojson::parse(R"js({"type": "object", "properties": {"v": {"type": "integer"},
              "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]})js");
        }
        return ojson{{"$ref", "#/$defs/node"}};
      }
    }
  }

  ojson string_schema() {
    ojson s{{"type", "string"}};
    switch (pick(5)) {
      case 0: {
        const int min = pick(3);
        s["minLength"] = min;
        if (chance(0.7)) s["maxLength"] = min + pick(6);
        break;
      }
      case 1: s["format"] = one_of<std::string>({"date", "time", "date-time", "uuid", "email", "ipv4"}); break;
      case 2:
        s["pattern"] = one_of<std::string>({"^[a-z]{2,5}$", R"js(^\d{3}-\d{2}$)js", "ab", "^(foo|bar)+$",
                                            R"js(^[^"]*x$)js", R"js(^\w+@\w+\.com$)js", "^é+$", R"js(^a\\b\n?$)js"});
        break;
      default: break;
    }
    return s;
  }

  ojson integer_schema() {
    ojson s{{"type", "integer"}};
    const int a = pick(2001) - 1000;
    const int b = a + pick(300);
    switch (pick(5)) {
      case 0: s["minimum"] = a; break;
      case 1: s["maximum"] = b; break;
      case 2: s["minimum"] = a, s["maximum"] = b; break;
      case 3: s["exclusiveMinimum"] = a, s["exclusiveMaximum"] = b + 2; break;
      default: break;
    }
    return s;
  }

  ojson number_schema() {
    ojson s{{"type", "number"}};
    const int a = pick(21) - 10;
    switch (pick(4)) {
      case 0: s["minimum"] = a; break;
      case 1: s["minimum"] = a, s["exclusiveMaximum"] = a + 1 + pick(3); break;
      case 2: s["exclusiveMinimum"] = a, s["maximum"] = a + 1 + pick(3); break;
      default: break;
    }
    return s;
  }

  ojson enum_schema() {
    static const std::vector<ojson> pool = {"red",
                                            "gr\"een",
                                            "é",
                                            "",
                                            "line\nbreak",
                                            1,
                                            -2.5,
                                            nullptr,
                                            true,
                                            ojson::parse(R"js({"k": [1, "x"]})js"),
                                            ojson::parse("[]")};
    if (chance(0.3)) return ojson{{"const", one_of(pool)}};
    ojson values = ojson::array();
    for (int n = 1 + pick(4); n > 0; --n) {
      const ojson& v = one_of(pool);
      if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
    }
    return ojson{{"enum", values}};
  }

  ojson object_schema(int depth) {
    static const std::vector<std::string> names = {"name", "id",   "tags",  "a\"q", "naïve", "x y",
                                                   "",     "n\\b", "value", "k1",   "k10",   "é"};
    ojson s{{"type", "object"}};
    ojson properties = ojson::object();
    ojson required = ojson::array();
    for (int n = pick(5); n > 0; --n) {
      const std::string& name = one_of(names);
      if (properties.contains(name)) continue;
      properties[name] = depth >= 3 ? string_schema() : value_schema(depth);
      if (chance(0.5)) required.push_back(name);
    }
    if (!properties.empty() || chance(0.5)) s["properties"] = properties;
    if (!required.empty()) s["required"] = required;
    switch (pick(4)) {
      case 0: s["additionalProperties"] = false; break;
      case 1: s["additionalProperties"] = true; break;
      case 2: s["additionalProperties"] = ojson{{"type", "integer"}}; break;
      default: break;  // absent: strict -> none, non-strict -> any
    }
    return s;
  }

  ojson array_schema(int depth) {
    ojson s{{"type", "array"}};
    if (chance(0.25)) {
      s["prefixItems"] = ojson::array({string_schema(), integer_schema()});
      if (chance(0.5)) s["items"] = false;
    } else if (chance(0.8)) {
      s["items"] = value_schema(depth);
    }
    const int min = pick(3);
    if (chance(0.5)) s["minItems"] = min;
    if (chance(0.5)) s["maxItems"] = min + 2 + pick(3);
    return s;
  }

  std::mt19937& rng_;
  ojson defs_;
};

// JSON-ish pieces, every single byte (so that anything can be spelled), EOS and a special token.
struct SamplingVocabulary {
  std::shared_ptr<const TokenTrie> trie;
  int32_t eos = 0;
  std::vector<bool> closer;  // tokens made only of '"', ']' and '}'
};

const SamplingVocabulary& sampling_vocabulary() {
  static const SamplingVocabulary v = [] {
    std::vector<std::string> tokens;
    for (int b = 1; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    for (const char* piece :
         {"{\"",   "\":",  "\",", "\"}",  "\": \"", ", \"",  "true",     "false",   "null", "name", "id",
          "value", "tags", " ",   "  ",   "\n",     "\n  ",  "[]",       "{}",      "12",   "-1",   ".5",
          "e+",    "é",    "\\n", "\\\"", "\\u00",  "2024-", "-01",      "foo",     "bar",  "@",    ".com",
          "\"]",   "\"}}", "]}",  "00:",  "abc",    "😀",     "\xF0\x9F", "\x98\x80"}) {
      tokens.push_back(piece);
    }
    SamplingVocabulary out;
    out.eos = static_cast<int32_t>(tokens.size());
    tokens.push_back("</s>");
    tokens.push_back("<|special|>");
    const int32_t eos[] = {out.eos};
    const int32_t special[] = {out.eos + 1};
    for (const std::string& t : tokens) out.closer.push_back(t.find_first_not_of("\"]}") == std::string::npos);
    out.trie = TokenTrie::build(std::move(tokens), eos, special).value();
    return out;
  }();
  return v;
}

struct SampledCase {
  ojson schema;
  bool strict = true;
  std::string output;
};

// Samples one document: uniform among allowed tokens, leaning to closers after a while, ending when allowed.
std::optional<std::string> sample_document(const std::shared_ptr<const Grammar>& grammar, std::mt19937& rng) {
  const SamplingVocabulary& v = sampling_vocabulary();
  GrammarMatcher m = grammar_test::make_matcher(grammar, v.trie);
  std::vector<uint32_t> mask(grammar_mask_words(v.trie->vocab_size()));
  std::string out;
  for (int step = 0; step < 600; ++step) {
    const Status s = m.fill_mask(mask);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) return std::nullopt;
    std::vector<int32_t> ids = grammar_test::allowed_ids(mask, v.trie->vocab_size());
    const bool eos_allowed = grammar_mask_test(mask, v.eos);
    EXPECT_EQ(eos_allowed, m.can_end());
    if (eos_allowed && (ids.size() == 1 || (step >= 12 && std::bernoulli_distribution(0.3)(rng)))) return out;
    std::erase(ids, v.eos);
    if (step > 40 && std::bernoulli_distribution(0.6)(rng)) {
      std::vector<int32_t> closers;
      for (int32_t id : ids) {
        if (v.closer[id]) closers.push_back(id);
      }
      if (!closers.empty()) ids = closers;
    }
    const int32_t id = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
    const Status accepted = m.accept(id);
    EXPECT_TRUE(accepted.ok()) << accepted.to_string();
    out += v.trie->token_bytes(id);
  }
  return std::nullopt;
}

std::vector<SampledCase> sample_random_schemas(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  SchemaGenerator generator(rng);
  std::vector<SampledCase> cases;
  int unfinished = 0;
  for (int i = 0; i < count; ++i) {
    SampledCase c;
    c.schema = generator.generate();
    c.strict = std::bernoulli_distribution(0.7)(rng);
    SCOPED_TRACE(::testing::Message() << "schema " << i << " (strict " << c.strict << "): " << c.schema.dump());
    JsonSchemaOptions options;
    options.strict = c.strict;
    options.max_whitespace = std::uniform_int_distribution<int>(0, 3)(rng);
    Result<Grammar> grammar = json_schema_to_grammar(c.schema, options);
    EXPECT_TRUE(grammar.ok()) << grammar.status().to_string();
    if (!grammar.ok()) continue;
    std::optional<std::string> output = sample_document(share(std::move(grammar).value()), rng);
    if (!output) {
      ++unfinished;
      continue;
    }
    c.output = *output;
    cases.push_back(std::move(c));
  }
  EXPECT_LE(unfinished, count / 10) << "too many samples did not finish within the step cap";
  return cases;
}

TEST(GrammarJsonSchema, RandomSchemasSampleValidDocuments) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<SampledCase> cases = sample_random_schemas(seed, 200);
  for (const SampledCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "schema " << c.schema.dump() << "\noutput " << c.output);
    std::string error;
    const ojson document = grammar_test::parse_json(c.output, error);
    ASSERT_EQ(error, "");
    EXPECT_EQ(grammar_test::SchemaChecker(c.schema).check(document, c.schema), "");
  }
}

// The same kind of cases judged by Python's jsonschema (Draft 2020-12), when the test venv has it: the C++
// checker above is ours, this one is not.
TEST(GrammarJsonSchema, RandomSchemasValidateWithPythonJsonschema) {
  std::string python = testing::source_dir() + "/.venv/bin/python";
  if (const char* env = std::getenv("TACHYON_TEST_PYTHON")) python = env;
  if (!std::filesystem::exists(python)) GTEST_SKIP() << python << " is absent (scripts/setup makes .venv); skipping";
  if (testing::run_command(python + " -c 'import jsonschema'").exit_code != 0) {
    GTEST_SKIP() << "the jsonschema package is not in " << python << " (scripts/setup installs it); skipping";
  }
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<SampledCase> cases = sample_random_schemas(seed, 200);
  const std::string path = testing::scratch_dir("grammar_json_schema") + "/cases.jsonl";
  {
    std::ofstream out(path);
    for (const SampledCase& c : cases) out << ojson{{"schema", c.schema}, {"output", c.output}}.dump() << "\n";
  }
  const std::string script = testing::source_dir() + "/tests/sampling/grammar_json_schema_check.py";
  const testing::CommandResult r = testing::run_command(python + " " + script + " " + path);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr(fmt::format("{} valid", cases.size())));
}

// Every JSON pointer into `value` (its own "" included).
void collect_pointers(const ojson& value, const std::string& at, std::vector<std::string>& out) {
  out.push_back(at);
  if (value.is_object()) {
    for (const auto& [key, child] : value.items()) {
      std::string escaped;  // JSON pointer escaping: ~ -> ~0, / -> ~1
      for (char c : key) escaped += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
      collect_pointers(child, at + "/" + escaped, out);
    }
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) collect_pointers(value[i], at + "/" + std::to_string(i), out);
  }
}

// Schemas with random values in random places: a grammar or a Status, never a crash or an exception.
TEST(GrammarJsonSchema, MutatedSchemasNeverCrash) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  SchemaGenerator generator(rng);
  // Junk, and values that are right for some keywords and wrong for others.
  const std::vector<ojson> junk = {nullptr,
                                   -1,
                                   0,
                                   2.5,
                                   1e300,
                                   "x",
                                   "#/nope",
                                   ojson::array(),
                                   ojson::object(),
                                   ojson::array({1, "a"}),
                                   true,
                                   false,
                                   ojson{{"type", 3}},
                                   "string",
                                   "integer",
                                   3,
                                   "^a+$",
                                   "(",
                                   "date",
                                   ojson::array({"null", "string"})};
  int compiled = 0;
  for (int i = 0; i < 300; ++i) {
    ojson schema = generator.generate();
    for (int k = std::uniform_int_distribution<int>(1, 2)(rng); k > 0; --k) {
      std::vector<std::string> pointers;
      collect_pointers(schema, "", pointers);
      const std::string& at = pointers[std::uniform_int_distribution<size_t>(1, pointers.size() - 1)(rng)];
      schema[ojson::json_pointer(at)] = junk[std::uniform_int_distribution<size_t>(0, junk.size() - 1)(rng)];
    }
    SCOPED_TRACE(schema.dump());
    Result<Grammar> g = json_schema_to_grammar(schema);
    if (g.ok()) {
      ++compiled;
      EXPECT_TRUE(GrammarMatcher::create(share(std::move(g).value()), grammar_test::byte_vocabulary()).ok());
    } else {
      EXPECT_FALSE(g.status().message().empty());
    }
  }
  EXPECT_GT(compiled, 10);  // most mutations are refused (about 9 in 10); enough are not
}

}  // namespace
}  // namespace tachyon
