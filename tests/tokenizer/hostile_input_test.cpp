// Hostile tokenizer files: Sequences nested thousands deep are refused with an error naming the
// limit (the parsers recurse once per level), 200k added tokens load in linear time, and a
// single huge id cannot make the tokenizer allocate a table of 16 million entries.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "test_util.h"
#include "wall_clock_scale.h"
#include "tokenizer/tokenizer.h"

namespace tachyon::testing {
namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

const std::string kModel = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";

// `depth` Sequences, each holding the next, around `leaf`.
std::string nested_sequence(int depth, const std::string& list_key, const std::string& leaf) {
  std::string out;
  for (int i = 0; i < depth; ++i) out += R"({"type": "Sequence", ")" + list_key + R"(": [)";
  out += leaf;
  for (int i = 0; i < depth; ++i) out += "]}";
  return out;
}

std::string tokenizer_json(const std::string& field, const std::string& value, const std::string& vocab = kModel) {
  return R"({"added_tokens": [], "model": )" + vocab + ", \"" + field + "\": " + value + "}";
}

class HostileTokenizer : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = scratch_dir("tok-hostile"); }
  Result<std::unique_ptr<Tokenizer>> load(const std::string& json_text, const std::string& config_text = "") {
    write_file(dir_ + "/tokenizer.json", json_text);
    std::string config_path;
    if (!config_text.empty()) {
      config_path = dir_ + "/tokenizer_config.json";
      write_file(config_path, config_text);
    }
    return Tokenizer::from_hf_json(dir_ + "/tokenizer.json", config_path);
  }
  std::string dir_;
};

struct SequenceCase {
  const char* field;
  const char* list_key;
  const char* leaf;
};
const SequenceCase kSequences[] = {
    {"normalizer", "normalizers", R"({"type": "Lowercase"})"},
    {"pre_tokenizer", "pretokenizers", R"({"type": "ByteLevel", "add_prefix_space": false})"},
    {"post_processor", "processors", R"({"type": "ByteLevel"})"},
    {"decoder", "decoders", R"({"type": "ByteLevel"})"},
};

TEST_F(HostileTokenizer, DeeplyNestedSequencesAreRefusedNamingTheLimit) {
  for (const SequenceCase& c : kSequences) {
    for (const int depth : {17, 100, 60000}) {  // past the Sequence limit; past the JSON limit
      auto tok = load(tokenizer_json(c.field, nested_sequence(depth, c.list_key, c.leaf)));
      ASSERT_FALSE(tok.ok()) << c.field << " " << depth;
      EXPECT_EQ(tok.status().code(), ErrorCode::kCorruptFile);
      EXPECT_NE(tok.status().message().find("levels (the limit)"), std::string::npos) << tok.status().message();
      EXPECT_LT(tok.status().message().size(), 400u);
    }
    auto tok = load(tokenizer_json(c.field, nested_sequence(3, c.list_key, c.leaf)));
    EXPECT_TRUE(tok.ok()) << c.field << ": " << tok.status().to_string();
  }
}

TEST_F(HostileTokenizer, ManyAddedTokensInTheConfigLoadInLinearTime) {
  // 200k entries took over 20 s when each was checked against every earlier one.
  constexpr int kCount = 200000;
  std::string config = R"({"added_tokens_decoder": {)";
  for (int i = 0; i < kCount; ++i) {
    config += fmt::format(R"({}"{}": {{"content": "<t{}>", "special": true}})", i == 0 ? "" : ",", 3 + i, i);
  }
  config += "}}";
  const auto start = std::chrono::steady_clock::now();
  auto tok = load(tokenizer_json("decoder", "null"), config);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->vocab_size(), 3 + kCount);
  EncodeOptions options;
  options.add_bos = false;
  options.parse_special = true;
  EXPECT_EQ((*tok)->encode("<t199999>", options), (std::vector<int32_t>{3 + kCount - 1}));
  EXPECT_LT(seconds, 5.0 * testing::kWallClockScale) << "a generous bound: linear loading takes well under a second";
}

TEST_F(HostileTokenizer, AHugeIdDoesNotAllocateA16MillionEntryTable) {
  auto tok = load(tokenizer_json("decoder", "null", R"({"type": "BPE", "vocab": {"a": 0, "b": 16777215}, "merges": []})"));
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("16777215"), std::string::npos) << tok.status().message();
  // The same through an added token.
  tok = load(R"({"added_tokens": [{"id": 16777215, "content": "<x>", "special": true}], "model": )" + kModel + "}");
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("16777215"), std::string::npos) << tok.status().message();
  tok = load(tokenizer_json("decoder", "null"), R"({"added_tokens_decoder": {"16777215": {"content": "<x>"}}})");
  ASSERT_FALSE(tok.ok());
  // Gaps of ordinary size still load.
  tok = load(R"({"added_tokens": [{"id": 1000, "content": "<x>", "special": true}], "model": )" + kModel + "}");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->vocab_size(), 1001);
}

}  // namespace
}  // namespace tachyon::testing
