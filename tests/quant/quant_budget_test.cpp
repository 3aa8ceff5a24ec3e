// Mixed precision under an error budget (`tachyon quantize --budget`): every candidate format's
// error per module on the bundled model, the choice (within the budget, the fewest bytes,
// monotone in the budget), the policy it writes read back into the same weights, W8A8's error the
// same as quantize_model's, and the command end to end (the directory it writes loads with its
// policy applied; perplexity --kl compares it with the weights as stored).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "model/model_loader.h"
#include "model/quantize_model.h"
#include "model/quantize_weights.h"
#include "quant/quant_policy.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

using testing::demo_f32;

std::vector<int32_t> calib_tokens(const LoadedModel& m, size_t count) {
  auto text = read_text_file(testing::source_dir() + "/tests/data/calib/calib.txt");
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  std::vector<int32_t> ids = m.tokenizer->encode(text->substr(0, count * 8));
  ids.resize(std::min(ids.size(), count));
  return ids;
}

class QuantBudget : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    loaded_ = new LoadedModel();
    model_ = new LlamaModel(demo_f32(2, loaded_));
    calib_ = new std::vector<int32_t>(calib_tokens(*loaded_, 256));
    MeasureFormatsOptions o;
    o.sequence_length = 128;
    auto m = measure_formats(*model_, *calib_, o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    measured_ = new FormatMeasurements(std::move(m).value());
  }
  static void TearDownTestSuite() {
    delete measured_;
    delete calib_;
    delete model_;
    delete loaded_;
  }
  static LoadedModel* loaded_;
  static LlamaModel* model_;
  static std::vector<int32_t>* calib_;
  static FormatMeasurements* measured_;
};
LoadedModel* QuantBudget::loaded_ = nullptr;
LlamaModel* QuantBudget::model_ = nullptr;
std::vector<int32_t>* QuantBudget::calib_ = nullptr;
FormatMeasurements* QuantBudget::measured_ = nullptr;

