// Broken and unsupported tokenizer files: every loader must return a Status that names the file
// and the field, never crash. Includes random corruption of real files.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace tachyon::testing {
namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// Expects an error of `code` whose message mentions every string in `parts`.
template <typename T>
void expect_error(const Result<T>& result, ErrorCode code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(result.ok()) << "expected an error mentioning " << *parts.begin();
  EXPECT_EQ(result.status().code(), code) << result.status().to_string();
  for (const std::string& part : parts) {
    EXPECT_NE(result.status().message().find(part), std::string::npos)
        << "'" << part << "' not in: " << result.status().message();
  }
}

std::string json_with_model(const std::string& model) {
  return R"({"added_tokens": [], "normalizer": null, "pre_tokenizer": null, "post_processor": null,
             "decoder": null, "model": )" +
         model + "}";
}

const std::string kGoodModel = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";

class BadHfJson : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = scratch_dir("tok-bad"); }
  Result<std::unique_ptr<Tokenizer>> load(const std::string& json_text, const std::string& config_text = "") {
    write_file(path(), json_text);
    std::string config_path;
    if (!config_text.empty()) {
      config_path = dir_ + "/tokenizer_config.json";
      write_file(config_path, config_text);
    }
    return Tokenizer::from_hf_json(path(), config_path);
  }
  std::string path() const { return dir_ + "/tokenizer.json"; }
  std::string dir_;
};

TEST_F(BadHfJson, GoodBaselineLoads) {
  auto tok = load(json_with_model(kGoodModel));
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->encode("ab"), (std::vector<int32_t>{2}));
}

TEST_F(BadHfJson, MissingAndTruncatedFiles) {
  expect_error(Tokenizer::from_hf_json(dir_ + "/nope.json", ""), ErrorCode::kNotFound, {"nope.json"});
  const std::string good = json_with_model(kGoodModel);
  expect_error(load(good.substr(0, good.size() / 2)), ErrorCode::kCorruptFile, {path(), "invalid JSON"});
  expect_error(load(""), ErrorCode::kCorruptFile, {path()});
  expect_error(load("[1, 2]"), ErrorCode::kCorruptFile, {path(), "object"});
  expect_error(load(R"({"version": "1.0"})"), ErrorCode::kCorruptFile, {path(), "model"});
}

TEST_F(BadHfJson, UnsupportedModelTypes) {
  expect_error(load(json_with_model(R"({"type": "WordPiece", "vocab": {"a": 0}})")), ErrorCode::kUnsupported,
               {path(), "model.type", "WordPiece"});
  expect_error(load(json_with_model(R"({"type": "Unigram", "vocab": [["a", 0.0]]})")), ErrorCode::kUnsupported,
               {path(), "Unigram"});
  expect_error(load(json_with_model(R"({"type": "WordLevel", "vocab": {"a": 0}})")), ErrorCode::kUnsupported,
               {"WordLevel"});
  expect_error(load(json_with_model(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [],
                                        "continuing_subword_prefix": "##"})")),
               ErrorCode::kUnsupported, {"continuing_subword_prefix"});
}

TEST_F(BadHfJson, MalformedModelFields) {
  expect_error(load(json_with_model(R"({"type": "BPE", "vocab": ["a"], "merges": []})")), ErrorCode::kCorruptFile,
               {path(), "model.vocab"});
  expect_error(load(json_with_model(R"({"type": "BPE", "vocab": {"a": -1}, "merges": []})")),
               ErrorCode::kCorruptFile, {"model.vocab", "-1"});
  expect_error(load(json_with_model(R"({"type": "BPE", "vocab": {"a": "zero"}, "merges": []})")),
               ErrorCode::kCorruptFile, {"model.vocab"});
  expect_error(load(json_with_model(R"({"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []})")),
               ErrorCode::kCorruptFile, {"id 0"});
  expect_error(load(json_with_model(R"({"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b", "ab"]})")),
               ErrorCode::kCorruptFile, {"model.merges[1]"});
  expect_error(load(json_with_model(R"({"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [[1, 2]]})")),
               ErrorCode::kCorruptFile, {"model.merges[0]"});
  expect_error(load(json_with_model(R"({"type": "BPE", "vocab": {"a": 0}})")), ErrorCode::kCorruptFile,
               {"model.merges"});
  expect_error(load(json_with_model(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [], "byte_fallback": "yes"})")),
               ErrorCode::kCorruptFile, {"byte_fallback"});
}

