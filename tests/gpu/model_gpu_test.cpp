// The whole model on the GPU (--device cuda) against independent references and the CPU path:
// Hugging Face logits of every conformance fixture, stories260K's greedy story, 32 prompts batched
// against each alone, the engine end to end (prefix caching, copy-on-write, no leaked block).
// Skips without a device. Quantized weights are in quant_gpu_test.cpp. The token-choice ops (argmax,
// top_tokens, sample, adjust_logits) are in sampling_gpu_test.cpp.
#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "core/device_memory.h"
#include "core/mapped_file.h"
#include "engine/engine.h"
#include "disagg/kv_export.h"
#include "disagg/kv_staging.h"
#include "disagg/kv_transfer.h"
#include "disagg/kv_transport.h"
#include "fixture.h"
#include "gpu_test_util.h"
#include "model_gpu_util.h"
#include "io/safetensors_writer.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/model_loader.h"
#include "model/quantize_model.h"
#include "model/quantize_weights.h"
#include "model/quantized_checkpoint.h"
#include "ops/cuda/launch.h"
#include "quant/quant_policy.h"
#include "quant/quantize.h"
#include "ops/ops.h"
#include "speculative/domain_classifier.h"
#include "speculative/spec_heads.h"
#include "test_util.h"

namespace tachyon {
namespace {

using testing::argmax;
using testing::relative_error;
using testing::Sessions;
using testing::to_host;

const Device kGpu = Device::cuda(0);

// Steps the engine until it is idle, appending each request's tokens to got[id]; every block is
// back at the end.
void drain(Engine& engine, std::map<RequestId, std::vector<int32_t>>& got) {
  while (engine.has_unfinished()) {
    auto out = engine.step();
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (!out.ok()) break;
    for (const auto& o : *out) got[o.id].insert(got[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  }
  EXPECT_TRUE(engine.check_no_leaks().ok());
}

TEST(GpuModel, SyntheticWeightsAreMadeOnTheDeviceAndEqualTheCpuOnes) {
  TACHYON_START_GPU();
  LoadedModel cpu = testing::load_model_or_fail("synthetic:tiny", Device::cpu());
  LoadedModel gpu = testing::load_model_or_fail("synthetic:tiny", kGpu);
  EXPECT_EQ(gpu.model->device(), kGpu);
  EXPECT_TRUE(testing::bitwise_equal(to_host(gpu.model->weights().layers[2].gate_proj.dense),
                                     cpu.model->weights().layers[2].gate_proj.dense, "gate_proj"));
  EXPECT_TRUE(testing::bitwise_equal(to_host(gpu.model->weights().final_norm), cpu.model->weights().final_norm,
                                     "final_norm"));
}

// GPU logits against the transformers reference of every conformance fixture: the prompt in one
// forward, in chunks of 5 (prefill through the paged cache), and 16 greedy decode steps.
class GpuConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuConformance, LogitsMatchTransformers) {
  TACHYON_START_GPU();
  const testing::ModelFixture f = testing::read_model_fixture(GetParam());
  LoadedModel m = testing::load_model_or_fail(f.dir, kGpu);
  const Tensor& ref_prompt = f.arrays.at("prompt_logits");
  const Tensor& ref_decode = f.arrays.at("decode_logits");
  const int64_t vocab = ref_prompt.size(1);
  const int P = static_cast<int>(f.prompt_ids.size());
  // f32 weights: the GEMV is exact f32 math and cuBLASLt runs f32, so an f32 KV cache keeps the
  // f32 tolerance within a small factor; a bf16 cache rounds K and V (bf16 tolerance). Mixtures of
  // experts take the f32 cache only: a bf16 one moves router logits by more than the fixtures'
  // routing margins, and a flipped expert is a different function, not a rounding.
  const std::vector<DType> kv_dtypes =
      m.model->config().is_moe() ? std::vector<DType>{DType::kF32} : std::vector<DType>{DType::kF32, DType::kBF16};
  for (DType kv : kv_dtypes) {
    const double tol = kv == DType::kF32 ? 1e-3 : 3e-2;
    Sessions whole = Sessions::make(*m.model, 1, P + 20, kv, 4);
    Tensor hidden;
    ForwardOptions with_hidden;
    with_hidden.hidden = &hidden;
    Tensor logits = whole.run({f.prompt_ids}, LogitsWanted::kAll, with_hidden);
    for (int i = 0; i < P; ++i) {
      EXPECT_LE(relative_error(logits.data<float>() + i * vocab, ref_prompt.data<float>() + i * vocab, vocab), tol)
          << f.dir << " kv " << dtype_name(kv) << " position " << i;
    }
    // The final hidden rows times the LM head (on the host, in double) give the reference logits.
    const Tensor head = to_host(m.model->weights().lm_head.dense).to_f32();
    ASSERT_TRUE(hidden.defined() && hidden.device().is_cpu());
    ASSERT_EQ(hidden.size(0), P);
    const int64_t d = hidden.size(1);
    std::vector<float> row(static_cast<size_t>(vocab));
    for (int i = 0; i < P; ++i) {
      for (int64_t v = 0; v < vocab; ++v) {
        double acc = 0.0;
        for (int64_t j = 0; j < d; ++j) acc += static_cast<double>(hidden.data<float>()[i * d + j]) * head.data<float>()[v * d + j];
        row[static_cast<size_t>(v)] = static_cast<float>(acc);
      }
      EXPECT_LE(relative_error(row.data(), ref_prompt.data<float>() + i * vocab, vocab), tol)
          << f.dir << " kv " << dtype_name(kv) << " hidden rows x LM head, position " << i;
    }
    Sessions chunked = Sessions::make(*m.model, 1, P + 4, kv, 16);
    for (int start = 0; start < P; start += 5) {
      const int len = std::min(5, P - start);
      std::vector<int32_t> part(f.prompt_ids.begin() + start, f.prompt_ids.begin() + start + len);
      Tensor l = chunked.run({part}, LogitsWanted::kAll);
      for (int i = 0; i < len; ++i) {
        EXPECT_LE(relative_error(l.data<float>() + i * vocab, ref_prompt.data<float>() + (start + i) * vocab, vocab),
                  tol)
            << f.dir << " kv " << dtype_name(kv) << " chunked prefill position " << start + i;
      }
    }
    int32_t next = argmax(logits.data<float>() + (P - 1) * vocab, vocab);
    for (size_t step = 0; step < f.decode_ids.size(); ++step) {
      ASSERT_EQ(next, f.decode_ids[step]) << f.dir << " kv " << dtype_name(kv) << " greedy step " << step;
      Tensor l = whole.run({{f.decode_ids[step]}}, LogitsWanted::kLast);
      EXPECT_LE(relative_error(l.data<float>(), ref_decode.data<float>() + static_cast<int64_t>(step) * vocab, vocab),
                tol)
          << f.dir << " kv " << dtype_name(kv) << " decode step " << step;
      next = argmax(l.data<float>(), vocab);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuConformance,
                         ::testing::Values("llama", "llama3-scaled", "llama-tied", "qwen2", "qwen3", "mistral",
                                           "qwen3-moe", "qwen2-moe", "mixtral"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

TEST(GpuModel, Stories260KGreedyEqualsTheCpuPath) {
  TACHYON_START_GPU();
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  LoadedModel cpu = testing::load_model_or_fail(shared + "/models/stories260K", Device::cpu());
  LoadedModel gpu = testing::load_model_or_fail(shared + "/models/stories260K", kGpu);
  const std::vector<int32_t> prompt = cpu.tokenizer->encode("Once upon a time");
  const int n = 64;
  const auto expected = testing::greedy_ids(*cpu.model, prompt, n);
  const auto f32 = testing::greedy_ids(*gpu.model, prompt, n, DType::kF32);
  const auto bf16 = testing::greedy_ids(*gpu.model, prompt, n, DType::kBF16);
  auto agree = [&](const std::vector<int32_t>& got) {
    size_t i = 0;
    while (i < got.size() && i < expected.size() && got[i] == expected[i]) ++i;
    return i;
  };
  std::printf("stories260K greedy agreement with the CPU over %d tokens: f32 KV %zu, bf16 KV %zu\n", n, agree(f32),
              agree(bf16));
  EXPECT_EQ(f32, expected);
  EXPECT_GE(agree(bf16), 32u);
}

// Quantized KV caches: the GPU stores the CPU's codes and scales (bit for bit, tests/gpu/
// cuda_attention_test.cpp), so stories260K's greedy run with an i8 or f8e4m3 cache on the GPU
// follows the CPU's with the same cache, and stays near the f32-cache run.
TEST(GpuModel, QuantizedKvGreedyEqualsTheCpuPath) {
  TACHYON_START_GPU();
  TACHYON_SKIP_WITHOUT_SHARED(shared);
  LoadedModel cpu = testing::load_model_or_fail(shared + "/models/stories260K", Device::cpu());
  LoadedModel gpu = testing::load_model_or_fail(shared + "/models/stories260K", kGpu);
  const std::vector<int32_t> prompt = cpu.tokenizer->encode("Once upon a time");
  const int n = 64;
  const auto f32 = testing::greedy_ids(*cpu.model, prompt, n, DType::kF32);
  for (DType dtype : {DType::kI8, DType::kF8E4M3}) {
    const auto expected = testing::greedy_ids(*cpu.model, prompt, n, dtype);
    const auto got = testing::greedy_ids(*gpu.model, prompt, n, dtype);
    auto agree = [](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
      size_t i = 0;
      while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
      return i;
    };
    std::printf("stories260K greedy over %d tokens, %s KV: GPU agrees with the CPU on %zu, CPU with the f32 cache on %zu\n",
                n, dtype_name(dtype), agree(got, expected), agree(expected, f32));
    EXPECT_GE(agree(got, expected), 32u) << dtype_name(dtype);
  }
}

// 32 prompts of mixed lengths in one batch against each alone, prefill then 24 greedy steps:
// logits within bf16 tolerance; tokens equal until a step whose top-2 margin is within it.
TEST(GpuModel, BatchedEqualsAloneWithinTolerance) {
  TACHYON_START_GPU();
  LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  const int64_t vocab = m.model->config().vocab_size;
  const uint32_t seed = testing::fresh_seed();
  std::mt19937 rng(seed);
  const int num = 32, steps = 24;
  std::vector<std::vector<int32_t>> prompts(num);
  for (auto& p : prompts) {
    p.resize(std::uniform_int_distribution<int>(1, 90)(rng));
    for (auto& id : p) id = std::uniform_int_distribution<int32_t>(3, static_cast<int32_t>(vocab) - 1)(rng);
  }
  const double tol = 2e-2;
  Sessions batched = Sessions::make(*m.model, num, 90 + steps + 1, DType::kBF16);
  std::vector<Sessions> alone;
  for (int i = 0; i < num; ++i) alone.push_back(Sessions::make(*m.model, 1, 90 + steps + 1, DType::kBF16));

  std::vector<std::vector<int32_t>> next_b(num), next_a(num);
  std::vector<int> agreed(num, 0);
  std::vector<bool> diverged(num, false);
  Tensor lb = batched.run(prompts, LogitsWanted::kLast);
  for (int step = 0; step <= steps; ++step) {
    for (int i = 0; i < num; ++i) {
      if (diverged[static_cast<size_t>(i)]) {
        next_a[i].clear();
        next_b[i].clear();
        continue;
      }
      Tensor la = alone[i].run({step == 0 ? prompts[i] : next_a[i]}, LogitsWanted::kLast);
      const float* a = la.data<float>();
      const float* b = lb.data<float>() + i * vocab;
      EXPECT_LE(relative_error(b, a, vocab), tol) << "seed " << seed << " prompt " << i << " step " << step;
      const int32_t ta = argmax(a, vocab), tb = argmax(b, vocab);
      if (ta != tb) {
        // Only a near-tie may flip: the alone run's top-2 margin is within the tolerance.
        float top1 = -INFINITY, top2 = -INFINITY, scale = 0.0f;
        for (int64_t j = 0; j < vocab; ++j) {
          scale = std::max(scale, std::fabs(a[j]));
          if (a[j] > top1) {
            top2 = top1;
            top1 = a[j];
          } else if (a[j] > top2) {
            top2 = a[j];
          }
        }
        EXPECT_LE(top1 - top2, tol * scale) << "seed " << seed << " prompt " << i << " step " << step;
        diverged[static_cast<size_t>(i)] = true;
        next_a[i].clear();
        next_b[i].clear();
        continue;
      }
      agreed[static_cast<size_t>(i)] = step + 1;
      next_a[i] = {ta};
      next_b[i] = {tb};
    }
    if (step == steps) break;
    bool any = false;
    for (auto& c : next_b) any = any || !c.empty();
    if (!any) break;
    lb = batched.run(next_b, LogitsWanted::kLast);
    // Rows of the sequences still running, in order: re-pack so row i is sequence i.
    Tensor packed = Tensor::zeros({num, vocab}, DType::kF32);
    int row = 0;
    for (int i = 0; i < num; ++i) {
      if (next_b[i].empty()) continue;
      std::copy_n(lb.data<float>() + row * vocab, vocab, packed.data<float>() + i * vocab);
      ++row;
    }
    lb = packed;
  }
  int full = 0;
  for (int a : agreed) full += a == steps + 1;
  std::printf("batched vs alone (seed %u): %d of %d prompts agree on all %d greedy tokens; first disagreement at",
              seed, full, num, steps + 1);
  for (int a : agreed) std::printf(" %d", a);
  std::printf("\n");
}

// Decode steps replayed from CUDA graphs equal eager steps bit for bit, over a growing context
// that crosses block-table widths (new graphs) and with batches of several sizes.
TEST(GpuModel, GraphReplayEqualsEagerBitForBit) {
  TACHYON_START_GPU();
  LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  const int64_t vocab = m.model->config().vocab_size;
  for (int num : {1, 3}) {
    Sessions graphs = Sessions::make(*m.model, num, 400, DType::kBF16);
    Sessions eager = Sessions::make(*m.model, num, 400, DType::kBF16);
    // The final hidden rows come back too (ForwardOptions::hidden), from the graph's buffer.
    Tensor hg, he;
    ForwardOptions with_graphs;
    with_graphs.hidden = &hg;
    ForwardOptions no_graphs;
    no_graphs.cuda_graphs = false;
    no_graphs.hidden = &he;
    std::vector<std::vector<int32_t>> chunk(num);
    for (int i = 0; i < num; ++i) chunk[i] = {static_cast<int32_t>(5 + i), 17, 42, static_cast<int32_t>(99 + 3 * i)};
    Tensor lg = graphs.run(chunk, LogitsWanted::kLast, with_graphs);
    Tensor le = eager.run(chunk, LogitsWanted::kLast, no_graphs);
    for (int step = 0; step < 300; ++step) {
      for (int i = 0; i < num; ++i) chunk[i] = {argmax(le.data<float>() + i * vocab, vocab)};
      lg = graphs.run(chunk, LogitsWanted::kLast, with_graphs);
      le = eager.run(chunk, LogitsWanted::kLast, no_graphs);
      ASSERT_EQ(std::memcmp(lg.raw_data(), le.raw_data(), le.nbytes()), 0) << num << " sequences, step " << step;
      ASSERT_TRUE(hg.defined() && hg.device().is_cpu() && hg.shape() == he.shape());
      ASSERT_EQ(hg.size(0), num);
      ASSERT_EQ(std::memcmp(hg.raw_data(), he.raw_data(), he.nbytes()), 0) << num << " sequences, step " << step;
    }
  }
}

// decode_steps with argmax as the pick (a graph replayed and its inputs moved on by advance_decode,
// no host round trip) gives the tokens, logprobs and top tokens of one forward and argmax per step, bit for bit,
// for sequences of different lengths crossing block boundaries, with graphs and eagerly.
TEST(GpuModel, GreedyStepsOnTheDeviceEqualStepByStepDecoding) {
  TACHYON_START_GPU();
  LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  const int64_t vocab = m.model->config().vocab_size;
  const int num = 3, steps = 37, top = 5;
  for (bool graphs : {true, false}) {
    ForwardOptions fo;
    fo.cuda_graphs = graphs;
    Sessions stepwise = Sessions::make(*m.model, num, 200, DType::kBF16);
    Sessions chain = Sessions::make(*m.model, num, 200, DType::kBF16);
    std::vector<std::vector<int32_t>> chunk(num);
    for (int i = 0; i < num; ++i) chunk[i].assign(static_cast<size_t>(3 + 7 * i), static_cast<int32_t>(11 + i));
    const Tensor first = stepwise.run(chunk, LogitsWanted::kLast, fo);
    chain.run(chunk, LogitsWanted::kLast, fo);
    std::vector<int32_t> first_ids(num);
    for (int i = 0; i < num; ++i) first_ids[static_cast<size_t>(i)] = argmax(first.data<float>() + i * vocab, vocab);
    // Step by step: the token, its logprob and the top tokens of every step's logits.
    std::vector<int32_t> want_ids, want_top;
    std::vector<float> want_lp, want_probs;
    for (int i = 0; i < num; ++i) chunk[i] = {first_ids[static_cast<size_t>(i)]};
    for (int s = 0; s < steps; ++s) {
      const Tensor logits = stepwise.run(chunk, LogitsWanted::kLast, fo);
      Tensor ids = Tensor::empty({num}, DType::kI32), lp = Tensor::empty({num}, DType::kF32);
      Tensor ti = Tensor::empty({num, top}, DType::kI32), tp = Tensor::empty({num, top}, DType::kF32);
      auto dl = copy_to(logits, kGpu);
      auto dids = empty_on({num}, DType::kI32, kGpu), dlp = empty_on({num}, DType::kF32, kGpu);
      auto dti = empty_on({num, top}, DType::kI32, kGpu), dtp = empty_on({num, top}, DType::kF32, kGpu);
      ASSERT_TRUE(dl.ok() && dids.ok() && dlp.ok() && dti.ok() && dtp.ok());
      ops::argmax(*dl, *dids, &*dlp);
      ops::top_tokens(*dl, *dti, *dtp);
      ids = to_host(*dids), lp = to_host(*dlp), ti = to_host(*dti), tp = to_host(*dtp);
      for (int i = 0; i < num; ++i) chunk[i] = {ids.data<int32_t>()[i]};
      want_ids.insert(want_ids.end(), ids.data<int32_t>(), ids.data<int32_t>() + num);
      want_lp.insert(want_lp.end(), lp.data<float>(), lp.data<float>() + num);
      want_top.insert(want_top.end(), ti.data<int32_t>(), ti.data<int32_t>() + num * top);
      want_probs.insert(want_probs.end(), tp.data<float>(), tp.data<float>() + num * top);
    }
    // As one chain: the tables hold every position first, the batch is the first step's.
    std::vector<SequenceChunk> batch;
    const int32_t pending = 0;
    for (int i = 0; i < num; ++i) {
      const int start = chain.tables[static_cast<size_t>(i)].num_tokens();
      ASSERT_TRUE(chain.blocks.grow_to(chain.tables[static_cast<size_t>(i)], start + steps).ok());
      batch.push_back(SequenceChunk{&chain.tables[static_cast<size_t>(i)], start, std::span<const int32_t>(&pending, 1),
                                    LogitsWanted::kLast, {}});
    }
    Tensor out_ids = *empty_on({steps, num}, DType::kI32, kGpu);
    Tensor out_lp = *empty_on({steps, num}, DType::kF32, kGpu);
    Tensor out_ti = *empty_on({steps, num, top}, DType::kI32, kGpu);
    Tensor out_tp = *empty_on({steps, num, top}, DType::kF32, kGpu);
    Tensor first_host = Tensor::empty({num}, DType::kI32);
    std::copy(first_ids.begin(), first_ids.end(), first_host.data<int32_t>());
    const Tensor first_dev = *copy_to(first_host, kGpu);
    const auto pick = [&](const Tensor& logits, int64_t s, Tensor& next) {
      Tensor lp = out_lp.select(0, s), ti = out_ti.select(0, s), tp = out_tp.select(0, s);
      ops::argmax(logits, next, &lp);
      ops::top_tokens(logits, ti, tp);
    };
    ASSERT_TRUE(m.model->decode_steps(build_forward_batch(batch), first_dev, chain.cache, out_ids, pick, fo).ok());
    const Tensor ids = to_host(out_ids), lp = to_host(out_lp), ti = to_host(out_ti), tp = to_host(out_tp);
    EXPECT_EQ(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + steps * num), want_ids) << graphs;
    EXPECT_EQ(std::memcmp(lp.raw_data(), want_lp.data(), lp.nbytes()), 0) << graphs;
    EXPECT_EQ(std::vector<int32_t>(ti.data<int32_t>(), ti.data<int32_t>() + steps * num * top), want_top) << graphs;
    EXPECT_EQ(std::memcmp(tp.raw_data(), want_probs.data(), tp.nbytes()), 0) << graphs;
  }
}

// Kernels that programmatic dependent launch schedules early (sm_90+: each waits for the kernel
// before it in the stream, then lets the next one be scheduled) compute what serially ordered
// kernels do, bit for bit: the bundled model in bf16 and with int4 g128 linears (the
// staged GEMM and its split-K finish at 1 token, conversion + GEMM at 3), eager and from graphs,
// over a growing context. Below sm_90 the switch changes nothing and the test still holds.
TEST(GpuModel, ProgrammaticLaunchEqualsSerialBitForBit) {
  TACHYON_START_GPU();
  LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  ModelWeights w4 = m.model->weights();
  QuantSpec spec;
  spec.format = QuantFormat::kInt4Group;
  spec.group_size = 128;
  ASSERT_OK(quantize_linear_weights(w4, spec));
  const LlamaModel int4(m.model->config(), std::move(w4));
  const int64_t vocab = m.model->config().vocab_size;
  const bool was = ops::cuda::programmatic_launch();
  ForwardOptions no_graphs;
  no_graphs.cuda_graphs = false;
  for (const LlamaModel* model : {static_cast<const LlamaModel*>(m.model.get()), &int4}) {
    for (int num : {1, 3}) {
      Sessions graphs = Sessions::make(*model, num, 200, DType::kBF16);
      Sessions eager = Sessions::make(*model, num, 200, DType::kBF16);
      Sessions serial = Sessions::make(*model, num, 200, DType::kBF16);
      std::vector<std::vector<int32_t>> chunk(num);
      for (int i = 0; i < num; ++i) chunk[i] = {static_cast<int32_t>(7 + i), 19, 23, static_cast<int32_t>(61 + 5 * i)};
      for (int step = 0; step < 150; ++step) {
        ops::cuda::set_programmatic_launch(true);
        const Tensor lg = graphs.run(chunk, LogitsWanted::kLast);
        const Tensor le = eager.run(chunk, LogitsWanted::kLast, no_graphs);
        ops::cuda::set_programmatic_launch(false);
        const Tensor ls = serial.run(chunk, LogitsWanted::kLast, no_graphs);
        ASSERT_EQ(std::memcmp(le.raw_data(), ls.raw_data(), ls.nbytes()), 0)
            << (model == &int4 ? "int4" : "bf16") << ", " << num << " sequences, eager, step " << step;
        ASSERT_EQ(std::memcmp(lg.raw_data(), ls.raw_data(), ls.nbytes()), 0)
            << (model == &int4 ? "int4" : "bf16") << ", " << num << " sequences, graphs, step " << step;
        for (int i = 0; i < num; ++i) chunk[i] = {argmax(ls.data<float>() + i * vocab, vocab)};
      }
    }
  }
  ops::cuda::set_programmatic_launch(was);
}

TEST(GpuEngine, ServesRequestsWithPrefixCachingAndReturnsEveryBlock) {
  TACHYON_START_GPU();
  LoadedModel gpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  LoadedModel cpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", Device::cpu());
  EngineOptions eo;
  eo.kv.num_blocks = 64;
  eo.max_model_len = 256;
  eo.kv.dtype = DType::kF32;
  auto engine = Engine::create(*gpu.model, gpu.tokenizer.get(), gpu.eos_token_ids, eo);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  GenerationParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = 20;
  p.ignore_eos = true;
  // The same long prompt three times (the later ones hit the prefix cache) and two others.
  const std::string shared_prompt =
      "Once upon a time there was a little robot who lived in a big city full of tall towers and busy streets.";
  std::vector<std::string> prompts = {shared_prompt, shared_prompt, "Tom had a red ball.", shared_prompt,
                                      "The sun was hot."};
  std::map<RequestId, std::vector<int32_t>> got;
  std::vector<RequestId> ids;
  auto drain = [&] {
    while ((*engine)->has_unfinished()) {
      auto out = (*engine)->step();
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      for (const auto& o : *out) got[o.id].insert(got[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto id = (*engine)->add_request(prompts[i], p);
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
    if (i == 0) drain();  // the first one's blocks are cached before the others arrive
  }
  drain();
  ASSERT_OK((*engine)->check_no_leaks());
  EXPECT_GT((*engine)->stats().prefix.hit_tokens, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto expected = testing::greedy_ids(*cpu.model, gpu.tokenizer->encode(prompts[i]), 20);
    size_t agree = 0;
    while (agree < expected.size() && agree < got[ids[i]].size() && expected[agree] == got[ids[i]][agree]) ++agree;
    EXPECT_GE(agree, 16u) << "prompt " << i << ": the GPU engine's greedy tokens leave the CPU's at " << agree;
  }
}

// Long-context tiers through the GPU engine (a bf16 cache: int4 history read by the tensor-core
// pipelines; drop as a sliding window) against the CPU engine with the same tiers (f32 cache):
// four requests of 150 tokens with a window of 32, batched, their greedy tokens agreeing until a
// near-tie, history blocks in use along the way, and every block and history block back at the end.
TEST(GpuEngine, KvTiersEqualTheCpuEngine) {
  TACHYON_START_GPU();
  LoadedModel gpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  LoadedModel cpu = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", Device::cpu());
  const std::vector<std::string> prompts = {"Once upon a time", "The sun was hot and the", "def add(a, b):",
                                            "Tom had a red ball. He"};
  for (KvHistory history : {KvHistory::kInt4, KvHistory::kDrop}) {
    std::vector<std::vector<int32_t>> outputs[2];
    int history_peak = 0;
    for (int side = 0; side < 2; ++side) {
      LoadedModel& m = side == 0 ? cpu : gpu;
      EngineOptions eo;
      eo.kv.num_blocks = 64;
      eo.kv.num_history_blocks = 64;
      eo.max_model_len = 256;
      eo.kv.dtype = side == 0 ? DType::kF32 : DType::kBF16;
      eo.kv.tiers = KvTierOptions{32, history};
      auto engine = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, eo);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      GenerationParams p;
      p.sampling.temperature = 0.0f;
      p.max_tokens = 150;
      p.ignore_eos = true;
      std::vector<RequestId> ids;
      for (const std::string& prompt : prompts) {
        auto id = (*engine)->add_request(prompt, p);
        ASSERT_TRUE(id.ok()) << id.status().to_string();
        ids.push_back(*id);
      }
      std::map<RequestId, std::vector<int32_t>> got;
      while ((*engine)->has_unfinished()) {
        auto out = (*engine)->step();
        ASSERT_TRUE(out.ok()) << out.status().to_string();
        for (const auto& o : *out) got[o.id].insert(got[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (side == 1) history_peak = std::max(history_peak, (*engine)->stats().kv_history_blocks_used);
      }
      ASSERT_OK((*engine)->check_no_leaks());
      EXPECT_EQ((*engine)->stats().kv_history_blocks_used, 0);
      for (RequestId id : ids) outputs[side].push_back(got[id]);
    }
    if (history == KvHistory::kInt4) EXPECT_GT(history_peak, 20);
    for (size_t i = 0; i < prompts.size(); ++i) {
      size_t agree = 0;
      while (agree < outputs[0][i].size() && agree < outputs[1][i].size() && outputs[0][i][agree] == outputs[1][i][agree]) {
        ++agree;
      }
      std::printf("kv history %s, prompt %zu: the GPU engine agrees with the CPU's on %zu of 150 greedy tokens\n",
                  kv_history_name(history), i, agree);
      EXPECT_GE(agree, 24u) << kv_history_name(history) << " prompt " << i;
    }
  }
}

// Disaggregation with both engines on the GPU: a prefill-only request's bf16 KV leaves one engine
// (device -> host), crosses the wire format through an in-process transport and is adopted by a
// second engine (host -> device), which decodes on. Requests run one at a time on each side, as on
// the colocated engine, so every kernel sees the same shapes and the tokens must equal exactly.
TEST(GpuEngine, DisaggregatedPrefillAndDecodeEqualColocated) {
  TACHYON_START_GPU();
  LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  EngineOptions eo;
  eo.kv.num_blocks = 96;
  eo.max_model_len = 512;
  eo.kv.dtype = DType::kBF16;
  auto colocated = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, eo);
  auto prefill = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, eo);
  EngineOptions decode_options = eo;
  decode_options.kv.block_size = 32;  // the sides' block sizes need not agree
  decode_options.kv.num_blocks = 40;
  auto decode = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, decode_options);
  ASSERT_TRUE(colocated.ok() && prefill.ok() && decode.ok());
  auto [to_decode, from_prefill] = disagg::make_local_transport_pair();
  const std::vector<std::string> prompts = {
      "Once upon a time there was a little robot who lived in a big city full of tall towers and busy streets.",
      "Tom had a red ball.", "The sun was hot.",
      "Lily and her mom went to the park. They saw a big dog and a small cat playing near the pond, and"};
  GenerationParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = 24;
  p.ignore_eos = true;
  const auto run = [](Engine& e, RequestId id) {
    std::vector<int32_t> tokens;
    while (e.has_unfinished()) {
      auto out = e.step();
      EXPECT_TRUE(out.ok()) << out.status().to_string();
      if (!out.ok()) break;
      for (const auto& o : *out) {
        if (o.id == id) tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      }
    }
    return tokens;
  };
  // Second round: the K/V stay on the device, exported into shareable memory (cudaMalloc'd with
  // an IPC handle, as --kv-transport cuda-ipc does) and adopted from it; the "mapping" here is the
  // exporter's own pointer, since a process cannot open its own IPC handle (the process test
  // GpuDisagg.CudaIpcBetweenProcessesEqualsColocated opens it for real).
  auto pool = disagg::KvStagingPool::create(m.model->device(), size_t{16} << 20);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  for (const bool in_region : {false, true}) {
    SCOPED_TRACE(in_region ? "device region" : "host layers");
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto cid = (*colocated)->add_request(prompts[i], p);
      ASSERT_TRUE(cid.ok());
      const std::vector<int32_t> expected = run(**colocated, *cid);
      ASSERT_EQ(expected.size(), 24u);

      GenerationParams pp = p;
      pp.prefill_only = true;
      auto pid = (*prefill)->add_request(prompts[i], pp);
      ASSERT_TRUE(pid.ok());
      std::vector<int32_t> got = run(**prefill, *pid);
      ASSERT_EQ(got.size(), 1u) << "the prefill side emits the first token only";
      auto exported = disagg::export_kv(**prefill, *pid, in_region ? pool->get() : nullptr);
      ASSERT_TRUE(exported.ok()) << exported.status().to_string();
      ASSERT_EQ(exported->device.has_value(), in_region);
      if (in_region) {
        EXPECT_TRUE(exported->layers.empty());
        EXPECT_EQ(exported->device->handle.size(), 64u) << "a cudaIpcMemHandle_t";
        EXPECT_EQ(exported->device->device, m.model->device());
      }
      ASSERT_OK((*prefill)->check_no_leaks());
      ASSERT_OK(disagg::send_kv(*to_decode, *exported, i + 1, disagg::Millis(5000)));
      disagg::KvReceiveOptions ro;
      ro.expect = disagg::kv_model_shape(**decode);
      uint8_t* const base = in_region ? static_cast<uint8_t*>(exported->device->data) - exported->device->offset : nullptr;
      ro.map_region = [&](std::span<const uint8_t> handle, uint64_t offset, uint64_t bytes) -> Result<disagg::KvDeviceRegion> {
        EXPECT_TRUE(std::equal(handle.begin(), handle.end(), exported->device->handle.begin(),
                               exported->device->handle.end()));
        disagg::KvDeviceRegion r;
        r.data = base + offset;
        r.device = m.model->device();
        r.bytes = static_cast<size_t>(bytes);
        return r;
      };
      auto received = disagg::receive_kv(*from_prefill, ro);
      ASSERT_TRUE(received.ok()) << received.status().to_string();
      EXPECT_EQ(received->kv.device.has_value(), in_region);
      auto did = disagg::adopt(**decode, received->kv, p);
      ASSERT_TRUE(did.ok()) << did.status().to_string();
      exported->device.reset();  // adopted: the region goes back to the pool
      const std::vector<int32_t> rest = run(**decode, *did);
      got.insert(got.end(), rest.begin(), rest.end());
      EXPECT_EQ(got, expected) << "prompt " << i;
    }
  }
  EXPECT_EQ((*pool)->free_bytes(), (*pool)->size());
  ASSERT_OK((*decode)->check_no_leaks());
  ASSERT_OK((*colocated)->check_no_leaks());
}

// Requests without top logprobs are drawn on the device (only ids come back): temperature, min-p,
// top-k, top-p, penalties and logit bias, greedy rows among them; asking for top logprobs sends the
// logits to the host Sampler instead. Same seeds, same draws: the same tokens either way.
TEST(GpuEngine, SamplingOnTheDeviceEqualsTheHostSampler) {
  TACHYON_START_GPU();
  LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  const std::vector<std::string> prompts = {"Once upon a time", "Tom had a red ball.", "The sun was hot and",
                                            "Lily and her mom went to the park.", "One day, a little dog",
                                            "The cat sat"};
  const auto run = [&](int logprobs) {
    EngineOptions eo;
    eo.kv.num_blocks = 64;
    eo.max_model_len = 256;
    auto engine = Engine::create(*m.model, m.tokenizer.get(), m.eos_token_ids, eo);
    EXPECT_TRUE(engine.ok());
    std::map<RequestId, std::vector<int32_t>> got;
    std::vector<RequestId> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationParams p;
      p.sampling.temperature = i == 2 ? 0.0f : 0.8f;  // a greedy request in the same batch
      p.sampling.min_p = i == 1 ? 0.05f : 0.0f;
      p.sampling.top_k = i == 3 ? 40 : 0;
      p.sampling.top_p = i == 3 || i == 4 ? 0.9f : 1.0f;
      p.sampling.repetition_penalty = i == 2 || i == 4 ? 1.2f : 1.0f;  // greedy with a penalty too
      p.sampling.frequency_penalty = i == 5 ? 0.6f : 0.0f;
      p.sampling.presence_penalty = i == 5 ? 0.3f : 0.0f;
      if (i == 5) p.sampling.logit_bias = {{15, 4.0f}, {16, -100.0f}};
      p.sampling.seed = 1234 + i;
      p.sampling.logprobs = logprobs;
      p.max_tokens = 24;
      p.ignore_eos = true;
      auto id = (*engine)->add_request(prompts[i], p);
      EXPECT_TRUE(id.ok());
      ids.push_back(*id);
    }
    drain(**engine, got);
    std::vector<std::vector<int32_t>> tokens;
    for (RequestId id : ids) tokens.push_back(got[id]);
    return tokens;
  };
  const auto device = run(0), host = run(1);
  ASSERT_EQ(device.size(), host.size());
  for (size_t i = 0; i < device.size(); ++i) {
    EXPECT_EQ(device[i].size(), 24u);
    EXPECT_EQ(device[i], host[i]) << "prompt " << i;
  }
}

// Speculative decoding on the device with token trees (tree attention in the prefill kernels,
// depth positions, accepted branches moved by slot copies) and with chains: greedy outputs equal
// plain decoding's for the bundled target/draft pair and for n-gram lookup. The cache is f32 so
// that the decode and prefill kernels' different summation orders cannot flip a greedy choice.
TEST(GpuEngine, SpeculativeTreesAndChainsEqualPlainGreedy) {
  TACHYON_START_GPU();
  LoadedModel target = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo", kGpu);
  LoadedModel draft = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo-draft", kGpu);
  auto code = read_text_file(testing::source_dir() + "/tests/data/eval/code.txt");
  ASSERT_TRUE(code.ok());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(target.tokenizer->encode(code->substr(static_cast<size_t>(i) * 5003 % (code->size() - 400), 300)));
  }
  // Proposal heads of random weights on the device (few drafts accepted: the verification, the
  // hidden rows' hand-over and the heads' ops on the device are what is tested).
  std::shared_ptr<const SpecHeads> heads;
  {
    std::mt19937 rng(testing::fresh_seed());
    const int d = target.model->config().hidden_size, m = 64, k = 4;
    std::vector<NamedTensor> t;
    for (int i = 0; i < k; ++i) {
      const std::string p = fmt::format("heads.{}.", i);
      t.push_back({p + "in_norm.weight", testing::random_tensor({d}, rng, 0.5f, 1.5f)});
      t.push_back({p + "x_proj.weight", testing::random_tensor({2 * m, d}, rng, -0.05f, 0.05f)});
      t.push_back({p + "e_proj.weight", testing::random_tensor({2 * m, d}, rng, -0.05f, 0.05f)});
      t.push_back({p + "down_proj.weight", testing::random_tensor({d, m}, rng, -0.05f, 0.05f)});
      t.push_back({p + "out_norm.weight", testing::random_tensor({d}, rng, 0.5f, 1.5f)});
    }
    const std::string path = testing::scratch_dir("gpu-heads") + "/heads.safetensors";
    ASSERT_TRUE(write_safetensors(path, t,
                                  {{"format", "tachyon-spec-heads"}, {"version", "1"}, {"num_heads", std::to_string(k)},
                                   {"hidden_size", std::to_string(d)}, {"ffn_size", std::to_string(m)},
                                   {"vocab_size", std::to_string(target.model->config().vocab_size)},
                                   {"rms_norm_eps", "1e-05"}})
                    .ok());
    auto loaded = load_spec_heads(path, target.model->config(), kGpu);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    heads = std::make_shared<const SpecHeads>(std::move(loaded).value());
  }
  // Named drafts pick by the prompt's kind (these prompts are code).
  auto classifier = DomainClassifier::load(testing::source_dir() + "/models/tachyon-demo/domains.safetensors",
                                           target.model->config().vocab_size);
  ASSERT_TRUE(classifier.ok()) << classifier.status().to_string();
  auto kinds = std::make_shared<const DomainClassifier>(std::move(classifier).value());
  const auto run = [&](SpecMethod method, int tree_nodes, SpecStats* stats, bool named = false) {
    EngineOptions eo;
    eo.kv.num_blocks = 256;
    eo.max_model_len = 512;
    eo.kv.dtype = DType::kF32;
    eo.spec.method = method;
    if (method == SpecMethod::kDraftModel) eo.spec.drafts = {{"", draft.model.get()}};
    if (named) {
      eo.spec.drafts = {{"prose", draft.model.get()}, {"code", draft.model.get()}};
      eo.spec.classifier = kinds;
    }
    eo.spec.heads = heads;
    eo.spec.k = method == SpecMethod::kNone ? 0 : 4;
    eo.spec.tree_nodes = tree_nodes;
    auto engine = Engine::create(*target.model, target.tokenizer.get(), target.eos_token_ids, eo);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    std::map<RequestId, std::vector<int32_t>> got;
    std::vector<RequestId> ids;
    for (const auto& prompt : prompts) {
      GenerationParams p;
      p.sampling.temperature = 0.0f;
      p.max_tokens = 48;
      p.ignore_eos = true;
      auto id = (*engine)->add_request(prompt, p);
      EXPECT_TRUE(id.ok());
      ids.push_back(*id);
    }
    drain(**engine, got);
    if (stats != nullptr) *stats = (*engine)->stats().spec;
    std::vector<std::vector<int32_t>> tokens;
    for (RequestId id : ids) tokens.push_back(got[id]);
    return tokens;
  };
  const auto plain = run(SpecMethod::kNone, 0, nullptr);
  for (SpecMethod method : {SpecMethod::kDraftModel, SpecMethod::kNgram}) {
    for (int tree_nodes : {0, 12}) {
      SpecStats st;
      const auto spec = run(method, tree_nodes, &st);
      const std::string what = fmt::format("{} tree {}", spec_method_name(method), tree_nodes);
      EXPECT_EQ(spec, plain) << what;
      EXPECT_GT(st.num_accepted, 0) << what;
      if (tree_nodes > 0) {
        EXPECT_GT(st.num_tree_steps, 0) << what;
      }
      std::printf("%s: %lld verify steps, %lld accepted of %lld proposed, %lld trees, %lld left the first branch\n",
                  what.c_str(), static_cast<long long>(st.num_verify_steps), static_cast<long long>(st.num_accepted),
                  static_cast<long long>(st.num_proposed), static_cast<long long>(st.num_tree_steps),
                  static_cast<long long>(st.num_off_first_branch));
    }
  }
  for (int tree_nodes : {0, 12}) {
    SpecStats st;
    EXPECT_EQ(run(SpecMethod::kHeads, tree_nodes, &st), plain) << "heads tree " << tree_nodes;
    EXPECT_GT(st.num_proposed, 0) << "heads tree " << tree_nodes;
    if (tree_nodes > 0) {
      EXPECT_GT(st.num_tree_steps, 0) << "heads tree " << tree_nodes;
    }
    std::printf("heads tree %d: %lld verify steps, %lld accepted of %lld proposed, %lld trees\n", tree_nodes,
                static_cast<long long>(st.num_verify_steps), static_cast<long long>(st.num_accepted),
                static_cast<long long>(st.num_proposed), static_cast<long long>(st.num_tree_steps));
  }
  SpecStats named;
  EXPECT_EQ(run(SpecMethod::kDraftModel, 0, &named, true), plain) << "named drafts";
  EXPECT_GT(named.by_proposer["draft:code"].num_accepted, 0);
  EXPECT_EQ(named.by_proposer["draft:prose"].num_verify_steps, 0);
  std::printf("named drafts: code %lld verify steps, prose %lld\n",
              static_cast<long long>(named.by_proposer["draft:code"].num_verify_steps),
              static_cast<long long>(named.by_proposer["draft:prose"].num_verify_steps));
}

TEST(GpuKvCache, CopyBlocksOnTheDevice) {
  TACHYON_START_GPU();
  KvCacheConfig kv;
  kv.num_layers = 2;
  kv.num_kv_heads = 3;
  kv.head_dim = 8;
  kv.block_size = 4;
  kv.num_blocks = 5;
  kv.dtype = DType::kBF16;
  kv.device = kGpu;
  auto cache = KvCache::create(kv);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  for (int l = 0; l < kv.num_layers; ++l) {
    ops::fill_uniform(cache->layer(l).k, 1, 10 + l, 1.0f, 0.0f);
    ops::fill_uniform(cache->layer(l).v, 1, 20 + l, 1.0f, 0.0f);
  }
  const Tensor before = to_host(cache->layer(1).k);
  const std::vector<BlockCopy> copies = {{1, 3}, {4, 0}};
  cache->copy_blocks(copies);
  ASSERT_OK(ops::synchronize(kGpu));
  const Tensor after = to_host(cache->layer(1).k);
  const int64_t per_block = before.numel() / kv.num_blocks;
  const auto* b = before.data<uint16_t>();
  const auto* a = after.data<uint16_t>();
  for (int blk = 0; blk < kv.num_blocks; ++blk) {
    const int src = blk == 3 ? 1 : blk == 0 ? 4 : blk;
    EXPECT_TRUE(std::equal(a + blk * per_block, a + (blk + 1) * per_block, b + src * per_block)) << "block " << blk;
  }
}

TEST(GpuModel, ClearErrors) {
  TACHYON_START_GPU();
  // A model on the GPU with its cache on the host.
  LoadedModel gpu = testing::load_model_or_fail("synthetic:tiny", kGpu);
  LoadedModel cpu = testing::load_model_or_fail("synthetic:tiny", Device::cpu());
  Sessions host = Sessions::make(*cpu.model, 1, 8, DType::kF32);
  BlockTable table(16);
  ASSERT_TRUE(host.blocks.grow_to(table, 2).ok());
  const std::vector<int32_t> tokens = {5, 6};
  ForwardBatch fb = build_forward_batch({SequenceChunk{&table, 0, tokens, LogitsWanted::kLast, {}}});
  Tensor logits;
  const Status s = gpu.model->forward(fb, host.cache, logits);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kv cache is on cpu"), std::string::npos) << s.to_string();
  // Another device while cuda:0 runs; an absent device.
  EXPECT_FALSE(ops::cuda::start_backend(1).ok());
  // Far more memory than the device has: the message gives the sizes.
  auto huge = empty_on({int64_t{1} << 40, 1024}, DType::kF32, kGpu, "a huge test tensor");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(huge.status().message().find("a huge test tensor"), std::string::npos) << huge.status().to_string();
}

}  // namespace
}  // namespace tachyon

#endif  // TACHYON_HAS_CUDA
