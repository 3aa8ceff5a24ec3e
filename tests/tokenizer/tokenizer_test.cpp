// Tokenizer behaviour on small hand-made inputs: a tokenizer.json written by the test (added
// and special tokens, merges in both spellings, post-processor and config precedence), the
// stories260K tokenizer, chat templates and lookups on the real vocabularies.
#include <gtest/gtest.h>

#include <fstream>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace tachyon::testing {
namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A character-level BPE over "a", "b", "c", " " with two merges (one per spelling), an unknown
// token, and added tokens: <|im_start|>/<|im_end|> special, [[x]] not special, <|pad|> with
// lstrip/rstrip.
const char* const kSmallTokenizerJson = R"({
  "version": "1.0",
  "added_tokens": [
    {"id": 0, "content": "<unk>", "special": true},
    {"id": 6, "content": "<|im_start|>", "special": true},
    {"id": 7, "content": "<|im_end|>", "special": true},
    {"id": 8, "content": "[[x]]", "special": false},
    {"id": 9, "content": "<|pad|>", "special": true, "lstrip": true, "rstrip": true}
  ],
  "normalizer": null,
  "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": false},
  "post_processor": {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
               {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
    "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [6], "tokens": ["<|im_start|>"]},
                       "<|im_end|>": {"id": "<|im_end|>", "ids": [7], "tokens": ["<|im_end|>"]}}
  },
  "decoder": null,
  "model": {
    "type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": false,
    "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, " ": 4, "ab": 5, "abc": 10, " a": 11},
    "merges": ["a b", ["ab", "c"], [" ", "a"]]
  }
})";

class SmallHfTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir("tok-small");
    write_file(dir_ + "/tokenizer.json", kSmallTokenizerJson);
    auto loaded = Tokenizer::from_hf_json(dir_ + "/tokenizer.json", "");
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    tok_ = std::move(loaded).value();
  }
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const {
    return tok_->encode(text, EncodeOptions{false, parse_special, false});
  }
  std::string dir_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SmallHfTokenizer, MergesInBothSpellings) {
  EXPECT_EQ(encode("abc", false), (std::vector<int32_t>{10}));
  // " ab": "a b" (rank 0) merges before " a" (rank 2) could.
  EXPECT_EQ(encode("ab ab", false), (std::vector<int32_t>{5, 4, 5}));
  EXPECT_EQ(encode(" ac", false), (std::vector<int32_t>{11, 3}));
  EXPECT_EQ(encode("cab", false), (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(tok_->vocab_size(), 12);
  EXPECT_EQ(tok_->kind(), TokenizerKind::kSentencePieceBpe);  // no byte-level alphabet
}

TEST_F(SmallHfTokenizer, SpecialsNeedParseSpecial) {
  // Parsed: the specials are single ids.
  EXPECT_EQ(encode("ab<|im_start|>ab<|im_end|>", true), (std::vector<int32_t>{5, 6, 5, 7}));
  // Not parsed: the same text is plain characters, unknown ones fused into one <unk> per run
  // ("<|im_st", "a", "rt|>").
  EXPECT_EQ(encode("ab<|im_start|>ab", false), (std::vector<int32_t>{5, 0, 1, 0, 5}));
  // A non-special added token is always recognized.
  EXPECT_EQ(encode("a[[x]]b", false), (std::vector<int32_t>{1, 8, 2}));
  EXPECT_EQ(encode("a[[x]]b", true), (std::vector<int32_t>{1, 8, 2}));
  // Longest match wins when one added token is a prefix of text that continues.
  EXPECT_EQ(encode("<|im_end|><|im_end|", true), (std::vector<int32_t>{7, 0}));
}

TEST_F(SmallHfTokenizer, LstripRstripSwallowSpaces) {
  EXPECT_EQ(encode("a  <|pad|>  b", true), (std::vector<int32_t>{1, 9, 2}));
  // Without the token: pieces "a", " ", " <|pad|>", " ", " b" (spaces merged with what follows).
  EXPECT_EQ(encode("a  <|pad|>  b", false), (std::vector<int32_t>{1, 4, 4, 0, 1, 0, 4, 4, 2}));
}

TEST_F(SmallHfTokenizer, PostProcessorGivesBosAndEos) {
  EXPECT_EQ(tok_->bos_id(), 6);
  ASSERT_FALSE(tok_->eos_ids().empty());
  EXPECT_EQ(tok_->eos_ids().front(), 7);
  EXPECT_TRUE(tok_->add_bos_by_default());
  EXPECT_TRUE(tok_->add_eos_by_default());
  EXPECT_EQ(tok_->encode("ab"), (std::vector<int32_t>{6, 5, 7}));
  EXPECT_EQ(tok_->decode({6, 5, 7}, false), "<|im_start|>ab<|im_end|>");
  EXPECT_EQ(tok_->decode({6, 5, 8, 7}, true), "ab[[x]]");
  EXPECT_EQ(tok_->token_id("<|im_end|>"), 7);
  EXPECT_EQ(tok_->token_id(" a"), 11);
  EXPECT_FALSE(tok_->token_id("zzz").has_value());
  EXPECT_TRUE(tok_->is_special(6));
  EXPECT_FALSE(tok_->is_special(8));
  EXPECT_EQ(tok_->token_type(0), TokenType::kUnknown);
  EXPECT_EQ(tok_->token_type(8), TokenType::kUserDefined);
}

TEST_F(SmallHfTokenizer, ConfigOverridesPostProcessor) {
  write_file(dir_ + "/tokenizer_config.json", R"({
    "add_bos_token": false, "add_eos_token": false,
    "bos_token": {"content": "<|im_start|>", "special": true}, "eos_token": "<|im_end|>",
    "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
  })");
  auto loaded = Tokenizer::from_hf_json(dir_ + "/tokenizer.json", dir_ + "/tokenizer_config.json");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const Tokenizer& tok = **loaded;
  EXPECT_FALSE(tok.add_bos_by_default());
  EXPECT_FALSE(tok.add_eos_by_default());
  EXPECT_EQ(tok.bos_id(), 6);
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{5}));
  EXPECT_EQ(tok.encode("ab", EncodeOptions{true, false, false}), (std::vector<int32_t>{6, 5}));
  EXPECT_EQ(tok.chat_template(), "D");
}

