// --quant-policy: the rule file's grammar and errors, glob matching, and a policy applied to the
// bundled model (formats per module as the rules say, the LM head only when named, the model's
// outputs those of the same modules quantized one by one).
#include <gtest/gtest.h>

#include <string>

#include "model/model_loader.h"
#include "model/quantize_weights.h"
#include "quant/quant_policy.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

TEST(QuantPolicy, GlobMatching) {
  EXPECT_TRUE(glob_match("*", "model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(glob_match("*.mlp.gate_proj", "model.layers.12.mlp.gate_proj"));
  EXPECT_FALSE(glob_match("*.mlp.gate_proj", "model.layers.12.mlp.up_proj"));
  EXPECT_TRUE(glob_match("model.layers.?.self_attn.*", "model.layers.3.self_attn.q_proj"));
  EXPECT_FALSE(glob_match("model.layers.?.self_attn.*", "model.layers.13.self_attn.q_proj"));
  EXPECT_TRUE(glob_match("model.layers.1*.mlp.*_proj", "model.layers.17.mlp.down_proj"));
  EXPECT_TRUE(glob_match("lm_head", "lm_head"));
  EXPECT_FALSE(glob_match("lm_head", "lm_head2"));
  EXPECT_TRUE(glob_match("**a*", "xxa"));
  EXPECT_FALSE(glob_match("", "x"));
}

TEST(QuantPolicy, ParsesRulesAndRejectsBadLines) {
  auto p = QuantPolicy::parse("# comment\n\n*.mlp.gate_proj dense   # keep\nmodel.layers.0.* int8\n* int4:g64\n",
                              "policy.txt");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->rules().size(), 3u);
  EXPECT_FALSE(p->rules()[0].spec.has_value());
  EXPECT_EQ(p->rules()[1].spec->format, QuantFormat::kInt8Channel);
  EXPECT_EQ(p->rules()[2].spec->format, QuantFormat::kInt4Group);
  EXPECT_EQ(p->rules()[2].spec->group_size, 64);
  EXPECT_EQ(p->rules()[2].line, 5);
  EXPECT_FALSE(p->spec_for("model.layers.0.mlp.gate_proj", std::nullopt).has_value());  // first match wins
  EXPECT_EQ(p->spec_for("model.layers.0.mlp.up_proj", std::nullopt)->format, QuantFormat::kInt8Channel);
  EXPECT_EQ(p->spec_for("model.layers.5.mlp.up_proj", std::nullopt)->format, QuantFormat::kInt4Group);
  for (const char* bad : {"* int3\n", "* int4:g100\n", "* int8:g64\n", "*\n", "* int8 extra\n", "# only\n",
                          "* int4:64\n"}) {
    auto r = QuantPolicy::parse(bad, "policy.txt");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("policy.txt"), std::string::npos) << r.status().to_string();
  }
  EXPECT_NE(QuantPolicy::parse("x int8\n* int3\n", "p").status().message().find("p:2"), std::string::npos);
  EXPECT_EQ(QuantPolicy::read_file("/nonexistent/policy").status().code(), ErrorCode::kNotFound);
}

TEST(QuantPolicy, AppliesPerModuleOnTheBundledModel) {
  LoadOptions o;
  o.path = testing::source_dir() + "/models/tachyon-demo";
  auto loaded = load_model(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  auto policy = QuantPolicy::parse("*.mlp.gate_proj dense\nmodel.layers.0.* int8\n*.self_attn.* int4:g64\n", "p");
  ASSERT_TRUE(policy.ok());
  ModelWeights w = loaded->model->weights();
  auto counts = quantize_linear_weights(w, *policy, QuantSpec{QuantFormat::kGgufQ8_0, 32});
  ASSERT_TRUE(counts.ok()) << counts.status().to_string();
  // 10 layers: gate dense everywhere; layer 0's six others int8; layers 1-9: 4 attention int4, up/down q8_0.
  EXPECT_EQ((*counts)["dense"], 10);
  EXPECT_EQ((*counts)["int8"], 6);
  EXPECT_EQ((*counts)["int4-g64"], 36);
  EXPECT_EQ((*counts)["q8_0"], 18);
  EXPECT_TRUE(w.layers[3].gate_proj.quant == nullptr);
  EXPECT_EQ(w.layers[0].down_proj.quant->format, QuantFormat::kInt8Channel);
  EXPECT_EQ(w.layers[4].o_proj.quant->format, QuantFormat::kInt4Group);
  EXPECT_EQ(w.layers[4].up_proj.quant->format, QuantFormat::kGgufQ8_0);
  EXPECT_TRUE(w.lm_head.quant == nullptr);  // tied to the embedding, and no rule names it

  // The same modules quantized one by one compute the same logits.
  ModelWeights by_hand = loaded->model->weights();
  for (size_t l = 0; l < by_hand.layers.size(); ++l) {
    LayerWeights& lw = by_hand.layers[l];
    for (Weight* m : {&lw.q_proj, &lw.k_proj, &lw.v_proj, &lw.o_proj, &lw.up_proj, &lw.down_proj}) {
      const bool attention = m == &lw.q_proj || m == &lw.k_proj || m == &lw.v_proj || m == &lw.o_proj;
      const QuantSpec spec = l == 0 ? QuantSpec{QuantFormat::kInt8Channel, 0}
                             : attention ? QuantSpec{QuantFormat::kInt4Group, 64}
                                         : QuantSpec{QuantFormat::kGgufQ8_0, 32};
      auto q = quantize_weight(*m, spec);
      ASSERT_TRUE(q.ok());
      *m = std::move(q).value();
    }
  }
  const std::vector<int32_t> tokens = {0, 17, 250, 3, 1999, 42, 7, 600};
  const LlamaModel a(loaded->model->config(), std::move(w)), b(loaded->model->config(), std::move(by_hand));
  const Tensor la = testing::prompt_logits(a, tokens), lb = testing::prompt_logits(b, tokens);
  for (int64_t i = 0; i < la.numel(); ++i) ASSERT_EQ(la.data<float>()[i], lb.data<float>()[i]) << i;
}

}  // namespace
}  // namespace tachyon
