// OutputConstraint and GrammarCache: every kind compiles to the language it names (checked on
// strings in and out of it), bad constraints are kInvalidArgument naming the kind, and the cache
// shares one grammar per constraint, evicts the least recently used, and holds up under threads.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <fmt/format.h>

#include "grammar_test_util.h"
#include "sampling/output_constraint.h"

namespace tachyon {
namespace {

using grammar_test::accepts;
using grammar_test::share;

std::shared_ptr<const Grammar> compile(const OutputConstraint& c) {
  Result<Grammar> g = compile_output_constraint(c);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return share(std::move(g).value());
}

TEST(OutputConstraint, EveryKindCompilesItsLanguage) {
  OutputConstraint c;
  c.kind = OutputConstraint::Kind::kJsonObject;
  auto g = compile(c);
  EXPECT_TRUE(accepts(g, R"({"a": [1, {"b": null}]})"));
  EXPECT_FALSE(accepts(g, "[1]"));

  c.kind = OutputConstraint::Kind::kJsonSchema;
  c.text = R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})";
  g = compile(c);
  EXPECT_TRUE(accepts(g, R"({"n": 12})"));
  EXPECT_FALSE(accepts(g, R"({"n": 12, "x": 1})"));  // strict: no extra properties
  c.strict = false;
  EXPECT_TRUE(accepts(compile(c), R"({"n": 12, "x": 1})"));
  c.max_whitespace = 0;
  EXPECT_FALSE(accepts(compile(c), R"({"n": 12})"));
  EXPECT_TRUE(accepts(compile(c), R"({"n":12})"));

  c = OutputConstraint{OutputConstraint::Kind::kRegex, "[a-c]+-[0-9]{2}", {}};
  g = compile(c);
  EXPECT_TRUE(accepts(g, "abc-42"));
  EXPECT_FALSE(accepts(g, "abc-4"));

  c = OutputConstraint{OutputConstraint::Kind::kGbnf, "root ::= \"x\" [0-9]*", {}};
  g = compile(c);
  EXPECT_TRUE(accepts(g, "x"));
  EXPECT_TRUE(accepts(g, "x123"));
  EXPECT_FALSE(accepts(g, "y"));

  c = OutputConstraint{OutputConstraint::Kind::kChoice, "", {"yes", "no", "n/a"}};
  g = compile(c);
  for (const char* s : {"yes", "no", "n/a"}) EXPECT_TRUE(accepts(g, s)) << s;
  for (const char* s : {"ye", "nope", "", "yesno"}) EXPECT_FALSE(accepts(g, s)) << s;
}

TEST(OutputConstraint, BadConstraintsAreInvalidArgumentsNamingTheKind) {
  const std::vector<OutputConstraint> bad = {
      {OutputConstraint::Kind::kJsonSchema, R"({"type": "object")", {}},
      {OutputConstraint::Kind::kJsonSchema, R"({"type": "number", "multipleOf": 3})", {}},
      {OutputConstraint::Kind::kRegex, "(a", {}},
      {OutputConstraint::Kind::kRegex, R"((a)\1)", {}},
      {OutputConstraint::Kind::kGbnf, "root ::= undefined-rule", {}},
      {OutputConstraint::Kind::kGbnf, "root ::= root \"a\"", {}},
      {OutputConstraint::Kind::kChoice, "", {}},
      {OutputConstraint::Kind::kChoice, "", {"a", ""}},
  };
  for (const OutputConstraint& c : bad) {
    const Result<Grammar> g = compile_output_constraint(c);
    ASSERT_FALSE(g.ok()) << c.cache_key();
    EXPECT_EQ(g.status().code(), ErrorCode::kInvalidArgument) << g.status().to_string();
    EXPECT_NE(g.status().to_string().find(c.kind_name()), std::string::npos) << g.status().to_string();
  }
}

TEST(GrammarCache, SharesEvictsAndSurvivesThreads) {
  GrammarCache cache(2);
  const OutputConstraint a{OutputConstraint::Kind::kRegex, "a+", {}};
  const OutputConstraint b{OutputConstraint::Kind::kRegex, "b+", {}};
  const OutputConstraint c{OutputConstraint::Kind::kChoice, "", {"a+"}};  // another kind, the same text
  auto ga = cache.get(a);
  ASSERT_TRUE(ga.ok());
  EXPECT_EQ(cache.get(a).value(), *ga);  // one grammar for both
  auto gc = cache.get(c);
  ASSERT_TRUE(gc.ok());
  EXPECT_NE(*gc, *ga);
  EXPECT_TRUE(accepts(*gc, "a+"));
  EXPECT_FALSE(accepts(*gc, "aa"));
  ASSERT_TRUE(cache.get(a).ok());  // a is now the most recent: b evicts c
  ASSERT_TRUE(cache.get(b).ok());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.get(a).value(), *ga);
  EXPECT_NE(cache.get(c).value(), *gc);  // compiled again
  EXPECT_FALSE(cache.get({OutputConstraint::Kind::kRegex, "(", {}}).ok());
  EXPECT_EQ(cache.size(), 2u);  // errors are not kept

  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const OutputConstraint k{OutputConstraint::Kind::kRegex, fmt::format("x{{{}}}", (i + t) % 5 + 1), {}};
        auto g = cache.get(k);
        if (!g.ok() || !accepts(*g, std::string(static_cast<size_t>((i + t) % 5 + 1), 'x'))) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(cache.size(), 2u);
}

}  // namespace
}  // namespace tachyon
