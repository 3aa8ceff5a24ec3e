// SamplingParams::validate: defaults and range edges pass; each absurd value is rejected with a
// message that names the field and the value.
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "sampling/sampling_params.h"

namespace tachyon {
namespace {

constexpr int kVocab = 1000;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(SamplingParams, DefaultsAndEdgesAreValid) {
  EXPECT_TRUE(SamplingParams{}.validate(kVocab).ok());
  const std::function<void(SamplingParams&)> edges[] = {
      [](SamplingParams& p) { p.temperature = 0.0f; },
      [](SamplingParams& p) { p.temperature = 100.0f; },
      [](SamplingParams& p) { p.top_k = -1; },
      [](SamplingParams& p) { p.top_k = 1; },
      [](SamplingParams& p) { p.top_k = 10 * kVocab; },
      [](SamplingParams& p) { p.top_p = 1.0f; },
      [](SamplingParams& p) { p.top_p = 1e-6f; },
      [](SamplingParams& p) { p.min_p = 0.0f; },
      [](SamplingParams& p) { p.min_p = 1.0f; },
      [](SamplingParams& p) { p.repetition_penalty = 0.01f; },
      [](SamplingParams& p) { p.presence_penalty = -2.0f; },
      [](SamplingParams& p) { p.frequency_penalty = 2.0f; },
      [](SamplingParams& p) { p.logprobs = 20; },
      [](SamplingParams& p) { p.seed = 0; },
      [](SamplingParams& p) { p.logit_bias = {{0, -100.0f}, {kVocab - 1, 100.0f}}; },
  };
  for (const auto& edit : edges) {
    SamplingParams params;
    edit(params);
    const Status status = params.validate(kVocab);
    EXPECT_TRUE(status.ok()) << status.to_string();
  }
}

struct BadCase {
  std::function<void(SamplingParams&)> edit;
  std::string field;  // the message must name it
  std::string value;  // and the value received
};

TEST(SamplingParams, RejectsAbsurdValuesNamingThem) {
  const BadCase cases[] = {
      {[](SamplingParams& p) { p.temperature = -0.5f; }, "temperature", "-0.5"},
      {[](SamplingParams& p) { p.temperature = kNaN; }, "temperature", "nan"},
      {[](SamplingParams& p) { p.temperature = kInf; }, "temperature", "inf"},
      {[](SamplingParams& p) { p.top_k = -2; }, "top_k", "-2"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p", "0"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p", "1.5"},
      {[](SamplingParams& p) { p.top_p = -0.1f; }, "top_p", "-0.1"},
      {[](SamplingParams& p) { p.top_p = kNaN; }, "top_p", "nan"},
      {[](SamplingParams& p) { p.min_p = -0.25f; }, "min_p", "-0.25"},
      {[](SamplingParams& p) { p.min_p = 1.25f; }, "min_p", "1.25"},
      {[](SamplingParams& p) { p.min_p = kNaN; }, "min_p", "nan"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty", "0"},
      {[](SamplingParams& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty", "-1"},
      {[](SamplingParams& p) { p.repetition_penalty = kInf; }, "repetition_penalty", "inf"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty", "2.5"},
      {[](SamplingParams& p) { p.presence_penalty = -3.0f; }, "presence_penalty", "-3"},
      {[](SamplingParams& p) { p.presence_penalty = kNaN; }, "presence_penalty", "nan"},
      {[](SamplingParams& p) { p.frequency_penalty = -2.5f; }, "frequency_penalty", "-2.5"},
      {[](SamplingParams& p) { p.frequency_penalty = -kInf; }, "frequency_penalty", "-inf"},
      {[](SamplingParams& p) { p.logprobs = 21; }, "logprobs", "21"},
      {[](SamplingParams& p) { p.logprobs = -1; }, "logprobs", "-1"},
      {[](SamplingParams& p) { p.logit_bias = {{kVocab, 1.0f}}; }, "logit_bias", "1000"},
      {[](SamplingParams& p) { p.logit_bias = {{-3, 1.0f}}; }, "logit_bias", "-3"},
      {[](SamplingParams& p) { p.logit_bias = {{5, 101.0f}}; }, "logit_bias", "101"},
      {[](SamplingParams& p) { p.logit_bias = {{5, kNaN}}; }, "logit_bias", "nan"},
  };
  for (const BadCase& bad : cases) {
    SamplingParams params;
    bad.edit(params);
    const Status status = params.validate(kVocab);
    ASSERT_FALSE(status.ok()) << bad.field << " = " << bad.value << " was accepted";
    EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(status.message().find(bad.field), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(bad.value), std::string::npos) << status.message();
  }
}

TEST(SamplingParams, RejectsNonPositiveVocabulary) {
  const Status status = SamplingParams{}.validate(0);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("vocab_size"), std::string::npos) << status.message();
}

}  // namespace
}  // namespace tachyon
