// Load-time quantization of the bundled trained model (models/tachyon-demo, bf16): int8 and int4
// linear weights against the 16-bit model on held-out prose (tests/data/eval/prose.txt):
// prompt logits, mean negative log-likelihood of the text, and greedy continuations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/model_loader.h"
#include "model/quantize_weights.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace tachyon {
namespace {

constexpr int kWindow = 256;   // tokens per forward (the model's context is 512)
constexpr int kWindows = 3;    // windows of prose scored

LoadedModel load_demo() {
  LoadOptions o;
  o.path = testing::source_dir() + "/models/tachyon-demo";
  auto m = load_model(o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

std::unique_ptr<LlamaModel> quantized(const LlamaModel& model, const QuantSpec& spec) {
  ModelWeights w = model.weights();
  const Status s = quantize_linear_weights(w, spec);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return std::make_unique<LlamaModel>(model.config(), std::move(w));
}

using testing::prompt_logits;

// Mean over positions of -log p(tokens[i + 1] | tokens[..i]).
double mean_nll(const Tensor& logits, std::span<const int32_t> tokens) {
  const int64_t vocab = logits.size(1);
  double total = 0.0;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    const float* row = logits.data<float>() + static_cast<int64_t>(i) * vocab;
    double max = row[0];
    for (int64_t v = 1; v < vocab; ++v) max = std::max<double>(max, row[v]);
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
    total += max + std::log(sum) - row[tokens[i + 1]];
  }
  return total / static_cast<double>(tokens.size() - 1);
}

// Over positions: max |got - ref| over the vocabulary / max |ref| (infinite where got is not
// finite).
double max_relative_logit_error(const Tensor& got, const Tensor& ref) {
  const int64_t positions = ref.size(0), vocab = ref.size(1);
  double worst = 0.0;
  for (int64_t i = 0; i < positions; ++i) {
    double max_diff = 0.0, max_ref = 0.0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double r = ref.data<float>()[i * vocab + v], g = got.data<float>()[i * vocab + v];
      if (!std::isfinite(g)) return INFINITY;
      max_diff = std::max(max_diff, std::fabs(g - r));
      max_ref = std::max(max_ref, std::fabs(r));
    }
    worst = std::max(worst, max_diff / max_ref);
  }
  return worst;
}

struct Scores {
  double nll = 0.0;             // mean over all windows
  double max_rel_error = 0.0;   // of a position's logits: max |a - b| / max |b|
};

TEST(QuantizedModel, DemoInt8AndInt4AgainstSixteenBit) {
  LoadedModel m = load_demo();
  ASSERT_TRUE(m.tokenizer);
  auto text = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  const std::vector<int32_t> ids = m.tokenizer->encode(text->substr(0, 40000));
  ASSERT_GE(ids.size(), static_cast<size_t>(kWindow * kWindows));

  const auto int8 = quantized(*m.model, QuantSpec{QuantFormat::kInt8Channel, 0});
  const auto int4 = quantized(*m.model, QuantSpec{QuantFormat::kInt4Group, 128});
  EXPECT_LT(int8->weights().decode_bytes_per_token(), m.model->weights().decode_bytes_per_token());
  EXPECT_LT(int4->weights().decode_bytes_per_token(), int8->weights().decode_bytes_per_token());

  Scores dense, s8, s4;
  for (int w = 0; w < kWindows; ++w) {
    const std::span<const int32_t> window(ids.data() + w * kWindow, kWindow);
    const Tensor ref = prompt_logits(*m.model, window);
    dense.nll += mean_nll(ref, window) / kWindows;
    for (auto [model, scores] : {std::pair{int8.get(), &s8}, std::pair{int4.get(), &s4}}) {
      const Tensor got = prompt_logits(*model, window);
      scores->nll += mean_nll(got, window) / kWindows;
      scores->max_rel_error = std::max(scores->max_rel_error, max_relative_logit_error(got, ref));
    }
  }
  std::printf("mean NLL over %d tokens of prose.txt: 16-bit %.4f, int8 %.4f, int4-g128 %.4f\n", kWindow * kWindows,
              dense.nll, s8.nll, s4.nll);
  std::printf("max relative logit error: int8 %.4f, int4-g128 %.4f\n", s8.max_rel_error, s4.max_rel_error);
  // Measured on this text (2026-11-30, int4 scales rounded up to f16): NLL 16-bit 2.6138, int8
  // 2.6147, int4-g128 2.7103 (2.7089 with exact f32 scales); worst
  // position's logit error int8 0.030, int4 0.42. The bounds leave ~1.7-2x headroom, except the
  // int8 NLL one, which is the target itself: perplexity (exp NLL) within +0.5%. Each int8
  // weight is off by at most max|w_row| / 254, a few tenths of a percent of the row's range; the
  // logit error is the sum of those over ten layers, worst at positions whose logits are small.
  EXPECT_LT(s8.max_rel_error, 0.05);
  EXPECT_LT(std::fabs(s8.nll - dense.nll), std::log(1.005));
  EXPECT_LT(s4.nll - dense.nll, 0.2);
  EXPECT_GT(s4.max_rel_error, s8.max_rel_error);
}

TEST(QuantizedModel, DemoInt8GreedyAgreesWithSixteenBit) {
  const testing::ExactQuantizedLinears exact;  // the weights' rounding alone (the activations': below)
  LoadedModel m = load_demo();
  const auto int8 = quantized(*m.model, QuantSpec{QuantFormat::kInt8Channel, 0});
  int agreeing = 0, total = 0;
  for (const char* prompt : {"Once upon a time", "The king said to his people", "In the beginning"}) {
    const std::vector<int32_t> ids = m.tokenizer->encode(prompt);
    const std::vector<int32_t> ref = testing::greedy_ids(*m.model, ids, 32);
    const std::vector<int32_t> got = testing::greedy_ids(*int8, ids, 32);
    ASSERT_EQ(ref.size(), got.size());
    size_t same = 0;
    while (same < ref.size() && ref[same] == got[same]) ++same;
    std::printf("'%s': int8 greedy agrees for %zu of %zu tokens\n", prompt, same, ref.size());
    agreeing += static_cast<int>(same);
    total += static_cast<int>(ref.size());
    EXPECT_GE(same, 16u) << prompt;
  }
  // Measured: 32, 32 and 21 of 32 tokens (89 %). Greedy decoding amplifies any difference once
  // two candidates are close, so the bound is on the share, with a floor per prompt.
  EXPECT_GE(agreeing * 4, total * 3);
}

// The integer dot products (activations rounded to int8 per block of 32) against the exact f32
// kernels on the same quantized weights: greedy continuations of 32 tokens from 24 prompts cut
// from held-out prose and code, counted up to each one's first difference.
TEST(QuantizedModel, DemoInt8ActivationsKeepTheGreedyContinuations) {
  LoadedModel m = load_demo();
  std::vector<std::vector<int32_t>> prompts;
  for (const char* file : {"prose.txt", "code.txt"}) {
    auto text = read_text_file(testing::source_dir() + "/tests/data/eval/" + file);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    for (size_t i = 0; i < 12; ++i) prompts.push_back(m.tokenizer->encode(text->substr(1000 + 2500 * i, 120)));
  }
  for (const QuantSpec& spec : {QuantSpec{QuantFormat::kInt8Channel, 0}, QuantSpec{QuantFormat::kInt4Group, 128},
                                QuantSpec{QuantFormat::kGgufQ8_0, 32}, QuantSpec{QuantFormat::kGgufQ4_K, 256},
                                QuantSpec{QuantFormat::kGgufQ6_K, 256}, QuantSpec{QuantFormat::kGgufQ5_K, 256},
                                QuantSpec{QuantFormat::kGgufQ4_1, 32}, QuantSpec{QuantFormat::kGgufQ5_0, 32},
                                QuantSpec{QuantFormat::kGgufQ5_1, 32}, QuantSpec{QuantFormat::kGgufIq4Nl, 32}}) {
    ModelWeights w = m.model->weights();
    ASSERT_TRUE(quantize_linear_weights(w, spec).ok());
    const LlamaModel quantized(m.model->config(), std::move(w));
    int agreeing = 0, total = 0, identical = 0;
    for (const std::vector<int32_t>& prompt : prompts) {
      std::vector<int32_t> exact_ids;
      {
        const testing::ExactQuantizedLinears exact;
        exact_ids = testing::greedy_ids(quantized, prompt, 32);
      }
      const std::vector<int32_t> ids = testing::greedy_ids(quantized, prompt, 32);
      size_t same = 0;
      while (same < ids.size() && same < exact_ids.size() && ids[same] == exact_ids[same]) ++same;
      agreeing += static_cast<int>(same);
      total += static_cast<int>(exact_ids.size());
      identical += same == exact_ids.size() ? 1 : 0;
    }
    std::printf("%s: int8 activations keep %d of %d greedy tokens (%.1f%%) before the first difference; %d of %zu "
                "continuations identical\n",
                quant_format_name(spec.format), agreeing, total, 100.0 * agreeing / total, identical, prompts.size());
    // Measured (2026-12-06): int8 733 of 768 (95.4 %, 22 of 24 identical), int4 g128 695 (90.5 %, 20), q8_0 670
    // (87.2 %, 20), q4_k 658 (85.7 %, 20; 623 when its 640-wide down_proj fell back to q8_0), q6_k 740 (96.4 %,
    // 23), q5_k 656 (85.4 %, 19), q4_1 651 (84.8 %, 19), q5_0 658 (85.7 %, 20), q5_1 675 (87.9 %, 20), iq4_nl
    // 723 (94.1 %, 22). A difference starts where the exact path's top
    // two logits are within the activations' rounding of each other; perplexity moves by 0.03 % (docs/quant.md).
    EXPECT_GE(agreeing * 100, total * 80) << quant_format_name(spec.format);
  }
}

// --quant-lm-head int8: the head alone in per-channel int8 against the 16-bit model on the same
// prose, then with int4 layers; a tied head gets a packed copy and the embedding stays as stored.
TEST(QuantizedModel, DemoInt8LmHeadAgainstSixteenBit) {
  LoadedModel m = load_demo();
  auto text = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  const std::vector<int32_t> ids = m.tokenizer->encode(text->substr(0, 20000));
  ASSERT_GE(ids.size(), static_cast<size_t>(kWindow));
  const std::span<const int32_t> window(ids.data(), kWindow);

  ModelWeights w = m.model->weights();
  const Tensor embedding = w.embed_tokens;
  ASSERT_TRUE(quantize_lm_head(w, QuantSpec{QuantFormat::kInt8Channel, 0}).ok());
  ASSERT_TRUE(w.lm_head.quant != nullptr);
  EXPECT_EQ(w.lm_head.quant->format, QuantFormat::kInt8Channel);
  EXPECT_EQ(w.embed_tokens.raw_data(), embedding.raw_data());  // the embedding as stored
  EXPECT_TRUE(w.layers[0].q_proj.quant == nullptr);            // the layers as stored
  const Status again = quantize_lm_head(w, QuantSpec{QuantFormat::kInt8Channel, 0});
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("already"), std::string::npos) << again.to_string();
  const auto head8 = std::make_unique<LlamaModel>(m.model->config(), std::move(w));
  EXPECT_LT(head8->weights().decode_bytes_per_token(), m.model->weights().decode_bytes_per_token());