TEST_F(QuantBudget, MeasuresEveryCandidateOfEveryModule) {
  ASSERT_EQ(measured_->modules.size(), 14u);
  EXPECT_EQ(measured_->modules[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(measured_->modules[13].module, "model.layers.1.mlp.down_proj");
  for (const ModuleFormats& m : measured_->modules) {
    SCOPED_TRACE(m.module);
    // Ten candidates; the 640-wide down_proj takes q4_k's and q5_k's fallbacks (q5_0, q5_1) and
    // q6_k's (q8_0, which is also a candidate of its own: measured once).
    EXPECT_EQ(m.measured.size(), m.module.find("down_proj") != std::string::npos ? 9u : 10u);
    double int8 = -1, int4 = -1;
    for (const MeasuredFormat& f : m.measured) {
      EXPECT_GT(f.error, 0.0) << quant_spec_name(f.spec);
      EXPECT_LT(f.error, 0.5) << quant_spec_name(f.spec);
      EXPECT_LT(f.bytes, m.dense_bytes) << quant_spec_name(f.spec);  // f32 as stored here
      if (quant_spec_name(f.spec) == "int8") int8 = f.error;
      if (quant_spec_name(f.spec) == "int4:g128") int4 = f.error;
      if (m.module.find("down_proj") != std::string::npos) {
        EXPECT_NE(f.spec.format, QuantFormat::kGgufQ4_K);
        EXPECT_NE(f.spec.format, QuantFormat::kGgufQ5_K);
      }
    }
    ASSERT_GT(int8, 0.0);
    EXPECT_LT(int8, 0.25 * int4);  // 8 bits per channel against 4 bits per group of 128
  }
}

TEST_F(QuantBudget, ChoosesTheCheapestWithinTheBudgetAndIsMonotone) {
  std::vector<double> errors;
  for (const ModuleFormats& m : measured_->modules) {
    for (const MeasuredFormat& f : m.measured) errors.push_back(f.error);
  }
  std::sort(errors.begin(), errors.end());
  std::vector<double> budgets = {errors.front() * 0.5};
  for (size_t i = 0; i < errors.size(); i += errors.size() / 12) budgets.push_back(errors[i]);
  budgets.push_back(errors.back() * 2);
  FormatChoice previous;
  for (size_t b = 0; b < budgets.size(); ++b) {
    const double budget = budgets[b];
    const FormatChoice c = choose_formats(*measured_, budget);
    ASSERT_EQ(c.modules.size(), measured_->modules.size());
    for (size_t i = 0; i < c.modules.size(); ++i) {
      const ModuleChoice& m = c.modules[i];
      SCOPED_TRACE(m.module + " budget " + std::to_string(budget));
      EXPECT_LE(m.error, budget);
      // Nothing that fits is cheaper than the choice.
      for (const MeasuredFormat& f : measured_->modules[i].measured) {
        if (f.error <= budget) {
          EXPECT_GE(f.bytes, m.bytes) << quant_spec_name(f.spec);
        }
      }
      if (!m.spec) {
        EXPECT_EQ(m.bytes, m.dense_bytes);
        for (const MeasuredFormat& f : measured_->modules[i].measured) EXPECT_GT(f.error, budget);
      }
      if (b > 0) {
        EXPECT_LE(m.bytes, previous.modules[i].bytes);  // a larger budget never costs more
      }
    }
    if (b > 0) {
      EXPECT_LE(c.bytes, previous.bytes);
    }
    previous = c;
  }
  // Below every error nothing is quantized; above every error every module takes its cheapest.
  const FormatChoice none = choose_formats(*measured_, budgets.front());
  EXPECT_EQ(none.bytes, none.dense_bytes);
  const FormatChoice all = choose_formats(*measured_, budgets.back());
  EXPECT_EQ(all.bytes, cheapest_formats(*measured_).bytes);
  EXPECT_LT(all.bytes, all.dense_bytes / 5);  // int4 / q4_k against f32
}

TEST_F(QuantBudget, ThePolicyRebuildsTheWeightsMeasured) {
  const FormatChoice c = choose_formats(*measured_, 0.03);
  int quantized = 0, dense = 0;
  for (const ModuleChoice& m : c.modules) (m.spec ? quantized : dense) += 1;
  EXPECT_GT(quantized, 0);
  const std::string text = format_policy_text(c, "test");
  auto policy = QuantPolicy::parse(text, "budget");
  ASSERT_TRUE(policy.ok()) << policy.status().to_string() << "\n" << text;
  ModelWeights w = model_->weights();
  ASSERT_TRUE(quantize_linear_weights(w, *policy, std::nullopt).ok());
  size_t i = 0;
  for (const LayerWeights& l : w.layers) {
    for (const Weight* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      const ModuleChoice& want = c.modules[i++];
      SCOPED_TRACE(want.module);
      ASSERT_EQ(m->quant != nullptr, want.spec.has_value());
      EXPECT_EQ(static_cast<int64_t>(m->nbytes()), want.bytes);
      if (want.spec) {
        EXPECT_EQ(m->quant->format, want.spec->format);
      }
    }
  }
}

// The budget's W8A8 error is the one `quantize --method w8a8 --smooth-alpha 0` reports.
TEST_F(QuantBudget, W8A8ErrorMatchesQuantizeModel) {
  QuantizeModelOptions o;
  o.method = QuantMethod::kW8A8;
  o.smooth_alpha = 0.0f;
  o.sequence_length = 128;
  o.max_layer_error = 1e9;
  auto q = quantize_model(*model_, *calib_, o);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  size_t i = 0;
  for (const LayerQuantReport& l : q->layers) {
    for (const ModuleQuantReport& r : l.modules) {
      const ModuleFormats& m = measured_->modules[i++];
      const auto w8a8 = std::find_if(m.measured.begin(), m.measured.end(),
                                     [](const MeasuredFormat& f) { return f.spec.format == QuantFormat::kW8A8; });
      ASSERT_NE(w8a8, m.measured.end());
      EXPECT_NEAR(w8a8->error, *r.relative_error, 1e-9 + 1e-6 * *r.relative_error) << m.module;
    }
  }
}

TEST_F(QuantBudget, BadInputsAreErrors) {
  MeasureFormatsOptions o;
  EXPECT_FALSE(measure_formats(*model_, std::vector<int32_t>{1}, o).ok());
  EXPECT_FALSE(measure_formats(*model_, std::vector<int32_t>{1, 2, 1 << 20}, o).ok());
  ModelWeights w = model_->weights();
  ASSERT_TRUE(quantize_linear_weights(w, QuantSpec{QuantFormat::kInt8Channel, 0}).ok());
  const LlamaModel packed(model_->config(), std::move(w));
  auto again = measure_formats(packed, *calib_, o);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("already quantized"), std::string::npos) << again.status().to_string();
}

// The command: a directory that loads with its policy, a report whose numbers hang together.
TEST(QuantBudgetCli, WritesADirectoryThatLoadsWithItsPolicy) {
  const std::string dir = testing::scratch_dir("quant_budget_cli");
  const std::string demo = testing::source_dir() + "/models/tachyon-demo";
  const std::string out = dir + "/mix";
  auto r = testing::run_command(testing::tachyon_binary() + " quantize -m " + demo + " --budget 0.03 --calib " +
                                testing::source_dir() + "/tests/data/calib/calib.txt --calib-tokens 512 -t 2 -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("fewer"), std::string::npos) << r.out;
  std::ifstream f(out + "/quantize_report.json");
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("modules").size(), 70u);
  for (const auto& m : j.at("modules")) {
    if (m.at("format") != "dense") {
      EXPECT_LE(m.at("relative_error").get<double>(), 0.03) << m.dump();
    }
  }
  const auto& e2e = j.at("end_to_end");
  EXPECT_GT(e2e.at("choice").at("kl").get<double>(), 0.0);
  EXPECT_LT(e2e.at("choice").at("kl").get<double>(), e2e.at("cheapest_everywhere").at("kl").get<double>());
  EXPECT_GT(e2e.at("predicted_kl").get<double>(), 0.0);
  EXPECT_LT(j.at("choice").at("bytes").get<int64_t>(), j.at("choice").at("dense_bytes").get<int64_t>());

  // -m OUT applies quant_policy.txt; --kl compares it with the weights as stored.
  auto info = testing::run_command(testing::tachyon_binary() + " bench -m " + out +
                                   " --workload latency --prompt-len 8 --output-len 2 --iters 1 -t 2 --json " + dir +
                                   "/b.json");
  ASSERT_EQ(info.exit_code, 0) << info.err;
  std::ifstream b(dir + "/b.json");
  const auto bj = nlohmann::json::parse(b);
  EXPECT_NE(bj.at("weight_format").get<std::string>(), "dense") << bj.dump();
  auto ppl = testing::run_command(testing::tachyon_binary() + " perplexity -m " + out + " -f " +
                                  testing::source_dir() + "/tests/data/eval/prose.txt --max-tokens 256 --kl -t 2");
  ASSERT_EQ(ppl.exit_code, 0) << ppl.err;
  EXPECT_NE(ppl.out.find("KL"), std::string::npos) << ppl.out;

  // Wrong combinations are one-line errors.
  for (const std::string& bad : {std::string(" --budget 0.03 --method int8"), std::string(" --budget 0.03"),
                                 std::string(" --budget 0.03 --formats int3 --calib x"),
                                 std::string(" --method int8 --formats int8")}) {
    auto e = testing::run_command(testing::tachyon_binary() + " quantize -m " + demo + bad + " -o " + dir + "/bad");
    EXPECT_NE(e.exit_code, 0) << bad;
    EXPECT_NE(e.err.find("error"), std::string::npos) << bad << ": " << e.err;
  }
}

}  // namespace
}  // namespace tachyon
