// Encoding speed: 1 MB of English must take well under a second, and one very long word (no
// pre-tokenizer split to help) must not go quadratic. Bounds are loose so that a loaded CI
// machine passes; the measured times are printed.
#include <gtest/gtest.h>

#include <random>

#include "core/timer.h"
#include "test_util.h"
#include "tokenizer_test_util.h"

namespace tachyon::testing {
namespace {

// Sanitizer builds run several times slower; the bounds are about complexity, not constants.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kSecondsBound = 20.0;
#else
constexpr double kSecondsBound = 2.0;
#endif

std::string english_megabyte() {
  // Varied words so that a per-word cache cannot do all the work.
  static const char* const kWords[] = {
      "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "while", "seventeen", "curious", "engineers",
      "measure", "throughput", "of", "tokenizers,", "and", "nobody", "expects", "it", "to", "be", "slow.",
      "Meanwhile", "(in", "2024)", "prices", "rose", "by", "3.5%", "\"quoted\"", "don't", "they're", "it's"};
  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::uniform_int_distribution<int> suffix(0, 999);
  std::string text;
  text.reserve(1 << 20);
  while (text.size() < (1u << 20)) {
    text += kWords[pick(rng)];
    if (suffix(rng) < 150) text += std::to_string(suffix(rng));
    text += (suffix(rng) < 30) ? "\n" : " ";
  }
  return text;
}

class EncodeSpeedTest : public ::testing::TestWithParam<const char*> {};

TEST_P(EncodeSpeedTest, OneMegabyteOfEnglish) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const std::string text = english_megabyte();
  Timer timer;
  const auto ids = tok->encode(text, EncodeOptions{false, false, false});
  const double seconds = timer.seconds();
  std::printf("[ speed    ] %s: %zu bytes -> %zu ids in %.3f s\n", GetParam(), text.size(), ids.size(), seconds);
  EXPECT_LT(seconds, kSecondsBound);
  EXPECT_EQ(tok->decode(ids), text);
}

TEST_P(EncodeSpeedTest, LongWordIsNotQuadratic) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  // 200 KB of letters without a break: one pre-token for every pattern.
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> letter(0, 25);
  std::string word;
  for (int i = 0; i < 200000; ++i) word.push_back(static_cast<char>('a' + letter(rng)));
  Timer timer;
  const auto ids = tok->encode(word, EncodeOptions{false, false, false});
  const double seconds = timer.seconds();
  std::printf("[ speed    ] %s: one %zu-byte word -> %zu ids in %.3f s\n", GetParam(), word.size(), ids.size(),
              seconds);
  EXPECT_LT(seconds, kSecondsBound);
  EXPECT_EQ(tok->decode(ids), word);
}

TEST_P(EncodeSpeedTest, LongRunsOfOneCharacterClass) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  // Lookahead patterns such as \s+(?!\S) backtrack over the whole run.
  for (const std::string& run : {std::string(1 << 18, ' '), std::string(1 << 18, '\n'), std::string(1 << 18, '7'),
                                 std::string(1 << 17, '!'), std::string(1 << 16, '\t') + "x"}) {
    Timer timer;
    const auto ids = tok->encode(run, EncodeOptions{false, false, false});
    const double seconds = timer.seconds();
    EXPECT_LT(seconds, kSecondsBound) << GetParam() << " on a run of " << run.size() << " x '" << escape_bytes(run.substr(0, 1))
                            << "'";
    EXPECT_EQ(tok->decode(ids), run) << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, EncodeSpeedTest,
                         ::testing::Values("llama3-tiktoken", "gpt2-files", "llama-spm-gguf", "codellama-hf"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace tachyon::testing