TEST(Tokenizer, Stories260kOnceUponATime) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* tok = shared_tokenizer("stories260k");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{2}));
  EXPECT_TRUE(tok->add_bos_by_default());
  // llama2.c's run.c: BOS, then the pieces of " Once upon a time".
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378};
  EXPECT_EQ(tok->encode("Once upon a time"), ids);
  EXPECT_EQ(tok->decode(ids, true), "Once upon a time");
  EXPECT_EQ(tok->token_to_piece(403), " Once");
  EXPECT_EQ(tok->encode(""), (std::vector<int32_t>{1}));
  // Characters outside its 512 pieces fall back to bytes (id = 3 + byte).
  const auto snowman = tok->encode("\xE2\x98\x83", EncodeOptions{false, false, false});
  EXPECT_EQ(snowman.back(), 3 + 0x83);
  EXPECT_EQ(tok->decode(snowman), "\xE2\x98\x83");
  EXPECT_EQ(tok->kind(), TokenizerKind::kSentencePieceBpe);
}

TEST(Tokenizer, ChatTemplatesAndLookups) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const Tokenizer* phi3 = shared_tokenizer("phi-3-gguf");
  ASSERT_NE(phi3, nullptr);
  EXPECT_NE(phi3->chat_template().find("<|assistant|>"), std::string::npos);
  EXPECT_TRUE(phi3->is_eos(*phi3->token_id("<|end|>")));
  const Tokenizer* gpt2 = shared_tokenizer("gpt2-files");
  ASSERT_NE(gpt2, nullptr);
  EXPECT_TRUE(gpt2->chat_template().empty());
  EXPECT_EQ(gpt2->token_id("\xC4\xA0the"), gpt2->token_id(" the"));  // "Ġthe" and its raw bytes
  EXPECT_EQ(gpt2->token_id("<|endoftext|>"), 50256);
  EXPECT_EQ(gpt2->token_to_piece(gpt2->token_id(" the").value()), " the");
  const Tokenizer* llama3 = shared_tokenizer("llama3-tiktoken");
  ASSERT_NE(llama3, nullptr);
  EXPECT_EQ(llama3->bos_id(), 128000);
  EXPECT_TRUE(llama3->is_eos(128009));  // <|eot_id|>
  EXPECT_TRUE(llama3->is_eos(128001));  // <|end_of_text|>
  EXPECT_EQ(llama3->encode("Hello").front(), 128000);
  EXPECT_EQ(llama3->vocab_size(), 128256);
  EXPECT_EQ(llama3->token_to_piece(-1), "");
  EXPECT_EQ(llama3->token_to_piece(1 << 30), "");
  EXPECT_EQ(llama3->decode({-3, 9906, 1 << 30}), "Hello");
}

TEST(Tokenizer, EmptyAndWhitespaceOnly) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  for (const char* name : {"gpt2-files", "llama-spm-gguf", "llama3-tiktoken", "codellama-hf"}) {
    const Tokenizer* tok = shared_tokenizer(name);
    ASSERT_NE(tok, nullptr);
    EXPECT_TRUE(tok->encode("", EncodeOptions{false, false, false}).empty()) << name;
    EXPECT_EQ(tok->decode(tok->encode("   \n\t", EncodeOptions{false, false, false})), "   \n\t") << name;
  }
}

}  // namespace
}  // namespace tachyon::testing
