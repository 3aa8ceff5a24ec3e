// GrammarMatcher: the trie-walk mask equals the brute-force mask (copy the matcher, accept each token) at every
// step of random walks through several grammars and random vocabularies; UTF-8 split across tokens; rollback
// restores exact masks; EOS only at completion (and forced when nothing else fits); special tokens never;
// the guards against blowups are errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "grammar_test_util.h"
#include "sampling/gbnf_parser.h"
#include "sampling/json_schema.h"
#include "sampling/regex_grammar.h"
#include "test_util.h"

namespace tachyon {
namespace {

using grammar_test::allowed_ids;
using grammar_test::brute_force_mask;
using grammar_test::escape_for_trace;
using grammar_test::make_matcher;
using grammar_test::mask_of;
using grammar_test::share;
using ::testing::HasSubstr;

constexpr std::string_view kArithmetic = R"gbnf(
root   ::= expr
expr   ::= term (ws [-+] ws term)*
term   ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
ws     ::= " "?
)gbnf";

// A random vocabulary: every single character of `alphabet` (so that anything can be spelled), random strings
// of 1-4 pieces of it, multi-byte characters whole and split, bytes that are never valid UTF-8, then EOS and
// a special token. Returns the trie and the id of EOS.
struct RandomVocabulary {
  std::shared_ptr<const TokenTrie> trie;
  int32_t eos = 0;
  int32_t special = 0;
};

RandomVocabulary random_vocabulary(std::mt19937& rng, const std::vector<std::string>& alphabet, int extra) {
  std::vector<std::string> tokens(alphabet.begin(), alphabet.end());
  // Whole characters first (the first ten may be glued into random tokens), then fragments and invalid bytes.
  // clang-format off
  const std::vector<std::string> multibyte = {
      "é", "€", "😀", "α", "\xC3", "\xA9", "\xE2\x82", "\xAC", "\xF0\x9F", "\x98\x80",
      "\x9F\x98\x80", "\xFF", "\x80", "\xC0\xAF", "\xED\xA0\x80"};
  // clang-format on
  tokens.insert(tokens.end(), multibyte.begin(), multibyte.end());
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> length(1, 4);
  for (int i = 0; i < extra; ++i) {
    std::string t;
    for (int n = length(rng); n > 0; --n) {
      t += std::bernoulli_distribution(0.08)(rng) ? multibyte[std::uniform_int_distribution<size_t>(0, 9)(rng)]
                                                  : alphabet[pick(rng)];
    }
    tokens.push_back(t);
  }
  tokens.push_back(alphabet[0]);  // a duplicate string: two ids on one trie node
  std::shuffle(tokens.begin(), tokens.end(), rng);
  RandomVocabulary v;
  v.eos = static_cast<int32_t>(tokens.size());
  tokens.push_back("<eos>");
  v.special = static_cast<int32_t>(tokens.size());
  tokens.push_back("(");  // a special token whose text the grammars could spell
  const int32_t eos[] = {v.eos};
  const int32_t special[] = {v.special};
  v.trie = TokenTrie::build(std::move(tokens), eos, special).value();
  return v;
}

std::vector<std::string> chars_of(std::string_view s) {
  std::vector<std::string> out;
  for (char c : s) out.push_back(std::string(1, c));
  return out;
}

// Random walks: at every step the mask must equal the brute-force mask.
void check_walks(const std::shared_ptr<const Grammar>& grammar, const std::vector<std::string>& alphabet,
                 std::mt19937& rng, int walks, int steps) {
  for (int w = 0; w < walks; ++w) {
    RandomVocabulary v = random_vocabulary(rng, alphabet, 120);
    // The mask cache off, thrashing (one slot) and on: the masks must not change.
    GrammarMatcherOptions options;
    options.max_cached_masks = w % 3 == 0 ? 0 : (w % 3 == 1 ? 1 : 8);
    GrammarMatcher m = make_matcher(grammar, v.trie, options);
    std::string text;
    for (int step = 0; step < steps; ++step) {
      SCOPED_TRACE(::testing::Message() << "walk " << w << " step " << step << " text '" << escape_for_trace(text)
                                        << "'");
      const std::vector<uint32_t> mask = mask_of(m);
      const std::vector<uint32_t> expected = brute_force_mask(m);
      ASSERT_EQ(mask, expected);
      EXPECT_FALSE(grammar_mask_test(mask, v.special));
      EXPECT_EQ(grammar_mask_test(mask, v.eos), m.can_end());
      std::vector<int32_t> ids = allowed_ids(mask, v.trie->vocab_size());
      ASSERT_FALSE(ids.empty());
      // Prefer continuing; end only sometimes.
      if (ids.size() > 1) std::erase(ids, v.eos);
      const int32_t id = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
      ASSERT_TRUE(m.accept(id).ok());
      if (id == v.eos) break;
      text += v.trie->token_bytes(id);
    }
  }
}

TEST(GrammarMatcher, MaskEqualsBruteForceOnJson) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  JsonSchemaOptions options;
  options.max_whitespace = 2;
  auto grammar = share(json_object_grammar(options).value());
  check_walks(grammar, chars_of("{}[]\":,.-+eE0159 \ntrufalsn\\/bu"), rng, 6, 40);
}

