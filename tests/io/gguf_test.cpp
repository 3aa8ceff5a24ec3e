// GGUF writer -> reader round trips: every metadata type, every writable tensor type, hand-made
// Q8_0/Q4_0 blocks, alignment, versions, typed getters.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/weight_source.h"
#include "io_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

using io_test::write_file;

GgufFile open_ok(const std::string& path) {
  auto r = GgufFile::open(path);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

std::string write_gguf(const GgufWriter& w, const std::string& tag) {
  const std::string path = testing::scratch_dir(tag) + "/model.gguf";
  Status s = w.write(path);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return path;
}

TEST(GgufRoundTrip, EveryMetadataType) {
  GgufWriter w;
  w.add("u8", gguf_u8(255));
  w.add("i8", gguf_i8(-128));
  w.add("u16", gguf_u16(65535));
  w.add("i16", gguf_i16(-32768));
  w.add("u32", gguf_u32(4294967295u));
  w.add("i32", gguf_i32(std::numeric_limits<int32_t>::min()));
  w.add("u64", gguf_u64(std::numeric_limits<uint64_t>::max()));
  w.add("i64", gguf_i64(std::numeric_limits<int64_t>::min()));
  w.add("f32", gguf_f32(1e-5f));
  w.add("f64", gguf_f64(-2.5e300));
  w.add("bool_true", gguf_bool(true));
  w.add("bool_false", gguf_bool(false));
  w.add("string", gguf_string("llama"));
  w.add("string_empty", gguf_string(""));
  w.add("string_nul", gguf_string(std::string("a\0b", 3)));
  w.add("strings", gguf_string_array({"<unk>", "", "\xe2\x96\x81the", std::string(300, 'x')}));
  w.add("f32s", gguf_array(GgufValueType::kFloat32, {gguf_f32(-1.5f), gguf_f32(0.0f), gguf_f32(3.25f)}));
  w.add("i32s", gguf_array(GgufValueType::kInt32, {gguf_i32(1), gguf_i32(-2), gguf_i32(6)}));
  w.add("u8s", gguf_array(GgufValueType::kUint8, {gguf_u8(0), gguf_u8(200)}));
  w.add("bools", gguf_array(GgufValueType::kBool, {gguf_bool(true), gguf_bool(false)}));
  w.add("u64s", gguf_array(GgufValueType::kUint64, {gguf_u64(1ull << 40)}));
  w.add("f64s", gguf_array(GgufValueType::kFloat64, {gguf_f64(0.1)}));
  w.add("empty", gguf_array(GgufValueType::kInt64, {}));
  w.add("nested", gguf_array(GgufValueType::kArray,
                             {gguf_array(GgufValueType::kInt16, {gguf_i16(-7), gguf_i16(8)}),
                              gguf_array(GgufValueType::kString, {gguf_string("x")}),
                              gguf_array(GgufValueType::kArray, {gguf_array(GgufValueType::kUint16, {gguf_u16(9)})})}));
  w.add("string", gguf_string("replaced"));  // a second add replaces
  const std::string path = write_gguf(w, "gguf-meta");

  GgufFile f = open_ok(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 24u);
  EXPECT_EQ(f.find("u8")->u, 255u);
  EXPECT_EQ(f.find("i8")->i, -128);
  EXPECT_EQ(f.find("u16")->u, 65535u);
  EXPECT_EQ(f.find("i16")->i, -32768);
  EXPECT_EQ(f.find("u32")->u, 4294967295u);
  EXPECT_EQ(f.find("i32")->i, std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f.find("u64")->u, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.find("i64")->i, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.find("f32")->f, static_cast<double>(1e-5f));
  EXPECT_EQ(f.find("f64")->f, -2.5e300);
  for (const char* key : {"u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64"}) {
    EXPECT_TRUE(f.find(key)->is_integer()) << key;
    EXPECT_FALSE(f.find(key)->is_float()) << key;
  }
  EXPECT_TRUE(f.find("f32")->is_float());
  EXPECT_EQ(f.find("f32")->type, GgufValueType::kFloat32);
  EXPECT_EQ(f.find("f64")->type, GgufValueType::kFloat64);
  EXPECT_EQ(*f.get_bool("bool_true"), true);
  EXPECT_EQ(*f.get_bool("bool_false"), false);
  EXPECT_EQ(*f.get_string("string"), "replaced");
  EXPECT_EQ(*f.get_string("string_empty"), "");
  EXPECT_EQ(*f.get_string("string_nul"), std::string("a\0b", 3));
  const auto strings = f.get_string_array("strings");
  ASSERT_TRUE(strings.ok());
  EXPECT_EQ(*strings, (std::vector<std::string>{"<unk>", "", "\xe2\x96\x81the", std::string(300, 'x')}));
  EXPECT_EQ(*f.get_float_array("f32s"), (std::vector<double>{-1.5, 0.0, 3.25}));
  EXPECT_EQ(*f.get_int_array("i32s"), (std::vector<int64_t>{1, -2, 6}));
  EXPECT_EQ(*f.get_float_array("i32s"), (std::vector<double>{1, -2, 6}));  // ints widen to floats
  EXPECT_EQ(*f.get_int_array("u8s"), (std::vector<int64_t>{0, 200}));
  EXPECT_EQ(f.find("bools")->array.size(), 2u);
  EXPECT_EQ(f.find("bools")->array[0].i, 1);
  EXPECT_EQ(*f.get_int_array("u64s"), (std::vector<int64_t>{1ll << 40}));
  EXPECT_EQ(*f.get_float_array("f64s"), (std::vector<double>{0.1}));
  EXPECT_TRUE(f.get_int_array("empty")->empty());
  EXPECT_EQ(f.find("empty")->array_type, GgufValueType::kInt64);
  const GgufValue* nested = f.find("nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->array_type, GgufValueType::kArray);
  ASSERT_EQ(nested->array.size(), 3u);
  EXPECT_EQ(nested->array[0].array_type, GgufValueType::kInt16);
  EXPECT_EQ(nested->array[0].array[0].i, -7);
  EXPECT_EQ(nested->array[0].array[1].i, 8);
  EXPECT_EQ(nested->array[1].array[0].s, "x");
  EXPECT_EQ(nested->array[2].array[0].array[0].u, 9u);
  EXPECT_EQ(f.find("strings")->to_string(), "[array of 4 string]");
  EXPECT_EQ(f.find("string")->to_string(), "\"replaced\"");
}

TEST(GgufRoundTrip, TypedGettersReportTypeAndAbsence) {
  GgufWriter w;
  w.add("name", gguf_string("llama"));
  w.add("count", gguf_u32(7));
  w.add("eps", gguf_f32(0.5f));
  w.add("huge", gguf_u64(~0ull));
  w.add("huge_array", gguf_array(GgufValueType::kUint64, {gguf_u64(~0ull)}));
  const std::string path = write_gguf(w, "gguf-getters");
  GgufFile f = open_ok(path);

  EXPECT_EQ(*f.get_int("count"), 7);
  EXPECT_EQ(*f.get_float("count"), 7.0);  // ints accepted as floats
  EXPECT_EQ(*f.get_float("eps"), 0.5);
  EXPECT_EQ(*f.get_int_or("absent", 42), 42);
  EXPECT_EQ(*f.get_float_or("absent", 1.5), 1.5);
  EXPECT_EQ(*f.get_string_or("absent", "x"), "x");
  EXPECT_EQ(*f.get_int_or("count", 42), 7);

  io_test::expect_error(f.get_int("absent").status(), ErrorCode::kNotFound, path, {"'absent'"});
  io_test::expect_error(f.get_int("name").status(), ErrorCode::kCorruptFile, path, {"'name'", "string", "integer"});
  io_test::expect_error(f.get_string("count").status(), ErrorCode::kCorruptFile, path, {"'count'", "u32"});
  io_test::expect_error(f.get_bool("count").status(), ErrorCode::kCorruptFile, path, {"bool"});
  io_test::expect_error(f.get_int("eps").status(), ErrorCode::kCorruptFile, path, {"f32"});
  io_test::expect_error(f.get_int("huge").status(), ErrorCode::kCorruptFile, path, {"18446744073709551615"});
  io_test::expect_error(f.get_int_array("huge_array").status(), ErrorCode::kCorruptFile, path, {"element 0"});
  io_test::expect_error(f.get_string_array("name").status(), ErrorCode::kCorruptFile, path, {"array of string"});
  io_test::expect_error(f.get_int_or("name", 1).status(), ErrorCode::kCorruptFile, path, {"'name'"});
}

TEST(GgufRoundTrip, FloatTensorsAreZeroCopyViews) {
  std::mt19937 rng(testing::fresh_seed());
  GgufWriter w;
  const Tensor a = testing::random_tensor({3, 5, 2, 4}, rng);
  const Tensor b = testing::random_tensor({7, 6}, rng);
  const Tensor c = testing::random_tensor({9}, rng);
  ASSERT_TRUE(w.add_tensor("a.f32", a, GgmlType::kF32).ok());
  ASSERT_TRUE(w.add_tensor("b.f16", b, GgmlType::kF16).ok());
  ASSERT_TRUE(w.add_tensor("c.bf16", c, GgmlType::kBF16).ok());
  EXPECT_EQ(w.add_tensor("a.f32", a, GgmlType::kF32).code(), ErrorCode::kInvalidArgument);  // duplicate
  const std::string path = write_gguf(w, "gguf-float");

  GgufFile f = open_ok(path);
  ASSERT_EQ(f.tensor_infos().size(), 3u);
  EXPECT_EQ(f.tensor_infos()[0].shape, (std::vector<int64_t>{3, 5, 2, 4}));
  EXPECT_EQ(f.tensor_infos()[1].type, GgmlType::kF16);
  EXPECT_EQ(f.tensor_infos()[1].nbytes, 7u * 6u * 2u);
  const uint8_t* begin = f.mapped_file()->data();
  const uint8_t* end = begin + f.mapped_file()->size();

  auto ta = f.tensor("a.f32");
  ASSERT_TRUE(ta.ok()) << ta.status().to_string();
  EXPECT_EQ(ta->dtype(), DType::kF32);
  EXPECT_EQ(ta->shape(), a.shape());
  EXPECT_GE(static_cast<const uint8_t*>(ta->raw_data()), begin);
  EXPECT_LT(static_cast<const uint8_t*>(ta->raw_data()), end);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta->raw_data()) % 32, 0u);
  EXPECT_EQ(std::memcmp(ta->raw_data(), a.raw_data(), a.nbytes()), 0);

  auto tb = f.tensor("b.f16");
  ASSERT_TRUE(tb.ok());
  EXPECT_EQ(tb->dtype(), DType::kF16);
  EXPECT_GE(static_cast<const uint8_t*>(tb->raw_data()), begin);
  for (int64_t k = 0; k < b.numel(); ++k) EXPECT_EQ(tb->data<uint16_t>()[k], f32_to_f16(b.data<float>()[k]));

  auto tc = f.tensor("c.bf16");
  ASSERT_TRUE(tc.ok());
  EXPECT_EQ(tc->dtype(), DType::kBF16);
  for (int64_t k = 0; k < c.numel(); ++k) EXPECT_EQ(tc->data<uint16_t>()[k], f32_to_bf16(c.data<float>()[k]));

  // The view outlives the GgufFile: it holds the mapping.
  Tensor kept = *ta;
  f = GgufFile();
  EXPECT_EQ(std::memcmp(kept.raw_data(), a.raw_data(), a.nbytes()), 0);
}

