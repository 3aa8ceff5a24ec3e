// Quantized weights on the GPU: the device quantizers against the host's bytes, linear() with
// packed weights against the reference, and whole models (int8, int4, every packed format, a
// --quant-policy mix, an AutoAWQ checkpoint, checkpoints with static activation scales) against
// the same weights on the CPU. Skips without a
// device.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "fixture.h"
#include "gpu_test_util.h"
#include "model/model_loader.h"
#include "model/quantize_model.h"
#include "model/quantize_weights.h"
#include "model/quantized_checkpoint.h"
#include "model_gpu_util.h"
#include "ops/cuda/launch.h"
#include "ops/ops.h"
#include "quant/quant_policy.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace tachyon {
namespace {

using testing::relative_error;
using testing::Sessions;
using testing::to_host;

const Device kGpu = Device::cuda(0);

// Feeds both models the CPU model's greedy sequence (the prompt, then one token a step) for 32
// steps: every step's logits agree within `tolerance` relative, and the GPU's argmax differs from
// the CPU's at no more than 3 steps (a flip needs the CPU's top two within that error of each
// other; counted and printed).
void expect_steps_agree(const LlamaModel& cm, const LlamaModel& gm, std::vector<int32_t> chunk, double tolerance,
                        const std::string& what) {
  const int64_t vocab = cm.config().vocab_size;
  const int P = static_cast<int>(chunk.size());
  Sessions cs = Sessions::make(cm, 1, P + 40, DType::kF32), gs = Sessions::make(gm, 1, P + 40, DType::kF32);
  double worst = 0.0;
  int near_ties = 0;
  for (int step = 0; step < 32; ++step) {
    const Tensor lc = cs.run({chunk}, LogitsWanted::kLast), lg = to_host(gs.run({chunk}, LogitsWanted::kLast));
    const float* c = lc.data<float>();
    const float* g = lg.data<float>();
    const double err = relative_error(g, c, vocab);
    worst = std::max(worst, err);
    ASSERT_LE(err, tolerance) << what << " step " << step;
    const int64_t top = std::max_element(c, c + vocab) - c, got = std::max_element(g, g + vocab) - g;
    if (got != top) ++near_ties;  // within the error above, so the CPU's top two were that close
    chunk = {static_cast<int32_t>(top)};
  }
  EXPECT_LE(near_ties, 3) << what;
  std::printf("%s: GPU vs CPU over 32 steps, worst logits error %.2e, %d near-tie argmax flips\n", what.c_str(), worst,
              near_ties);
}

// Greedy decoding of the two prompts below on both models for 32 tokens: the GPU's tokens agree
// with the CPU's for at least the first 16 (the GPU's GEMMs round activations to bf16 where the
// CPU keeps f32, so a near-tie may flip late; the start must agree). Prints the agreement.
void expect_greedy_start_agrees(const LlamaModel& cm, const LlamaModel& gm, const Tokenizer& tokenizer,
                                const std::string& what) {
  for (const char* text : {"Once upon a time", "The little dog ran to the park and"}) {
    const std::vector<int32_t> prompt = tokenizer.encode(text);
    const auto expected = testing::greedy_ids(cm, prompt, 32);
    const auto got = testing::greedy_ids(gm, prompt, 32, DType::kF32);
    size_t agree = 0;
    while (agree < got.size() && agree < expected.size() && got[agree] == expected[agree]) ++agree;
    std::printf("%s greedy agreement GPU vs CPU over 32 tokens (\"%s\"): %zu\n", what.c_str(), text, agree);
    EXPECT_GE(agree, 16u) << what << " \"" << text << "\"";
  }
}

// Per-channel int8 on the device: quantize_int8_rows makes the host quantizer's bytes and scales
// (bf16 and f32 rows, odd shapes, a zero row); linear() with the packed weight matches the
// reference product with the dequantized weight on every path kAuto takes: the GEMV (f32 sums),
// the tensor-core GEMM (activations rounded to bf16), the weight expanded to bf16 for cuBLASLt.
TEST(GpuOps, Int8WeightsQuantizeAndMultiplyLikeTheHost) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{67, 131}, {256, 515}, {1032, 515}, {4096, 96}};
  for (auto [in, out] : shapes) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      Tensor w = testing::convert(testing::random_tensor({out, in}, rng, -0.5f, 0.5f), dtype);
      if (dtype == DType::kF32) {
        for (int64_t i = 0; i < in; ++i) w.data<float>()[3 * in + i] = 0.0f;  // an all-zero row
      }
      auto host_q = quantize_int8_channel(w);
      ASSERT_TRUE(host_q.ok()) << host_q.status().to_string();
      auto dw = copy_to(w, kGpu);
      auto packed = empty_on({out, in}, DType::kI8, kGpu);
      auto scales = empty_on({out}, DType::kF32, kGpu);
      ASSERT_TRUE(dw.ok() && packed.ok() && scales.ok());
      ops::quantize_int8_rows(*dw, *packed, *scales);
      ASSERT_TRUE(testing::bitwise_equal(to_host(*packed), host_q->packed, "packed"));
      ASSERT_TRUE(testing::bitwise_equal(to_host(*scales), host_q->scales, "scales"));
      if (dtype != DType::kBF16) continue;

      const Tensor dense = dequantize(*host_q);
      auto dq = std::make_shared<QuantWeight>(*host_q);
      dq->packed = *packed;
      dq->scales = *scales;
      Weight dweight;
      dweight.quant = dq;
      for (int64_t n : {1, 2, 3, 5, 8, 9, 13, 17, 40, 64, 70}) {
        const std::string what = fmt::format("int8 {}x{} n={}", in, out, n);
        const Tensor x = testing::random_tensor({n, in}, rng);
        const bool with_bias = n % 2 == 1;
        const Tensor bias = testing::random_tensor({out}, rng);
        Weight hw;
        hw.dense = dense;
        Tensor expected = Tensor::empty({n, out}, DType::kF32), expected_rounded = Tensor::empty({n, out}, DType::kF32);
        ops::linear(x, hw, with_bias ? &bias : nullptr, expected);
        ops::linear(testing::convert(x, DType::kBF16).to_f32(), hw, with_bias ? &bias : nullptr, expected_rounded);
        auto dx = copy_to(x, kGpu);
        auto db = copy_to(bias, kGpu);
        auto dy = empty_on({n, out}, DType::kF32, kGpu);
        ASSERT_TRUE(dx.ok() && db.ok() && dy.ok());
        ops::linear(*dx, dweight, with_bias ? &*db : nullptr, *dy);
        const Tensor got = to_host(*dy);
        // The path kAuto takes (ops/cuda/cuda_ops.h): the GEMV is exact f32 arithmetic, the
        // tensor-core GEMM rounds the activations to bf16, the expanded weight rounds both.
        const bool mma = in % 64 == 0 && n > ops::cuda::kLinearAutoGemvMaxTokensInt8 &&
                         n <= ops::cuda::detail::kGemmMmaMaxTokens;
        const bool gemv = n <= ops::cuda::kLinearAutoGemvMaxTokensInt8 || (in % 64 != 0 && n <= 8);
        if (gemv) {
          ASSERT_TRUE(testing::relative_l2_below(got, expected, 1e-5, what + " (gemv)"));
        } else if (mma) {
          ASSERT_TRUE(testing::relative_l2_below(got, expected_rounded, 1e-4, what + " (tensor cores)"));
        } else {
          ASSERT_TRUE(testing::relative_l2_below(got, expected, 1e-2, what + " (expanded to bf16)"));
        }
      }
    }
  }
}

