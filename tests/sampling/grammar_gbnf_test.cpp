// GBNF parser: valid grammars parse and match what they should; each kind of malformed grammar is an error
// that says where; to_gbnf() round-trips to the same language.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "grammar_test_util.h"
#include "sampling/gbnf_parser.h"
#include "test_util.h"

namespace tachyon {
namespace {

using grammar_test::accepts;
using grammar_test::share;
using ::testing::HasSubstr;

std::shared_ptr<const Grammar> parse_or_fail(std::string_view text) {
  Result<Grammar> g = parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().to_string() << "\n" << text;
  if (!g.ok()) return share(*parse_gbnf("root ::= \"\""));
  return share(std::move(g).value());
}

void expect_error(std::string_view text, std::vector<std::string> parts) {
  Result<Grammar> g = parse_gbnf(text);
  ASSERT_FALSE(g.ok()) << "parsed, but should not:\n" << text;
  EXPECT_EQ(g.status().code(), ErrorCode::kInvalidArgument);
  for (const std::string& part : parts) EXPECT_THAT(g.status().message(), HasSubstr(part)) << text;
}

constexpr std::string_view kJsonGbnf = R"(
# JSON, as llama.cpp's grammars/json.gbnf writes it (bounded whitespace here)
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt/] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(GrammarGbnf, JsonGrammarParsesAndMatches) {
  auto g = parse_or_fail(kJsonGbnf);
  EXPECT_TRUE(accepts(g, R"({"a": [1, 2.5, "x\n\u00e9", true, null], "b": {}})"));
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_TRUE(accepts(g, "{\n  \"k\": \"é\"}"));
  EXPECT_FALSE(accepts(g, "[1]"));
  EXPECT_FALSE(accepts(g, R"({"a": 01})"));
  EXPECT_FALSE(accepts(g, R"({"a" 1})"));
  EXPECT_FALSE(accepts(g, "{\"a\": \"\x01\"}"));
  EXPECT_FALSE(accepts(g, "{"));
}

TEST(GrammarGbnf, Repetitions) {
  auto g = parse_or_fail(R"(root ::= "a"{2} "b"{1,3} "c"{2,} "d"* "e"+ "f"?)");
  EXPECT_TRUE(accepts(g, "aabcce"));
  EXPECT_TRUE(accepts(g, "aabbbcccccdddeef"));
  EXPECT_FALSE(accepts(g, "abcce"));
  EXPECT_FALSE(accepts(g, "aabbbbcce"));
  EXPECT_FALSE(accepts(g, "aabce"));
  EXPECT_FALSE(accepts(g, "aabcc"));
  EXPECT_FALSE(accepts(g, "aabcceff"));
  auto spaces = parse_or_fail("root ::= \"x\" { 1 , 2 }");
  EXPECT_TRUE(accepts(spaces, "xx"));
  EXPECT_FALSE(accepts(spaces, "xxx"));
}

TEST(GrammarGbnf, EscapesClassesAndUnicode) {
  auto g = parse_or_fail(R"(root ::= "\x41\u00e9\U0001F600\t\"\\" [^a-z\]] [α-ω]+ . "\[")");
  EXPECT_TRUE(accepts(g, "Aé😀\t\"\\Xαβ?["));
  EXPECT_TRUE(accepts(g, "Aé😀\t\"\\Zω😀["));
  EXPECT_FALSE(accepts(g, "Aé😀\t\"\\]ω😀["));
  EXPECT_FALSE(accepts(g, "Aé😀\t\"\\aα?["));
  EXPECT_FALSE(accepts(g, "Aé😀\t\"\\XA?["));
  auto dash = parse_or_fail(R"(root ::= [-a] [a-] [\-] [\^^])");
  EXPECT_TRUE(accepts(dash, "-a-^"));
  EXPECT_TRUE(accepts(dash, "a--^"));
  EXPECT_FALSE(accepts(dash, "b---"));
  // Raw UTF-8 in literals and classes.
  auto raw = parse_or_fail("root ::= \"日本\" [語語]");
  EXPECT_TRUE(accepts(raw, "日本語"));
}