TEST(GrammarMatcher, MaskEqualsBruteForceOnArithmetic) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto grammar = share(parse_gbnf(kArithmetic).value());
  check_walks(grammar, chars_of("0123456789.+-*/() x"), rng, 6, 40);
}

TEST(GrammarMatcher, MaskEqualsBruteForceOnRegexAndUnicodeClasses) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto regex = share(regex_to_grammar(R"gbnf((ab|c[de]*)+(é|€){1,2}(x|😀)?[^a-e]*)gbnf").value());
  std::vector<std::string> alphabet = chars_of("abcdexyz");
  check_walks(regex, alphabet, rng, 6, 30);
  auto unicode = share(parse_gbnf(R"gbnf(root ::= ([α-ω] | "é")+ "€" [^a-z]{2,3} ("😀" | "x")*)gbnf").value());
  check_walks(unicode, alphabet, rng, 6, 30);
}

TEST(GrammarMatcher, Utf8SplitAcrossTokens) {
  // Tokens: the two bytes of 'é' apart and together, its first byte with 'x', and an overlong form.
  std::vector<std::string> tokens = {"\xC3", "\xA9", "é", "\xA9x", "x", "\xC0\xA9", "\xC3\xA9x"};
  const int32_t eos[] = {7};
  tokens.push_back("<eos>");
  auto vocab = TokenTrie::build(tokens, eos).value();
  auto grammar = share(parse_gbnf(R"gbnf(root ::= "é" "x")gbnf").value());
  GrammarMatcher m = make_matcher(grammar, vocab);
  std::vector<uint32_t> mask = mask_of(m);
  EXPECT_EQ(allowed_ids(mask, vocab->vocab_size()), (std::vector<int32_t>{0, 2, 6}));
  ASSERT_TRUE(m.accept(0).ok());  // "\xC3": half a character
  EXPECT_FALSE(m.can_end());
  mask = mask_of(m);
  EXPECT_EQ(allowed_ids(mask, vocab->vocab_size()), (std::vector<int32_t>{1, 3}));
  EXPECT_FALSE(m.accept(4).ok());  // "x" cannot finish the character
  ASSERT_TRUE(m.accept(1).ok());
  EXPECT_EQ(allowed_ids(mask_of(m), vocab->vocab_size()), (std::vector<int32_t>{4}));
  ASSERT_TRUE(m.accept(4).ok());
  EXPECT_TRUE(m.can_end());
  EXPECT_EQ(allowed_ids(mask_of(m), vocab->vocab_size()), (std::vector<int32_t>{7}));  // EOS forced

  // A class that admits only some continuations of a lead byte: [À-Ã] is C3 80..C3 83.
  auto narrow = share(parse_gbnf(R"gbnf(root ::= [À-Ã])gbnf").value());
  GrammarMatcher n = make_matcher(narrow, vocab);
  ASSERT_TRUE(n.accept(0).ok());
  EXPECT_FALSE(n.accept(1).ok());  // C3 A9 is 'é', outside the class
}

TEST(GrammarMatcher, InvalidUtf8IsNeverAccepted) {
  auto grammar = share(parse_gbnf("root ::= .*").value());
  for (std::string_view bad : {"\x80", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                               "\xF5\x80\x80\x80", "\xFF", "\xC3\x28"}) {
    GrammarMatcher m = make_matcher(grammar);
    EXPECT_FALSE(m.accept_bytes(bad).ok()) << escape_for_trace(bad);
  }
  GrammarMatcher m = make_matcher(grammar);
  EXPECT_TRUE(m.accept_bytes("\xF4\x8F\xBF\xBF\xEF\xBF\xBD\x7F").ok());
}