TEST(GgufRoundTrip, HandMadeQ8_0BlocksDequantize) {
  // Two blocks: d = 0.5 (f16 0x3800) with q = -16..15, then d = -0.25 (0xb400) with q = 127, -127, 0, ...
  std::vector<uint8_t> bytes;
  io_test::put<uint16_t>(&bytes, 0x3800);
  for (int j = 0; j < 32; ++j) io_test::put<int8_t>(&bytes, static_cast<int8_t>(j - 16));
  io_test::put<uint16_t>(&bytes, 0xb400);
  for (int j = 0; j < 32; ++j) io_test::put<int8_t>(&bytes, static_cast<int8_t>(j % 3 == 0 ? 127 : j % 3 == 1 ? -127 : 0));
  GgufWriter w;
  ASSERT_TRUE(w.add_raw_tensor("q8", {1, 64}, GgmlType::kQ8_0, bytes).ok());
  const std::string path = write_gguf(w, "gguf-q8");
  GgufFile f = open_ok(path);
  EXPECT_EQ(f.tensor_infos()[0].nbytes, 68u);
  auto t = f.tensor("q8");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->dtype(), DType::kF32);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{1, 64}));
  const float* v = t->data<float>();
  for (int j = 0; j < 32; ++j) EXPECT_EQ(v[j], 0.5f * static_cast<float>(j - 16)) << j;
  for (int j = 0; j < 32; ++j) {
    const float expected = j % 3 == 0 ? -31.75f : j % 3 == 1 ? 31.75f : 0.0f;
    EXPECT_EQ(v[32 + j], expected) << j;
  }
  // The raw blocks are available untouched.
  auto raw = f.raw_tensor("q8");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->dtype(), DType::kU8);
  EXPECT_EQ(raw->numel(), 68);
  EXPECT_EQ(std::memcmp(raw->raw_data(), bytes.data(), 68), 0);
}

