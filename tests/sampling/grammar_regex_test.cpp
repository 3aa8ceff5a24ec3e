// Regex -> grammar: known patterns, refused constructs, and random patterns from a small generator judged
// against std::regex (ECMAScript) on random strings and on strings sampled from the grammar itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "grammar_test_util.h"
#include "sampling/regex_grammar.h"
#include "test_util.h"

namespace tachyon {
namespace {

using grammar_test::accepts;
using grammar_test::escape_for_trace;
using grammar_test::share;
using ::testing::HasSubstr;

std::shared_ptr<const Grammar> compile_or_fail(std::string_view pattern) {
  Result<Grammar> g = regex_to_grammar(pattern);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return share(regex_to_grammar("").value());
  return share(std::move(g).value());
}

TEST(GrammarRegex, KnownPatterns) {
  auto phone = compile_or_fail(R"(\d{3}-\d{4})");
  EXPECT_TRUE(accepts(phone, "555-1234"));
  EXPECT_FALSE(accepts(phone, "555-123"));
  EXPECT_FALSE(accepts(phone, "5555-1234"));
  auto anchored = compile_or_fail(R"(^(?:[A-Z][a-z]*\s?)+$)");
  EXPECT_TRUE(accepts(anchored, "Hello World"));
  EXPECT_FALSE(accepts(anchored, "hello"));
  auto named = compile_or_fail(R"((?<year>\d{4})-(?<month>0[1-9]|1[0-2]))");
  EXPECT_TRUE(accepts(named, "2024-12"));
  EXPECT_FALSE(accepts(named, "2024-13"));
  auto escapes = compile_or_fail(R"(\.\*\+\?\(\)\[\]\{\}\|\\\/\^\$-\x41\u00e9\t\cJ[\b])");
  EXPECT_TRUE(accepts(escapes, ".*+?()[]{}|\\/^$-Aé\t\n\b"));
  auto dot = compile_or_fail("a.c");
  EXPECT_TRUE(accepts(dot, "abc"));
  EXPECT_TRUE(accepts(dot, "a😀c"));
  EXPECT_FALSE(accepts(dot, "a\nc"));
  auto classes = compile_or_fail(R"([\w-]+@[^\s@]+\.[a-z]{2,3}\S\D\W)");
  EXPECT_TRUE(accepts(classes, "a_b-c@x.y.com!x!"));
  EXPECT_FALSE(accepts(classes, "a b@x.com!x!"));
  auto lazy = compile_or_fail("a+?b*?c??");
  EXPECT_TRUE(accepts(lazy, "aab"));
  auto empty_class = compile_or_fail("a[]|b");
  EXPECT_TRUE(accepts(empty_class, "b"));
  EXPECT_FALSE(accepts(empty_class, "a"));
  auto any_class = compile_or_fail("[^]");
  EXPECT_TRUE(accepts(any_class, "\n"));
}

TEST(GrammarRegex, NullableRepetitionsAreRewrittenNotRefused) {
  auto g = compile_or_fail("(a*)*b(c?|d*){2,}(|x)+");
  EXPECT_TRUE(accepts(g, "b"));
  EXPECT_TRUE(accepts(g, "aaabcdddcx"));
  EXPECT_FALSE(accepts(g, "aaa"));
}

TEST(GrammarRegex, SearchModeAllowsTextAroundUnanchoredEnds) {
  auto search = [](std::string_view pattern) {
    GrammarBuilder b;
    EXPECT_TRUE(b.add_rule("root", regex_to_expr(pattern, RegexMatchMode::kSearch).value()).ok());
    return share(b.build().value());
  };
  EXPECT_TRUE(accepts(search("abc"), "xxabc\nyy"));
  EXPECT_FALSE(accepts(search("abc"), "xxab"));
  EXPECT_TRUE(accepts(search("^abc"), "abcyy"));
  EXPECT_FALSE(accepts(search("^abc"), "xabc"));
  EXPECT_TRUE(accepts(search("abc$"), "xabc"));
  EXPECT_FALSE(accepts(search("abc$"), "abcx"));
  EXPECT_TRUE(accepts(search("^a$|b"), "xbx"));
  EXPECT_FALSE(accepts(search("^a$|b"), "xax"));
}

TEST(GrammarRegex, UnsupportedConstructsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a)\\1", "backreferences"},
      {"(?<n>a)\\k<n>", "backreferences"},
      {"a(?=b)", "lookahead"},
      {"a(?!b)", "lookahead"},
      {"(?<=a)b", "lookbehind"},
      {"(?<!a)b", "lookbehind"},
      {"\\bword", "word boundaries"},
      {"a\\B", "word boundaries"},
      {"(?i)abc", "not supported"},
      {"\\p{L}", "Unicode property"},
      {"a^b", "anchor '^'"},
      {"a$b", "anchor '$'"},
      {"(a$)", "anchor '$'"},
      {"a{", "repetition"},
      {"a{2,1}", "below the minimum"},
      {"a**", "nothing to repeat"},
      {"*a", "nothing to repeat"},
      {"a++", "possessive"},
      {"(ab", "unclosed '('"},
      {"ab)", "unbalanced ')'"},
      {"[ab", "unterminated"},
      {"[b-a]", "out of order"},
      {"[\\d-z]", "class escape"},
      {"\\q", "unknown escape"},
      {"a\\", "ends with"},
      {"\\x4", "hex digits"},
      {"\\012", "octal"},
      {"\\u{1F600}", "not supported"},
      {"a]", "unescaped"},
  };
  for (const auto& [pattern, expected] : cases) {
    Result<Grammar> g = regex_to_grammar(pattern);
    ASSERT_FALSE(g.ok()) << pattern;
    EXPECT_EQ(g.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(g.status().message(), HasSubstr(expected)) << pattern;
  }
  std::string deep = std::string(kMaxRegexNesting + 1, '(') + "a" + std::string(kMaxRegexNesting + 1, ')');
  EXPECT_FALSE(regex_to_grammar(deep).ok());
}

// Random regexes over a tiny alphabet, built from the constructs both engines share.
class RegexGenerator {
 public:
  explicit RegexGenerator(std::mt19937& rng) : rng_(rng) {}
  std::string pattern(int depth = 0) {
    std::string out = sequence(depth);
    if (depth < 2 && chance(0.25)) out += "|" + sequence(depth);
    return out;
  }

