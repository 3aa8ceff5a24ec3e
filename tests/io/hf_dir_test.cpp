// Hugging Face directories: required and optional JSON files, weight discovery (single,
// sharded, ambiguous, pickle-only, absent), JSON errors with positions, config.json fuzzing;
// and format detection / open_weight_source over every container.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/gguf_writer.h"
#include "io/hf_dir.h"
#include "io/model_format.h"
#include "io_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

using io_test::build_safetensors;
using io_test::expect_error;
using io_test::f32_bytes;
using io_test::write_file;
using io_test::write_text;

const char* kConfig = R"({
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 8,
  "num_hidden_layers": 1,
  "torch_dtype": "float32"
})";

std::string make_dir(const std::string& tag) {
  const std::string dir = testing::scratch_dir(tag);
  write_text(dir + "/config.json", kConfig);
  write_file(dir + "/model.safetensors", build_safetensors({{"model.norm.weight", "F32", {8}, f32_bytes(8)}}));
  return dir;
}

TEST(HfDirectory, ReadsConfigsAndWeights) {
  const std::string dir = make_dir("hf");
  write_text(dir + "/generation_config.json", R"({"eos_token_id": 2, "temperature": 0.6})");
  write_text(dir + "/tokenizer.json", R"({"model": {"type": "BPE"}})");
  write_text(dir + "/tokenizer_config.json", R"({"chat_template": "{{ messages }}"})");
  auto hf = HfDirectory::open(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  EXPECT_EQ(hf->config()["hidden_size"], 8);
  EXPECT_EQ(hf->config_path(), dir + "/config.json");
  ASSERT_TRUE(hf->generation_config().has_value());
  EXPECT_EQ((*hf->generation_config())["eos_token_id"], 2);
  EXPECT_EQ((*hf->tokenizer_json())["model"]["type"], "BPE");
  EXPECT_EQ((*hf->tokenizer_config())["chat_template"], "{{ messages }}");
  EXPECT_EQ(hf->tokenizer_json_path(), dir + "/tokenizer.json");
  EXPECT_EQ(hf->weights_path(), dir + "/model.safetensors");
  ASSERT_NE(hf->weights(), nullptr);
  auto norm = hf->weights()->tensor("model.norm.weight");
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->data<float>()[7], 7.0f);
}

TEST(HfDirectory, OptionalFilesMayBeAbsent) {
  const std::string dir = make_dir("hf-min");
  auto hf = HfDirectory::open(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  EXPECT_FALSE(hf->generation_config().has_value());
  EXPECT_FALSE(hf->tokenizer_json().has_value());
  EXPECT_FALSE(hf->tokenizer_config().has_value());
  EXPECT_TRUE(hf->tokenizer_json_path().empty());
}

TEST(HfDirectory, FindsWeights) {
  // A single non-standard name.
  std::string dir = make_dir("hf-weights");
  std::filesystem::rename(dir + "/model.safetensors", dir + "/weights.safetensors");
  auto hf = HfDirectory::open(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  EXPECT_EQ(hf->weights_path(), dir + "/weights.safetensors");
  // Two files without an index are ambiguous.
  write_file(dir + "/other.safetensors", build_safetensors({{"x", "F32", {1}, f32_bytes(1)}}));
  expect_error(HfDirectory::open(dir).status(), ErrorCode::kCorruptFile, dir, {"2 .safetensors files", "index"});
  // An index resolves it.
  write_text(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"model.norm.weight": "weights.safetensors", "x": "other.safetensors"}})");
  hf = HfDirectory::open(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  EXPECT_EQ(hf->weights()->tensor_names().size(), 2u);
  EXPECT_EQ(hf->weights()->shards().size(), 2u);
  // Pickle only.
  dir = testing::scratch_dir("hf-pickle");
  write_text(dir + "/config.json", kConfig);
  write_file(dir + "/pytorch_model.bin", {1, 2, 3});
  expect_error(HfDirectory::open(dir).status(), ErrorCode::kUnsupported, dir, {"pickle"});
  // Nothing at all.
  std::filesystem::remove(dir + "/pytorch_model.bin");
  expect_error(HfDirectory::open(dir).status(), ErrorCode::kNotFound, dir, {"no weights"});
}

TEST(HfDirectory, ErrorsNameTheFileAndPosition) {
  const std::string dir = make_dir("hf-bad");
  expect_error(HfDirectory::open(dir + "/nope").status(), ErrorCode::kNotFound, dir + "/nope");
  write_text(dir + "/config.json", "{\n  \"hidden_size\": 8,\n  \"x\": tru\n}");
  expect_error(HfDirectory::open(dir).status(), ErrorCode::kCorruptFile, dir + "/config.json",
               {"line 3, column"});
  write_text(dir + "/config.json", "[1]");
  expect_error(HfDirectory::open(dir).status(), ErrorCode::kCorruptFile, dir + "/config.json", {"object"});
  write_text(dir + "/config.json", kConfig);
  write_text(dir + "/tokenizer.json", "{\"model\": ");
  expect_error(HfDirectory::open(dir).status(), ErrorCode::kCorruptFile, dir + "/tokenizer.json", {"line 1"});
  std::filesystem::remove(dir + "/tokenizer.json");
  write_text(dir + "/generation_config.json", "\xff\xfe");
  expect_error(HfDirectory::open(dir).status(), ErrorCode::kCorruptFile, dir + "/generation_config.json");
  std::filesystem::remove(dir + "/generation_config.json");
  std::filesystem::remove(dir + "/config.json");
  expect_error(HfDirectory::open(dir).status(), ErrorCode::kNotFound, dir, {"config.json"});
  // A corrupt weight file is reported, naming it.
  write_text(dir + "/config.json", kConfig);
  write_file(dir + "/model.safetensors", {9, 0, 0, 0, 0, 0, 0, 0});
  expect_error(HfDirectory::open(dir).status(), ErrorCode::kCorruptFile, dir + "/model.safetensors", {"header length 9"});
}

TEST(HfDirectory, RandomConfigMutationsNeverCrash) {
  const std::string dir = make_dir("hf-fuzz");
  const std::string text = std::string(kConfig);
  const std::vector<uint8_t> base(text.begin(), text.end());
  auto open = [&](const std::string&) -> Status {
    auto hf = HfDirectory::open(dir);
    return hf.ok() ? Status::Ok() : hf.status();
  };
  io_test::fuzz_file(base, dir + "/config.json", 99u, 1000, open);
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "fresh seed " << seed);
  io_test::fuzz_file(base, dir + "/config.json", seed, 300, open);
}