TEST(GgufRoundTrip, HandMadeQ4_0BlocksDequantize) {
  // d = 0.25 (f16 0x3400); qs[j] = j | (15 - j) << 4, so element j is 0.25 * (j - 8) and
  // element 16 + j is 0.25 * (7 - j).
  std::vector<uint8_t> bytes;
  io_test::put<uint16_t>(&bytes, 0x3400);
  for (int j = 0; j < 16; ++j) io_test::put<uint8_t>(&bytes, static_cast<uint8_t>(j | ((15 - j) << 4)));
  // Second block: d = 2.0 (0x4000), all nibbles 0 -> every element -16.
  io_test::put<uint16_t>(&bytes, 0x4000);
  for (int j = 0; j < 16; ++j) io_test::put<uint8_t>(&bytes, 0);
  GgufWriter w;
  ASSERT_TRUE(w.add_raw_tensor("q4", {2, 32}, GgmlType::kQ4_0, bytes).ok());
  EXPECT_EQ(w.add_raw_tensor("bad", {2, 32}, GgmlType::kQ4_0, std::vector<uint8_t>(35)).code(),
            ErrorCode::kInvalidArgument);
  const std::string path = write_gguf(w, "gguf-q4");
  GgufFile f = open_ok(path);
  auto t = f.tensor("q4");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 32}));
  const float* v = t->data<float>();
  const float expected_low[16] = {-2.0f, -1.75f, -1.5f, -1.25f, -1.0f, -0.75f, -0.5f, -0.25f,
                                  0.0f,  0.25f,  0.5f,  0.75f,  1.0f,  1.25f,  1.5f,  1.75f};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v[j], expected_low[j]) << j;
    EXPECT_EQ(v[16 + j], expected_low[15 - j]) << j;
  }
  for (int j = 32; j < 64; ++j) EXPECT_EQ(v[j], -16.0f) << j;
}

