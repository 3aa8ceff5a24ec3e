#include <cmath>

#include <gtest/gtest.h>

#include "model/model_loader.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace tachyon {
namespace {

Result<LoadedModel> load(const std::string& path, DType dtype = DType::kBF16, uint64_t seed = 0) {
  LoadOptions o;
  o.path = path;
  o.synthetic_dtype = dtype;
  o.synthetic_seed = seed;
  return load_model(o);
}

std::vector<int32_t> run(const LlamaModel& model) {
  const std::vector<int32_t> out = testing::greedy_ids(model, {1, 7, 99, 3, 250, 17}, 12);
  EXPECT_EQ(out.size(), 12u);
  return out;
}

TEST(Synthetic, EveryPresetHasAValidConfig) {
  for (const auto& name : synthetic_presets()) {
    auto c = synthetic_config(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().to_string();
  }
  auto q = synthetic_config("qwen2.5-0.5b");
  ASSERT_TRUE(q.ok());
  // Qwen2.5-0.5B has 494M parameters (embedding tied).
  EXPECT_NEAR(static_cast<double>(q->num_parameters()) / 1e6, 494.0, 1.0);
  auto l = synthetic_config("llama3-8b");
  EXPECT_NEAR(static_cast<double>(l->num_parameters()) / 1e9, 8.03, 0.01);
  EXPECT_FALSE(synthetic_config("gpt-17").ok());
}

TEST(Synthetic, DeterministicFromSeedAndFinite) {
  auto a = load("synthetic:tiny", DType::kBF16, 7);
  auto b = load("synthetic:tiny", DType::kBF16, 7);
  auto c = load("synthetic:tiny", DType::kBF16, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const auto ta = run(*a->model), tb = run(*b->model), tc = run(*c->model);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Synthetic, UnknownPresetIsAClearError) {
  auto r = load("synthetic:nope");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("qwen2.5-0.5b"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace tachyon
