// rope == the scalar reference (both styles, partial rotary, large positions, strided views), the
// reference's rotation has RoPE's defining property, and make_rope_table matches Hugging Face
// transformers' tables (fixture from tools/reference/make_rope_fixtures.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "ops/cpu/reference.h"
#include "ops/ops.h"
#include "ops_test_util.h"

namespace tachyon {
namespace {

using ops::cpu::Isa;
using testing::all_close;

constexpr double kTol = 1e-6;

RopeTable table_for(RopeStyle style, int rotary_dim, RopeScaling scaling = RopeScaling::kNone) {
  RopeConfig c;
  c.theta = 1000000.0f;
  c.rotary_dim = rotary_dim;
  c.style = style;
  c.scaling = scaling;
  c.factor = 4.0f;
  c.original_max_position = 4096;
  return make_rope_table(c);
}

TEST(Rope, MatchesReference) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kInterleaved}) {
      for (auto [head_dim, rotary_dim] :
           std::vector<std::pair<int, int>>{{64, 64}, {128, 128}, {48, 48}, {6, 6}, {128, 64}, {80, 20}, {34, 34}}) {
        for (RopeScaling scaling : {RopeScaling::kNone, RopeScaling::kYarn}) {
          const RopeTable table = table_for(style, rotary_dim, scaling);
          for (int64_t n : {1, 3, 17}) {
            const std::string what =
                fmt::format("{} {} head_dim={} rotary={} n={}", ops::cpu::isa_name(isa),
                            style == RopeStyle::kNeox ? "neox" : "interleaved", head_dim, rotary_dim, n);
            const int64_t heads = 3;
            const Tensor x0 = testing::random_tensor({n, heads, head_dim}, rng);
            const Tensor positions = testing::random_i32({n}, rng, 0, 200000);
            Tensor x = x0.contiguous();
            ops::rope(x, positions, table);
            Tensor expected = x0.contiguous();
            ops::reference::rope(expected, positions, table);
            ASSERT_TRUE(all_close(x, expected, kTol, what));
          }
        }
      }
    }
  }
}

// q and k rotated in place inside a fused QKV buffer; v untouched.
TEST(Rope, StridedViewsOfFusedQkv) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (Isa isa : testing::simd_isas()) {
    testing::IsaScope scope(isa);
    const int64_t n = 9, heads = 4, kv_heads = 2, head_dim = 32;
    const Tensor qkv0 = testing::random_tensor({n, heads + 2 * kv_heads, head_dim}, rng);
    const Tensor positions = testing::random_i32({n}, rng, 0, 5000);
    const RopeTable table = table_for(RopeStyle::kNeox, head_dim);
    Tensor qkv = qkv0.contiguous();
    Tensor q = qkv.slice(1, 0, heads), k = qkv.slice(1, heads, heads + kv_heads);
    ops::rope(q, positions, table);
    ops::rope(k, positions, table);
    Tensor q_ref = qkv0.slice(1, 0, heads).contiguous(), k_ref = qkv0.slice(1, heads, heads + kv_heads).contiguous();
    ops::reference::rope(q_ref, positions, table);
    ops::reference::rope(k_ref, positions, table);
    ASSERT_TRUE(all_close(q, q_ref, kTol, "q"));
    ASSERT_TRUE(all_close(k, k_ref, kTol, "k"));
    ASSERT_TRUE(testing::bitwise_equal(qkv.slice(1, heads + kv_heads, heads + 2 * kv_heads),
                                       qkv0.slice(1, heads + kv_heads, heads + 2 * kv_heads), "v untouched"));
  }
}

// <rope(q, p1), rope(k, p2)> depends only on p1 - p2: the reference rotates as RoPE must.
TEST(Rope, ReferenceDotProductDependsOnlyOnOffset) {
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 rng(seed);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kInterleaved}) {
    const int head_dim = 64;
    RopeConfig c;
    c.theta = 10000.0f;
    c.rotary_dim = head_dim;
    c.style = style;
    const RopeTable table = make_rope_table(c);
    const Tensor q0 = testing::random_tensor({1, 1, head_dim}, rng);
    const Tensor k0 = testing::random_tensor({1, 1, head_dim}, rng);
    auto rotated_dot = [&](int32_t pq, int32_t pk) {
      Tensor q = q0.contiguous(), k = k0.contiguous();
      ops::reference::rope(q, testing::i32_tensor({pq}), table);
      ops::reference::rope(k, testing::i32_tensor({pk}), table);
      double dot = 0.0;
      for (int i = 0; i < head_dim; ++i) dot += static_cast<double>(q.data<float>()[i]) * k.data<float>()[i];
      return dot;
    };
    const double base = rotated_dot(5, 2);
    EXPECT_NEAR(rotated_dot(105, 102), base, 1e-4);
    EXPECT_NEAR(rotated_dot(1003, 1000), base, 1e-3);
    // position 0 is the identity
    Tensor q = q0.contiguous();
    ops::reference::rope(q, testing::i32_tensor({0}), table);
    EXPECT_TRUE(testing::bitwise_equal(q, q0, "position 0"));
  }
}

