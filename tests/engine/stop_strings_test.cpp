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

}  // namespace
}  // namespace tachyon
