// Checkpoints that disagree with themselves: a config naming more layers than the weights hold
// (an error naming the missing tensor and the config key), fewer (a warning naming the tensors
// left unused, as transformers gives), NaN/Inf weights and GGUF block scales (an error at load
// naming the tensor), and token ids outside the vocabulary (a warning; the id is dropped).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "io/gguf.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace tachyon {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return testing::source_dir() + "/tests/fixtures/models/" + name; }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A copy of the llama fixture (2 layers, f32 safetensors) with config.json edited by `edit`.
std::string llama_copy(const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = testing::scratch_dir(tag);
  fs::copy_file(fixture("llama") + "/model.safetensors", dir + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(read_bytes(fixture("llama") + "/config.json"));
  edit(config);
  write_bytes(dir + "/config.json", config.dump());
  return dir;
}

Result<LoadedModel> load_capturing(const std::string& path, std::string* log) {
  LoadOptions options;
  options.path = path;
  ::testing::internal::CaptureStderr();
  auto loaded = load_model(options);
  *log = ::testing::internal::GetCapturedStderr();
  return loaded;
}

// Overwrites the f32 at element `index` of safetensors tensor `name` in the file at `path`.
void poke_safetensors_f32(const std::string& path, const std::string& name, size_t index, float value) {
  std::string bytes = read_bytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_len));
  const size_t at = 8 + header_len + header.at(name).at("data_offsets")[0].get<size_t>() + 4 * index;
  std::memcpy(bytes.data() + at, &value, 4);
  write_bytes(path, bytes);
}

TEST(HostileWeights, FewerLayersThanTensorsWarnsNamingTheUnusedOnes) {
  const std::string dir = llama_copy("layers-fewer", [](nlohmann::json& c) { c["num_hidden_layers"] = 1; });
  std::string log;
  auto loaded = load_capturing(dir, &log);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->model->config().num_layers, 1);
  EXPECT_NE(log.find("not used"), std::string::npos) << log;
  EXPECT_NE(log.find("model.layers.1.self_attn.q_proj.weight"), std::string::npos) << log;
  EXPECT_EQ(log.find("model.layers.0."), std::string::npos) << log;
}

TEST(HostileWeights, MoreLayersThanTensorsIsAnErrorNamingTheConfigKey) {
  const std::string dir = llama_copy("layers-more", [](nlohmann::json& c) { c["num_hidden_layers"] = 3; });
  std::string log;
  auto loaded = load_capturing(dir, &log);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(loaded.status().message().find("model.layers.2."), std::string::npos) << loaded.status().message();
  EXPECT_NE(loaded.status().message().find("num_hidden_layers = 3"), std::string::npos) << loaded.status().message();
}

TEST(HostileWeights, TheUnchangedFixtureLoadsWithoutWarnings) {
  std::string log;
  auto loaded = load_capturing(fixture("llama"), &log);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(log.find("warn"), std::string::npos) << log;
}

TEST(HostileWeights, NonFiniteWeightsAreReportedAtLoadWithTheTensorName) {
  struct Case {
    const char* tensor;
    size_t index;
    float value;
    const char* what;
  };
  const Case cases[] = {
      {"model.layers.1.self_attn.q_proj.weight", 77, std::numeric_limits<float>::quiet_NaN(), "NaN"},
      {"model.norm.weight", 3, -std::numeric_limits<float>::infinity(), "-inf"},
      {"model.embed_tokens.weight", 1000, std::numeric_limits<float>::infinity(), "inf"},
  };
  for (const Case& c : cases) {
    const std::string dir = llama_copy("nonfinite", [](nlohmann::json&) {});
    poke_safetensors_f32(dir + "/model.safetensors", c.tensor, c.index, c.value);
    std::string log;
    auto loaded = load_capturing(dir, &log);
    ASSERT_FALSE(loaded.ok()) << c.tensor;
    EXPECT_EQ(loaded.status().code(), ErrorCode::kCorruptFile);
    EXPECT_NE(loaded.status().message().find(c.tensor), std::string::npos) << loaded.status().message();
    EXPECT_NE(loaded.status().message().find(fmt::format("element {}", c.index)), std::string::npos)
        << loaded.status().message();
    EXPECT_NE(loaded.status().message().find(c.what), std::string::npos) << loaded.status().message();
  }
}

// GGUF Q8_0: the embedding is expanded at load, the linears stay packed; a NaN block scale is
// found in either.
TEST(HostileWeights, NonFiniteGgufBlockScalesAreReportedWithTheTensorName) {
  for (const char* tensor : {"token_embd.weight", "blk.1.ffn_down.weight"}) {
    const std::string dir = testing::scratch_dir("gguf-scale");
    const std::string path = dir + "/model.gguf";
    fs::copy_file(fixture("llama") + "/model-q8_0.gguf", path);
    uint64_t at = 0;
    {
      auto gguf = GgufFile::open(path);
      ASSERT_TRUE(gguf.ok()) << gguf.status().to_string();
      const GgufTensorInfo* info = gguf->find_tensor(tensor);
      ASSERT_NE(info, nullptr) << tensor;
      ASSERT_EQ(info->type, GgmlType::kQ8_0) << tensor;
      at = gguf->data_offset() + info->offset + 34 * 3;  // block 3's f16 scale
    }
    std::string bytes = read_bytes(path);
    const uint16_t nan_f16 = 0x7E00;
    std::memcpy(bytes.data() + at, &nan_f16, 2);
    write_bytes(path, bytes);
    std::string log;
    auto loaded = load_capturing(path, &log);
    ASSERT_FALSE(loaded.ok()) << tensor;
    EXPECT_EQ(loaded.status().code(), ErrorCode::kCorruptFile);
    EXPECT_NE(loaded.status().message().find(tensor), std::string::npos) << loaded.status().message();
    EXPECT_NE(loaded.status().message().find("NaN"), std::string::npos) << loaded.status().message();
  }
}

TEST(HostileWeights, TokenIdsOutsideTheVocabularyAreDroppedWithAWarning) {
  const std::string dir = llama_copy("ids", [](nlohmann::json& c) {
    c["eos_token_id"] = nlohmann::json::array({2, 300});  // the vocabulary has 256
    c["bos_token_id"] = 256;
  });
  std::string log;
  auto loaded = load_capturing(dir, &log);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(loaded->bos_token_id, -1);
  EXPECT_NE(log.find("eos token id 300 is outside the vocabulary"), std::string::npos) << log;
  EXPECT_NE(log.find("bos token id 256 is outside the vocabulary"), std::string::npos) << log;
  // generation_config.json's ids beyond 32 bits are an error, not wrapped to 0.
  write_bytes(dir + "/generation_config.json", R"({"eos_token_id": 1099511627776})");
  loaded = load_capturing(dir, &log);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("generation_config.json"), std::string::npos) << loaded.status().message();
  EXPECT_NE(loaded.status().message().find("1099511627776"), std::string::npos) << loaded.status().message();
}

}  // namespace
}  // namespace tachyon