// The bundled model with its linear weights in int8: on the GPU (fused projections quantized
// there) and on the CPU (host quantizer, separate projections) the packed weights are the same
// bytes, so greedy decoding agrees (token for token but for near-ties late in the run).
TEST(GpuModel, Int8GreedyEqualsTheCpuInt8Path) {
  TACHYON_START_GPU();
  const testing::ExactQuantizedLinears exact;  // the CPU side in f32 activations, as before
  LoadedModel cpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", Device::cpu());
  LoadedModel gpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  QuantSpec spec;
  spec.format = QuantFormat::kInt8Channel;
  ModelWeights cw = cpu.model->weights(), gw = gpu.model->weights();
  ASSERT_OK(quantize_linear_weights(cw, spec));
  ASSERT_OK(quantize_linear_weights(gw, spec));
  ASSERT_TRUE(gw.layers[0].qkv_proj.quant != nullptr && gw.layers[0].q_proj.quant != nullptr);
  ASSERT_TRUE(testing::bitwise_equal(to_host(gw.layers[1].k_proj.quant->packed), cw.layers[1].k_proj.quant->packed,
                                     "layer 1 k_proj packed (a row view of the fused qkv)"));
  LlamaModel cm(cpu.model->config(), std::move(cw)), gm(gpu.model->config(), std::move(gw));
  expect_greedy_start_agrees(cm, gm, *cpu.tokenizer, "int8");
}