TEST(GrammarMatcher, EosOnlyAtCompletionAndForcedAtTheEnd) {
  auto grammar = share(parse_gbnf(R"gbnf(root ::= "a"+ "b"?)gbnf").value());
  GrammarMatcher m = make_matcher(grammar);
  std::vector<uint32_t> mask = mask_of(m);
  EXPECT_FALSE(grammar_mask_test(mask, grammar_test::kByteEos));
  EXPECT_FALSE(m.accept(grammar_test::kByteEos).ok());
  ASSERT_TRUE(m.accept('a').ok());
  mask = mask_of(m);
  EXPECT_TRUE(grammar_mask_test(mask, grammar_test::kByteEos));
  EXPECT_TRUE(grammar_mask_test(mask, 'a'));
  EXPECT_TRUE(grammar_mask_test(mask, 'b'));
  ASSERT_TRUE(m.accept('b').ok());
  EXPECT_EQ(allowed_ids(mask_of(m), m.vocabulary().vocab_size()), std::vector<int32_t>{grammar_test::kByteEos});
  ASSERT_TRUE(m.accept(grammar_test::kByteEos).ok());
  EXPECT_TRUE(m.is_terminated());
  EXPECT_EQ(allowed_ids(mask_of(m), m.vocabulary().vocab_size()), std::vector<int32_t>{grammar_test::kByteEos});
  EXPECT_FALSE(m.accept('a').ok());
  ASSERT_TRUE(m.rollback(1).ok());
  EXPECT_FALSE(m.is_terminated());
}

TEST(GrammarMatcher, SpecialTokensAreNeverAllowed) {
  // The special token's text "<s>" is exactly what the grammar wants; only the plain bytes may spell it.
  auto grammar = share(parse_gbnf(R"gbnf(root ::= "<s>")gbnf").value());
  GrammarMatcher m = make_matcher(grammar);
  EXPECT_FALSE(grammar_mask_test(mask_of(m), grammar_test::kByteSpecial));
  const Status s = m.accept(grammar_test::kByteSpecial);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("special token"));
  EXPECT_FALSE(m.accept(100000).ok());
  EXPECT_FALSE(m.accept(-1).ok());
  EXPECT_TRUE(m.accept_bytes("<s>").ok());
}

TEST(GrammarMatcher, RefusedTokensLeaveTheStateUnchanged) {
  auto grammar = share(parse_gbnf(kArithmetic).value());
  GrammarMatcher m = make_matcher(grammar);
  ASSERT_TRUE(m.accept_bytes("(1 +").ok());
  const std::vector<uint32_t> before = mask_of(m);
  EXPECT_FALSE(m.accept_bytes(" 2)x").ok());
  EXPECT_FALSE(m.accept(')').ok());
  EXPECT_EQ(mask_of(m), before);
  EXPECT_EQ(m.rollback_capacity(), 1);
}

TEST(GrammarMatcher, RollbackRestoresExactMasks) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  JsonSchemaOptions options;
  options.max_whitespace = 1;
  auto grammar = share(json_object_grammar(options).value());
  RandomVocabulary v = random_vocabulary(rng, chars_of("{}[]\":,.-0159 trufalsne"), 200);
  GrammarMatcherOptions matcher_options;
  matcher_options.max_rollback_tokens = 16;
  GrammarMatcher m = make_matcher(grammar, v.trie, matcher_options);
  std::vector<std::vector<uint32_t>> masks;
  std::vector<bool> can_end;
  for (int step = 0; step < 60; ++step) {
    masks.push_back(mask_of(m));
    can_end.push_back(m.can_end());
    std::vector<int32_t> ids = allowed_ids(masks.back(), v.trie->vocab_size());
    if (ids.size() > 1) std::erase(ids, v.eos);
    const int32_t id = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
    ASSERT_TRUE(m.accept(id).ok());
    if (id == v.eos) break;
    // Now and then, roll back a few tokens, check the masks of those points, and replay the same tokens.
    if (step % 7 == 6) {
      const int k = std::uniform_int_distribution<int>(1, std::min<int>(5, m.rollback_capacity()))(rng);
      ASSERT_TRUE(m.rollback(k).ok());
      const size_t at = masks.size() - static_cast<size_t>(k);
      EXPECT_EQ(mask_of(m), masks[at]) << "after rolling back " << k;
      EXPECT_EQ(m.can_end(), can_end[at]);
      masks.resize(at);
      can_end.resize(at);
    }
  }
  // The history is bounded.
  EXPECT_LE(m.rollback_capacity(), 16);
  const Status s = m.rollback(17);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kOutOfRange);
}