TEST(HfDirectory, RandomIndexMutationsNeverCrash) {
  const std::string dir = make_dir("hf-index-fuzz");
  const std::string text = R"({"metadata": {"total_size": 32}, "weight_map": {"model.norm.weight": "model.safetensors"}})";
  const std::vector<uint8_t> base(text.begin(), text.end());
  auto open = [&](const std::string& path) -> Status {
    auto source = SafetensorsWeightSource::open_index(path);
    if (!source.ok()) return source.status();
    io_test::touch_all_tensors(**source, nullptr);
    return Status::Ok();
  };
  io_test::fuzz_file(base, dir + "/model.safetensors.index.json", 5u, 1000, open);
}

TEST(ModelFormat, DetectsAndOpensEveryContainer) {
  const std::string dir = make_dir("fmt");
  // GGUF.
  GgufWriter w;
  std::mt19937 rng(1);
  ASSERT_TRUE(w.add_tensor("token_embd.weight", testing::random_tensor({4, 2}, rng), GgmlType::kF32).ok());
  ASSERT_TRUE(w.write(dir + "/m.gguf").ok());
  // llama2.c v0 and v1.
  io_test::Llama2cSpec spec;
  write_file(dir + "/stories.bin", io_test::build_llama2c(spec));
  spec.version = 1;
  write_file(dir + "/v1.ckpt", io_test::build_llama2c(spec));
  write_text(dir + "/notes.txt", "hello");

  EXPECT_EQ(*detect_model_format(dir), ModelFormat::kHfDirectory);
  EXPECT_EQ(*detect_model_format(dir + "/m.gguf"), ModelFormat::kGguf);
  EXPECT_EQ(*detect_model_format(dir + "/model.safetensors"), ModelFormat::kSafetensors);
  EXPECT_EQ(*detect_model_format(dir + "/stories.bin"), ModelFormat::kLlama2c);
  EXPECT_EQ(*detect_model_format(dir + "/v1.ckpt"), ModelFormat::kLlama2c);
  expect_error(detect_model_format(dir + "/notes.txt").status(), ErrorCode::kUnsupported, dir + "/notes.txt");
  expect_error(detect_model_format(dir + "/absent").status(), ErrorCode::kNotFound, dir + "/absent");
  EXPECT_STREQ(model_format_name(ModelFormat::kLlama2c), "llama2.c");

  for (const std::string& p : {dir, dir + "/m.gguf", dir + "/model.safetensors", dir + "/stories.bin",
                               dir + "/v1.ckpt"}) {
    SCOPED_TRACE(p);
    auto source = open_weight_source(p);
    ASSERT_TRUE(source.ok()) << source.status().to_string();
    EXPECT_FALSE((*source)->tensor_names().empty());
    EXPECT_FALSE((*source)->describe().empty());
    EXPECT_GT(io_test::touch_all_tensors(**source, nullptr), 0);
  }
}

}  // namespace
}  // namespace tachyon
