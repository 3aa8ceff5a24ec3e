// safetensors: single files with every dtype, sharded sets with an index, and corrupt files
// (truncations, bad headers, bad offsets and shapes, unknown dtypes, random mutations).
#include <gtest/gtest.h>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "io_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

using io_test::build_safetensors;
using io_test::expect_error;
using io_test::f32_bytes;
using io_test::StTensor;
using io_test::write_file;
using io_test::write_text;

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<StTensor> every_dtype() {
  return {
      {"f32", "F32", {2, 3}, f32_bytes(6, 1.0f)},
      {"f16", "F16", {2}, bytes_of<uint16_t>({f32_to_f16(1.5f), f32_to_f16(-2.0f)})},
      {"bf16", "BF16", {1, 2}, bytes_of<uint16_t>({f32_to_bf16(0.25f), f32_to_bf16(8.0f)})},
      {"i8", "I8", {3}, bytes_of<int8_t>({-1, 0, 127})},
      {"u8", "U8", {2}, bytes_of<uint8_t>({200, 1})},
      {"i32", "I32", {2}, bytes_of<int32_t>({-7, 1 << 30})},
      {"i64", "I64", {1, 1, 1, 2}, bytes_of<int64_t>({-1, int64_t{1} << 40})},
      {"scalar", "F32", {}, f32_bytes(1, 42.0f)},
      {"empty", "F32", {0, 4}, {}},
      {"mask", "BOOL", {2}, {1, 0}},
      {"f64", "F64", {1}, bytes_of<double>({0.5})},
  };
}

TEST(Safetensors, EveryDtypeRoundTrip) {
  const std::string path = testing::scratch_dir("st") + "/model.safetensors";
  write_file(path, build_safetensors(every_dtype(), {{"format", "pt"}}));
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.tensors().size(), 11u);
  // Listed in file order.
  EXPECT_EQ(f.tensors()[0].name, "f32");
  EXPECT_EQ(f.tensors()[1].name, "f16");

  auto f32 = f.tensor("f32");
  ASSERT_TRUE(f32.ok()) << f32.status().to_string();
  EXPECT_EQ(f32->shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f32->data<float>()[5], 6.0f);
  EXPECT_EQ(f.tensor("f16")->data<uint16_t>()[1], f32_to_f16(-2.0f));
  EXPECT_EQ(f.tensor("f16")->dtype(), DType::kF16);
  EXPECT_EQ(f.tensor("bf16")->to_f32().data<float>()[1], 8.0f);
  EXPECT_EQ(f.tensor("i8")->data<int8_t>()[2], 127);
  EXPECT_EQ(f.tensor("u8")->data<uint8_t>()[0], 200);
  EXPECT_EQ(f.tensor("i32")->data<int32_t>()[1], 1 << 30);
  EXPECT_EQ(f.tensor("i64")->data<int64_t>()[1], int64_t{1} << 40);
  EXPECT_EQ(f.tensor("i64")->dim(), 4);
  EXPECT_EQ(f.tensor("scalar")->dim(), 0);
  EXPECT_EQ(f.tensor("scalar")->data<float>()[0], 42.0f);
  EXPECT_EQ(f.tensor("empty")->numel(), 0);
  const TensorMeta* mask = f.find("mask");
  ASSERT_NE(mask, nullptr);
  EXPECT_FALSE(mask->supported);
  EXPECT_EQ(mask->stored_type, "BOOL");
  expect_error(f.tensor("mask").status(), ErrorCode::kUnsupported, path, {"'mask'", "BOOL"});
  expect_error(f.tensor("f64").status(), ErrorCode::kUnsupported, path, {"'f64'", "F64"});
  expect_error(f.tensor("absent").status(), ErrorCode::kNotFound, path, {"'absent'"});
}