TEST_F(BadHfJson, MalformedPipelineFields) {
  auto with = [&](const std::string& key, const std::string& value) {
    return R"({"model": )" + kGoodModel + R"(, ")" + key + R"(": )" + value + "}";
  };
  expect_error(load(with("added_tokens", R"([{"id": "x", "content": "<s>"}])")), ErrorCode::kCorruptFile,
               {"added_tokens[0].id"});
  expect_error(load(with("added_tokens", R"([{"id": 5}])")), ErrorCode::kCorruptFile, {"added_tokens[0].content"});
  expect_error(load(with("normalizer", R"({"type": "BertNormalizer"})")), ErrorCode::kUnsupported,
               {"normalizer", "BertNormalizer"});
  expect_error(load(with("normalizer", R"({"type": "Sequence", "normalizers": [{"type": "Precompiled"}]})")),
               ErrorCode::kUnsupported, {"normalizer.normalizers[0]", "Precompiled"});
  expect_error(load(with("pre_tokenizer", R"({"type": "Split", "pattern": {"Regex": "(unclosed"},
                                              "behavior": "Isolated", "invert": false})")),
               ErrorCode::kInvalidArgument, {"pre_tokenizer", "(unclosed"});
  expect_error(load(with("pre_tokenizer", R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"})")),
               ErrorCode::kUnsupported, {"pre_tokenizer.behavior", "Sideways"});
  expect_error(load(with("pre_tokenizer", R"({"type": "BertPreTokenizer"})")), ErrorCode::kUnsupported,
               {"BertPreTokenizer"});
  expect_error(load(with("post_processor", R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}],
                                               "special_tokens": {}})")),
               ErrorCode::kCorruptFile, {"post_processor.special_tokens"});
  expect_error(load(json_with_model(kGoodModel), "{not json"), ErrorCode::kCorruptFile, {"tokenizer_config.json"});
  expect_error(load(json_with_model(kGoodModel), R"({"add_bos_token": "yes"})"), ErrorCode::kCorruptFile,
               {"tokenizer_config.json", "add_bos_token"});
}

TEST_F(BadHfJson, RandomCorruptionNeverCrashes) {
  const std::string good = json_with_model(
      R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<0x41>": 3}, "merges": ["a b"], "byte_fallback": true})");
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  for (int round = 0; round < 300; ++round) {
    std::string mutated = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) mutated[rng() % mutated.size()] = static_cast<char>(rng() % 128);
    auto tok = load(mutated);
    if (tok.ok()) {
      (void)(*tok)->encode("abba \xFF", EncodeOptions{true, true, true});
    } else {
      EXPECT_NE(tok.status().message().find(path()), std::string::npos)
          << "seed " << seed << ": " << tok.status().message();
    }
  }
}

TEST(BadLlama2cTokenizer, TruncatedOrWrongSize) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const std::string good = read_file_bytes(shared + "/models/stories260K/tok512.bin");
  ASSERT_EQ(good.size(), 6227u);
  const std::string dir = scratch_dir("tok-bad-bin");
  const std::string path = dir + "/tokenizer.bin";
  write_file(path, good.substr(0, 1000));
  expect_error(Tokenizer::from_llama2c(path, 512), ErrorCode::kCorruptFile, {path, "token"});
  write_file(path, good);
  expect_error(Tokenizer::from_llama2c(path, 600), ErrorCode::kCorruptFile, {path, "token 512"});
  expect_error(Tokenizer::from_llama2c(path, 0), ErrorCode::kInvalidArgument, {path, "vocab_size"});
  expect_error(Tokenizer::from_llama2c(path, -4), ErrorCode::kInvalidArgument, {"vocab_size"});
  write_file(path, "");
  expect_error(Tokenizer::from_llama2c(path, 512), ErrorCode::kCorruptFile, {path, "max_token_length"});
  std::string bad_length = good;
  const int32_t huge = 1 << 30;
  std::memcpy(bad_length.data() + 4 + 4, &huge, 4);  // length of token 0
  write_file(path, bad_length);
  expect_error(Tokenizer::from_llama2c(path, 512), ErrorCode::kCorruptFile, {path, "token 0", "length"});
  expect_error(Tokenizer::from_llama2c(dir + "/absent.bin", 512), ErrorCode::kNotFound, {"absent.bin"});
  // A smaller vocab_size than the file holds is only a warning (trailing bytes ignored).
  auto smaller = Tokenizer::from_llama2c(shared + "/models/stories260K/tok512.bin", 300);
  ASSERT_TRUE(smaller.ok()) << smaller.status().to_string();
  EXPECT_EQ((*smaller)->vocab_size(), 300);
}