// Group-wise int4 on the device: quantize_int4_groups makes the host quantizer's bytes, scales and
// zeros (bf16 and f32 rows, each group size, odd row counts, a zero row, a constant row); linear()
// with the packed weight matches the reference product with the dequantized weight: the tensor-core
// GEMM (group 128, up to 32 tokens), the int4 GEMV (f32 sums, 1..8 tokens, with and without split
// K) and the weight expanded to bf16 for cuBLASLt.
// Outputs are poisoned first, so an unwritten element fails.
TEST(GpuOps, Int4WeightsQuantizeAndMultiplyLikeTheHost) {
  TACHYON_START_GPU();
  const uint32_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {} (TACHYON_TEST_SEED={} reproduces)", seed, seed));
  std::mt19937 rng(seed);
  struct Case {
    int64_t in, out;
    int group;
  };
  for (const Case c : {Case{96, 131, 32}, Case{256, 515, 64}, Case{1280, 77, 128}, Case{4096, 96, 128},
                       Case{256, 2100, 128}, Case{3072, 1031, 32}}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      Tensor w = testing::convert(testing::random_tensor({c.out, c.in}, rng, -0.5f, 0.5f), dtype);
      if (dtype == DType::kF32) {
        for (int64_t i = 0; i < c.in; ++i) {
          w.data<float>()[3 * c.in + i] = 0.0f;   // an all-zero row
          w.data<float>()[5 * c.in + i] = -0.25f;  // a constant negative row: zero point 15
        }
      }
      // Scales as `--quant int4` makes them (rounded up to f16) for bf16 weights, exact for f32.
      const bool f16_scales = dtype == DType::kBF16;
      auto host_q = quantize_int4_group(w, c.group, f16_scales ? Int4Scales::kF16 : Int4Scales::kF32);
      ASSERT_TRUE(host_q.ok()) << host_q.status().to_string();
      auto dw = copy_to(w, kGpu);
      auto packed = empty_on({c.out, c.in / 2}, DType::kU8, kGpu);
      auto scales = empty_on({c.out, c.in / c.group}, DType::kF32, kGpu);
      auto zeros = empty_on({c.out, c.in / c.group}, DType::kF32, kGpu);
      ASSERT_TRUE(dw.ok() && packed.ok() && scales.ok() && zeros.ok());
      ops::quantize_int4_groups(*dw, c.group, f16_scales, *packed, *scales, *zeros);
      const std::string shape = fmt::format("int4 g{} {}x{} {}", c.group, c.in, c.out, dtype_name(dtype));
      ASSERT_TRUE(testing::bitwise_equal(to_host(*packed), host_q->packed, shape + " packed"));
      ASSERT_TRUE(testing::bitwise_equal(to_host(*scales), host_q->scales, shape + " scales"));
      ASSERT_TRUE(testing::bitwise_equal(to_host(*zeros), host_q->zeros, shape + " zeros"));
      if (dtype != DType::kBF16) continue;

      const Tensor dense = dequantize(*host_q);
      auto dq = std::make_shared<QuantWeight>(*host_q);
      dq->packed = *packed;
      dq->scales = *scales;
      dq->zeros = *zeros;
      Weight dweight;
      dweight.quant = dq;
      Weight hw;
      hw.dense = dense;
      for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 17, 32, 33, 70}) {
        const std::string what = fmt::format("{} n={}", shape, n);
        const Tensor x = testing::random_tensor({n, c.in}, rng);
        const bool with_bias = n % 2 == 1;
        const Tensor bias = testing::random_tensor({c.out}, rng);
        Tensor expected = Tensor::empty({n, c.out}, DType::kF32), expected_rounded = Tensor::empty({n, c.out}, DType::kF32);
        ops::linear(x, hw, with_bias ? &bias : nullptr, expected);
        ops::linear(testing::convert(x, DType::kBF16).to_f32(), hw, with_bias ? &bias : nullptr, expected_rounded);
        auto dx = copy_to(x, kGpu);
        auto db = copy_to(bias, kGpu);
        Tensor poison = Tensor::empty({n, c.out}, DType::kF32);
        std::fill_n(poison.data<float>(), poison.numel(), std::numeric_limits<float>::quiet_NaN());
        auto dy = copy_to(poison, kGpu);
        ASSERT_TRUE(dx.ok() && db.ok() && dy.ok());
        ops::linear(*dx, dweight, with_bias ? &*db : nullptr, *dy);
        const Tensor got = to_host(*dy);
        // The path kAuto takes (ops/cuda/cuda_ops.h): the tensor-core GEMM (group 128) rounds the
        // activations to bf16, the GEMV is exact f32 arithmetic, the expansion rounds both.
        const bool small = n <= ops::cuda::kLinearAutoGemvMaxTokensInt4Small &&
                           c.out <= ops::cuda::kLinearAutoGemvMaxRowsInt4;
        const bool mma = c.group == 128 && n <= ops::cuda::detail::kGemmMmaMaxTokensInt4 && !small;
        if (mma) {
          ASSERT_TRUE(testing::relative_l2_below(got, expected_rounded, 1e-4, what + " (tensor cores)"));
        } else if (n <= ops::cuda::kLinearAutoGemvMaxTokensInt4) {
          ASSERT_TRUE(testing::relative_l2_below(got, expected, 1e-5, what + " (gemv)"));
        } else {
          ASSERT_TRUE(testing::relative_l2_below(got, expected, 1e-2, what + " (expanded to bf16)"));
        }
        if (n <= ops::cuda::kLinearAutoGemvMaxTokensInt4) {
          // The GEMV on every group size (what LinearMode::kBatchInvariant runs).
          ops::linear(*dx, dweight, with_bias ? &*db : nullptr, *dy, ops::LinearMode::kBatchInvariant);
          ASSERT_TRUE(testing::relative_l2_below(to_host(*dy), expected, 1e-5, what + " (gemv, batch-invariant)"));
        }
      }
      // Batch invariance: a token's row through the GEMV is the same bits alone and in a batch.
      const Tensor x = testing::random_tensor({8, c.in}, rng);
      auto dx = copy_to(x, kGpu);
      auto dx0 = copy_to(x.slice(0, 5, 6).contiguous(), kGpu);
      auto dy = empty_on({8, c.out}, DType::kF32, kGpu);
      auto dy0 = empty_on({1, c.out}, DType::kF32, kGpu);
      ASSERT_TRUE(dx.ok() && dx0.ok() && dy.ok() && dy0.ok());
      ops::linear(*dx, dweight, nullptr, *dy, ops::LinearMode::kBatchInvariant);
      ops::linear(*dx0, dweight, nullptr, *dy0, ops::LinearMode::kBatchInvariant);
      ASSERT_TRUE(testing::bitwise_equal(to_host(*dy).slice(0, 5, 6).contiguous(), to_host(*dy0),
                                         shape + " row 5 alone vs in a batch of 8"));
    }
  }
}

