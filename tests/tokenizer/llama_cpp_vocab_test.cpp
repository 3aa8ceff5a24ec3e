// llama.cpp's tokenizer test vectors (../shared/tokenizers/llama.cpp-vocab): 46 awkward strings
// per vocabulary with the ids the model's own Hugging Face tokenizer gives (no BOS, specials
// not parsed).
#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer_test_util.h"

namespace tachyon::testing {
namespace {

struct VocabCase {
  const char* vectors;    // file stem under llama.cpp-vocab/
  const char* tokenizer;  // shared_tokenizer() name
};

class LlamaCppVocabTest : public ::testing::TestWithParam<VocabCase> {};

TEST_P(LlamaCppVocabTest, MatchesExpectedIds) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const VocabCase& c = GetParam();
  const std::string stem = shared + "/tokenizers/llama.cpp-vocab/" + c.vectors;
  const auto inputs = read_vocab_test_inputs(stem + ".inp");
  const auto expected = read_vocab_test_outputs(stem + ".out");
  ASSERT_EQ(inputs.size(), 46u);
  ASSERT_EQ(expected.size(), inputs.size());
  const Tokenizer* tok = shared_tokenizer(c.tokenizer);
  ASSERT_NE(tok, nullptr);
  int matched = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto ids = tok->encode(inputs[i], EncodeOptions{false, false, false});
    if (ids == expected[i]) {
      ++matched;
    } else {
      ADD_FAILURE() << c.vectors << " string " << i << " '" << escape_bytes(inputs[i]) << "'\n  expected "
                    << ids_to_string(expected[i]) << "\n  got      " << ids_to_string(ids);
    }
  }
  std::printf("[ vectors  ] %s via %s: %d/%zu strings match\n", c.vectors, c.tokenizer, matched, inputs.size());
}

INSTANTIATE_TEST_SUITE_P(
    Vocabularies, LlamaCppVocabTest,
    ::testing::Values(VocabCase{"ggml-vocab-gpt-2.gguf", "gpt2-gguf"}, VocabCase{"ggml-vocab-gpt-2.gguf", "gpt2-files"},
                      VocabCase{"ggml-vocab-llama-spm.gguf", "llama-spm-gguf"},
                      VocabCase{"ggml-vocab-llama-spm.gguf", "llama2-bin"},
                      VocabCase{"ggml-vocab-llama-spm.gguf", "codellama-hf"},
                      VocabCase{"ggml-vocab-phi-3.gguf", "phi-3-gguf"},
                      VocabCase{"ggml-vocab-llama-bpe.gguf", "llama3-tiktoken"},
                      VocabCase{"ggml-vocab-qwen2.gguf", "qwen-tiktoken"},
                      VocabCase{"ggml-vocab-falcon.gguf", "falcon-gguf"},
                      VocabCase{"ggml-vocab-mpt.gguf", "mpt-gguf"}),
    [](const ::testing::TestParamInfo<VocabCase>& info) {
      std::string name = info.param.tokenizer;
      for (char& ch : name) {
        if (ch == '-') ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace tachyon::testing
