#include <random>

#include <gtest/gtest.h>

#include "engine/stop_strings.h"
#include "test_util.h"

namespace tachyon {
namespace {

// Feeds `text` cut at random points; returns (shown text, matched stop or "").
std::pair<std::string, std::string> feed(const std::vector<std::string>& stops, const std::string& text,
                                         std::mt19937& rng) {
  StopStringMatcher m(stops);
  std::string shown;
  size_t pos = 0;
  while (pos < text.size() && !m.matched()) {
    const size_t n = std::min(text.size() - pos, static_cast<size_t>(rng() % 4));
    const std::string piece = text.substr(pos, n);
    const std::string out = m.push(piece);
    shown += out;
    pos += n;
  }
  if (!m.matched()) shown += m.flush();
  return {shown, m.matched() ? m.matched_string() : std::string()};
}

// The reference, over the whole text: the stop string that is complete first (earliest end,
// then earliest start).
std::pair<std::string, std::string> reference(const std::vector<std::string>& stops, const std::string& text) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = std::string::npos;
    std::string which;
    for (const auto& s : stops) {
      if (s.empty() || s.size() > end) continue;
      if (text.compare(end - s.size(), s.size(), s) == 0 && end - s.size() < best) {
        best = end - s.size();
        which = s;
      }
    }
    if (!which.empty()) return {text.substr(0, best), which};
  }
  return {text, std::string()};
}

TEST(StopStrings, MatchesAcrossPiecesAndHoldsBackPossibleStarts) {
  StopStringMatcher m({"</s>", "STOP"});
  EXPECT_EQ(m.push("Hello <"), "Hello ");  // "<" may start "</s>"
  EXPECT_EQ(m.push("/"), "");
  EXPECT_EQ(m.push("b>"), "</b>");         // no longer a possible start
  EXPECT_EQ(m.push(" ST"), " ");
  EXPECT_EQ(m.push("OP and more"), "");  // the rest of the piece after the match is dropped too
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_string(), "STOP");
  EXPECT_EQ(m.push("ignored"), "");
  EXPECT_EQ(m.flush(), "");
  StopStringMatcher n({"abc"});
  EXPECT_EQ(n.push("xab"), "x");
  EXPECT_EQ(n.flush(), "ab");  // the stream ended: nothing can match any more
  StopStringMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
  StopStringMatcher first_complete({"abcd", "c"});  // "c" is complete before "abcd"
  EXPECT_EQ(first_complete.push("abcd"), "ab");
  EXPECT_EQ(first_complete.matched_string(), "c");
  StopStringMatcher empty_stop({""});
  EXPECT_EQ(empty_stop.push("abc"), "abc");
  EXPECT_FALSE(empty_stop.matched());
}

TEST(StopStrings, RandomSplitsAgreeWithTheWholeTextReference) {
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  const std::string alphabet = "ab\xc3\xa9 ";
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops(1 + rng() % 3);
    for (auto& s : stops) {
      const int sl = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < sl; ++i) s += alphabet[rng() % alphabet.size()];
    }
    const auto got = feed(stops, text, rng);
    const auto want = reference(stops, text);
    ASSERT_EQ(got.first, want.first) << "seed " << seed << " trial " << trial;
    ASSERT_EQ(got.second, want.second) << "seed " << seed << " trial " << trial;
  }
}

// min_tokens and include_stop_str_in_output: the first `unarmed` bytes arrive with may_stop = false
// (in random pieces, the boundary falling between two), and a match counts only if it ends past
// them; with include_stop the match itself is shown. Against the whole-text reference.
TEST(StopStrings, UnarmedTextCannotEndTheStreamAndIncludedStopsShow) {
  StopStringMatcher held({"ab"}, /*include_stop=*/true);
  EXPECT_EQ(held.push("xab", /*may_stop=*/false), "xab");  // complete, but before min_tokens
  EXPECT_FALSE(held.matched());
  EXPECT_EQ(held.push("a", false), "");  // may start a match that ends later
  EXPECT_EQ(held.push("b!"), "ab");      // ends in armed text: counts, and shows
  EXPECT_TRUE(held.matched());

  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  const std::string alphabet = "ab ";
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const size_t len = rng() % 30;
    for (size_t i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops(1 + rng() % 3);
    for (auto& s : stops) {
      const int sl = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < sl; ++i) s += alphabet[rng() % alphabet.size()];
    }
    const size_t unarmed = len == 0 ? 0 : rng() % (len + 1);
    const bool include = rng() % 2 == 0;
    // Reference: the earliest-ending (then earliest-starting) match that ends past `unarmed`.
    size_t best = std::string::npos, best_end = std::string::npos;
    for (const std::string& stop : stops) {
      for (size_t at = 0; at + stop.size() <= text.size(); ++at) {
        const size_t end = at + stop.size();
        if (end <= unarmed || text.compare(at, stop.size(), stop) != 0) continue;
        if (end < best_end || (end == best_end && at < best)) {
          best = at;
          best_end = end;
        }
        break;
      }
    }
    const std::string want = best == std::string::npos ? text : text.substr(0, include ? best_end : best);
    StopStringMatcher m(stops, include);
    std::string shown;
    size_t pos = 0;
    while (pos < text.size() && !m.matched()) {
      const size_t limit = pos < unarmed ? unarmed : text.size();
      const size_t n = std::min(limit - pos, static_cast<size_t>(1 + rng() % 4));
      shown += m.push(text.substr(pos, n), pos >= unarmed);
      pos += n;
    }
    if (!m.matched()) shown += m.flush();
    ASSERT_EQ(shown, want) << "seed " << seed << " trial " << trial << " text '" << text << "' unarmed " << unarmed;
    ASSERT_EQ(m.matched(), best != std::string::npos) << "seed " << seed << " trial " << trial;
  }
}

}  // namespace
}  // namespace tachyon
