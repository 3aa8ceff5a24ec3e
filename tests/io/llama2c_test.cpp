// llama2.c checkpoints: the v0 and v1 layouts checked element by element with position-coded
// values, shared and separate classifiers, refused versions, size and header validation,
// truncations and random mutations, and finding the tokenizer beside a checkpoint.
#include <gtest/gtest.h>

#include <climits>
#include <filesystem>

#include "io/llama2c.h"
#include "io_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

using io_test::build_llama2c;
using io_test::expect_error;
using io_test::Llama2cSpec;
using io_test::write_file;

struct Expected {
  int array;
  int64_t base;  // flat index of the tensor's first element within its array
};

// Where each HF-named tensor's values come from in the position-coded checkpoint.
std::map<std::string, Expected> expected_layout(const Llama2cSpec& s) {
  const int64_t d = s.dim, h = s.hidden_dim, kv = s.n_kv_heads * (s.dim / s.n_heads);
  std::map<std::string, Expected> m;
  m["model.embed_tokens.weight"] = {io_test::kEmbed, 0};
  for (int64_t i = 0; i < s.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    m[p + "input_layernorm.weight"] = {io_test::kAttNorm, i * d};
    m[p + "self_attn.q_proj.weight"] = {io_test::kWq, i * d * d};
    m[p + "self_attn.k_proj.weight"] = {io_test::kWk, i * kv * d};
    m[p + "self_attn.v_proj.weight"] = {io_test::kWv, i * kv * d};
    m[p + "self_attn.o_proj.weight"] = {io_test::kWo, i * d * d};
    m[p + "post_attention_layernorm.weight"] = {io_test::kFfnNorm, i * d};
    m[p + "mlp.gate_proj.weight"] = {io_test::kW1, i * h * d};
    m[p + "mlp.down_proj.weight"] = {io_test::kW2, i * d * h};
    m[p + "mlp.up_proj.weight"] = {io_test::kW3, i * h * d};
  }
  m["model.norm.weight"] = {io_test::kNorm, 0};
  m["lm_head.weight"] = {s.shared_classifier ? io_test::kEmbed : io_test::kWcls, 0};
  return m;
}

class Llama2cLayout : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Llama2cLayout, EveryTensorElementComesFromItsArray) {
  Llama2cSpec spec;
  spec.version = std::get<0>(GetParam());
  spec.shared_classifier = std::get<1>(GetParam());
  const std::string path = testing::scratch_dir("l2c") + "/model.bin";
  write_file(path, build_llama2c(spec));
  auto ckpt = Llama2cCheckpoint::open(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const Llama2cConfig& c = (*ckpt)->config();
  EXPECT_EQ(c.version, spec.version);
  EXPECT_EQ(c.dim, 16);
  EXPECT_EQ(c.hidden_dim, 24);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.vocab_size, 10);
  EXPECT_EQ(c.seq_len, 6);
  EXPECT_EQ(c.head_size(), 4);
  EXPECT_EQ(c.kv_dim(), 8);
  EXPECT_EQ(c.shared_classifier, spec.shared_classifier);