 private:
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  std::string sequence(int depth) {
    std::string out;
    for (int n = 1 + pick(3); n > 0; --n) out += quantified(depth);
    return out;
  }
  std::string quantified(int depth) {
    std::string a = atom(depth);
    switch (pick(9)) {
      case 0: return a + "*";
      case 1: return a + "+";
      case 2: return a + "?";
      case 3: return a + "{" + std::to_string(pick(3)) + "}";
      case 4: return a + "{" + std::to_string(pick(2)) + "," + std::to_string(2 + pick(2)) + "}";
      case 5: return a + "{1,}";
      default: return a;
    }
  }
  std::string atom(int depth) {
    static const char* kAtoms[] = {"a", "b", "c", ".", "[ab]", "[^a]", "\\d", "[a-c1]", "\\w", "\\s", "\\.", "1"};
    if (depth < 3 && chance(0.2)) return (chance(0.5) ? "(" : "(?:") + pattern(depth + 1) + ")";
    return kAtoms[pick(static_cast<int>(std::size(kAtoms)))];
  }
  std::mt19937& rng_;
};

TEST(GrammarRegex, RandomPatternsAgreeWithStdRegex) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  RegexGenerator generator(rng);
  const std::string alphabet = "abc1. \n";
  int positives = 0;
  for (int p = 0; p < 250; ++p) {
    const std::string pattern = generator.pattern();
    SCOPED_TRACE(::testing::Message() << "pattern /" << pattern << "/");
    const std::regex reference(pattern, std::regex::ECMAScript);
    auto grammar = compile_or_fail(pattern);
    std::vector<std::string> subjects;
    for (int i = 0; i < 30; ++i) {
      std::string s;
      for (int n = std::uniform_int_distribution<int>(0, 6)(rng); n > 0; --n) {
        s += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      }
      subjects.push_back(s);
    }
    // Strings the grammar produces (ASCII only: std::regex works on bytes).
    for (int i = 0; i < 10; ++i) {
      std::optional<std::string> s = grammar_test::sample_string(grammar, rng, 0, 12);
      if (s && std::all_of(s->begin(), s->end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
        subjects.push_back(*s);
      }
    }
    for (const std::string& s : subjects) {
      const bool expected = std::regex_match(s, reference);
      positives += expected;
      EXPECT_EQ(accepts(grammar, s), expected) << "subject '" << escape_for_trace(s) << "'";
    }
  }
  EXPECT_GT(positives, 500);  // the comparison is not only on non-matches
}

// Random character soup: a grammar or a Status, never a crash.
TEST(GrammarRegex, GarbagePatternsNeverCrash) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::string alphabet = "ab()[]{}|*+?^$\\.-,0123dDwWsSbBkpux:=!<>é\xff";
  int compiled = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string pattern;
    for (int n = std::uniform_int_distribution<int>(0, 12)(rng); n > 0; --n) {
      pattern += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
    }
    Result<Grammar> g = regex_to_grammar(pattern);
    if (!g.ok()) continue;
    ++compiled;
    EXPECT_TRUE(GrammarMatcher::create(share(std::move(g).value()), grammar_test::byte_vocabulary()).ok());
  }
  EXPECT_GT(compiled, 300);
}

}  // namespace
}  // namespace tachyon
