// IncrementalDetokenizer on the cases that make streaming hard: characters split across
// byte-level tokens, byte-fallback tokens that only together form a character, the
// SentencePiece leading space, specials, and invalid leftovers.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace tachyon::testing {
namespace {

std::vector<std::string> stream_chunks(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detok(tok, DetokenizerOptions{skip_special});
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(detok.push(id));
  chunks.push_back(detok.flush());
  return chunks;
}

int32_t id_of(const Tokenizer& tok, std::string_view piece) {
  const auto id = tok.token_id(piece);
  EXPECT_TRUE(id.has_value()) << "no token '" << piece << "'";
  return id.value_or(-1);
}

TEST(IncrementalDetokenizer, ByteFallbackTokensFormOneCharacter) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer("llama-spm-gguf");
  ASSERT_NE(tok, nullptr);
  // U+4E2D "中" = E4 B8 AD as three byte-fallback tokens, after "▁Hello".
  const std::vector<int32_t> ids = {id_of(*tok, "\xE2\x96\x81Hello"), id_of(*tok, "<0xE4>"), id_of(*tok, "<0xB8>"),
                                    id_of(*tok, "<0xAD>")};
  const auto chunks = stream_chunks(*tok, ids, false);
  ASSERT_EQ(chunks.size(), 5u);
  EXPECT_EQ(chunks[0], "Hello");  // the dummy-prefix space is dropped
  EXPECT_EQ(chunks[1], "");
  EXPECT_EQ(chunks[2], "");
  EXPECT_EQ(chunks[3], "\xE4\xB8\xAD");
  EXPECT_EQ(chunks[4], "");
  EXPECT_EQ(tok->decode(ids), "Hello\xE4\xB8\xAD");
}

TEST(IncrementalDetokenizer, InvalidLeftoversBecomeReplacementCharacters) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer("llama-spm-gguf");
  ASSERT_NE(tok, nullptr);
  // E4 B8 then a letter: the pair can no longer complete, so it is one U+FFFD right away.
  const std::vector<int32_t> broken = {id_of(*tok, "<0xE4>"), id_of(*tok, "<0xB8>"), id_of(*tok, "\xE2\x96\x81x")};
  auto chunks = stream_chunks(*tok, broken, false);
  EXPECT_EQ(chunks[0] + chunks[1], "");
  EXPECT_EQ(chunks[2], std::string(kReplacementCharacter).append(" x"));
  // A truncated sequence at the very end comes out of flush().
  const std::vector<int32_t> truncated = {id_of(*tok, "\xE2\x96\x81x"), id_of(*tok, "<0xF0>"), id_of(*tok, "<0x9F>")};
  chunks = stream_chunks(*tok, truncated, false);
  EXPECT_EQ(chunks[0], "x");
  EXPECT_EQ(chunks[1] + chunks[2], "");
  EXPECT_EQ(chunks[3], kReplacementCharacter);
  EXPECT_EQ(tok->decode(truncated), std::string("x").append(kReplacementCharacter));
}

TEST(IncrementalDetokenizer, ByteLevelCharacterSplitAcrossTokens) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer("gpt2-files");
  ASSERT_NE(tok, nullptr);
  // GPT-2 has no token for "😀" (F0 9F 98 80): it comes out as several byte tokens.
  const std::string text = "hi \xF0\x9F\x98\x80!";
  const auto ids = tok->encode(text);
  ASSERT_GT(ids.size(), 3u);
  IncrementalDetokenizer detok(*tok);
  std::string out;
  bool held_back = false;
  for (int32_t id : ids) {
    const std::string chunk = detok.push(id);
    ASSERT_TRUE(is_valid_utf8(chunk));
    held_back = held_back || detok.has_pending();
    out += chunk;
  }
  out += detok.flush();
  EXPECT_TRUE(held_back);
  EXPECT_EQ(out, text);
}

TEST(IncrementalDetokenizer, SpecialsAndLeadingSpace) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer("stories260k");
  ASSERT_NE(tok, nullptr);
  const auto ids = tok->encode("Once upon a time");  // BOS first
  ASSERT_EQ(ids.front(), 1);
  auto chunks = stream_chunks(*tok, ids, /*skip_special=*/true);
  EXPECT_EQ(chunks[0], "");
  EXPECT_EQ(chunks[1], "Once");  // the first text token loses its space even after a BOS
  std::string joined;
  for (const auto& c : chunks) joined += c;
  EXPECT_EQ(joined, "Once upon a time");
  chunks = stream_chunks(*tok, ids, /*skip_special=*/false);
  EXPECT_EQ(chunks[0], "<s>");
  EXPECT_EQ(chunks[1], " Once");  // the text does not start with the space any more
}

TEST(IncrementalDetokenizer, ResetStartsOver) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer("stories260k");
  ASSERT_NE(tok, nullptr);
  IncrementalDetokenizer detok(*tok);
  const auto ids = tok->encode("Once", EncodeOptions{false, false, false});
  std::string first;
  for (int32_t id : ids) first += detok.push(id);
  detok.push(3 + 0xE4);  // a dangling byte
  detok.reset();
  EXPECT_FALSE(detok.has_pending());
  std::string second;
  for (int32_t id : ids) second += detok.push(id);
  second += detok.flush();
  EXPECT_EQ(first, "Once");
  EXPECT_EQ(second, "Once");
  EXPECT_EQ(detok.push(-5), "");
  EXPECT_EQ(detok.push(1 << 20), "");
}

}  // namespace
}  // namespace tachyon::testing