TEST(GgufRoundTrip, QuantizedTensorsWithinErrorBound) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Tensor x = testing::random_tensor({5, 96}, rng, -3.0f, 3.0f);
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor("q8", x, GgmlType::kQ8_0).ok());
  ASSERT_TRUE(w.add_tensor("q4", x, GgmlType::kQ4_0).ok());
  EXPECT_EQ(w.add_tensor("odd", testing::random_tensor({2, 33}, rng), GgmlType::kQ8_0).code(),
            ErrorCode::kInvalidArgument);
  const std::string path = write_gguf(w, "gguf-quant");
  GgufFile f = open_ok(path);
  auto q8 = f.tensor("q8");
  auto q4 = f.tensor("q4");
  ASSERT_TRUE(q8.ok() && q4.ok());
  const float* xs = x.data<float>();
  for (int64_t b = 0; b < x.numel() / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xs[b * 32 + j]));
    // Half a quantization step plus the f16 rounding of the scale.
    const float step8 = amax / 127.0f, step4 = amax / 8.0f;
    for (int j = 0; j < 32; ++j) {
      const int64_t k = b * 32 + j;
      EXPECT_NEAR(q8->data<float>()[k], xs[k], 0.5f * step8 + amax * 1e-3f) << k;
      EXPECT_NEAR(q4->data<float>()[k], xs[k], step4 + amax * 1e-3f) << k;
    }
  }
  // The value of largest magnitude is reproduced (it maps to -8 * d exactly, up to f16 d).
  float signed_max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(xs[j]) > std::fabs(signed_max)) signed_max = xs[j];
  }
  for (int j = 0; j < 32; ++j) {
    if (xs[j] == signed_max) {
      EXPECT_NEAR(q4->data<float>()[j], signed_max, std::fabs(signed_max) * 1e-3f);
    }
  }
}