  const Tensor ref = prompt_logits(*m.model, window);
  const Tensor got = prompt_logits(*head8, window);
  const double max_rel_error = max_relative_logit_error(got, ref);
  const double nll_dense = mean_nll(ref, window), nll_head8 = mean_nll(got, window);
  std::printf("LM head int8: mean NLL %.4f against 16-bit %.4f; max relative logit error %.4f\n", nll_head8,
              nll_dense, max_rel_error);
  // Measured (2026-12-06): NLL 2.8458 against 2.8465, worst position's logit error 0.0077; the
  // bounds are int8 layers' (above), which a head alone stays well inside.
  EXPECT_LT(std::fabs(nll_head8 - nll_dense), std::log(1.005));
  EXPECT_LT(max_rel_error, 0.05);
}

TEST(QuantizedModel, QuantizingTwiceIsAnErrorAndChangesNothing) {
  LoadedModel m = load_demo();
  ModelWeights w = m.model->weights();
  ASSERT_TRUE(quantize_linear_weights(w, QuantSpec{QuantFormat::kInt8Channel, 0}).ok());
  EXPECT_TRUE(w.layers[0].q_proj.quant != nullptr);
  EXPECT_TRUE(w.lm_head.quant == nullptr);  // the LM head stays 16-bit
  const auto before = w.layers[0].q_proj.quant;
  const Status again = quantize_linear_weights(w, QuantSpec{QuantFormat::kInt4Group, 128});
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("already quantized"), std::string::npos) << again.to_string();
  EXPECT_EQ(w.layers[0].q_proj.quant, before);
}

}  // namespace
}  // namespace tachyon