TEST(GrammarGbnf, RulesSpanLinesAndCommentsAreSkipped) {
  auto g = parse_or_fail(R"(
root ::= greeting # a comment after a rule
  | "bye"   # continuation lines start with |
greeting ::= "hi"
   name?
name ::= " " [A-Z] [a-z]*
)");
  EXPECT_TRUE(accepts(g, "hi"));
  EXPECT_TRUE(accepts(g, "hi Bob"));
  EXPECT_TRUE(accepts(g, "bye"));
  EXPECT_FALSE(accepts(g, "hi bob"));
}

TEST(GrammarGbnf, EmptyAlternativesAndRightRecursion) {
  auto g = parse_or_fail("root ::= \"(\" list \")\"\nlist ::= | item list\nitem ::= [0-9]");
  EXPECT_TRUE(accepts(g, "()"));
  EXPECT_TRUE(accepts(g, "(123)"));
  EXPECT_FALSE(accepts(g, "(12a)"));
}

TEST(GrammarGbnf, MalformedGrammarsNameThePosition) {
  expect_error("", {"no 'root' rule"});
  expect_error("start ::= \"a\"", {"no 'root' rule"});
  expect_error("root ::= foo", {"undefined rule 'foo'", "1:10"});
  expect_error("root ::= \"a\"\n  | bar", {"undefined rule 'bar'", "2:5"});
  expect_error("root ::= \"abc", {"1:10", "unterminated string"});
  expect_error("root ::= \"ab\nc\"", {"1:10", "unterminated string"});
  expect_error("root ::= [a-", {"1:10", "unterminated character class"});
  expect_error("root ::= \"\\q\"", {"1:11", "unknown escape"});
  expect_error("root ::= \"\\x4\"", {"1:11", "hex digits"});
  expect_error("root ::= \"\\uD800\"", {"1:11", "surrogate"});
  expect_error("root ::= \"\\U00110000\"", {"1:11", "beyond U+10FFFF"});
  expect_error("root = \"a\"", {"1:6", "expected '::='"});
  expect_error("root ::= * \"a\"", {"1:10", "nothing before it to repeat"});
  expect_error("root ::= \"a\"{3,2}", {"1:13", "below the minimum"});
  expect_error("root ::= \"a\"{x}", {"1:14", "expected a number"});
  expect_error("root ::= \"a\"{2", {"1:15", "expected '}'"});
  expect_error("root ::= (\"a\"", {"1:10", "unclosed '('"});
  expect_error("root ::= \"a\" )", {"1:14", "unbalanced ')'"});
  expect_error("root ::= [z-a]", {"1:11", "reversed"});
  expect_error("root ::= \"a\" ::= \"b\"", {"'::=' without a rule name"});
  expect_error("root ::= \"\xff\"", {"1:11", "invalid UTF-8"});
  expect_error("root ::= \"a\"\nroot ::= \"b\"", {"rule 'root' is defined twice", "2:1", "1:1"});
  expect_error("root ::= ~", {"1:10", "unexpected '~'"});
  std::string deep =
      "root ::= " + std::string(kMaxGbnfNesting + 1, '(') + "\"a\"" + std::string(kMaxGbnfNesting + 1, ')');
  expect_error(deep, {"nested deeper"});
}

TEST(GrammarGbnf, LeftRecursionAndDeadRulesAreRefused) {
  expect_error("root ::= root \"a\" | \"b\"", {"left-recursive", "root -> root"});
  expect_error("root ::= x\nx ::= y \"a\" | \"b\"\ny ::= \"\" | x", {"left-recursive", "x -> y -> x"});
  expect_error("root ::= (\"a\"?)*", {"left-recursive", "repetition of something that can be empty"});
  expect_error("root ::= \"a\" x\nx ::= \"b\" x", {"'x'", "can never finish", "2:1"});
  expect_error("root ::= []", {"'root'", "can never finish"});
  // Right recursion and recursion behind a character are fine.
  EXPECT_TRUE(parse_gbnf("root ::= \"(\" root \")\" | \"x\"").ok());
  // A dead alternative next to a live one is dropped, not an error.
  auto g = parse_or_fail("root ::= \"a\" [] | \"a\" \"b\"");
  EXPECT_TRUE(accepts(g, "ab"));
  EXPECT_FALSE(accepts(g, "a"));
}