TEST(Safetensors, ViewsAreZeroCopyAndMisalignedDataIsCopied) {
  const std::string dir = testing::scratch_dir("st-align");
  for (size_t padding = 0; padding < 8; ++padding) {
    SCOPED_TRACE(padding);
    const std::string path = dir + "/m" + std::to_string(padding) + ".safetensors";
    write_file(path, build_safetensors({{"a", "F32", {3}, f32_bytes(3, 1.0f)}, {"b", "F32", {4}, f32_bytes(4, 10.0f)}},
                                       {}, padding));
    auto source = SafetensorsWeightSource::open(path);
    ASSERT_TRUE(source.ok()) << source.status().to_string();
    const auto& mapping = (*source)->shards()[0]->mapped_file();
    auto b = (*source)->tensor("b");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->raw_data()) % 4, 0u);
    EXPECT_EQ(b->data<float>()[3], 13.0f);
    const auto* p = static_cast<const uint8_t*>(b->raw_data());
    const bool inside = p >= mapping->data() && p < mapping->data() + mapping->size();
    const bool aligned_in_file = ((*source)->shards()[0]->data_offset() + 12) % 4 == 0;
    EXPECT_EQ(inside, aligned_in_file);
  }
}

// Writes shard files and an index into `dir`.
void write_sharded(const std::string& dir, const std::string& index_text) {
  write_file(dir + "/model-00001-of-00002.safetensors",
             build_safetensors({{"model.embed_tokens.weight", "F32", {4, 2}, f32_bytes(8, 0.0f)},
                                {"model.layers.0.mlp.up_proj.weight", "BF16", {2, 2},
                                 bytes_of<uint16_t>({0x3f80, 0x4000, 0x4040, 0x4080})},
                                {"extra", "F32", {1}, f32_bytes(1)}}));
  write_file(dir + "/model-00002-of-00002.safetensors",
             build_safetensors({{"lm_head.weight", "F16", {4, 2}, std::vector<uint8_t>(16, 0)},
                                {"model.norm.weight", "F32", {2}, f32_bytes(2, 5.0f)}}));
  write_text(dir + "/model.safetensors.index.json", index_text);
}

const char* kIndex = R"({
  "metadata": {"total_size": 92},
  "weight_map": {
    "lm_head.weight": "model-00002-of-00002.safetensors",
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors"
  }
})";

