// GGUF tokenizer metadata built by the test: SentencePiece ("llama") scoring, byte fallback,
// unknown tokens, user-defined tokens, add_space_prefix; byte-level ("gpt2") merges, control
// tokens and the pre-tokenizer choice.
#include <gtest/gtest.h>

#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tachyon {
namespace {

using testing::scratch_dir;

Result<std::unique_ptr<Tokenizer>> load(const GgufWriter& writer, const std::string& path) {
  TACHYON_RETURN_IF_ERROR(writer.write(path));
  TACHYON_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::open(path));
  return Tokenizer::from_gguf(gguf);
}

GgufValue int_array(const std::vector<int32_t>& values) {
  std::vector<GgufValue> out;
  for (int32_t v : values) out.push_back(gguf_i32(v));
  return gguf_array(GgufValueType::kInt32, out);
}

GgufValue float_array(const std::vector<float>& values) {
  std::vector<GgufValue> out;
  for (float v : values) out.push_back(gguf_f32(v));
  return gguf_array(GgufValueType::kFloat32, out);
}

// ids:                   0        1      2       3          4    5    6           7     8
const std::vector<std::string> kSpmTokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab",
                                             // 9                    10          11        12
                                             "\xE2\x96\x81" "ab", "<|user|>", "<0xC3>", "<0xA9>"};
const std::vector<int32_t> kSpmTypes = {2, 3, 3, 1, 1, 1, 1, 1, 1, 4, 6, 6};
const std::vector<float> kSpmScores = {0, 0, 0, -10, -11, -12, -1, -2, -3, 0, 0, 0};

GgufWriter spm_writer() {
  GgufWriter w;
  w.add("tokenizer.ggml.model", gguf_string("llama"));
  w.add("tokenizer.ggml.tokens", gguf_string_array(kSpmTokens));
  w.add("tokenizer.ggml.token_type", int_array(kSpmTypes));
  w.add("tokenizer.ggml.scores", float_array(kSpmScores));
  w.add("tokenizer.ggml.bos_token_id", gguf_u32(1));
  w.add("tokenizer.ggml.eos_token_id", gguf_u32(2));
  w.add("tokenizer.chat_template", gguf_string("{{ messages }}"));
  return w;
}

TEST(GgufVocab, SentencePieceMergesByScore) {
  auto tok = load(spm_writer(), scratch_dir("tok-gguf") + "/spm.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.kind(), TokenizerKind::kSentencePieceBpe);
  EXPECT_TRUE(t.add_bos_by_default());
  EXPECT_EQ(t.chat_template(), "{{ messages }}");
  // "▁a▁ab": "▁a" (best score) merges twice, leftmost first, leaving "▁a" + "b" -> "▁ab".
  EXPECT_EQ(t.encode("a ab"), (std::vector<int32_t>{1, 6, 8}));
  EXPECT_EQ(t.decode({1, 6, 8}, true), "a ab");
  // Byte fallback for "é" (C3 A9), the unknown token for "x" (no byte token for it).
  EXPECT_EQ(t.encode("\xC3\xA9x", EncodeOptions{false, false, false}), (std::vector<int32_t>{3, 10, 11, 0}));
  EXPECT_EQ(t.decode({3, 10, 11}), "\xC3\xA9");
  // User-defined tokens are cut out even without parse_special; each text segment gets "▁".
  EXPECT_EQ(t.encode("a<|user|>b", EncodeOptions{false, false, false}), (std::vector<int32_t>{6, 9, 3, 5}));
  // Control tokens only with parse_special.
  EXPECT_EQ(t.encode("</s>", EncodeOptions{false, true, false}), (std::vector<int32_t>{2}));
  EXPECT_NE(t.encode("</s>", EncodeOptions{false, false, false}), (std::vector<int32_t>{2}));
  EXPECT_EQ(t.token_type(0), TokenType::kUnknown);
  EXPECT_EQ(t.token_type(9), TokenType::kUserDefined);
  EXPECT_EQ(t.token_type(10), TokenType::kByte);
}

TEST(GgufVocab, SentencePieceWithoutSpacePrefix) {
  GgufWriter w = spm_writer();
  w.add("tokenizer.ggml.add_space_prefix", gguf_bool(false));
  w.add("tokenizer.ggml.add_bos_token", gguf_bool(false));
  auto tok = load(w, scratch_dir("tok-gguf") + "/spm-noprefix.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_FALSE((*tok)->add_bos_by_default());
  EXPECT_EQ((*tok)->encode("a b"), (std::vector<int32_t>{4, 3, 5}));
  EXPECT_EQ((*tok)->decode({3, 4}), " a");  // nothing to strip: no prefix was added
}

TEST(GgufVocab, ByteLevelMergesAndPreTokenizer) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_level_encode(std::string(1, static_cast<char>(b))));
    types.push_back(1);
  }
  tokens.push_back(byte_level_encode(" a"));  // 256
  tokens.push_back(byte_level_encode("12"));  // 257
  tokens.push_back("<|endoftext|>");          // 258
  types.insert(types.end(), {1, 1, 3});
  GgufWriter w;
  w.add("tokenizer.ggml.model", gguf_string("gpt2"));
  w.add("tokenizer.ggml.tokens", gguf_string_array(tokens));
  w.add("tokenizer.ggml.token_type", int_array(types));
  w.add("tokenizer.ggml.merges", gguf_string_array({"\xC4\xA0 a", "1 2"}));
  w.add("tokenizer.ggml.eos_token_id", gguf_u32(258));
  w.add("tokenizer.ggml.pre", gguf_string("qwen2"));  // digits one by one
  const std::string dir = scratch_dir("tok-gguf");
  auto tok = load(w, dir + "/bpe.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->kind(), TokenizerKind::kByteLevelBpe);
  EXPECT_FALSE((*tok)->add_bos_by_default());
  EXPECT_EQ((*tok)->encode(" a a12<|endoftext|>", EncodeOptions{false, true, false}),
            (std::vector<int32_t>{256, 256, '1', '2', 258}));
  w.add("tokenizer.ggml.pre", gguf_string("gpt-2"));  // digit runs stay together
  tok = load(w, dir + "/bpe2.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->encode(" a a12", EncodeOptions{false, true, false}), (std::vector<int32_t>{256, 256, 257}));
  EXPECT_EQ((*tok)->token_id("\xC4\xA0" "a"), 256);
  EXPECT_EQ((*tok)->decode({256, 257, 258}, true), " a12");
}

}  // namespace
}  // namespace tachyon