TEST(GrammarGbnf, LimitsAreErrorsNotCrashes) {
  GrammarLimits limits;
  limits.max_repeat = 100;
  Result<Grammar> g = parse_gbnf("root ::= \"a\"{0,101}", "root", limits);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), ErrorCode::kOutOfRange);
  limits.max_repeat = 1000;
  limits.max_elements = 500;
  g = parse_gbnf("root ::= \"a\"{0,1000}", "root", limits);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("grammar too large"));
}

TEST(GrammarGbnf, ToGbnfRoundTripsTheLanguage) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<std::string> sources = {
      std::string(kJsonGbnf),
      R"(root ::= ([a-c] | "\"" | "\\" | [^\x00-\x7F]){1,3} ("x" [\n\t]?)* "é"?)",
      "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\"",
  };
  for (const std::string& source : sources) {
    auto g = parse_or_fail(source);
    const std::string printed = g->to_gbnf();
    Result<Grammar> again = parse_gbnf(printed);
    ASSERT_TRUE(again.ok()) << again.status().to_string() << "\n" << printed;
    auto g2 = share(std::move(again).value());
    for (int i = 0; i < 40; ++i) {
      std::optional<std::string> s = grammar_test::sample_string(g, rng, 0, 48);
      if (!s) continue;
      EXPECT_TRUE(accepts(g2, *s)) << grammar_test::escape_for_trace(*s) << "\n" << printed;
      // A one-byte change must be judged alike by both.
      std::string mutated = *s;
      if (!mutated.empty()) mutated[std::uniform_int_distribution<size_t>(0, mutated.size() - 1)(rng)] = 'b';
      EXPECT_EQ(accepts(g, mutated), accepts(g2, mutated)) << grammar_test::escape_for_trace(mutated);
    }
  }
}

// Mutated grammars: every outcome is a grammar that runs or a Status; never a crash or a hang.
TEST(GrammarGbnf, MutatedGrammarsNeverCrash) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::string pieces[] = {
      "(", ")", "[", "]",    "\"", "\\", "*", "+", "?",    "{", "}",   "{2,1}", "{0,3}", "|",    "::=",          "\n",
      " ", "#", "a", "root", "x",  "^",  "-", ".", "\xff", "é", "\\u", "\\x4",  "[^",    "\"\"", "root ::= root"};
  const std::vector<std::string> sources = {std::string(kJsonGbnf), "root ::= (\"a\" | [b-d]+)* x?\nx ::= \"e\"{1,3}"};
  int parsed = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string text = sources[i % sources.size()];
    for (int k = std::uniform_int_distribution<int>(1, 4)(rng); k > 0; --k) {
      const size_t at = std::uniform_int_distribution<size_t>(0, text.size())(rng);
      const std::string& piece = pieces[std::uniform_int_distribution<size_t>(0, std::size(pieces) - 1)(rng)];
      if (std::bernoulli_distribution(0.3)(rng) && at < text.size()) {
        text.erase(at, std::uniform_int_distribution<size_t>(1, 4)(rng));
      } else {
        text.insert(at, piece);
      }
    }
    Result<Grammar> g = parse_gbnf(text);
    if (!g.ok()) {
      EXPECT_FALSE(g.status().message().empty());
      continue;
    }
    ++parsed;
    GrammarMatcher m = grammar_test::make_matcher(share(std::move(g).value()));
    std::vector<uint32_t> mask(grammar_mask_words(m.vocabulary().vocab_size()));
    for (int step = 0; step < 8; ++step) {
      if (!m.fill_mask(mask).ok()) break;
      const std::vector<int32_t> ids = grammar_test::allowed_ids(mask, m.vocabulary().vocab_size());
      if (ids.empty() || !m.accept(ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)]).ok()) break;
    }
  }
  EXPECT_GT(parsed, 50);
}

}  // namespace
}  // namespace tachyon
