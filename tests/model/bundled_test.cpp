// The bundled models (models/tachyon-demo, a real trained byte-level-BPE Llama, and its draft
// models/tachyon-demo-draft): the engine's tokenizer and greedy continuations equal those of HF
// tokenizers + transformers in float32 (tools/reference/make_bundled_fixture.py).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace tachyon {
namespace {

void expect_matches_fixture(const std::string& model_dir, const std::string& fixture) {
  auto text = read_text_file(testing::source_dir() + "/tests/fixtures/models/" + fixture);
  ASSERT_TRUE(text.ok());
  LoadOptions o;
  o.path = testing::source_dir() + "/models/" + model_dir;
  auto m = load_model(o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(m->tokenizer);
  // Named: a range-for over `parse(...).at("cases")` would iterate a member of a temporary that
  // is destroyed before the loop starts.
  const nlohmann::json fixture_json = nlohmann::json::parse(*text);
  for (const auto& c : fixture_json.at("cases")) {
    const auto prompt_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto expected = c.at("greedy_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(m->tokenizer->encode(c.at("prompt").get<std::string>()), prompt_ids);
    const std::vector<int32_t> got = testing::greedy_ids(*m->model, prompt_ids, static_cast<int>(expected.size()));
    EXPECT_EQ(got, expected) << model_dir << ": " << c.at("prompt");
  }
}

TEST(BundledModel, TokenizerAndGreedyMatchTransformers) {
  expect_matches_fixture("tachyon-demo", "tachyon_demo_greedy.json");
}

TEST(BundledModel, DraftMatchesTransformersAndSharesTheVocabulary) {
  expect_matches_fixture("tachyon-demo-draft", "tachyon_demo_draft_greedy.json");
  LoadOptions t, d;
  t.path = testing::source_dir() + "/models/tachyon-demo";
  d.path = testing::source_dir() + "/models/tachyon-demo-draft";
  auto target = load_model(t);
  auto draft = load_model(d);
  ASSERT_TRUE(target.ok() && draft.ok());
  EXPECT_EQ(target->model->config().vocab_size, draft->model->config().vocab_size);
  const std::string probe = "func main() {\n\tfmt.Println(\"héllo\")\n}";
  EXPECT_EQ(target->tokenizer->encode(probe), draft->tokenizer->encode(probe));
  EXPECT_EQ(target->eos_token_ids, draft->eos_token_ids);
  EXPECT_LT(draft->model->weights().total_bytes(), target->model->weights().total_bytes() / 3);
}

}  // namespace
}  // namespace tachyon
