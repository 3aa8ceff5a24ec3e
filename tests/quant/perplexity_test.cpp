// `tachyon perplexity` and what it is made of: the log-softmax and KL arithmetic on hand-made
// distributions, the sliding-window plan, the CLI's perplexity against an independent
// calculation (one plain forward per window and a scalar log-softmax loop), --kl of int8 against
// the bundled model as stored, bad inputs, and the finite-logits check that load-time
// quantization falls back on (cli/quant_check.h).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "cli/quant_check.h"
#include "cli/scoring.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "core/mapped_file.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/model_loader.h"
#include "model/quantize_weights.h"
#include "test_util.h"

namespace tachyon {
namespace {

using testing::run_command;
using testing::tachyon_binary;

std::string demo() { return testing::source_dir() + "/models/tachyon-demo"; }

LoadedModel load_demo() {
  LoadOptions o;
  o.path = demo();
  auto m = load_model(o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

// The first `bytes` of the held-out prose, cut at a line end, in a scratch file.
std::string prose_excerpt(size_t bytes) {
  auto text = read_text_file(testing::source_dir() + "/tests/data/eval/prose.txt");
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  std::string excerpt = text->substr(0, text->rfind('\n', bytes) + 1);
  const std::string path = testing::scratch_dir("perplexity") + "/prose_excerpt.txt";
  std::ofstream(path) << excerpt;
  return path;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

std::string last_line(const std::string& out) {
  std::string line, last;
  std::istringstream in(out);
  while (std::getline(in, line)) last = line;
  return last;
}

// Scalar reference: -log softmax(row)[target] with a float max and a double sum.
double reference_nll(std::span<const float> row, int32_t target) {
  float max = row[0];
  for (float x : row) max = std::max(max, x);
  double sum = 0.0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - max);
  return static_cast<double>(max) + std::log(sum) - row[static_cast<size_t>(target)];
}

TEST(Scoring, LogSoftmaxAndKlOnHandMadeDistributions) {
  const std::vector<float> uniform{0.0f, 0.0f};
  EXPECT_DOUBLE_EQ(cli::token_nll(uniform, 1), std::log(2.0));
  const std::vector<float> one_to_three{0.0f, std::log(3.0f)};
  EXPECT_NEAR(cli::token_nll(one_to_three, 1), -std::log(0.75), 1e-7);
  // Shifted far out, where a plain exp overflows (or underflows to log 0).
  const std::vector<float> large{1000.0f, 1000.0f}, apart{-1000.0f, 0.0f};
  EXPECT_NEAR(cli::token_nll(large, 0), std::log(2.0), 1e-12);  // 1000 + log 2 - 1000: rounding at 1000's scale
  EXPECT_NEAR(cli::token_nll(apart, 0), 1000.0, 1e-9);
  EXPECT_TRUE(std::isnan(cli::token_nll(std::vector<float>{0.0f, NAN}, 0)));

  // KL(P || Q), P = (0.5, 0.5), Q = (0.9, 0.1): 0.5 ln(0.5 / 0.9) + 0.5 ln(0.5 / 0.1) = 0.5 ln(25 / 9).
  // Q's logits carry an offset: softmax does not see it.
  const std::vector<float> p{std::log(0.5f), std::log(0.5f)}, q{std::log(0.9f) + 7.0f, std::log(0.1f) + 7.0f};
  EXPECT_NEAR(cli::kl_divergence(p, q), 0.5 * std::log(25.0 / 9.0), 1e-7);
  EXPECT_NEAR(cli::kl_divergence(q, p), 0.9 * std::log(0.9 / 0.5) + 0.1 * std::log(0.1 / 0.5), 1e-7);
  // P puts nothing on one token: that token adds nothing. P = (1, 0), Q uniform: ln 2.
  EXPECT_NEAR(cli::kl_divergence(std::vector<float>{0.0f, -INFINITY}, uniform), std::log(2.0), 1e-12);

  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> a(1000), b(1000);
  for (auto& x : a) x = normal(rng);
  for (auto& x : b) x = normal(rng);
  // A distribution against itself: exactly 0, the argmax agrees and both NLLs are the same.
  const cli::PositionComparison same = cli::compare_distributions(a, a, 17);
  EXPECT_EQ(same.kl, 0.0) << "seed " << seed;
  EXPECT_TRUE(same.same_argmax);
  EXPECT_EQ(same.nll, same.reference_nll);
  EXPECT_NEAR(same.nll, reference_nll(a, 17), 1e-9) << "seed " << seed;
  // Against the textbook three-pass formula.
  const double la = cli::log_sum_exp(a), lb = cli::log_sum_exp(b);
  double expected = 0.0;
  for (size_t v = 0; v < a.size(); ++v) expected += std::exp(a[v] - la) * ((a[v] - la) - (b[v] - lb));
  const cli::PositionComparison c = cli::compare_distributions(a, b, 3);
  EXPECT_NEAR(c.kl, expected, 1e-9 * std::max(1.0, expected)) << "seed " << seed;
  EXPECT_GT(c.kl, 0.0);
  EXPECT_EQ(c.same_argmax, cli::argmax(a) == cli::argmax(b));
  EXPECT_NEAR(c.nll, reference_nll(b, 3), 1e-9) << "seed " << seed;
  EXPECT_NEAR(c.reference_nll, reference_nll(a, 3), 1e-9) << "seed " << seed;
}

TEST(Scoring, WindowPlanScoresEveryTokenOnceWithEnoughContext) {
  struct Case {
    int64_t targets;
    int ctx, stride;
  };
  for (const Case& k : {Case{1, 2, 1}, Case{99, 32, 16}, Case{100, 32, 32}, Case{31, 32, 8}, Case{1000, 512, 256},
                        Case{1000, 64, 1}, Case{46080, 512, 512}}) {
    const auto windows = cli::plan_windows(k.targets, k.ctx, k.stride);
    // 1 + ceil((T - ctx) / stride) windows when the text is longer than one window.
    const int64_t expected_windows = 1 + (std::max<int64_t>(0, k.targets - k.ctx) + k.stride - 1) / k.stride;
    EXPECT_EQ(static_cast<int64_t>(windows.size()), expected_windows) << k.targets << " " << k.ctx << " " << k.stride;
    std::vector<int> scored(static_cast<size_t>(k.targets) + 1, 0);
    for (size_t w = 0; w < windows.size(); ++w) {
      const cli::ScoreWindow& win = windows[w];
      EXPECT_EQ(win.begin, static_cast<int64_t>(w) * k.stride);
      ASSERT_LE(win.end - win.begin, k.ctx);
      ASSERT_LT(win.score_begin, win.end);
      ASSERT_GE(win.score_begin, win.begin);
      // Past the first window, every scored token has at least ctx - stride tokens before it.
      if (w > 0) {
        EXPECT_GE(win.score_begin - win.begin, k.ctx - k.stride);
      }
      if (k.stride == k.ctx) {  // non-overlapping windows score every input
        EXPECT_EQ(win.score_begin, win.begin);
      }
      for (int64_t t = win.score_begin + 1; t <= win.end; ++t) ++scored[static_cast<size_t>(t)];
    }
    EXPECT_EQ(scored[0], 0);
    for (int64_t t = 1; t <= k.targets; ++t) ASSERT_EQ(scored[static_cast<size_t>(t)], 1) << "token " << t;
  }
}

// The CLI's NLL against this one: each window run in one forward with logits at every position (the
// CLI runs a window's context without logits, then its scored part), each target assigned to the
// first window that reaches it (the CLI plans windows one after another), a scalar log-softmax.
TEST(PerplexityCli, MatchesAnIndependentForwardAndLogSoftmax) {
  const std::string text = prose_excerpt(3000);
  const std::string dir = testing::scratch_dir("perplexity_cli");
  constexpr int kCtx = 64, kStride = 48, kMaxTokens = 300;
  auto r = run_command(tachyon_binary() + " perplexity -m " + demo() + " -f " + text + " --ctx 64 --stride 48 " +
                       "--max-tokens 300 -t 2 --json " + dir + "/p.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = read_json(dir + "/p.json");

  LoadedModel m = load_demo();
  auto contents = read_text_file(text);
  ASSERT_TRUE(contents.ok());
  const std::vector<int32_t> ids = m.tokenizer->encode(*contents);
  ASSERT_GT(ids.size(), static_cast<size_t>(kMaxTokens + 1));
  EXPECT_EQ(j.at("text_tokens").get<size_t>(), ids.size());
  EXPECT_EQ(j.at("tokens_scored").get<int64_t>(), kMaxTokens);
  EXPECT_EQ(j.at("windows").get<int64_t>(), 6);  // 1 + ceil((300 - 64) / 48)
  EXPECT_EQ(j.at("ctx").get<int>(), kCtx);
  EXPECT_EQ(j.at("stride").get<int>(), kStride);
  EXPECT_EQ(j.at("weight_format").get<std::string>(), "dense");

  const LlamaModel& model = *m.model;
  const int64_t vocab = model.config().vocab_size;
  double total = 0.0;
  int64_t scored = 0;
  for (int64_t k = 0; k * kStride < kMaxTokens; ++k) {
    const int64_t begin = k * kStride, end = std::min<int64_t>(begin + kCtx, kMaxTokens);
    const std::span<const int32_t> window(ids.data() + begin, static_cast<size_t>(end - begin));
    KvCacheConfig kv;
    kv.num_layers = model.config().num_layers;
    kv.num_kv_heads = model.config().num_kv_heads;
    kv.head_dim = model.config().head_dim;
    kv.num_blocks = kCtx / kv.block_size;
    auto cache = KvCache::create(kv);
    ASSERT_TRUE(cache.ok());
    BlockManager blocks({kv.num_blocks, kv.block_size, false, {}});
    BlockTable table(kv.block_size);
    ASSERT_TRUE(blocks.grow_to(table, static_cast<int>(window.size())).ok());
    SequenceChunk chunk;
    chunk.block_table = &table;
    chunk.tokens = window;
    chunk.logits = LogitsWanted::kAll;
    Tensor logits;
    ASSERT_TRUE(model.forward(build_forward_batch({chunk}), *cache, logits).ok());
    for (int64_t t = begin + 1; t <= end; ++t) {
      // Token t belongs to the first window whose inputs reach position t - 1.
      const int64_t first_window = std::max<int64_t>(0, (t - kCtx + kStride - 1) / kStride);
      if (first_window != k) continue;
      const std::span<const float> row(logits.data<float>() + (t - 1 - begin) * vocab, static_cast<size_t>(vocab));
      total += reference_nll(row, ids[static_cast<size_t>(t)]);
      ++scored;
    }
  }
  ASSERT_EQ(scored, kMaxTokens);
  const double nll = total / static_cast<double>(scored);
  std::printf("demo model, %d tokens of prose: NLL CLI %.6f, independent %.6f\n", kMaxTokens,
              j.at("nll").get<double>(), nll);
  EXPECT_NEAR(j.at("nll").get<double>(), nll, 1e-4);
  EXPECT_NEAR(j.at("perplexity").get<double>(), std::exp(j.at("nll").get<double>()), 1e-9);
  EXPECT_EQ(last_line(r.out), fmt::format("perplexity: {:.4f}", j.at("perplexity").get<double>()));
}

TEST(PerplexityCli, Int8KlAgainstTheModelAsStored) {
  const std::string text = prose_excerpt(4000);
  const std::string dir = testing::scratch_dir("perplexity_kl");
  const std::string common = " perplexity -m " + demo() + " -f " + text + " --ctx 128 --stride 64 --max-tokens 256 -t 2";
  auto kl = run_command(tachyon_binary() + common + " --quant int8 --kl --json " + dir + "/kl.json");
  ASSERT_EQ(kl.exit_code, 0) << kl.err;
  EXPECT_EQ(kl.err.find("non-finite"), std::string::npos) << kl.err;
  auto dense = run_command(tachyon_binary() + common + " --json " + dir + "/dense.json");
  ASSERT_EQ(dense.exit_code, 0) << dense.err;
  const auto k = read_json(dir + "/kl.json"), d = read_json(dir + "/dense.json");
  std::printf("int8 vs 16-bit on 256 tokens of prose: KL mean %.6f, p99 %.6f, max %.6f, top-1 %.4f, perplexity "
              "%.4f vs %.4f\n",
              k.at("kl_mean").get<double>(), k.at("kl_p99").get<double>(), k.at("kl_max").get<double>(),
              k.at("top1_agreement").get<double>(), k.at("perplexity").get<double>(),
              k.at("reference_perplexity").get<double>());
  EXPECT_EQ(k.at("weight_format").get<std::string>(), "int8");
  EXPECT_EQ(k.at("tokens_scored").get<int64_t>(), 256);
  // The reference is the model as stored, run exactly as a plain run runs it.
  EXPECT_NEAR(k.at("reference_perplexity").get<double>(), d.at("perplexity").get<double>(), 1e-9);
  EXPECT_NEAR(k.at("reference_nll").get<double>(), d.at("nll").get<double>(), 1e-12);
  // Measured (2026-11-30): KL mean 0.0004, top-1 agreement 0.996. The bounds leave room for other
  // SIMD paths and still fail for a broken int8 path: int4 g128, a much coarser format, gives KL
  // 0.067 and top-1 0.85 on 1024 tokens of the same text.
  EXPECT_GT(k.at("top1_agreement").get<double>(), 0.9);
  EXPECT_LT(k.at("kl_mean").get<double>(), 0.01);
  EXPECT_LE(k.at("kl_p99").get<double>(), k.at("kl_max").get<double>());
  EXPECT_LT(std::fabs(k.at("nll").get<double>() - k.at("reference_nll").get<double>()), 0.01);
}

// --kv scores with a quantized KV cache; --kl then compares it with the default (f32) cache on the
// same weights. int8 stays close; the reference side is exactly a plain run.
TEST(PerplexityCli, QuantizedKvCacheKlAgainstTheDefaultCache) {
  const std::string text = prose_excerpt(4000);
  const std::string dir = testing::scratch_dir("perplexity_kv");
  const std::string common = " perplexity -m " + demo() + " -f " + text + " --ctx 128 --stride 64 --max-tokens 256 -t 2";
  auto dense = run_command(tachyon_binary() + common + " --json " + dir + "/dense.json");
  ASSERT_EQ(dense.exit_code, 0) << dense.err;
  const auto d = read_json(dir + "/dense.json");
  for (const char* kv : {"int8", "fp8"}) {
    auto r = run_command(tachyon_binary() + common + " --kv " + kv + " --kl --json " + dir + "/" + kv + ".json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto k = read_json(dir + "/" + kv + ".json");
    std::printf("kv %s vs f32 cache on 256 tokens of prose: KL mean %.6f, p99 %.6f, top-1 %.4f, perplexity %.4f vs %.4f\n",
                kv, k.at("kl_mean").get<double>(), k.at("kl_p99").get<double>(), k.at("top1_agreement").get<double>(),
                k.at("perplexity").get<double>(), k.at("reference_perplexity").get<double>());
    EXPECT_EQ(k.at("kv_dtype").get<std::string>(), kv == std::string("int8") ? "i8" : "f8e4m3");
    EXPECT_EQ(k.at("weight_format").get<std::string>(), "dense");
    EXPECT_NEAR(k.at("reference_nll").get<double>(), d.at("nll").get<double>(), 1e-12);
    EXPECT_GT(k.at("kl_mean").get<double>(), 0.0);  // the cache really is quantized
    EXPECT_LT(k.at("kl_mean").get<double>(), 0.05);
    EXPECT_GT(k.at("top1_agreement").get<double>(), 0.8);
  }
  auto bad = run_command(tachyon_binary() + common + " --kv q4");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--kv 'q4' is not a KV cache dtype"), std::string::npos) << bad.err;
}

TEST(PerplexityCli, BadInputsAreOneLineErrors) {
  const std::string dir = testing::scratch_dir("perplexity_bad");
  std::ofstream(dir + "/empty.txt").flush();
  std::ofstream(dir + "/one.txt") << "a";
  std::ofstream(dir + "/ok.txt") << "Once upon a time there was a king who ruled a small country.\n";
  const std::string m = " perplexity -m " + demo() + " -t 1 ";
  const std::string ok = " -f " + dir + "/ok.txt";
  struct Case {
    std::string args, message;
  };
  for (const Case& c : {Case{" -f " + dir + "/missing.txt", "cannot open"},
                        Case{" -f " + dir + "/empty.txt", "the text file is empty"},
                        Case{" -f " + dir, "is a directory"},
                        Case{" -f " + dir + "/one.txt --no-bos", "1 token(s); at least 2"},
                        Case{ok + " --ctx 1", "--ctx 1: a window needs at least 2 tokens"},
                        Case{ok + " --ctx 1024", "--ctx 1024 is longer than the model's context (512 tokens)"},
                        Case{ok + " --stride 0", "--stride 0: must be at least 1"},
                        Case{ok + " --ctx 64 --stride 65", "--stride 65 is longer than the window (--ctx 64)"},
                        Case{ok + " --max-tokens 0", "--max-tokens 0"},
                        Case{ok + " --kl", "--kl compares a quantized model"}}) {
    auto r = run_command(tachyon_binary() + m + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find("tachyon: error: "), std::string::npos) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << ": " << r.err;
    EXPECT_EQ(r.out.find("perplexity:"), std::string::npos) << c.args;
  }
}

// A NaN in one scale of one quantized weight poisons every logit (attention and the residual
// stream spread it); the check catches it and the model as stored stays loaded.
// A NaN in one module's scales: the guard returns that module alone to 16 bits (its weight as
// stored), and the rest stays quantized; the same weights without the NaN pass untouched.
TEST(QuantCheck, NonFiniteModuleFallsBackAloneToTheWeightsAsStored) {
  for (const QuantSpec spec : {QuantSpec{QuantFormat::kInt8Channel, 0}, QuantSpec{QuantFormat::kInt4Group, 64}}) {
    SCOPED_TRACE(quant_format_name(spec.format));
    LoadedModel loaded = load_demo();
    const std::string stored_dtypes = loaded.weight_dtypes;
    const Weight stored_down = loaded.model->weights().layers[4].down_proj;

    ModelWeights clean = loaded.model->weights();
    ASSERT_TRUE(quantize_linear_weights(clean, spec).ok());
    ModelWeights poisoned = clean;
    // A fresh copy of one weight's QuantWeight (the clean model shares the original), one scale NaN.
    auto bad = std::make_shared<QuantWeight>(*poisoned.layers[4].down_proj.quant);
    bad->scales = bad->scales.to_f32();
    bad->scales.data<float>()[3] = NAN;
    poisoned.layers[4].down_proj.quant = bad;

    auto poisoned_model = std::make_unique<LlamaModel>(loaded.model->config(), std::move(poisoned));
    auto check = cli::check_finite_logits(*poisoned_model, loaded.bos_token_id, loaded.tokenizer.get());
    ASSERT_TRUE(check.ok()) << check.status().to_string();
    EXPECT_FALSE(check->finite);
    EXPECT_NE(check->first_non_finite.find("nan"), std::string::npos) << check->first_non_finite;
    auto kept = cli::keep_quantized_if_finite(loaded, std::move(poisoned_model), "test-format");
    ASSERT_TRUE(kept.ok()) << kept.status().to_string();
    EXPECT_TRUE(*kept);
    const ModelWeights& w = loaded.model->weights();
    EXPECT_EQ(w.layers[4].down_proj.quant, nullptr);
    EXPECT_EQ(w.layers[4].down_proj.dense.raw_data(), stored_down.dense.raw_data());  // the weight as stored
    for (size_t l = 0; l < w.layers.size(); ++l) {
      for (const Weight* m : {&w.layers[l].q_proj, &w.layers[l].o_proj, &w.layers[l].gate_proj, &w.layers[l].up_proj}) {
        EXPECT_NE(m->quant, nullptr) << "layer " << l;
      }
      if (l != 4) {
        EXPECT_NE(w.layers[l].down_proj.quant, nullptr) << "layer " << l;
      }
    }
    EXPECT_EQ(loaded.weight_dtypes, "test-format, 1 module 16-bit (embedding, lm head: " + stored_dtypes + ")");

    // The same weights without the NaN pass, quickly, and replace the model as stored whole.
    LoadedModel again = load_demo();
    auto clean_model = std::make_unique<LlamaModel>(again.model->config(), std::move(clean));
    auto ok = cli::check_finite_logits(*clean_model, again.bos_token_id, again.tokenizer.get());
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    EXPECT_TRUE(ok->finite) << ok->first_non_finite;
    std::printf("%s: finite-logits check %.2f ms\n", quant_format_name(spec.format), ok->seconds * 1e3);
    kept = cli::keep_quantized_if_finite(again, std::move(clean_model), "test-format");
    ASSERT_TRUE(kept.ok()) << kept.status().to_string();
    EXPECT_TRUE(*kept);
    EXPECT_NE(again.model->weights().layers[4].down_proj.quant, nullptr);
    EXPECT_EQ(again.weight_dtypes, "test-format (embedding, lm head: " + stored_dtypes + ")");
  }
}

// Finite but wrong: one module's scales 300 times too large. The probe's KL to the stored model is
// far past the limit; the guard measures each module's own damage and returns the broken one first,
// which is enough. Ternary rounding on a model not trained for it fails everywhere: modules return
// worst first until the limit holds; with the limit at 0 only finiteness is checked and all stay.
TEST(QuantCheck, KlPastTheLimitFallsBackModuleByModule) {
  LoadedModel loaded = load_demo();
  const std::vector<int32_t> probe =
      cli::guard_probe_tokens(loaded.tokenizer.get(), loaded.bos_token_id, loaded.model->config().vocab_size);
  ASSERT_EQ(probe.size(), static_cast<size_t>(cli::kFiniteCheckTokens));
  EXPECT_EQ(probe[0], loaded.bos_token_id);
  ModelWeights w = loaded.model->weights();
  ASSERT_TRUE(quantize_linear_weights(w, QuantSpec{QuantFormat::kInt8Channel, 0}).ok());
  auto bad = std::make_shared<QuantWeight>(*w.layers[6].up_proj.quant);
  bad->scales = bad->scales.to_f32();
  for (int64_t i = 0; i < bad->scales.numel(); ++i) bad->scales.data<float>()[i] *= 300.0f;
  w.layers[6].up_proj.quant = bad;
  auto g = cli::guard_quantized_weights(loaded.model->config(), w, &loaded.model->weights(), probe, Tensor(),
                                        cli::kDefaultGuardKl);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_TRUE(g->finite);
  EXPECT_GT(g->kl, 1.0);
  EXPECT_TRUE(g->passed);
  ASSERT_EQ(g->fell_back, std::vector<std::string>{"model.layers.6.mlp.up_proj"});
  EXPECT_LT(g->final_kl, 0.01);
  EXPECT_EQ(w.layers[6].up_proj.quant, nullptr);
  EXPECT_NE(w.layers[5].up_proj.quant, nullptr);
  std::printf("one broken module: KL %.3f -> %.5f after %d probes (%.1f ms)\n", g->kl, g->final_kl, g->probes,
              g->seconds * 1e3);

  ModelWeights ternary = loaded.model->weights();
  ASSERT_TRUE(quantize_linear_weights(ternary, QuantSpec{QuantFormat::kTernary, 128}).ok());
  ModelWeights finite_only = ternary;
  auto t = cli::guard_quantized_weights(loaded.model->config(), ternary, &loaded.model->weights(), probe, Tensor(),
                                        cli::kDefaultGuardKl);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(t->passed);
  EXPECT_GT(t->kl, cli::kDefaultGuardKl);
  EXPECT_LE(t->final_kl, cli::kDefaultGuardKl);
  EXPECT_GT(t->fell_back.size(), 1u);
  EXPECT_LT(t->fell_back.size(), 70u);
  std::printf("ternary: KL %.3f -> %.3f with %zu of 70 modules back to 16 bits\n", t->kl, t->final_kl,
              t->fell_back.size());
  auto f = cli::guard_quantized_weights(loaded.model->config(), finite_only, &loaded.model->weights(), probe, Tensor(), 0.0);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->passed);
  EXPECT_TRUE(f->fell_back.empty());
}

// A checkpoint `tachyon quantize` wrote holds the 16-bit model's probe logits; one module's scales
// corrupted (finite, 300x) fail the guard at load, and that module alone comes back from the source
// model the report names. Without the source the load is a one-line error; a NaN scale is refused
// by the loader itself.
TEST(QuantCheck, CorruptedCheckpointScaleFallsBackForThatModuleOnly) {
  const std::string dir = testing::scratch_dir("quant_guard_checkpoint");
  const std::string demo = testing::source_dir() + "/models/tachyon-demo";
  auto q = run_command(testing::tachyon_binary() + " quantize -m " + demo + " --method int8 -t 2 -o " + dir + "/ck");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  ASSERT_TRUE(std::filesystem::exists(dir + "/ck/" + cli::kQuantProbeFile));
  auto clean = run_command(testing::tachyon_binary() + " generate -m " + dir + "/ck -p 'Once upon a time' -n 4 --temp 0 -t 2");
  ASSERT_EQ(clean.exit_code, 0) << clean.err;
  EXPECT_EQ(clean.err.find("guard"), std::string::npos) << clean.err;

  // Corrupt one module's weight_scale in a copy of the checkpoint.
  const auto corrupt = [&](const std::string& to, float factor) {
    std::filesystem::create_directories(to);
    for (const auto& e : std::filesystem::directory_iterator(dir + "/ck")) {
      std::filesystem::copy_file(e.path(), to + "/" + e.path().filename().string(),
                                 std::filesystem::copy_options::overwrite_existing);
    }
    auto file = SafetensorsFile::open(dir + "/ck/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    std::vector<NamedTensor> tensors;
    for (const TensorMeta& m : (*file)->tensors()) {
      auto t = (*file)->tensor(m.name);
      ASSERT_TRUE(t.ok()) << m.name;
      Tensor copy = *t;
      if (m.name == "model.layers.4.mlp.down_proj.weight_scale") {
        copy = t->to_f32();  // a copy of its own
        ASSERT_EQ(copy.dtype(), DType::kF32);
        for (int64_t i = 0; i < copy.numel(); ++i) copy.data<float>()[i] *= factor;
      }
      tensors.push_back(NamedTensor{m.name, copy});
    }
    ASSERT_TRUE(write_safetensors(to + "/model.safetensors", tensors).ok());
  };
  corrupt(dir + "/bad", 300.0f);
  auto r = run_command(testing::tachyon_binary() + " generate -m " + dir + "/bad -p 'Once upon a time' -n 4 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("1 module back to 16 bits: model.layers.4.mlp.down_proj (KL now"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[tachyon warn]", r.err.find("[tachyon warn]") + 1), std::string::npos) << r.err;  // one warning

  // Without the source model: an error naming the failure.
  {
    std::ifstream in(dir + "/bad/quantize_report.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["model"] = dir + "/nowhere";
    std::ofstream out(dir + "/bad/quantize_report.json", std::ios::trunc);
    out << j.dump();
  }
  auto e = run_command(testing::tachyon_binary() + " generate -m " + dir + "/bad -p 'Once upon a time' -n 4 --temp 0 -t 2");
  EXPECT_NE(e.exit_code, 0);
  EXPECT_NE(e.err.find("fails the guard"), std::string::npos) << e.err;
  EXPECT_NE(e.err.find("is not there to fall back to"), std::string::npos) << e.err;
  // --quant-guard-kl 0: finiteness only, and the scales are finite.
  auto off = run_command(testing::tachyon_binary() + " generate -m " + dir +
                         "/bad -p 'Once upon a time' -n 4 --temp 0 -t 2 --quant-guard-kl 0");
  EXPECT_EQ(off.exit_code, 0) << off.err;

  corrupt(dir + "/nan", NAN);
  auto n = run_command(testing::tachyon_binary() + " generate -m " + dir + "/nan -p 'Once upon a time' -n 4 --temp 0 -t 2");
  EXPECT_NE(n.exit_code, 0);
  EXPECT_NE(n.err.find("model.layers.4.mlp.down_proj"), std::string::npos) << n.err;
}

}  // namespace
}  // namespace tachyon
