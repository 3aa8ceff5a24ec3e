// The bundled model (models/tachyon-demo, a real trained byte-level-BPE Llama): the engine's
// tokenizer and greedy continuations equal those of HF tokenizers + transformers in float32
// (tools/reference/make_bundled_fixture.py).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace tachyon {
namespace {

TEST(BundledModel, TokenizerAndGreedyMatchTransformers) {
  auto text = read_text_file(testing::source_dir() + "/tests/fixtures/models/tachyon_demo_greedy.json");
  ASSERT_TRUE(text.ok());
  LoadOptions o;
  o.path = testing::source_dir() + "/models/tachyon-demo";
  auto m = load_model(o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(m->tokenizer);
  for (const auto& c : nlohmann::json::parse(*text).at("cases")) {
    const auto prompt_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto expected = c.at("greedy_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(m->tokenizer->encode(c.at("prompt").get<std::string>()), prompt_ids);
    const std::vector<int32_t> got = testing::greedy_ids(*m->model, prompt_ids, static_cast<int>(expected.size()));
    EXPECT_EQ(got, expected) << c.at("prompt");
  }
}

}  // namespace
}  // namespace tachyon
