// Hostile JSON: nesting tens of thousands of levels deep is refused before parsing (a clear
// error naming the limit, not a stack overflow), and error messages quote at most a couple of
// hundred bytes of the offending value.
#include <gtest/gtest.h>

#include <string>

#include "io/json_file.h"
#include "io/quantization_config.h"
#include "model/model_config.h"

namespace tachyon {
namespace {

std::string nested(int depth, const std::string& inner = "1") {
  return std::string(static_cast<size_t>(depth), '[') + inner + std::string(static_cast<size_t>(depth), ']');
}

std::string config_with(const std::string& field, const std::string& value) {
  std::string fields = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 16,
    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2)";
  return fields + ", \"" + field + "\": " + value + "}";
}

TEST(HostileJson, DeepNestingIsRefusedNamingTheLimit) {
  for (const int depth : {kMaxJsonDepth + 1, 75000}) {
    auto j = parse_json(config_with("vocab_size_extra", nested(depth)), "config.json");
    ASSERT_FALSE(j.ok()) << depth;
    EXPECT_EQ(j.status().code(), ErrorCode::kCorruptFile);
    EXPECT_NE(j.status().message().find(fmt::format("deeper than {} levels", kMaxJsonDepth)), std::string::npos)
        << j.status().message();
  }
}

TEST(HostileJson, NestingUpToTheLimitParses) {
  EXPECT_TRUE(parse_json(nested(kMaxJsonDepth), "x").ok());
  // Brackets inside strings (escaped quotes too) are not nesting.
  const std::string brackets = "\"" + std::string(100000, '[') + "\\\"" + std::string(100000, '{') + "\"";
  auto j = parse_json("[" + brackets + "]", "x");
  EXPECT_TRUE(j.ok()) << j.status().to_string();
}

TEST(HostileJson, ConfigErrorsQuoteLittleOfAHugeValue) {
  // A deep value that passes the limit, a long array and a long string, each where a number belongs.
  std::string long_array = "[1";
  for (int i = 0; i < 100000; ++i) long_array += ",1";
  long_array += "]";
  for (const std::string& value : {nested(kMaxJsonDepth - 2), long_array, "\"" + std::string(300000, 'x') + "\""}) {
    auto j = parse_json(config_with("rope_theta", value), "config.json");
    ASSERT_TRUE(j.ok()) << j.status().to_string();
    auto c = model_config_from_hf(*j, "config.json");
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("rope_theta"), std::string::npos) << c.status().message();
    EXPECT_LT(c.status().message().size(), kMaxEchoBytes + 100) << c.status().message().substr(0, 400);
  }
}

TEST(HostileJson, QuantizationConfigErrorsQuoteLittle) {
  auto j = parse_json(config_with("quantization_config", R"({"quant_method": "awq", "bits": ")" +
                                                             std::string(100000, 'x') + "\"}"),
                      "config.json");
  ASSERT_TRUE(j.ok());
  auto q = read_quantization_config(*j, "config.json");
  ASSERT_FALSE(q.ok());
  EXPECT_LT(q.status().message().size(), kMaxEchoBytes + 150) << q.status().message().substr(0, 400);
}

TEST(HostileJson, ParseErrorQuotesLittle) {
  auto j = parse_json("[\"" + std::string(100000, 'x'), "x");  // an unterminated 100 KB string
  ASSERT_FALSE(j.ok());
  EXPECT_LT(j.status().message().size(), kMaxEchoBytes + 200) << j.status().message().substr(0, 400);
}

TEST(HostileJson, TokenIdsBeyondInt32AreRefusedNotWrapped) {
  for (const std::string& value : {"1099511627776", "[1, 1099511627776]", "-1", "4294967296", "1.5"}) {
    auto j = parse_json(config_with("eos_token_id", value), "config.json");
    ASSERT_TRUE(j.ok());
    auto c = model_config_from_hf(*j, "config.json");
    ASSERT_FALSE(c.ok()) << value;
    EXPECT_NE(c.status().message().find("eos_token_id"), std::string::npos) << c.status().message();
  }
  auto j = parse_json(config_with("bos_token_id", "1099511627776"), "config.json");
  ASSERT_TRUE(j.ok());
  EXPECT_FALSE(model_config_from_hf(*j, "config.json").ok());
  j = parse_json(config_with("eos_token_id", "[2, 3]"), "config.json");
  auto c = model_config_from_hf(*j, "config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2, 3}));
}

TEST(HostileJson, ExcerptCutsAtACharacterBoundary) {
  const std::string text(300, 'a');
  EXPECT_EQ(excerpt("short"), "short");
  const std::string cut = excerpt(text);
  EXPECT_LT(cut.size(), kMaxEchoBytes + 30);
  EXPECT_NE(cut.find("(300 bytes)"), std::string::npos);
  const std::string utf8 = std::string(199, 'a') + "\xC3\xA9" + std::string(100, 'b');  // é straddles byte 200
  EXPECT_EQ(excerpt(utf8).substr(0, 200), std::string(199, 'a') + ".");
}

}  // namespace
}  // namespace tachyon