TEST(GrammarMatcher, CopiesAreIndependent) {
  auto grammar = share(parse_gbnf(kArithmetic).value());
  GrammarMatcher a = make_matcher(grammar);
  ASSERT_TRUE(a.accept_bytes("1").ok());
  GrammarMatcher b = a;
  ASSERT_TRUE(a.accept_bytes("+").ok());
  ASSERT_TRUE(b.accept_bytes("*").ok());
  EXPECT_FALSE(a.can_end());
  EXPECT_FALSE(b.accept_bytes("+").ok());
  EXPECT_TRUE(a.accept_bytes("2").ok());
  EXPECT_TRUE(b.accept_bytes("(3)").ok());
  EXPECT_TRUE(a.can_end());
  EXPECT_TRUE(b.can_end());
  a.reset();
  EXPECT_FALSE(a.can_end());
  EXPECT_EQ(a.rollback_capacity(), 0);
}

TEST(GrammarMatcher, AmbiguityBlowupIsAnError) {
  auto grammar = share(parse_gbnf(R"gbnf(root ::= "x"{0,20} "x"{0,20} "x"{0,20} "y")gbnf").value());
  GrammarMatcherOptions options;
  options.max_stacks = 8;
  GrammarMatcher m = make_matcher(grammar, grammar_test::byte_vocabulary(), options);
  const Status s = m.accept_bytes("xxxxxx");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("max_stacks"));
  // The default limit copes with it.
  GrammarMatcher fine = make_matcher(grammar);
  EXPECT_TRUE(fine.accept_bytes("xxxxxxxxxxy").ok());
}

TEST(GrammarMatcher, StateCacheIsBoundedAndFlushedSafely) {
  auto grammar = share(parse_gbnf(R"gbnf(root ::= [a-z]{0,300})gbnf").value());
  GrammarMatcherOptions options;
  options.max_cached_states = 16;
  GrammarMatcher m = make_matcher(grammar, grammar_test::byte_vocabulary(), options);
  std::string text;
  for (int i = 0; i < 120; ++i) {
    ASSERT_TRUE(m.accept('a' + i % 26).ok());
    EXPECT_LE(m.num_cached_states(), 16 + 2 + 2);
  }
  ASSERT_TRUE(m.rollback(10).ok());
  EXPECT_EQ(mask_of(m), brute_force_mask(m));
  options.max_states_per_call = 1;
  GrammarMatcher tight = make_matcher(grammar, grammar_test::byte_vocabulary(), options);
  const Status s = tight.accept_bytes("abcdef");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("max_states_per_call"));
}

TEST(GrammarMatcher, BadArgumentsAreErrors) {
  auto grammar = share(parse_gbnf("root ::= \"a\"").value());
  EXPECT_FALSE(GrammarMatcher::create(nullptr, grammar_test::byte_vocabulary()).ok());
  EXPECT_FALSE(GrammarMatcher::create(grammar, nullptr).ok());
  GrammarMatcherOptions options;
  options.max_stacks = 0;
  EXPECT_FALSE(GrammarMatcher::create(grammar, grammar_test::byte_vocabulary(), options).ok());
  GrammarMatcher m = make_matcher(grammar);
  std::vector<uint32_t> small(3);
  EXPECT_FALSE(m.fill_mask(small).ok());
  const int32_t bad_eos[] = {5};
  EXPECT_FALSE(TokenTrie::build({"a", "b"}, bad_eos).ok());
  EXPECT_FALSE(TokenTrie::build({}, {}).ok());
}

TEST(GrammarMatcher, NoSpellableContinuationIsAnError) {
  // The vocabulary cannot write 'z', so after "a" nothing fits and the grammar is not complete.
  const int32_t eos[] = {1};
  auto vocab = TokenTrie::build({"a", "<eos>"}, eos).value();
  auto grammar = share(parse_gbnf(R"gbnf(root ::= "a" "z")gbnf").value());
  GrammarMatcher m = make_matcher(grammar, vocab);
  ASSERT_TRUE(m.accept(0).ok());
  std::vector<uint32_t> mask(grammar_mask_words(vocab->vocab_size()));
  const Status s = m.fill_mask(mask);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no token of the vocabulary"));
}

TEST(GrammarMatcher, TrieSharesNodesAndExcludesSpecials) {
  const int32_t eos[] = {4};
  const int32_t special[] = {3};
  auto trie = TokenTrie::build({"ab", "a", "ab", "<x>", "</s>", "", "b"}, eos, special).value();
  EXPECT_EQ(trie->num_nodes(), 3);  // a, ab, b
  EXPECT_TRUE(trie->in_trie(0));
  EXPECT_FALSE(trie->in_trie(3));
  EXPECT_FALSE(trie->in_trie(4));
  EXPECT_FALSE(trie->in_trie(5));  // empty bytes
  EXPECT_TRUE(trie->is_eos(4));
  EXPECT_EQ(trie->node_tokens(1).size(), 2u);  // "ab" twice
  EXPECT_EQ(trie->subtree_end(0), 2);
}

}  // namespace
}  // namespace tachyon