TEST(GgufRoundTrip, AlignmentAndVersionTwo) {
  std::mt19937 rng(7);
  const Tensor a = testing::random_tensor({3}, rng);  // 12 bytes: the next tensor needs padding
  const Tensor b = testing::random_tensor({4, 4}, rng);
  for (uint64_t alignment : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    GgufWriter w;
    w.set_version(2);
    w.set_alignment(alignment);
    w.add("general.name", gguf_string("x"));  // odd-sized header
    ASSERT_TRUE(w.add_tensor("a", a, GgmlType::kF32).ok());
    ASSERT_TRUE(w.add_tensor("b", b, GgmlType::kF32).ok());
    ASSERT_TRUE(w.add_tensor("c", b, GgmlType::kF16).ok());
    const std::string path = write_gguf(w, "gguf-align");
    GgufFile f = open_ok(path);
    EXPECT_EQ(f.version(), 2u);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    EXPECT_EQ(*f.get_int_or("general.alignment", 32), alignment == 32 ? 32 : static_cast<int64_t>(alignment));
    for (const auto& info : f.tensor_infos()) EXPECT_EQ(info.offset % alignment, 0u);
    // With alignment 1 the f32 tensors may sit at odd addresses: they come back as copies with
    // the same values.
    auto ta = f.tensor("a");
    auto tb = f.tensor("b");
    ASSERT_TRUE(ta.ok() && tb.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(tb->raw_data()) % 4, 0u);
    EXPECT_EQ(std::memcmp(ta->raw_data(), a.raw_data(), a.nbytes()), 0);
    EXPECT_EQ(std::memcmp(tb->raw_data(), b.raw_data(), b.nbytes()), 0);
  }
}

TEST(GgufRoundTrip, VocabularyOnlyFileWithoutPadding) {
  // llama.cpp writes vocabulary-only files without padding after the header, so the aligned
  // data offset lies past the end of the file; that is fine when there are no tensors.
  GgufWriter w;
  w.add("tokenizer.ggml.tokens", gguf_string_array({"a", "bb", "ccc"}));
  auto bytes = w.serialize();
  ASSERT_TRUE(bytes.ok());
  while (!bytes->empty() && bytes->back() == 0) bytes->pop_back();
  const std::string path = testing::scratch_dir("gguf-vocab") + "/vocab.gguf";
  write_file(path, *bytes);
  GgufFile f = open_ok(path);
  EXPECT_TRUE(f.tensor_infos().empty());
  EXPECT_GT(f.data_offset(), f.mapped_file()->size());
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens")->size(), 3u);
}

