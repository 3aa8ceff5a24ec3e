// UTF-8 repair (against Python's bytes.decode("utf-8", errors="replace")), the streaming
// variant, and the byte-level alphabet.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/unicode.h"

namespace tachyon {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8, SanitizeMatchesPythonReplace) {
  // (input, what Python's decode(errors="replace") gives, re-encoded)
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", ""},
      {"plain ascii", "plain ascii"},
      {"\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80", "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"},
      {"\x80", kFffd},
      {"a\xFF" "b", "a" + kFffd + "b"},
      {"\xE4\xB8", kFffd},                       // truncated: one maximal subpart
      {"\xE4\xB8" "a", kFffd + "a"},
      {"\xC0\xAF", kFffd + kFffd},               // overlong lead bytes are never valid
      {"\xE0\x80\xAF", kFffd + kFffd + kFffd},   // E0 needs A0..BF next
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},   // surrogate
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},  // above U+10FFFF
      {"\xF0\x9F\x98", kFffd},
      {"\xF8\x88\x80\x80\x80", kFffd + kFffd + kFffd + kFffd + kFffd},
      {"\xC3\xA9\xC3", "\xC3\xA9" + kFffd},
      {"\xE0\xA0", kFffd},
      {"\xF0\x90\x80", kFffd},
      {std::string("nul\0byte", 8), std::string("nul\0byte", 8)},
  };
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(sanitize_utf8(in), want) << "input of " << in.size() << " bytes";
    EXPECT_EQ(is_valid_utf8(in), in == want);
    EXPECT_TRUE(is_valid_utf8(sanitize_utf8(in)));
  }
}

TEST(Utf8, StreamEqualsWholeOnRandomBytes) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  // Mostly valid text with random damage, split at random points.
  const std::string alphabet = "a \xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\x80\xBF\xC0\xED\xA0\xF4\x90\xFF";
  for (int round = 0; round < 300; ++round) {
    std::string bytes;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) bytes.push_back(alphabet[rng() % alphabet.size()]);
    Utf8Stream stream;
    std::string out;
    size_t pos = 0;
    while (pos < bytes.size()) {
      const size_t take = 1 + rng() % 4;
      const std::string chunk = stream.push(std::string_view(bytes).substr(pos, take));
      ASSERT_TRUE(is_valid_utf8(chunk)) << "seed " << seed;
      out += chunk;
      pos += take;
    }
    out += stream.flush();
    ASSERT_EQ(out, sanitize_utf8(bytes)) << "seed " << seed << " round " << round;
  }
}

TEST(Utf8, StreamHoldsBackIncompleteSequences) {
  Utf8Stream stream;
  EXPECT_EQ(stream.push("\xE4"), "");
  EXPECT_TRUE(stream.has_pending());
  EXPECT_EQ(stream.push("\xB8"), "");
  EXPECT_EQ(stream.push("\xAD" "x"), "\xE4\xB8\xAD" "x");
  EXPECT_EQ(stream.push("\xF0\x9F"), "");
  EXPECT_EQ(stream.push("a"), kFffd + "a");  // known invalid as soon as 'a' arrives
  EXPECT_EQ(stream.push("\xC3"), "");
  EXPECT_EQ(stream.flush(), kFffd);
  EXPECT_FALSE(stream.has_pending());
}

TEST(Utf8, CodePointsAndWhiteSpace) {
  std::string s;
  for (char32_t cp : {U'a', U'\u00E9', U'\u4E2D', U'\U0001F600'}) append_utf8(s, cp);
  size_t pos = 0;
  EXPECT_EQ(next_code_point(s, pos), U'a');
  EXPECT_EQ(next_code_point(s, pos), U'\u00E9');
  EXPECT_EQ(next_code_point(s, pos), U'\u4E2D');
  EXPECT_EQ(next_code_point(s, pos), U'\U0001F600');
  EXPECT_EQ(pos, s.size());
  EXPECT_EQ(previous_code_point_start(s, s.size()), s.size() - 4);
  EXPECT_TRUE(is_unicode_white_space(U'\u3000'));
  EXPECT_TRUE(is_unicode_white_space(U'\t'));
  EXPECT_FALSE(is_unicode_white_space(U'\u200B'));
}

TEST(ByteLevel, AlphabetIsABijectionOntoPrintableCodePoints) {
  const auto& table = byte_level_alphabet();
  EXPECT_EQ(table[' '], U'\u0120');   // Ġ
  EXPECT_EQ(table['\n'], U'\u010A');  // Ċ
  EXPECT_EQ(table['A'], U'A');
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string spelled = byte_level_encode(all);
  EXPECT_TRUE(is_valid_utf8(spelled));
  const auto back = byte_level_decode(spelled);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, all);
  EXPECT_EQ(byte_level_encode(" hello"), "\xC4\xA0hello");
  EXPECT_FALSE(byte_level_decode("plain space").has_value());  // ' ' is not in the alphabet
  EXPECT_FALSE(byte_level_decode("\xE4\xB8\xAD").has_value());
}

TEST(ByteLevel, ByteTokens) {
  EXPECT_EQ(parse_byte_token("<0x0A>"), uint8_t{0x0A});
  EXPECT_EQ(parse_byte_token("<0xff>"), uint8_t{0xFF});
  EXPECT_FALSE(parse_byte_token("<0x0G>").has_value());
  EXPECT_FALSE(parse_byte_token("<0x0A").has_value());
  EXPECT_FALSE(parse_byte_token("0x0A").has_value());
}

}  // namespace
}  // namespace tachyon
