// Long inputs: 1 MB of English, one very long word (no pre-tokenizer split to help) and long
// runs of one character class round-trip exactly. Tests assert no timings; a quadratic BPE or
// a backtracking regex shows up as the test's ctest timeout, and the times are printed.
#include <gtest/gtest.h>

#include <random>

#include "core/timer.h"
#include "test_util.h"
#include "tokenizer_test_util.h"

namespace tachyon::testing {
namespace {

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

class LongInputTest : public ::testing::TestWithParam<const char*> {};

TEST_P(LongInputTest, OneMegabyteOfEnglish) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const std::string text = english_megabyte();
  Timer timer;
  const auto ids = tok->encode(text, EncodeOptions{false, false, false});
  const double seconds = timer.seconds();
  std::printf("[ speed    ] %s: %zu bytes -> %zu ids in %.3f s\n", GetParam(), text.size(), ids.size(), seconds);
  EXPECT_EQ(tok->decode(ids), text);
}

TEST_P(LongInputTest, LongWordIsNotQuadratic) {
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
  EXPECT_EQ(tok->decode(ids), word);
}

TEST_P(LongInputTest, LongRunsOfOneCharacterClass) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  // Lookahead patterns such as \s+(?!\S) backtrack over the whole run.
  for (const std::string& run : {std::string(1 << 18, ' '), std::string(1 << 18, '\n'), std::string(1 << 18, '7'),
                                 std::string(1 << 17, '!'), std::string(1 << 16, '\t') + "x"}) {
    Timer timer;
    const auto ids = tok->encode(run, EncodeOptions{false, false, false});
    std::printf("[ time     ] %s: a run of %zu x '%s' in %.3f s\n", GetParam(), run.size(),
                escape_bytes(run.substr(0, 1)).c_str(), timer.seconds());
    EXPECT_EQ(tok->decode(ids), run) << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, LongInputTest,
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