TEST(Safetensors, ShardedIndex) {
  const std::string dir = testing::scratch_dir("st-sharded");
  write_sharded(dir, kIndex);
  auto source = SafetensorsWeightSource::open(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  EXPECT_EQ((*source)->shards().size(), 2u);
  // File order: shard 1 then shard 2, by offset; "extra" is not in the weight_map.
  EXPECT_EQ((*source)->tensor_names(),
            (std::vector<std::string>{"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                                      "lm_head.weight", "model.norm.weight"}));
  EXPECT_EQ((*source)->find("extra"), nullptr);
  EXPECT_EQ((*source)->index_metadata()["total_size"], 92);
  EXPECT_EQ((*source)->find("lm_head.weight")->dtype, DType::kF16);
  EXPECT_EQ((*source)->find("model.layers.0.mlp.up_proj.weight")->stored_type, "BF16");
  auto norm = (*source)->tensor("model.norm.weight");
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->data<float>()[1], 6.0f);
  auto up = (*source)->tensor("model.layers.0.mlp.up_proj.weight");
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->to_f32().data<float>()[3], 4.0f);
  expect_error((*source)->tensor("extra").status(), ErrorCode::kNotFound, "model.safetensors.index.json", {"'extra'"});
  EXPECT_NE((*source)->describe().find("2 files"), std::string::npos);
}

TEST(Safetensors, ShardedIndexErrors) {
  const std::string dir = testing::scratch_dir("st-sharded-bad");
  const std::string index = dir + "/model.safetensors.index.json";
  auto open = [&](const std::string& text) {
    write_sharded(dir, text);
    return SafetensorsWeightSource::open(index).status();
  };
  // Listed in the index, missing from its shard: names the tensor, the shard and the index.
  expect_error(open(R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})"),
               ErrorCode::kCorruptFile, index, {"'model.norm.weight'", "model-00001-of-00002.safetensors"});
  expect_error(open(R"({"weight_map": {"w": "model-00009-of-00009.safetensors"}})"), ErrorCode::kNotFound, index,
               {"model-00009-of-00009.safetensors", "'w'"});
  expect_error(open(R"({"weight_map": {"w": 3}})"), ErrorCode::kCorruptFile, index, {"weight_map['w']"});
  expect_error(open(R"({"weight_map": {"w": "/etc/passwd"}})"), ErrorCode::kCorruptFile, index, {"absolute"});
  expect_error(open(R"({"weight_map": {}})"), ErrorCode::kCorruptFile, index, {"empty"});
  expect_error(open(R"({"metadata": {}})"), ErrorCode::kCorruptFile, index, {"weight_map"});
  expect_error(open(R"([1, 2])"), ErrorCode::kCorruptFile, index, {"object"});
  expect_error(open("{\n  \"weight_map\": {\n    \"a\": \"b\",,\n  }\n}"), ErrorCode::kCorruptFile, index,
               {"line 3, column"});
  expect_error(open(""), ErrorCode::kCorruptFile, index, {"invalid JSON"});
  expect_error(SafetensorsWeightSource::open(dir + "/absent.safetensors.index.json").status(), ErrorCode::kNotFound,
               "absent.safetensors.index.json");
  // A corrupt shard is reported with the index as context.
  write_sharded(dir, kIndex);
  write_file(dir + "/model-00002-of-00002.safetensors", {1, 0, 0, 0, 0, 0, 0, 0, '{'});
  expect_error(SafetensorsWeightSource::open(index).status(), ErrorCode::kCorruptFile, index,
               {"model-00002-of-00002.safetensors", "JSON header"});
}

class SafetensorsCorrupt : public ::testing::Test {
 protected:
  void SetUp() override { path_ = testing::scratch_dir("st-corrupt") + "/bad.safetensors"; }
  Status open_bytes(const std::vector<uint8_t>& bytes) {
    write_file(path_, bytes);
    return SafetensorsFile::open(path_).status();
  }
  // A file whose header is `json` verbatim followed by `data` bytes.
  Status open_header(const std::string& json, size_t data = 64) {
    std::vector<uint8_t> bytes;
    io_test::put<uint64_t>(&bytes, json.size());
    bytes.insert(bytes.end(), json.begin(), json.end());
    bytes.resize(bytes.size() + data, 0);
    return open_bytes(bytes);
  }
  void expect_header(const std::string& json, ErrorCode code, const std::vector<std::string>& needles) {
    expect_error(open_header(json), code, path_, needles);
  }
  std::string path_;
};

TEST_F(SafetensorsCorrupt, EveryTruncationIsReported) {
  const std::vector<uint8_t> full = build_safetensors(every_dtype(), {{"format", "pt"}});
  ASSERT_TRUE(open_bytes(full).ok());
  for (size_t cut = 0; cut < full.size(); ++cut) {
    const Status s = open_bytes(std::vector<uint8_t>(full.begin(), full.begin() + static_cast<ptrdiff_t>(cut)));
    ASSERT_FALSE(s.ok()) << "prefix of " << cut << " bytes opened";
    EXPECT_EQ(s.code(), ErrorCode::kCorruptFile) << cut << ": " << s.to_string();
    EXPECT_NE(s.message().find(path_), std::string::npos) << s.message();
  }
}

TEST_F(SafetensorsCorrupt, HeaderAndTensorFields) {
  expect_error(open_bytes({1, 2, 3}), ErrorCode::kCorruptFile, path_, {"too short"});
  std::vector<uint8_t> huge;
  io_test::put<uint64_t>(&huge, 1ull << 62);
  huge.resize(64, '{');
  expect_error(open_bytes(huge), ErrorCode::kCorruptFile, path_, {"header length 4611686018427387904"});
  expect_header("[]", ErrorCode::kCorruptFile, {"expected an object"});
  expect_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}", ErrorCode::kCorruptFile,
                {"JSON header", "invalid JSON", "line 1"});
  expect_header(R"({"w": 5})", ErrorCode::kCorruptFile, {"tensor 'w'", "expected an object"});
  expect_header(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", ErrorCode::kCorruptFile, {"tensor 'w'", "dtype"});
  expect_header(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", ErrorCode::kCorruptFile, {"tensor 'w'", "shape"});
  expect_header(R"({"w": {"dtype": "F32", "shape": [1]}})", ErrorCode::kCorruptFile, {"tensor 'w'", "data_offsets"});
  expect_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", ErrorCode::kCorruptFile,
                {"data_offsets"});
  expect_header(R"({"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}})", ErrorCode::kUnsupported,
                {"tensor 'w'", "dtype 'Q9'"});
  expect_header(R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 4]}})", ErrorCode::kCorruptFile,
                {"tensor 'w'", "shape[1] = -3"});
  expect_header(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", ErrorCode::kCorruptFile,
                {"tensor 'w'", "shape[0] = 1.5"});
  expect_header(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})",
                ErrorCode::kCorruptFile, {"tensor 'w'", "overflows"});
  expect_header(R"({"w": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})",
                ErrorCode::kCorruptFile, {"tensor 'w'", "more than 2^64"});
  expect_header(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", ErrorCode::kCorruptFile,
                {"tensor 'w'", "hold 4 bytes but the shape needs 8"});
  expect_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", ErrorCode::kCorruptFile,
                {"tensor 'w'", "[8, 4]"});
  expect_header(R"({"w": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}})", ErrorCode::kCorruptFile,
                {"tensor 'w'", "[0, 128]", "64 data bytes"});
  expect_header(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", ErrorCode::kCorruptFile,
                {"tensor 'w'", "data_offsets"});
  expect_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                ErrorCode::kCorruptFile, {"'a' and 'b' overlap"});
  expect_header(R"({"__metadata__": {"format": 1}})", ErrorCode::kCorruptFile, {"__metadata__", "format"});
  expect_header(R"({"__metadata__": []})", ErrorCode::kCorruptFile, {"__metadata__"});
  // Deep nesting is refused without recursing through it.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  expect_header("{\"w\": " + deep + "}", ErrorCode::kCorruptFile, {"JSON header", "nested deeper than", "the limit"});
  expect_header(R"({"w": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 4]}})",
                ErrorCode::kCorruptFile, {"JSON header", "nested deeper than", "the limit"});
  // Nesting within the limit still reaches the field checks.
  const std::string nested = std::string(100, '[') + std::string(100, ']');
  expect_header("{\"w\": " + nested + "}", ErrorCode::kCorruptFile, {"tensor 'w'", "array"});
  expect_header(R"({"w": {"dtype": "F32", "shape": )" + nested + R"(, "data_offsets": [0, 4]}})",
                ErrorCode::kCorruptFile, {"tensor 'w'", "shape[0]"});
  // More than four dimensions: listed, but not loadable as a Tensor.
  ASSERT_TRUE(open_header(R"({"w": {"dtype": "F32", "shape": [1,1,1,1,2], "data_offsets": [0, 8]}})").ok());
  auto f = SafetensorsFile::open(path_);
  ASSERT_TRUE(f.ok());
  expect_error((*f)->tensor("w").status(), ErrorCode::kUnsupported, path_, {"'w'", "[1, 1, 1, 1, 2]"});
}

TEST_F(SafetensorsCorrupt, RandomMutationsNeverCrash) {
  const std::vector<uint8_t> base = build_safetensors(every_dtype(), {{"format", "pt"}});
  auto open = [](const std::string& path) -> Status {
    auto f = SafetensorsWeightSource::open_file(path);
    if (!f.ok()) return f.status();
    io_test::touch_all_tensors(**f, (*f)->shards()[0]->mapped_file().get());
    return Status::Ok();
  };
  io_test::fuzz_file(base, path_, 777u, 3000, open);
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "fresh seed " << seed << " (TACHYON_TEST_SEED reproduces it)");
  io_test::fuzz_file(base, path_, seed, 1000, open);
}

}  // namespace
}  // namespace tachyon