// The bundled model with its linear weights in int4 (g64): the GPU quantizes the same bytes as
// the host (fused projections as one matrix), and greedy decoding agrees with the CPU int4 path.
TEST(GpuModel, Int4GreedyEqualsTheCpuInt4Path) {
  TACHYON_START_GPU();
  const testing::ExactQuantizedLinears exact;  // the CPU side in f32 activations, as before
  LoadedModel cpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", Device::cpu());
  LoadedModel gpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  QuantSpec spec;
  spec.format = QuantFormat::kInt4Group;
  spec.group_size = 64;
  ModelWeights cw = cpu.model->weights(), gw = gpu.model->weights();
  const int64_t q_rows = cw.layers[1].q_proj.out_features(), k_rows = cw.layers[1].k_proj.out_features();
  ASSERT_TRUE(testing::bitwise_equal(
      to_host(gw.layers[1].qkv_proj.dense).slice(0, q_rows + k_rows, q_rows + 2 * k_rows).contiguous(),
      cw.layers[1].v_proj.dense, "layer 1 v_proj as loaded"));
  ASSERT_OK(quantize_linear_weights(cw, spec));
  ASSERT_OK(quantize_linear_weights(gw, spec));
  ASSERT_TRUE(gw.layers[0].qkv_proj.quant != nullptr && gw.layers[0].up_proj.quant != nullptr);
  ASSERT_TRUE(testing::bitwise_equal(to_host(gw.layers[1].v_proj.quant->scales), cw.layers[1].v_proj.quant->scales,
                                     "layer 1 v_proj scales"));
  ASSERT_TRUE(testing::bitwise_equal(to_host(gw.layers[1].v_proj.quant->zeros), cw.layers[1].v_proj.quant->zeros,
                                     "layer 1 v_proj zeros"));
  ASSERT_TRUE(testing::bitwise_equal(to_host(gw.layers[1].v_proj.quant->packed), cw.layers[1].v_proj.quant->packed,
                                     "layer 1 v_proj packed (a row view of the fused qkv)"));
  ASSERT_TRUE(testing::bitwise_equal(to_host(gw.layers[2].up_proj.quant->zeros), cw.layers[2].up_proj.quant->zeros,
                                     "layer 2 up_proj zeros (a row view of the fused gate_up)"));
  LlamaModel cm(cpu.model->config(), std::move(cw)), gm(gpu.model->config(), std::move(gw));
  expect_greedy_start_agrees(cm, gm, *cpu.tokenizer, "int4");
}

