// Corrupt GGUF files: every truncation, crafted bad fields, and random mutations must give a
// Status (never a crash, hang or huge allocation) whose message names the file and the field.
#include <gtest/gtest.h>

#include <algorithm>

#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/weight_source.h"
#include "io_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

using io_test::expect_error;
using io_test::put;
using io_test::write_file;

// Hand-assembled GGUF bytes, for fields the writer would never produce.
struct RawGguf {
  std::vector<uint8_t> b;
  RawGguf(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    put<uint32_t>(&b, 0x46554747);
    put<uint32_t>(&b, version);
    put<uint64_t>(&b, n_tensors);
    put<uint64_t>(&b, n_kv);
  }
  RawGguf& u8(uint8_t v) { put(&b, v); return *this; }
  RawGguf& u32(uint32_t v) { put(&b, v); return *this; }
  RawGguf& u64(uint64_t v) { put(&b, v); return *this; }
  RawGguf& str(const std::string& s) {
    put<uint64_t>(&b, s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& pad(size_t alignment = 32) {
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    return *this;
  }
  RawGguf& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
  // A tensor info: name, dims (ne order), ggml type id, offset.
  RawGguf& tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset) {
    str(name);
    u32(static_cast<uint32_t>(ne.size()));
    for (auto v : ne) u64(v);
    u32(type);
    u64(offset);
    return *this;
  }
};

class GgufCorrupt : public ::testing::Test {
 protected:
  void SetUp() override { path_ = testing::scratch_dir("gguf-corrupt") + "/bad.gguf"; }
  Status open_bytes(const std::vector<uint8_t>& bytes) {
    write_file(path_, bytes);
    return GgufFile::open(path_).status();
  }
  void expect(const std::vector<uint8_t>& bytes, ErrorCode code, const std::vector<std::string>& needles) {
    expect_error(open_bytes(bytes), code, path_, needles);
  }
  std::string path_;
};

// A small file holding every metadata type and tensors of several types.
std::vector<uint8_t> small_gguf() {
  GgufWriter w;
  w.add("general.architecture", gguf_string("llama"));
  w.add("llama.block_count", gguf_u32(2));
  w.add("eps", gguf_f32(1e-5f));
  w.add("flag", gguf_bool(true));
  w.add("tokens", gguf_string_array({"<s>", "</s>", "a", "b"}));
  w.add("scores", gguf_array(GgufValueType::kFloat32, {gguf_f32(0), gguf_f32(-1), gguf_f32(-2), gguf_f32(-3)}));
  w.add("nested", gguf_array(GgufValueType::kArray, {gguf_array(GgufValueType::kInt8, {gguf_i8(1)})}));
  w.add("i64", gguf_i64(-5));
  std::mt19937 rng(11);
  EXPECT_TRUE(w.add_tensor("f32", testing::random_tensor({2, 3}, rng), GgmlType::kF32).ok());
  EXPECT_TRUE(w.add_tensor("f16", testing::random_tensor({5}, rng), GgmlType::kF16).ok());
  EXPECT_TRUE(w.add_tensor("q8", testing::random_tensor({2, 32}, rng), GgmlType::kQ8_0).ok());
  EXPECT_TRUE(w.add_tensor("q4", testing::random_tensor({1, 64}, rng), GgmlType::kQ4_0).ok());
  EXPECT_TRUE(w.add_tensor("bf16", testing::random_tensor({3, 2}, rng), GgmlType::kBF16).ok());
  auto bytes = w.serialize();
  EXPECT_TRUE(bytes.ok());
  return *bytes;
}

TEST_F(GgufCorrupt, EveryTruncationIsReported) {
  const std::vector<uint8_t> full = small_gguf();
  ASSERT_TRUE(open_bytes(full).ok());
  ASSERT_LT(full.size(), 4000u);
  for (size_t cut = 0; cut < full.size(); ++cut) {
    const Status s = open_bytes(std::vector<uint8_t>(full.begin(), full.begin() + static_cast<ptrdiff_t>(cut)));
    ASSERT_FALSE(s.ok()) << "prefix of " << cut << " bytes opened";
    EXPECT_EQ(s.code(), ErrorCode::kCorruptFile) << cut << ": " << s.to_string();
    EXPECT_NE(s.message().find(path_), std::string::npos) << s.message();
  }
  // A cut inside the data names the tensor and the sizes.
  expect(std::vector<uint8_t>(full.begin(), full.end() - 1), ErrorCode::kCorruptFile,
         {"tensor 'bf16'", "past the end of the file", std::to_string(full.size() - 1)});
  // A cut inside a metadata value names the key (the counts before it still fit).
  const std::string key = "i64";
  const auto at = std::search(full.begin(), full.end(), key.begin(), key.end()) - full.begin();
  const size_t cut = static_cast<size_t>(at) + key.size() + 4 + 3;  // type, then 3 of the 8 value bytes
  expect(std::vector<uint8_t>(full.begin(), full.begin() + static_cast<ptrdiff_t>(cut)), ErrorCode::kCorruptFile,
         {"metadata key 'i64'", "truncated at byte", "i64 value"});
}

TEST_F(GgufCorrupt, HeaderFields) {
  expect({}, ErrorCode::kCorruptFile, {"too short"});
  expect({'G', 'G', 'U', 'X', 3, 0, 0, 0}, ErrorCode::kCorruptFile, {"magic", "47 47 55 58"});
  expect(RawGguf(0, 0, 1).b, ErrorCode::kUnsupported, {"version 1"});
  expect(RawGguf(0, 0, 4).b, ErrorCode::kUnsupported, {"version 4"});
  expect(RawGguf(0, 0, 0x03000000).b, ErrorCode::kUnsupported, {"big-endian"});
  expect(RawGguf(0, 1ull << 60).b, ErrorCode::kCorruptFile, {"metadata count 1152921504606846976"});
  expect(RawGguf(1ull << 62, 0).b, ErrorCode::kCorruptFile, {"tensor count 4611686018427387904"});
  // Fine when empty.
  EXPECT_TRUE(open_bytes(RawGguf(0, 0).b).ok());
}

TEST_F(GgufCorrupt, MetadataFields) {
  // A key length larger than the file.
  expect(RawGguf(0, 1).u64(1ull << 40).zeros(16).b, ErrorCode::kCorruptFile, {"metadata key length 1099511627776"});
  expect(RawGguf(0, 1).str("k").u32(13).u8(0).b, ErrorCode::kCorruptFile, {"'k'", "value type 13"});
  expect(RawGguf(0, 1).str("k").u32(8).u64(~0ull).b, ErrorCode::kCorruptFile, {"'k'", "string value length"});
  expect(RawGguf(0, 1).str("k").u32(7).u8(2).b, ErrorCode::kCorruptFile, {"'k'", "bool value 2"});
  // Arrays: absurd count, unknown element type, strings past the end, deep nesting.
  expect(RawGguf(0, 1).str("arr").u32(9).u32(4).u64(1ull << 50).b, ErrorCode::kCorruptFile,
         {"'arr'", "array of 1125899906842624 u32"});
  expect(RawGguf(0, 1).str("arr").u32(9).u32(8).u64(1ull << 61).b, ErrorCode::kCorruptFile, {"'arr'", "string"});
  expect(RawGguf(0, 1).str("arr").u32(9).u32(77).u64(1).b, ErrorCode::kCorruptFile, {"'arr'", "element type 77"});
  expect(RawGguf(0, 1).str("arr").u32(9).u32(8).u64(2).str("ok").u64(1000).b, ErrorCode::kCorruptFile,
         {"'arr'", "array element 1 of 2", "string value length 1000"});
  RawGguf deep(0, 1);
  deep.str("deep").u32(9);
  for (int k = 0; k < 20; ++k) deep.u32(9).u64(1);
  deep.u32(4).u64(0);
  expect(deep.b, ErrorCode::kUnsupported, {"'deep'", "nested deeper"});
  expect(RawGguf(0, 2).str("k").u32(4).u32(1).str("k").u32(4).u32(2).b, ErrorCode::kCorruptFile,
         {"'k' appears twice"});
  // general.alignment must be a power-of-two integer.
  for (uint32_t bad : {0u, 3u, 48u}) {
    expect(RawGguf(0, 1).str("general.alignment").u32(4).u32(bad).b, ErrorCode::kCorruptFile,
           {"general.alignment = " + std::to_string(bad)});
  }
  expect(RawGguf(0, 1).str("general.alignment").u32(8).str("32").b, ErrorCode::kCorruptFile,
         {"general.alignment", "string"});
}

TEST_F(GgufCorrupt, TensorInfoFields) {
  // Each case: one tensor info, padding to 32, then `data` bytes.
  auto file = [](const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset, size_t data) {
    return RawGguf(1, 0).tensor("w", ne, type, offset).pad().zeros(data).b;
  };
  EXPECT_TRUE(open_bytes(file({4, 2}, 0, 0, 32)).ok());
  expect(RawGguf(1, 0).str("w").u32(5).zeros(16).b, ErrorCode::kCorruptFile, {"tensor 'w'", "n_dims 5"});
  expect(file({4, 0}, 0, 0, 32), ErrorCode::kCorruptFile, {"tensor 'w'", "ne[1] = 0"});
  expect(file({1ull << 63}, 0, 0, 32), ErrorCode::kCorruptFile, {"tensor 'w'", "ne[0] = 9223372036854775808"});
  expect(file({1ull << 32, 1ull << 32}, 0, 0, 32), ErrorCode::kCorruptFile, {"tensor 'w'", "overflows"});
  expect(file({1ull << 31, 1ull << 31}, 28, 0, 32), ErrorCode::kCorruptFile, {"tensor 'w'", "byte size overflows"});
  expect(file({4}, 99, 0, 32), ErrorCode::kUnsupported, {"tensor 'w'", "type id 99"});
  expect(file({4}, 4, 0, 32), ErrorCode::kUnsupported, {"tensor 'w'", "type id 4"});  // retired Q4_2
  expect(file({33, 1}, 8, 0, 64), ErrorCode::kCorruptFile, {"tensor 'w'", "33 elements", "Q8_0", "32"});
  expect(file({4}, 0, 4, 32), ErrorCode::kCorruptFile, {"tensor 'w'", "offset 4", "alignment 32"});
  expect(file({4, 2}, 0, 32, 32), ErrorCode::kCorruptFile, {"tensor 'w'", "offset 32 + 32 bytes", "past the end"});
  expect(file({4, 2}, 0, ~0ull - 31, 32), ErrorCode::kCorruptFile, {"tensor 'w'", "past the end"});
  expect(file({4, 2}, 0, 0, 31), ErrorCode::kCorruptFile, {"tensor 'w'", "past the end"});
  expect(RawGguf(2, 0).tensor("w", {4}, 0, 0).tensor("w", {4}, 0, 32).pad().zeros(64).b, ErrorCode::kCorruptFile,
         {"tensor name 'w' appears twice"});
  expect(RawGguf(1, 0).u64(1ull << 33).zeros(24).b, ErrorCode::kCorruptFile, {"tensor info 0 of 1", "tensor name length"});
}

// Tensors whose data ranges share bytes (a retyped tensor running into its neighbour) are refused
// naming both; tensors that merely touch load.
TEST_F(GgufCorrupt, OverlappingTensorsAreRefused) {
  // f32 (type 0): 8 elements are 32 bytes.
  EXPECT_TRUE(open_bytes(RawGguf(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(64).b).ok());
  expect(RawGguf(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 0).pad().zeros(64).b, ErrorCode::kCorruptFile,
         {"'a'", "'b'", "overlap"});
  expect(RawGguf(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(64).b, ErrorCode::kCorruptFile,
         {"'a'", "0 + 64 bytes", "'b' (data offset 32)", "overlap"});
  // Listed out of order, and a Q8_0 tensor (34 bytes a block) running into the next.
  expect(RawGguf(3, 0)
             .tensor("c", {8}, 0, 128)
             .tensor("q", {64}, 8, 64)
             .tensor("a", {8}, 0, 0)
             .pad()
             .zeros(192)
             .b,
         ErrorCode::kCorruptFile, {"'q'", "Q8_0", "'c'", "overlap"});
}

TEST_F(GgufCorrupt, RandomMutationsNeverCrash) {
  const std::vector<uint8_t> base = small_gguf();
  auto open = [](const std::string& path) -> Status {
    auto f = GgufFile::open(path);
    if (!f.ok()) return f.status();
    // Anything that opened must serve every tensor from inside the file (or refuse it).
    GgufWeightSource source(std::make_shared<const GgufFile>(std::move(f).value()));
    io_test::touch_all_tensors(source, source.file().mapped_file().get());
    for (const auto& [key, value] : source.file().metadata()) (void)value.to_string();
    return Status::Ok();
  };
  io_test::fuzz_file(base, path_, 20240601u, 3000, open);
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "fresh seed " << seed << " (TACHYON_TEST_SEED reproduces it)");
  io_test::fuzz_file(base, path_, seed, 1000, open);
}

}  // namespace
}  // namespace tachyon