TEST(GgufRoundTrip, UnsupportedTypesAndMissingTensors) {
  GgufWriter w;
  // A Q8_1 tensor (32-element blocks of 36 bytes, ggml's activation format): listed, raw bytes
  // readable, not dequantized.
  ASSERT_TRUE(w.add_raw_tensor("q81", {2, 64}, GgmlType::kQ8_1, std::vector<uint8_t>(144, 0x11)).ok());
  std::vector<uint8_t> i32s;
  for (int32_t k = 0; k < 6; ++k) io_test::put(&i32s, k * 1000 - 1);
  ASSERT_TRUE(w.add_raw_tensor("ids", {2, 3}, GgmlType::kI32, i32s).ok());
  const std::string path = write_gguf(w, "gguf-unsupported");
  GgufFile f = open_ok(path);
  io_test::expect_error(f.tensor("q81").status(), ErrorCode::kUnsupported, path, {"'q81'", "Q8_1"});
  auto raw = f.raw_tensor("q81");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->numel(), 144);
  auto ids = f.tensor("ids");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->dtype(), DType::kI32);
  EXPECT_EQ(ids->data<int32_t>()[5], 4999);
  io_test::expect_error(f.tensor("nope").status(), ErrorCode::kNotFound, path, {"'nope'"});
  io_test::expect_error(f.raw_tensor("nope").status(), ErrorCode::kNotFound, path, {"'nope'"});

  auto source = GgufWeightSource::open(path);
  ASSERT_TRUE(source.ok());
  EXPECT_EQ((*source)->tensor_names(), (std::vector<std::string>{"q81", "ids"}));
  const TensorMeta* meta = (*source)->find("q81");
  ASSERT_NE(meta, nullptr);
  EXPECT_FALSE(meta->supported);
  EXPECT_EQ(meta->stored_type, "Q8_1");
  EXPECT_EQ(meta->ggml_type, GgmlType::kQ8_1);
  EXPECT_EQ(meta->shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ((*source)->find("ids")->dtype, DType::kI32);
  EXPECT_EQ((*source)->find("absent"), nullptr);
  EXPECT_NE((*source)->describe().find(path), std::string::npos);
}

TEST(GgufRoundTrip, WeightSourceKeepsMappingAlive) {
  std::mt19937 rng(3);
  const Tensor a = testing::random_tensor({4, 32}, rng);
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor("w", a, GgmlType::kF32).ok());
  ASSERT_TRUE(w.add_tensor("q", a, GgmlType::kQ8_0).ok());
  const std::string path = write_gguf(w, "gguf-source");
  Tensor kept;
  {
    auto source = GgufWeightSource::open(path);
    ASSERT_TRUE(source.ok());
    EXPECT_EQ((*source)->find("q")->dtype, DType::kF32);  // dequantized on load
    EXPECT_EQ((*source)->find("q")->nbytes, 4u * 34u);
    kept = *(*source)->tensor("w");
  }
  EXPECT_EQ(std::memcmp(kept.raw_data(), a.raw_data(), a.nbytes()), 0);
}

TEST(GgufRoundTrip, WriterRejectsMismatchedArrays) {
  GgufWriter w;
  w.add("bad", gguf_array(GgufValueType::kInt32, {gguf_i32(1), gguf_string("x")}));
  auto bytes = w.serialize();
  EXPECT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), ErrorCode::kInvalidArgument);
  GgufWriter w2;
  w2.set_alignment(3);
  EXPECT_FALSE(w2.serialize().ok());
}

}  // namespace
}  // namespace tachyon
