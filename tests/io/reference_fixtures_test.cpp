// Files written by the reference Python implementations (gguf-py, safetensors; see
// tools/reference/make_io_fixtures.py) read back with the expected values, and Tachyon's
// Q8_0/Q4_0/Q5_0 quantizers compared byte for byte with gguf-py's blocks.
#include <gtest/gtest.h>

#include <cstdlib>

#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "io_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

std::string fixture(const std::string& name) { return testing::source_dir() + "/tests/fixtures/io/" + name; }

nlohmann::json expected() {
  auto j = read_json_file(fixture("reference_expected.json"));
  EXPECT_TRUE(j.ok()) << j.status().to_string();
  return j.ok() ? *j : nlohmann::json::object();
}

std::vector<float> values_f32(const Tensor& t) {
  const Tensor f = t.to_f32();
  return {f.data<float>(), f.data<float>() + f.numel()};
}

TEST(ReferenceFixtures, GgufFromGgufPy) {
  const nlohmann::json e = expected();
  auto g = GgufFile::open(fixture("reference.gguf"));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(*g->get_string("general.architecture"), "llama");
  const auto& m = e["gguf_metadata"];
  EXPECT_EQ(g->find("t.u8")->u, m["t.u8"].get<uint64_t>());
  EXPECT_EQ(g->find("t.i8")->i, m["t.i8"].get<int64_t>());
  EXPECT_EQ(g->find("t.u16")->u, m["t.u16"].get<uint64_t>());
  EXPECT_EQ(g->find("t.i16")->i, m["t.i16"].get<int64_t>());
  EXPECT_EQ(g->find("t.u32")->u, m["t.u32"].get<uint64_t>());
  EXPECT_EQ(g->find("t.i32")->i, m["t.i32"].get<int64_t>());
  EXPECT_EQ(std::to_string(g->find("t.u64")->u), m["t.u64"].get<std::string>());
  EXPECT_EQ(g->find("t.i64")->i, m["t.i64"].get<int64_t>());
  EXPECT_EQ(g->find("t.f32")->f, m["t.f32"].get<double>());
  EXPECT_EQ(g->find("t.f64")->f, m["t.f64"].get<double>());
  EXPECT_EQ(*g->get_bool("t.bool"), true);
  EXPECT_EQ(*g->get_string("t.string"), m["t.string"].get<std::string>());
  EXPECT_EQ(*g->get_string_array("t.strings"), m["t.strings"].get<std::vector<std::string>>());
  EXPECT_EQ(*g->get_float_array("t.f32s"), m["t.f32s"].get<std::vector<double>>());
  EXPECT_EQ(*g->get_int_array("t.i32s"), m["t.i32s"].get<std::vector<int64_t>>());
  const GgufValue* nested = g->find("t.nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->array.size(), 2u);
  EXPECT_EQ(nested->array[0].array[1].i, 2);
  EXPECT_EQ(nested->array[1].array[0].i, 3);

  for (const auto& [name, t] : e["gguf_tensors"].items()) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* info = g->find_tensor(name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(ggml_type_name(info->type), t["type"].get<std::string>());
    EXPECT_EQ(info->shape, t["shape"].get<std::vector<int64_t>>());
    auto tensor = g->tensor(name);
    ASSERT_TRUE(tensor.ok()) << tensor.status().to_string();
    const std::vector<float> got = values_f32(*tensor);
    const auto want = t["values"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], static_cast<float>(want[k])) << "element " << k;
  }
}

TEST(ReferenceFixtures, QuantizerMatchesGgufPyBlocks) {
  const nlohmann::json e = expected();
  auto g = GgufFile::open(fixture("reference.gguf"));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  for (const char* name : {"q8_0", "q4_0", "q5_0_rtn"}) {
    SCOPED_TRACE(name);
    const auto source = e["gguf_tensors"][name]["source"].get<std::vector<float>>();
    std::vector<uint8_t> ours;
    const std::string n = name;
    const int64_t count = static_cast<int64_t>(source.size());
    if (n == "q8_0") {
      quantize_q8_0(source.data(), count, &ours);
    } else if (n == "q4_0") {
      quantize_q4_0(source.data(), count, &ours);
    } else {
      quantize_q5_0(source.data(), count, &ours);
    }
    auto raw = g->raw_tensor(name);
    ASSERT_TRUE(raw.ok());
    ASSERT_EQ(ours.size(), static_cast<size_t>(raw->numel()));
    for (size_t k = 0; k < ours.size(); ++k) ASSERT_EQ(ours[k], raw->data<uint8_t>()[k]) << "byte " << k;
  }
}