  const auto layout = expected_layout(spec);
  const auto names = (*ckpt)->tensor_names();
  EXPECT_EQ(names.size(), layout.size());
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  const MappedFile& file = *(*ckpt)->mapped_file();
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    ASSERT_EQ(layout.count(name), 1u);
    const Expected e = layout.at(name);
    auto t = (*ckpt)->tensor(name);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const TensorMeta* meta = (*ckpt)->find(name);
    ASSERT_NE(meta, nullptr);
    EXPECT_EQ(t->shape(), meta->shape);
    EXPECT_EQ(meta->nbytes, t->nbytes());
    EXPECT_EQ(t->dtype(), DType::kF32);
    // A zero-copy view into the file.
    const auto* p = static_cast<const uint8_t*>(t->raw_data());
    EXPECT_GE(p, file.data());
    EXPECT_LE(p + t->nbytes(), file.data() + file.size());
    for (int64_t k = 0; k < t->numel(); ++k) {
      ASSERT_EQ(t->data<float>()[k], io_test::llama2c_value(e.array, e.base + k)) << "element " << k;
    }
  }
  const TensorMeta* q = (*ckpt)->find("model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(q->shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ((*ckpt)->find("model.layers.0.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ((*ckpt)->find("model.layers.0.mlp.gate_proj.weight")->shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ((*ckpt)->find("model.layers.0.mlp.down_proj.weight")->shape, (std::vector<int64_t>{16, 24}));
  EXPECT_EQ((*ckpt)->find("lm_head.weight")->shape, (std::vector<int64_t>{10, 16}));
  const bool same_memory =
      (*ckpt)->tensor("lm_head.weight")->raw_data() == (*ckpt)->tensor("model.embed_tokens.weight")->raw_data();
  EXPECT_EQ(same_memory, spec.shared_classifier);
  expect_error((*ckpt)->tensor("wq").status(), ErrorCode::kNotFound, path, {"'wq'"});
  EXPECT_NE((*ckpt)->describe().find("llama2.c"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(VersionsAndClassifiers, Llama2cLayout,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Bool()));

class Llama2cCorrupt : public ::testing::Test {
 protected:
  void SetUp() override { path_ = testing::scratch_dir("l2c-corrupt") + "/model.bin"; }
  Status open_bytes(const std::vector<uint8_t>& bytes) {
    write_file(path_, bytes);
    return Llama2cCheckpoint::open(path_).status();
  }
  std::string path_;
};

Llama2cSpec tiny_spec() {
  Llama2cSpec s;
  s.dim = 8;
  s.hidden_dim = 12;
  s.n_layers = 1;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.vocab_size = 5;
  s.seq_len = 4;
  return s;
}

TEST_F(Llama2cCorrupt, VersionsRefused) {
  std::vector<uint8_t> v2;
  io_test::put<uint32_t>(&v2, 0x616b3432);
  io_test::put<int32_t>(&v2, 2);
  v2.resize(512, 0);
  expect_error(open_bytes(v2), ErrorCode::kUnsupported, path_, {"version 2", "Q8_0"});
  io_test::poke<int32_t>(&v2, 4, 9);
  expect_error(open_bytes(v2), ErrorCode::kUnsupported, path_, {"version 9"});
}

TEST_F(Llama2cCorrupt, SizeMustMatchTheHeader) {
  for (int version : {0, 1}) {
    SCOPED_TRACE(version);
    Llama2cSpec spec = tiny_spec();
    spec.version = version;
    std::vector<uint8_t> bytes = build_llama2c(spec);
    ASSERT_TRUE(open_bytes(bytes).ok());
    const std::string size = std::to_string(bytes.size());
    bytes.push_back(0);
    expect_error(open_bytes(bytes), ErrorCode::kCorruptFile, path_,
                 {"should be " + size + " bytes, the file has " + std::to_string(bytes.size())});
    bytes.pop_back();
    // Every proper prefix is refused.
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      const Status s = open_bytes(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(cut)));
      ASSERT_FALSE(s.ok()) << cut;
      EXPECT_EQ(s.code(), ErrorCode::kCorruptFile) << cut << ": " << s.to_string();
      EXPECT_NE(s.message().find(path_), std::string::npos);
    }
    // A separate classifier the header does not announce: the message points at the flag.
    Llama2cSpec separate = spec;
    separate.shared_classifier = false;
    std::vector<uint8_t> with_wcls = build_llama2c(separate);
    if (version == 0) {
      io_test::poke<int32_t>(&with_wcls, 20, spec.vocab_size);
      expect_error(open_bytes(with_wcls), ErrorCode::kCorruptFile, path_, {"sign of vocab_size"});
    } else {
      with_wcls[36] = 1;
      expect_error(open_bytes(with_wcls), ErrorCode::kCorruptFile, path_, {"shared_classifier byte"});
    }
  }
}

TEST_F(Llama2cCorrupt, HeaderValues) {
  const std::vector<uint8_t> good = build_llama2c(tiny_spec());
  auto with = [&](int field, int32_t value) {
    std::vector<uint8_t> b = good;
    io_test::poke<int32_t>(&b, static_cast<size_t>(field) * 4, value);
    return b;
  };
  expect_error(open_bytes(with(0, 0)), ErrorCode::kCorruptFile, path_, {"dim=0", "positive"});
  expect_error(open_bytes(with(2, -1)), ErrorCode::kCorruptFile, path_, {"n_layers=-1"});
  expect_error(open_bytes(with(6, 0)), ErrorCode::kCorruptFile, path_, {"seq_len=0"});
  expect_error(open_bytes(with(5, INT_MIN)), ErrorCode::kCorruptFile, path_, {"vocab_size=-2147483648"});
  expect_error(open_bytes(with(5, 0)), ErrorCode::kCorruptFile, path_, {"vocab_size=0"});
  expect_error(open_bytes(with(3, 3)), ErrorCode::kCorruptFile, path_, {"dim 8 is not a multiple of n_heads 3"});
  expect_error(open_bytes(with(4, 3)), ErrorCode::kCorruptFile, path_, {"n_heads 2 is not a multiple of n_kv_heads 3"});
  // Sizes whose layout overflows 64 bits are a size mismatch, not a crash.
  std::vector<uint8_t> big = with(0, 1 << 30);
  io_test::poke<int32_t>(&big, 4, INT_MAX);
  io_test::poke<int32_t>(&big, 8, INT_MAX);
  io_test::poke<int32_t>(&big, 12, 1 << 30);
  io_test::poke<int32_t>(&big, 16, 1 << 30);
  expect_error(open_bytes(big), ErrorCode::kCorruptFile, path_, {"more than 2^64"});
  expect_error(open_bytes({1, 2}), ErrorCode::kCorruptFile, path_, {"shorter than the 28-byte"});

  Llama2cSpec v1 = tiny_spec();
  v1.version = 1;
  std::vector<uint8_t> b1 = build_llama2c(v1);
  b1[36] = 7;
  expect_error(open_bytes(b1), ErrorCode::kCorruptFile, path_, {"shared_classifier byte is 7"});
  b1 = build_llama2c(v1);
  io_test::poke<int32_t>(&b1, 28, -5);
  expect_error(open_bytes(b1), ErrorCode::kCorruptFile, path_, {"vocab_size must be positive"});
  expect_error(open_bytes(std::vector<uint8_t>(b1.begin(), b1.begin() + 100)), ErrorCode::kCorruptFile, path_,
               {"256-byte"});
}

TEST_F(Llama2cCorrupt, RandomMutationsNeverCrash) {
  for (int version : {0, 1}) {
    Llama2cSpec spec = tiny_spec();
    spec.version = version;
    auto open = [](const std::string& path) -> Status {
      auto c = Llama2cCheckpoint::open(path);
      if (!c.ok()) return c.status();
      io_test::touch_all_tensors(**c, (*c)->mapped_file().get());
      return Status::Ok();
    };
    // Mutations in the float data go unnoticed (any bytes are valid floats), so the fuzzer's
    // error floor holds only because its edits favour the header.
    io_test::fuzz_file(build_llama2c(spec), path_, 4242u + static_cast<uint32_t>(version), 1500, open);
    const uint32_t seed = testing::fresh_seed();
    SCOPED_TRACE(::testing::Message() << "fresh seed " << seed);
    io_test::fuzz_file(build_llama2c(spec), path_, seed, 500, open);
  }
}

TEST(Llama2cTokenizer, FoundBesideTheCheckpoint) {
  const std::string dir = testing::scratch_dir("l2c-tok");
  const std::string ckpt = dir + "/stories.bin";
  io_test::write_file(ckpt, {0});
  expect_error(find_llama2c_tokenizer(ckpt).status(), ErrorCode::kNotFound, ckpt);
  io_test::write_file(dir + "/tok512.bin", {0});
  EXPECT_EQ(*find_llama2c_tokenizer(ckpt), dir + "/tok512.bin");
  io_test::write_file(dir + "/tok32000.bin", {0});
  expect_error(find_llama2c_tokenizer(ckpt).status(), ErrorCode::kInvalidArgument, ckpt, {"tok32000.bin"});
  EXPECT_EQ(*find_llama2c_tokenizer(ckpt, 512), dir + "/tok512.bin");
  io_test::write_file(dir + "/tokenizer.bin", {0});
  EXPECT_EQ(*find_llama2c_tokenizer(ckpt), dir + "/tokenizer.bin");
  std::filesystem::create_directories(dir + "/sub");
  expect_error(find_llama2c_tokenizer(dir + "/sub/model.bin").status(), ErrorCode::kNotFound, "model.bin");
  io_test::write_file(dir + "/sub/tok.bin", {0});
  EXPECT_EQ(*find_llama2c_tokenizer(dir + "/sub/model.bin"), dir + "/sub/tok.bin");
}

}  // namespace
}  // namespace tachyon
