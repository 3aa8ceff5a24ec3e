// The real files in ../shared: stories260K as GGUF and as a llama2.c checkpoint (compared
// tensor by tensor), the F16 llama-2-tiny-random GGUF with its 32,000-token vocabulary, and
// llama.cpp's vocabulary-only GGUF files. Skipped when ../shared is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/gguf.h"
#include "io/llama2c.h"
#include "io/model_format.h"
#include "io/weight_source.h"
#include "io_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

// llama.cpp's GGUF names -> the Hugging Face names the llama2.c reader uses.
std::string hf_name(const std::string& gguf_name) {
  static const std::map<std::string, std::string> kTop = {{"token_embd.weight", "model.embed_tokens.weight"},
                                                          {"output_norm.weight", "model.norm.weight"},
                                                          {"output.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> kBlock = {
      {"attn_norm.weight", "input_layernorm.weight"},   {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},     {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"}};
  if (auto it = kTop.find(gguf_name); it != kTop.end()) return it->second;
  // blk.N.rest
  const size_t dot = gguf_name.find('.', 4);
  const std::string layer = gguf_name.substr(4, dot - 4);
  return "model.layers." + layer + "." + kBlock.at(gguf_name.substr(dot + 1));
}

TEST(SharedModels, Stories260KGgufMatchesLlama2cBitForBit) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const std::string gguf_path = shared + "/models/stories260K-gguf/stories260K.gguf";
  const std::string bin_path = shared + "/models/stories260K/stories260K.bin";
  auto gguf = GgufWeightSource::open(gguf_path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().to_string();
  auto ckpt = Llama2cCheckpoint::open(bin_path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();

  const GgufFile& g = (*gguf)->file();
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.data_offset(), 14176u);
  EXPECT_EQ(g.metadata().size(), 19u);
  EXPECT_EQ(g.tensor_infos().size(), 48u);
  EXPECT_EQ(*g.get_string("general.architecture"), "llama");
  EXPECT_EQ(*g.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(*g.get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(*g.get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(*g.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(*g.get_int("llama.block_count"), 5);
  EXPECT_EQ(*g.get_int("llama.context_length"), 2048);
  EXPECT_EQ(*g.get_int("llama.rope.dimension_count"), 8);
  EXPECT_EQ(*g.get_float("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
  EXPECT_EQ(*g.get_int("tokenizer.ggml.padding_token_id"), 4294967295);  // u32 "none"
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.tokens")->size(), 512u);
  EXPECT_EQ(g.get_float_array("tokenizer.ggml.scores")->size(), 512u);
  EXPECT_EQ(g.get_int_array("tokenizer.ggml.token_type")->size(), 512u);
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.tokens")->at(1), "<s>");

  const Llama2cConfig& c = (*ckpt)->config();
  EXPECT_EQ(c.version, 0);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ((*ckpt)->tensor_names().size(), 48u);

  // Every GGUF tensor equals the llama2.c array of the same role, byte for byte, in the same
  // [out, in] shape. attn_q/attn_k included: llama.cpp's llama2.c converter does NOT permute
  // q/k rows (and needs not: llama2.c and llama.cpp's llama both rotate adjacent pairs), so
  // both files share one RoPE convention and the same weights.
  for (const auto& info : g.tensor_infos()) {
    SCOPED_TRACE(info.name);
    EXPECT_EQ(info.type, GgmlType::kF32);
    const std::string name = hf_name(info.name);
    auto a = (*gguf)->tensor(info.name);
    auto b = (*ckpt)->tensor(name);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(a->shape(), b->shape());
    ASSERT_EQ(a->nbytes(), b->nbytes());
    EXPECT_EQ(std::memcmp(a->raw_data(), b->raw_data(), a->nbytes()), 0);
  }
  EXPECT_EQ((*gguf)->find("blk.0.attn_k.weight")->shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ((*gguf)->find("blk.0.ffn_down.weight")->shape, (std::vector<int64_t>{64, 172}));
  EXPECT_EQ((*gguf)->find("token_embd.weight")->shape, (std::vector<int64_t>{512, 64}));

  auto tokenizer = find_llama2c_tokenizer(bin_path, c.vocab_size);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ(std::filesystem::path(*tokenizer).filename(), "tok512.bin");
  EXPECT_EQ(*detect_model_format(bin_path), ModelFormat::kLlama2c);
  EXPECT_EQ(*detect_model_format(gguf_path), ModelFormat::kGguf);
}

TEST(SharedModels, LlamaTinyRandomF16) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const std::string path = shared + "/models/llama-2-tiny-random-gguf/llama-2-tiny-random.gguf";
  auto source = GgufWeightSource::open(path);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  const GgufFile& g = (*source)->file();
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.metadata().size(), 18u);
  EXPECT_EQ(g.tensor_infos().size(), 12u);
  EXPECT_EQ(g.data_offset(), 724416u);
  EXPECT_EQ(*g.get_int("general.file_type"), 1);
  EXPECT_EQ(*g.get_int("llama.embedding_length"), 8);
  EXPECT_EQ(*g.get_string("tokenizer.ggml.model"), "llama");
  const auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 32000u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[2], "</s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  EXPECT_EQ(g.get_float_array("tokenizer.ggml.scores")->size(), 32000u);
  EXPECT_EQ(*g.get_int("tokenizer.ggml.bos_token_id"), 1);

  auto embed = (*source)->tensor("token_embd.weight");
  ASSERT_TRUE(embed.ok());
  EXPECT_EQ(embed->dtype(), DType::kF16);
  EXPECT_EQ(embed->shape(), (std::vector<int64_t>{32000, 8}));
  const auto& mapping = *g.mapped_file();
  EXPECT_EQ(static_cast<const uint8_t*>(embed->raw_data()), mapping.data() + 724416);  // zero copy
  EXPECT_EQ((*source)->find("blk.0.ffn_down.weight")->shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ((*source)->find("blk.0.ffn_down.weight")->dtype, DType::kF16);
  EXPECT_EQ((*source)->find("output_norm.weight")->dtype, DType::kF32);
  for (const auto& name : (*source)->tensor_names()) {
    auto t = (*source)->tensor(name);
    ASSERT_TRUE(t.ok()) << name;
    const Tensor f = t->to_f32();
    for (int64_t k = 0; k < f.numel(); ++k) ASSERT_TRUE(std::isfinite(f.data<float>()[k])) << name << " " << k;
  }
}

TEST(SharedModels, VocabularyOnlyGgufs) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const std::map<std::string, size_t> kVocab = {{"ggml-vocab-gpt-2.gguf", 50257},   {"ggml-vocab-llama-spm.gguf", 32000},
                                                {"ggml-vocab-phi-3.gguf", 32064},   {"ggml-vocab-falcon.gguf", 65024},
                                                {"ggml-vocab-mpt.gguf", 50432},     {"ggml-vocab-bert-bge.gguf", 30522}};
  for (const auto& [file, vocab] : kVocab) {
    SCOPED_TRACE(file);
    auto g = GgufFile::open(shared + "/tokenizers/llama.cpp-vocab/" + file);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_TRUE(g->tensor_infos().empty());
    EXPECT_EQ(g->get_string_array("tokenizer.ggml.tokens")->size(), vocab);
    EXPECT_TRUE(g->get_string("tokenizer.ggml.model").ok());
  }
  auto gpt2 = GgufFile::open(shared + "/tokenizers/llama.cpp-vocab/ggml-vocab-gpt-2.gguf");
  ASSERT_TRUE(gpt2.ok());
  EXPECT_EQ(gpt2->get_string_array("tokenizer.ggml.merges")->size(), 50000u);
  EXPECT_EQ(*gpt2->get_string("tokenizer.ggml.pre"), "gpt-2");
  auto bert = GgufFile::open(shared + "/tokenizers/llama.cpp-vocab/ggml-vocab-bert-bge.gguf");
  ASSERT_TRUE(bert.ok());
  EXPECT_EQ(*bert->get_bool("bert.attention.causal"), false);
}

// The real files survive truncation too: 300 cut points in the stories GGUF (most inside its
// header) and 100 across the llama2.c checkpoint.
TEST(SharedModels, TruncatedRealFilesAreRefused) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const std::string dir = testing::scratch_dir("shared-cut");
  const auto gguf = io_test::read_file(shared + "/models/stories260K-gguf/stories260K.gguf");
  const auto bin = io_test::read_file(shared + "/models/stories260K/stories260K.bin");
  std::mt19937 rng(testing::fresh_seed());
  for (int k = 0; k < 300; ++k) {
    // Mostly inside the 14 KB of header and tensor infos, where the parsing happens.
    const size_t cut = k < 250 ? rng() % 16000 : rng() % gguf.size();
    io_test::write_file(dir + "/cut.gguf", std::vector<uint8_t>(gguf.begin(), gguf.begin() + static_cast<ptrdiff_t>(cut)));
    const Status s = GgufFile::open(dir + "/cut.gguf").status();
    ASSERT_FALSE(s.ok()) << cut;
    EXPECT_EQ(s.code(), ErrorCode::kCorruptFile) << s.to_string();
    if (k % 3 != 0) continue;
    const size_t cut_bin = rng() % bin.size();
    io_test::write_file(dir + "/cut.bin", std::vector<uint8_t>(bin.begin(), bin.begin() + static_cast<ptrdiff_t>(cut_bin)));
    const Status s2 = Llama2cCheckpoint::open(dir + "/cut.bin").status();
    ASSERT_FALSE(s2.ok()) << cut_bin;
    EXPECT_EQ(s2.code(), ErrorCode::kCorruptFile) << s2.to_string();
  }
}

}  // namespace
}  // namespace tachyon