TEST(RopeTable, PlainAndLinear) {
  RopeConfig c;
  c.theta = 10000.0f;
  c.rotary_dim = 8;
  RopeTable t = make_rope_table(c);
  ASSERT_EQ(t.inv_freq.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(t.inv_freq[static_cast<size_t>(i)], std::pow(10000.0f, -2.0f * i / 8));
  EXPECT_EQ(t.attention_scale, 1.0f);
  c.scaling = RopeScaling::kLinear;
  c.factor = 4.0f;
  RopeTable lin = make_rope_table(c);
  for (int i = 0; i < 4; ++i)
    EXPECT_FLOAT_EQ(lin.inv_freq[static_cast<size_t>(i)], t.inv_freq[static_cast<size_t>(i)] / 4);
}

RopeConfig config_from_fixture(const nlohmann::json& c) {
  const auto& p = c["rope_parameters"];
  RopeConfig config;
  config.rotary_dim = c["rotary_dim"].get<int>();
  config.theta = p["rope_theta"].get<float>();
  const std::string type = p["rope_type"].get<std::string>();
  if (type == "linear") config.scaling = RopeScaling::kLinear;
  if (type == "llama3") config.scaling = RopeScaling::kLlama3;
  if (type == "yarn") config.scaling = RopeScaling::kYarn;
  config.factor = p.value("factor", 1.0f);
  config.low_freq_factor = p.value("low_freq_factor", 1.0f);
  config.high_freq_factor = p.value("high_freq_factor", 4.0f);
  config.original_max_position = p.value("original_max_position_embeddings", 8192);
  config.yarn_beta_fast = p.value("beta_fast", 32.0f);
  config.yarn_beta_slow = p.value("beta_slow", 1.0f);
  config.yarn_attention_factor = p.value("attention_factor", 0.0f);
  config.yarn_truncate = p.value("truncate", true);
  return config;
}

TEST(RopeTable, MatchesTransformersFixtures) {
  const std::string path = testing::source_dir() + "/tests/fixtures/ops/rope_tables.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing fixture " << path;
  const nlohmann::json fixture = nlohmann::json::parse(in);
  ASSERT_GE(fixture["cases"].size(), 9u);
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const RopeTable table = make_rope_table(config_from_fixture(c));
    const auto expected = c["inv_freq"].get<std::vector<float>>();
    ASSERT_EQ(table.inv_freq.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      // transformers computes in f32, we in double rounded once: a few f32 ulps apart at most.
      EXPECT_NEAR(table.inv_freq[i], expected[i], 4e-7 * std::fabs(expected[i])) << "inv_freq[" << i << "]";
    }
    EXPECT_NEAR(table.attention_scale, c["attention_scale"].get<double>(), 1e-6);

    // cos/sin at recorded positions (up to 131071): the f32 angle definition matches HF's. HF
    // evaluates cos in f32 (error ~ 1 ulp of the angle's cos), we in double.
    const auto positions = c["positions"].get<std::vector<int32_t>>();
    const auto cos = c["cos"].get<std::vector<std::vector<float>>>();
    const auto sin = c["sin"].get<std::vector<std::vector<float>>>();
    for (size_t p = 0; p < positions.size(); ++p) {
      for (size_t i = 0; i < expected.size(); ++i) {
        float cv, sv;
        ops::reference::rope_cos_sin(positions[p], expected[i], table.attention_scale, &cv, &sv);
        ASSERT_NEAR(cv, cos[p][i], 1e-6) << "cos at position " << positions[p] << " pair " << i;
        ASSERT_NEAR(sv, sin[p][i], 1e-6) << "sin at position " << positions[p] << " pair " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tachyon