TEST(BadLlama2cTokenizer, RandomCorruptionNeverCrashes) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  const std::string good = read_file_bytes(shared + "/models/stories260K/tok512.bin");
  const std::string path = scratch_dir("tok-fuzz-bin") + "/tokenizer.bin";
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  for (int round = 0; round < 300; ++round) {
    std::string mutated = good;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) mutated[rng() % mutated.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) mutated.resize(rng() % mutated.size());
    write_file(path, mutated);
    auto tok = Tokenizer::from_llama2c(path, 512);
    if (tok.ok()) {
      const auto ids = (*tok)->encode("Once upon a time \xE2\x98\x83 \xFF");
      (void)(*tok)->decode(ids);
    } else {
      EXPECT_NE(tok.status().message().find(path), std::string::npos) << "seed " << seed;
    }
  }
}

TEST(BadTiktoken, MalformedLines) {
  const std::string dir = scratch_dir("tok-bad-tiktoken");
  const std::string path = dir + "/ranks.tiktoken";
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) {
    static const char* const kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    all_bytes += std::string{kB64[b >> 2], kB64[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  write_file(path, all_bytes + "YWI= 256\n");  // "ab"
  auto good = Tokenizer::from_tiktoken(path, std::string(kGpt2Pattern), {{"<|end|>", 300}});
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ((*good)->encode("ab ab<|end|>", EncodeOptions{false, true, false}),
            (std::vector<int32_t>{256, ' ', 256, 300}));
  EXPECT_EQ((*good)->vocab_size(), 301);

  write_file(path, all_bytes + "Y*I= 256\n");
  expect_error(Tokenizer::from_tiktoken(path, std::string(kGpt2Pattern), {}), ErrorCode::kCorruptFile,
               {path, "line 257", "base64"});
  write_file(path, all_bytes + "YWI= x\n");
  expect_error(Tokenizer::from_tiktoken(path, std::string(kGpt2Pattern), {}), ErrorCode::kCorruptFile,
               {path, "line 257", "rank"});
  write_file(path, all_bytes + "YWI=\n");
  expect_error(Tokenizer::from_tiktoken(path, std::string(kGpt2Pattern), {}), ErrorCode::kCorruptFile,
               {path, "line 257"});
  write_file(path, all_bytes + "YWI= 5\n");
  expect_error(Tokenizer::from_tiktoken(path, std::string(kGpt2Pattern), {}), ErrorCode::kCorruptFile,
               {path, "rank 5 appears twice"});
  write_file(path, "YWI= 0\n");
  expect_error(Tokenizer::from_tiktoken(path, std::string(kGpt2Pattern), {}), ErrorCode::kCorruptFile,
               {path, "byte 0x00"});
  write_file(path, all_bytes);
  expect_error(Tokenizer::from_tiktoken(path, "(", {}), ErrorCode::kInvalidArgument, {path, "pattern"});
  expect_error(Tokenizer::from_tiktoken(path, std::string(kGpt2Pattern), {{"<|x|>", 7}}),
               ErrorCode::kInvalidArgument, {"<|x|>", "7"});
  TiktokenOptions options;
  options.bos_token = "<|nope|>";
  expect_error(Tokenizer::from_tiktoken(path, std::string(kGpt2Pattern), {}, options), ErrorCode::kInvalidArgument,
               {"<|nope|>"});
}

// GGUF tokenizer metadata written by the test.
class BadGgufVocab : public ::testing::Test {
 protected:
  void SetUp() override { path_ = scratch_dir("tok-bad-gguf") + "/vocab.gguf"; }
  Result<std::unique_ptr<Tokenizer>> load(const GgufWriter& writer) {
    const Status written = writer.write(path_);
    EXPECT_TRUE(written.ok()) << written.to_string();
    auto gguf = GgufFile::open(path_);
    if (!gguf.ok()) return gguf.status();
    return Tokenizer::from_gguf(*gguf);
  }
  static GgufWriter llama_vocab(size_t scores) {
    GgufWriter w;
    w.add("tokenizer.ggml.model", gguf_string("llama"));
    w.add("tokenizer.ggml.tokens", gguf_string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a"}));
    std::vector<GgufValue> s;
    for (size_t i = 0; i < scores; ++i) s.push_back(gguf_f32(-static_cast<float>(i)));
    w.add("tokenizer.ggml.scores", gguf_array(GgufValueType::kFloat32, s));
    return w;
  }
  std::string path_;
};

TEST_F(BadGgufVocab, UnsupportedModels) {
  GgufWriter w;
  w.add("tokenizer.ggml.model", gguf_string("bert"));
  w.add("tokenizer.ggml.tokens", gguf_string_array({"[PAD]", "a"}));
  expect_error(load(w), ErrorCode::kUnsupported, {path_, "tokenizer.ggml.model", "bert", "WordPiece"});
  w.add("tokenizer.ggml.model", gguf_string("t5"));
  expect_error(load(w), ErrorCode::kUnsupported, {"Unigram"});
  w.add("tokenizer.ggml.model", gguf_string("gpt2"));
  w.add("tokenizer.ggml.merges", gguf_string_array({"a b"}));
  w.add("tokenizer.ggml.pre", gguf_string("some-new-model"));
  expect_error(load(w), ErrorCode::kUnsupported, {path_, "tokenizer.ggml.pre", "some-new-model", "qwen2"});
  GgufWriter none;
  none.add("general.architecture", gguf_string("llama"));
  expect_error(load(none), ErrorCode::kNotFound, {"tokenizer.ggml.model"});
}

TEST_F(BadGgufVocab, InconsistentArrays) {
  expect_error(load(llama_vocab(4)), ErrorCode::kCorruptFile, {path_, "tokenizer.ggml.scores", "4", "5"});
  GgufWriter w = llama_vocab(5);
  w.add("tokenizer.ggml.token_type", gguf_array(GgufValueType::kInt32, {gguf_i32(1)}));
  expect_error(load(w), ErrorCode::kCorruptFile, {"tokenizer.ggml.token_type"});
  w = llama_vocab(5);
  w.add("tokenizer.ggml.scores", gguf_string_array({"x", "y", "z", "w", "v"}));
  expect_error(load(w), ErrorCode::kCorruptFile, {"tokenizer.ggml.scores"});
  w = llama_vocab(5);
  w.add("tokenizer.ggml.tokens", gguf_string("not an array"));
  expect_error(load(w), ErrorCode::kCorruptFile, {"tokenizer.ggml.tokens"});
  w = llama_vocab(5);
  w.add("tokenizer.ggml.tokens", gguf_string_array({}));
  w.add("tokenizer.ggml.scores", gguf_array(GgufValueType::kFloat32, {}));
  expect_error(load(w), ErrorCode::kCorruptFile, {"tokenizer.ggml.tokens", "empty"});
  w = llama_vocab(5);
  w.add("tokenizer.ggml.add_bos_token", gguf_u32(1));
  expect_error(load(w), ErrorCode::kCorruptFile, {"tokenizer.ggml.add_bos_token"});
  // An id outside the vocabulary is dropped with a warning, not fatal.
  w = llama_vocab(5);
  w.add("tokenizer.ggml.bos_token_id", gguf_u32(99));
  auto tok = load(w);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->bos_id(), -1);
}

}  // namespace
}  // namespace tachyon::testing
