// stories260K, a real pretrained llama2.c model: the llama2.c checkpoint reproduces, token for
// token, the greedy continuation computed by an independent float64 numpy forward over the same
// weights (tools/reference/make_stories_fixture.py), and its GGUF twin gives the same logits.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "fixture.h"
#include "model/model_loader.h"
#include "test_util.h"
#include "tokenizer/detokenizer.h"

namespace tachyon {
namespace {

std::vector<int32_t> greedy(const LoadedModel& m, const std::vector<int32_t>& prompt, int n) {
  return testing::greedy_ids(*m.model, prompt, n);
}

TEST(Stories260K, GreedyMatchesIndependentReference) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  auto text = read_text_file(testing::source_dir() + "/tests/fixtures/models/stories260K_greedy.json");
  ASSERT_TRUE(text.ok());
  const auto j = nlohmann::json::parse(*text);
  const auto prompt = j.at("prompt_ids").get<std::vector<int32_t>>();
  const auto expected = j.at("greedy_ids").get<std::vector<int32_t>>();

  LoadedModel m = testing::load_model_or_fail(shared + "/models/stories260K");  // the directory: finds the .bin and tok512.bin
  EXPECT_EQ(m.format, "llama2c");
  ASSERT_TRUE(m.tokenizer);
  EXPECT_EQ(m.tokenizer->encode("Once upon a time"), prompt);
  const auto ids = greedy(m, prompt, static_cast<int>(expected.size()));
  EXPECT_EQ(ids, expected);

  // The decoded story is fluent English, as llama2.c's own sample for this model.
  IncrementalDetokenizer detok(*m.tokenizer, DetokenizerOptions{true});
  std::string story;
  for (int32_t id : prompt) story += detok.push(id);
  for (int32_t id : ids) story += detok.push(id);
  story += detok.flush();
  EXPECT_EQ(story.rfind("Once upon a time, there was a little girl named Lily.", 0), 0u) << story;
}

TEST(Stories260K, GgufTwinGivesSameLogits) {
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  LoadedModel bin = testing::load_model_or_fail(shared + "/models/stories260K/stories260K.bin");
  LoadedModel gguf = testing::load_model_or_fail(shared + "/models/stories260K-gguf/stories260K.gguf");
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  EXPECT_EQ(greedy(bin, prompt, 40), greedy(gguf, prompt, 40));
  ASSERT_TRUE(gguf.tokenizer);
  EXPECT_EQ(gguf.tokenizer->encode("Once upon a time"), prompt);
}

}  // namespace
}  // namespace tachyon