// Writes a file for `make_io_fixtures.py --check-writer` when TACHYON_IO_WRITER_OUT names a
// path; otherwise just checks the file reads back.
TEST(ReferenceFixtures, WriterOutputForGgufPy) {
  const nlohmann::json e = expected();
  const auto source = e["gguf_tensors"]["q8_0"]["source"].get<std::vector<float>>();
  Tensor x = Tensor::empty({static_cast<int64_t>(source.size()) / 64, 64}, DType::kF32);
  std::copy(source.begin(), source.end(), x.data<float>());
  GgufWriter w;
  w.add("general.architecture", gguf_string("llama"));
  w.add("t.strings", gguf_string_array({"a", "b"}));
  w.add("t.nested", gguf_array(GgufValueType::kArray, {gguf_array(GgufValueType::kInt32, {gguf_i32(1)})}));
  ASSERT_TRUE(w.add_tensor("source", x, GgmlType::kF32).ok());
  ASSERT_TRUE(w.add_tensor("q8_0", x, GgmlType::kQ8_0).ok());
  ASSERT_TRUE(w.add_tensor("q4_0", x, GgmlType::kQ4_0).ok());
  ASSERT_TRUE(w.add_tensor("f16", x, GgmlType::kF16).ok());
  ASSERT_TRUE(w.add_tensor("bf16", x, GgmlType::kBF16).ok());
  const char* out = std::getenv("TACHYON_IO_WRITER_OUT");
  const std::string path = out ? out : testing::scratch_dir("writer-out") + "/writer.gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto g = GgufFile::open(path);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->tensor_infos().size(), 5u);
}

TEST(ReferenceFixtures, SafetensorsFromReferencePackage) {
  const nlohmann::json e = expected();
  auto f = SafetensorsFile::open(fixture("reference.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->metadata(), (e["safetensors_metadata"].get<std::map<std::string, std::string>>()));
  EXPECT_EQ((*f)->tensors().size(), e["safetensors"].size());
  for (const auto& [name, t] : e["safetensors"].items()) {
    SCOPED_TRACE(name);
    const TensorMeta* meta = (*f)->find(name);
    ASSERT_NE(meta, nullptr);
    EXPECT_EQ(meta->stored_type, t["dtype"].get<std::string>());
    EXPECT_EQ(meta->shape, t["shape"].get<std::vector<int64_t>>());
    auto tensor = (*f)->tensor(name);
    ASSERT_TRUE(tensor.ok()) << tensor.status().to_string();
    // Zero copy: safetensors pads its header so that data is 8-byte aligned.
    const auto& mapping = *(*f)->mapped_file();
    EXPECT_GE(static_cast<const uint8_t*>(tensor->raw_data()), mapping.data());
    const auto& values = t["values"];
    ASSERT_EQ(static_cast<size_t>(tensor->numel()), values.size());
    for (size_t k = 0; k < values.size(); ++k) {
      const auto i = static_cast<int64_t>(k);
      switch (tensor->dtype()) {
        case DType::kF32: EXPECT_EQ(tensor->data<float>()[i], values[k].get<double>()); break;
        case DType::kF16: EXPECT_EQ(f16_to_f32(tensor->data<uint16_t>()[i]), values[k].get<double>()); break;
        case DType::kI8: EXPECT_EQ(std::to_string(tensor->data<int8_t>()[i]), values[k].get<std::string>()); break;
        case DType::kU8: EXPECT_EQ(std::to_string(tensor->data<uint8_t>()[i]), values[k].get<std::string>()); break;
        case DType::kI32: EXPECT_EQ(std::to_string(tensor->data<int32_t>()[i]), values[k].get<std::string>()); break;
        case DType::kI64: EXPECT_EQ(std::to_string(tensor->data<int64_t>()[i]), values[k].get<std::string>()); break;
        default: ADD_FAILURE() << "unexpected dtype";
      }
    }
  }
}

}  // namespace
}  // namespace tachyon