// The bundled model with its linear weights in each packed format quantized on the host — the
// GGUF blocks (the K-quants' 640-wide down projections in the 32-weight format llama.cpp falls back
// to: q4_k's q5_0, q5_k's q5_1, q6_k's q8_0), w8a8, fp8, ternary g128 — moved to the GPU packed.
// Both devices are fed the CPU's greedy sequence (the prompt, then one token per step: the GPU's
// prefill of a prompt of more tokens than a format's GEMV takes runs its GEMM — the bf16
// expansion, cuBLASLt int8, cuBLASLt fp8 on e4m3 activations — its steps the GEMVs): every step's
// logits agree within 2e-2 relative (fp8: 1e-1, its prefill's activations rounded to e4m3), and
// the GPU's argmax differs from the CPU's at no more than 3 of 32 steps (a flip needs the CPU's
// top two within that error of each other; counted and printed).
TEST(GpuModel, PackedWeightsMatchTheCpuPath) {
  TACHYON_START_GPU();
  const testing::ExactQuantizedLinears exact;  // the CPU side in f32 activations, as before
  LoadedModel cpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", Device::cpu());
  for (const char* name :
       {"q4_k", "q5_k", "q6_k", "q8_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "w8a8", "fp8", "ternary"}) {
    auto spec = parse_quant_spec(name, 128);
    ASSERT_TRUE(spec.ok());
    ModelWeights cw = cpu.model->weights();
    ASSERT_OK(quantize_linear_weights(cw, *spec));
    auto gw = copy_weights_to(cw, kGpu);
    ASSERT_TRUE(gw.ok()) << gw.status().to_string();
    const Weight& gate = gw->layers[0].gate_proj;
    ASSERT_TRUE(gate.quant != nullptr && gate.quant->format == spec->format) << name;
    EXPECT_EQ(gate.quant->packed.device(), kGpu);
    if (is_gguf_block_format(spec->format)) {
      const QuantFormat down = spec->format == QuantFormat::kGgufQ4_K   ? QuantFormat::kGgufQ5_0
                               : spec->format == QuantFormat::kGgufQ5_K ? QuantFormat::kGgufQ5_1
                               : spec->format == QuantFormat::kGgufQ6_K ? QuantFormat::kGgufQ8_0
                                                                        : spec->format;
      EXPECT_EQ(gw->layers[0].down_proj.quant->format, down) << name << ": 640-wide inputs";
    }
    LlamaModel cm(cpu.model->config(), std::move(cw)), gm(cpu.model->config(), std::move(gw).value());
    // fp8's GEMM rounds the activations to e4m3 (2^-4 relative) where the CPU keeps f32.
    const double tolerance = spec->format == QuantFormat::kFp8Channel ? 1e-1 : 2e-2;
    for (const char* text : {"Once upon a time", "The little dog ran to the park and"}) {
      expect_steps_agree(cm, gm, cpu.tokenizer->encode(text), tolerance, fmt::format("{} \"{}\"", name, text));
    }
  }
}

// --quant-policy on a GPU: the bundled model loaded there (fused qkv and gate_up) takes a policy
// module by module. Where q/k/v (or gate/up) get one format in every layer the fused matrix is
// quantized whole; where they differ every layer runs them apart. Each module ends in the format
// the rule gives it (K-quant fallbacks as on the host), and the step-by-step logits agree with the
// same policy applied on the CPU as in PackedWeightsMatchTheCpuPath.
TEST(GpuModel, QuantPolicyOnTheGpuMatchesTheCpu) {
  TACHYON_START_GPU();
  const testing::ExactQuantizedLinears exact;
  LoadedModel cpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", Device::cpu());
  LoadedModel gpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  struct Case {
    const char* rules;
    bool fused_qkv, fused_gate_up;
  };
  for (const Case& c : {Case{"*.self_attn.v_proj int8\n*.self_attn.* int4:g64\n*.mlp.gate_proj q4_k\n"
                             "model.layers.1.* dense\n* q8_0\n", false, false},
                        Case{"*.self_attn.o_proj w8a8\n*.self_attn.* int4:g128\n*.mlp.down_proj q5_k\n* int8\n",
                             true, true}}) {
    SCOPED_TRACE(c.rules);
    auto policy = QuantPolicy::parse(c.rules, "policy");
    ASSERT_TRUE(policy.ok()) << policy.status().to_string();
    ModelWeights cw = cpu.model->weights(), gw = gpu.model->weights();
    auto cc = quantize_linear_weights(cw, *policy, std::nullopt);
    ASSERT_TRUE(cc.ok()) << cc.status().to_string();
    auto gc = quantize_linear_weights(gw, *policy, std::nullopt);
    ASSERT_TRUE(gc.ok()) << gc.status().to_string();
    EXPECT_EQ(*cc, *gc);  // the same modules per format
    for (size_t l = 0; l < gw.layers.size(); ++l) {
      const LayerWeights& g = gw.layers[l];
      const LayerWeights& h = cw.layers[l];
      EXPECT_EQ(g.qkv_proj.defined(), c.fused_qkv) << "layer " << l;
      EXPECT_EQ(g.gate_up_proj.defined(), c.fused_gate_up) << "layer " << l;
      const Weight* gm[] = {&g.q_proj, &g.k_proj, &g.v_proj, &g.o_proj, &g.gate_proj, &g.up_proj, &g.down_proj};
      const Weight* hm[] = {&h.q_proj, &h.k_proj, &h.v_proj, &h.o_proj, &h.gate_proj, &h.up_proj, &h.down_proj};
      for (int m = 0; m < 7; ++m) {
        ASSERT_EQ(gm[m]->quant != nullptr, hm[m]->quant != nullptr) << "layer " << l << " module " << m;
        if (hm[m]->quant) {
          EXPECT_EQ(gm[m]->quant->format, hm[m]->quant->format) << "layer " << l << " module " << m;
          EXPECT_EQ(gm[m]->quant->packed.device(), kGpu);
        }
      }
    }
    LlamaModel cm(cpu.model->config(), std::move(cw)), gm(gpu.model->config(), std::move(gw));
    expect_steps_agree(cm, gm, cpu.tokenizer->encode("Once upon a time"), 2e-2, "policy");
  }
}

// A checkpoint already quantized (AutoAWQ GEMM layout, int4 g128 with a calibrated AWQ search) runs
// on the GPU packed as loaded: the weights reach the device as int4, and greedy decoding agrees
// with the same checkpoint on the CPU.
TEST(GpuModel, AwqCheckpointRunsPackedAndAgreesWithTheCpu) {
  TACHYON_START_GPU();
  const testing::ExactQuantizedLinears exact;  // the CPU side in f32 activations, as before
  LoadedModel original = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", Device::cpu());
  std::vector<int32_t> calib = original.tokenizer->encode(
      "Once upon a time there was a little girl who lived in a village near the forest. Whenever she went out, "
      "the little girl wore a red riding cloak, so everyone in the village called her Little Red Riding Hood.");
  QuantizeModelOptions o;
  o.method = QuantMethod::kAwqInt4;
  o.group_size = 128;
  o.sequence_length = 64;
  o.grid = 5;
  auto q = quantize_model(*original.model, calib, o);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  const std::string out = testing::scratch_dir("gpu_awq") + "/out";
  auto saved = save_quantized_checkpoint({original.path, out, CheckpointQuantMethod::kAwqGemm, ""},
                                         original.model->config(), q->weights);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  LoadedModel cpu = testing::load_model_or_fail(out, Device::cpu());
  LoadedModel gpu = testing::load_model_or_fail(out, kGpu);
  const Weight& gate = gpu.model->weights().layers[0].gate_proj;
  ASSERT_TRUE(gate.quant != nullptr && gate.quant->format == QuantFormat::kInt4Group && gate.quant->group_size == 128);
  EXPECT_EQ(gate.quant->packed.device(), kGpu);
  expect_greedy_start_agrees(*cpu.model, *gpu.model, *cpu.tokenizer, "AWQ checkpoint");
}

// Checkpoints with static activation scales (W8A8 with SmoothQuant and an entropy observer; fp8
// with min-max) load on the GPU with their scales (fused q/k/v and gate/up keep the shared one) and
// agree step by step with the same checkpoint on the CPU: W8A8's static codes are the CPU's (2.5e-7
// worst on an H100, 2026-12-07). fp8 is held to 1e-1, as PackedWeightsMatchTheCpuPath holds per-token
// fp8: its 5-token prefill through cuBLASLt's fp8 GEMM differed from the CPU by 7.0e-2 on the H100
// although both round the activations to the same codes (per-token fp8 there: 5.8e-2), where the
// kernel tests at 9+ tokens agree within 1e-4; CudaLinearQuant.Fp8WithAStaticScaleMatchesTheCpu now
// forces that GEMM at 3 and 5 tokens to find out why.
TEST(GpuModel, StaticActivationScaleCheckpointsMatchTheCpu) {
  TACHYON_START_GPU();
  const testing::ExactQuantizedLinears exact;
  LoadedModel original = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", Device::cpu());
  std::vector<int32_t> calib = original.tokenizer->encode(
      "Once upon a time there was a little girl who lived in a village near the forest. Whenever she went out, "
      "the little girl wore a red riding cloak, so everyone in the village called her Little Red Riding Hood.");
  struct Case {
    QuantMethod method;
    CheckpointQuantMethod checkpoint;
    ObserverKind observer;
    double tolerance;
  };
  for (const Case& c : {Case{QuantMethod::kW8A8, CheckpointQuantMethod::kW8A8, ObserverKind::kEntropy, 2e-2},
                        Case{QuantMethod::kFp8, CheckpointQuantMethod::kFp8Channel, ObserverKind::kMinMax, 1e-1}}) {
    SCOPED_TRACE(quant_method_name(c.method));
    QuantizeModelOptions o;
    o.method = c.method;
    o.sequence_length = 32;
    ObserverOptions observer;
    observer.kind = c.observer;
    o.act_observer = observer;
    o.act_fallback_ratio = 0.0;  // every module static
    auto q = quantize_model(*original.model, calib, o);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    const std::string out = testing::scratch_dir("gpu_static_scales") + "/out";
    auto saved = save_quantized_checkpoint({original.path, out, c.checkpoint, observer_name(c.observer)},
                                           original.model->config(), q->weights);
    ASSERT_TRUE(saved.ok()) << saved.status().to_string();
    LoadedModel cpu = testing::load_model_or_fail(out, Device::cpu());
    LoadedModel gpu = testing::load_model_or_fail(out, kGpu);
    const LayerWeights& g = gpu.model->weights().layers[0];
    const float want = cpu.model->weights().layers[0].q_proj.quant->input_scale;
    EXPECT_GT(want, 0.0f);
    if (g.qkv_proj.defined()) {
      EXPECT_EQ(g.qkv_proj.quant->input_scale, want) << "the fused q/k/v";
    }
    EXPECT_EQ(g.q_proj.quant->input_scale, want);
    expect_steps_agree(*cpu.model, *gpu.model, cpu.tokenizer->encode("Once upon a time"), c.tolerance,
                       fmt::format("{} static scales", quant_method_name(c.method)));
  }
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
