// The engine's logits against Hugging Face transformers (float32, CPU) on tiny random-weight
// models of every supported family, loaded from the HF directory and from GGUF files written by
// the `gguf` package: every prompt position, and 16 greedy decode steps through the paged cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "fixture.h"
#include "core/ggml_blocks.h"
#include "core/mapped_file.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/model_loader.h"
#include "model/quantize_weights.h"
#include "quant/quant_policy.h"
#include "ops/ops.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace tachyon {
namespace {

using testing::argmax;
using testing::ModelFixture;
using testing::relative_error;

constexpr double kTolerance = 1e-4;  // max relative error in f32

struct Session {
  const LlamaModel* model;
  KvCache cache;
  BlockManager blocks;
  BlockTable table;

  static Session make(const LlamaModel& model, int max_tokens, int block_size = 16, const KvTierOptions& tiers = {}) {
    const ModelConfig& c = model.config();
    KvCacheConfig kv;
    kv.num_layers = c.num_layers;
    kv.num_kv_heads = c.num_kv_heads;
    kv.head_dim = c.head_dim;
    kv.block_size = block_size;
    kv.num_blocks = (max_tokens + block_size - 1) / block_size + 2;
    kv.tiers = tiers;
    auto cache = KvCache::create(kv);
    EXPECT_TRUE(cache.ok());
    return Session{&model, std::move(cache).value(), BlockManager({kv.num_blocks, block_size, false, tiers}),
                   BlockTable(block_size)};
  }

  // Appends `tokens`, returning logits of every one of them [len, vocab] (and, when `hidden` is
  // given, their final hidden rows [len, hidden_size] there).
  Tensor run(std::span<const int32_t> tokens, Tensor* hidden = nullptr) {
    const int start = table.num_tokens();
    EXPECT_TRUE(blocks.grow_to(table, start + static_cast<int>(tokens.size())).ok());
    SequenceChunk chunk{&table, start, tokens, LogitsWanted::kAll};
    ForwardBatch batch = build_forward_batch({chunk});
    Tensor logits;
    ForwardOptions options;
    options.hidden = hidden;
    const Status s = model->forward(batch, cache, logits, options);
    EXPECT_TRUE(s.ok()) << s.to_string();
    blocks.retire(table, table.num_tokens());  // as the scheduler does after each step
    return logits;
  }
};

// Prompt logits (in one forward, and again in chunks of 5 through the paged cache) and 16
// greedy decode steps, against the reference arrays.
void check_against_fixture(const LlamaModel& model, const ModelFixture& f, const std::string& prompt_key,
                           bool check_decode, double tolerance) {
  const Tensor& ref_prompt = f.arrays.at(prompt_key);
  const int64_t vocab = ref_prompt.size(1);
  ASSERT_EQ(vocab, model.config().vocab_size);
  const int P = static_cast<int>(f.prompt_ids.size());
  Session s = Session::make(model, P + 20, /*block_size=*/4);  // small blocks: many block boundaries
  Tensor hidden;
  Tensor logits = s.run(f.prompt_ids, &hidden);
  for (int i = 0; i < P; ++i) {
    EXPECT_LE(relative_error(logits.data<float>() + i * vocab, ref_prompt.data<float>() + i * vocab, vocab), tolerance)
        << f.dir << " " << prompt_key << " position " << i;
  }
  // The final hidden rows (what proposers reading the target's features take) are the LM head's
  // input: multiplied by its weights here, in double, they give the reference logits.
  ASSERT_TRUE(hidden.defined());
  ASSERT_EQ(hidden.size(0), P);
  ASSERT_EQ(hidden.size(1), model.config().hidden_size);
  const Weight& head = model.weights().lm_head;
  const DType head_dtype = head.dense.defined() ? head.dense.dtype() : DType::kU8;
  if (!head.quant && (head_dtype == DType::kF32 || head_dtype == DType::kF16 || head_dtype == DType::kBF16)) {
    const Tensor w = head.dense.to_f32();
    const int64_t d = hidden.size(1);
    std::vector<float> row(static_cast<size_t>(vocab));
    for (int i = 0; i < P; ++i) {
      const float* x = hidden.data<float>() + i * d;
      for (int64_t v = 0; v < vocab; ++v) {
        double acc = 0.0;
        for (int64_t j = 0; j < d; ++j) acc += static_cast<double>(x[j]) * w.data<float>()[v * d + j];
        row[static_cast<size_t>(v)] = static_cast<float>(acc);
      }
      EXPECT_LE(relative_error(row.data(), ref_prompt.data<float>() + i * vocab, vocab), tolerance)
          << f.dir << " hidden rows x LM head, position " << i;
    }
  }
  // Chunked prefill over the paged cache gives the same logits.
  Session chunked = Session::make(model, P + 4, /*block_size=*/16);
  for (int start = 0; start < P; start += 5) {
    const int len = std::min(5, P - start);
    Tensor part = chunked.run(std::span<const int32_t>(f.prompt_ids).subspan(static_cast<size_t>(start), static_cast<size_t>(len)));
    for (int i = 0; i < len; ++i) {
      EXPECT_LE(relative_error(part.data<float>() + i * vocab, ref_prompt.data<float>() + (start + i) * vocab, vocab),
                tolerance)
          << f.dir << " chunked prefill, position " << start + i;
    }
  }
  if (!check_decode) return;
  const Tensor& ref_decode = f.arrays.at("decode_logits");
  int32_t next = argmax(logits.data<float>() + (P - 1) * vocab, vocab);
  for (size_t step = 0; step < f.decode_ids.size(); ++step) {
    ASSERT_EQ(next, f.decode_ids[step]) << f.dir << " greedy step " << step;
    Tensor step_logits = s.run(std::span<const int32_t>(&f.decode_ids[step], 1));
    EXPECT_LE(relative_error(step_logits.data<float>(), ref_decode.data<float>() + static_cast<int64_t>(step) * vocab, vocab),
              tolerance)
        << f.dir << " decode step " << step;
    next = argmax(step_logits.data<float>(), vocab);
  }
}

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, HfDirectoryMatchesTransformers) {
  const ModelFixture f = testing::read_model_fixture(GetParam());
  LoadedModel m = testing::load_model_or_fail(f.dir);
  check_against_fixture(*m.model, f, "prompt_logits", true, kTolerance);
}

TEST_P(Conformance, GgufMatchesTransformers) {
  const ModelFixture f = testing::read_model_fixture(GetParam());
  LoadedModel m = testing::load_model_or_fail(f.dir + "/model.gguf");
  EXPECT_EQ(m.format, "gguf");
  check_against_fixture(*m.model, f, "prompt_logits", true, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Models, Conformance,
                         ::testing::Values("llama", "llama3-scaled", "llama-tied", "qwen2", "qwen3", "mistral",
                                           "qwen3-moe", "qwen2-moe", "mixtral"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

// A sliding window imposed by the KV cache (--kv-window 8 --kv-history drop) on a model that has
// none is Mistral's window of 8 as transformers computes it: the Mistral fixture's directory with
// "sliding_window" removed from its config, against the fixture's logits (made with the window),
// while the blocks the window has passed are freed (blocks of 4: most of the 36 positions).
TEST(Conformance, KvWindowDropIsTheSlidingWindowOfTransformers) {
  const ModelFixture f = testing::read_model_fixture("mistral");
  const std::string dir = testing::scratch_dir("mistral-no-window");
  for (const char* name : {"model.safetensors", "generation_config.json"}) {
    std::filesystem::copy_file(f.dir + "/" + name, dir + "/" + name);
  }
  auto config = read_text_file(f.dir + "/config.json");
  ASSERT_TRUE(config.ok());
  const std::string key = "\"sliding_window\": 8";
  const size_t at = config->find(key);
  ASSERT_NE(at, std::string::npos);
  std::string text = *config;
  text.replace(at, key.size(), "\"sliding_window\": null");
  {
    std::ofstream out(dir + "/config.json");
    out << text;
  }
  LoadedModel m = testing::load_model_or_fail(dir);
  ASSERT_EQ(m.model->config().sliding_window, 0);

  const KvTierOptions drop{8, KvHistory::kDrop};
  const Tensor& ref_prompt = f.arrays.at("prompt_logits");
  const Tensor& ref_decode = f.arrays.at("decode_logits");
  const int64_t vocab = ref_prompt.size(1);
  const int P = static_cast<int>(f.prompt_ids.size());
  // Token by token, and in chunks of 5, then the decodes: both release blocks as they go.
  for (int chunk : {1, 5}) {
    Session s = Session::make(*m.model, P + 20, /*block_size=*/4, drop);
    for (int start = 0; start < P; start += chunk) {
      const int len = std::min(chunk, P - start);
      Tensor part =
          s.run(std::span<const int32_t>(f.prompt_ids).subspan(static_cast<size_t>(start), static_cast<size_t>(len)));
      for (int i = 0; i < len; ++i) {
        EXPECT_LE(relative_error(part.data<float>() + i * vocab, ref_prompt.data<float>() + (start + i) * vocab, vocab),
                  kTolerance)
            << "chunks of " << chunk << ", position " << start + i;
      }
      EXPECT_LE(s.table.num_resident(), (8 + chunk + 3) / 4 + 1) << "position " << start;
    }
    for (size_t step = 0; step < f.decode_ids.size(); ++step) {
      Tensor logits = s.run(std::span<const int32_t>(&f.decode_ids[step], 1));
      EXPECT_LE(relative_error(logits.data<float>(), ref_decode.data<float>() + static_cast<int64_t>(step) * vocab, vocab),
                kTolerance)
          << "chunks of " << chunk << ", decode step " << step;
    }
    // 36 positions: the next query sees 29..36, so blocks [0, 28) are gone and two are held.
    EXPECT_EQ(s.table.num_released(), 7);
    EXPECT_EQ(s.blocks.num_used(), 2);
    const BlockTable* tables[] = {&s.table};
    EXPECT_TRUE(s.blocks.check(tables).ok());
  }
}

// F16 and Q8_0 GGUF weights (dequantized on load) against a float64 numpy forward over the same
// dequantized weights.
TEST(Conformance, GgufF16AndQ8_0) {
  const ModelFixture f = testing::read_model_fixture("llama");
  LoadedModel f16 = testing::load_model_or_fail(f.dir + "/model-f16.gguf");
  EXPECT_EQ(f16.weight_dtypes.find("f16") != std::string::npos, true) << f16.weight_dtypes;
  check_against_fixture(*f16.model, f, "gguf_f16_prompt_logits", false, kTolerance);
  LoadedModel q8 = testing::load_model_or_fail(f.dir + "/model-q8_0.gguf");
  {
    const testing::ExactQuantizedLinears exact;  // the weights' f32 function
    check_against_fixture(*q8.model, f, "gguf_q8_0_prompt_logits", false, kTolerance);
  }
  // The integer path (activations rounded to int8 per block of 32) on this random-weight model:
  // 1.6e-2 to 4.0e-2 measured (2026-12-06), each activation off by up to 1/254 of its block's
  // largest, through two layers of random weights.
  check_against_fixture(*q8.model, f, "gguf_q8_0_prompt_logits", false, 8e-2);
}

// A GGUF whose linear weights are Q4_0 (written from the fixture's f32 GGUF by the GGUF writer,
// every other tensor copied as stored) loads them packed as int4 group 32 and computes what the
// same weights expanded to f32 compute: prompt logits within the f32 tolerance, the same 16
// greedy tokens.
TEST(Conformance, GgufQ4_0LinearWeightsRunPacked) {
  const ModelFixture f = testing::read_model_fixture("llama");
  const testing::ExactQuantizedLinears exact;  // the weights' f32 function
  auto src = GgufFile::open(f.dir + "/model.gguf");
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  GgufWriter w;
  for (const auto& [key, value] : src->metadata()) w.add(key, value);
  const std::vector<std::string> linear = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  int quantized = 0;
  for (const GgufTensorInfo& info : src->tensor_infos()) {
    const bool is_linear = std::any_of(linear.begin(), linear.end(), [&](const std::string& role) {
      return info.name.ends_with("." + role + ".weight");
    });
    if (is_linear) {
      auto dense = src->tensor(info.name);
      ASSERT_TRUE(dense.ok()) << dense.status().to_string();
      ASSERT_TRUE(w.add_tensor(info.name, *dense, GgmlType::kQ4_0).ok()) << info.name;
      ++quantized;
      continue;
    }
    auto raw = src->raw_tensor(info.name);
    ASSERT_TRUE(raw.ok()) << raw.status().to_string();
    const auto* b = static_cast<const uint8_t*>(raw->raw_data());
    ASSERT_TRUE(w.add_raw_tensor(info.name, info.shape, info.type, std::vector<uint8_t>(b, b + raw->numel())).ok());
  }
  ASSERT_EQ(quantized, 7 * 2);
  const std::string path = testing::scratch_dir("gguf_q4_0") + "/model-q4_0.gguf";
  ASSERT_TRUE(w.write(path).ok());

  LoadedModel packed = testing::load_model_or_fail(path);
  EXPECT_NE(packed.weight_dtypes.find("int4-g32 (packed)"), std::string::npos) << packed.weight_dtypes;
  ModelWeights expanded = packed.model->weights();
  for (LayerWeights& l : expanded.layers) {
    for (Weight* lw : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      ASSERT_TRUE(lw->quant != nullptr && lw->quant->format == QuantFormat::kInt4Group && lw->quant->group_size == 32);
      lw->dense = dequantize(*lw->quant);
      lw->quant = nullptr;
    }
  }
  const LlamaModel dense(packed.model->config(), std::move(expanded));
  const int P = static_cast<int>(f.prompt_ids.size());
  const int64_t vocab = dense.config().vocab_size;
  Session a = Session::make(*packed.model, P + 4), b = Session::make(dense, P + 4);
  const Tensor la = a.run(f.prompt_ids), lb = b.run(f.prompt_ids);
  for (int i = 0; i < P; ++i) {
    EXPECT_LE(relative_error(la.data<float>() + i * vocab, lb.data<float>() + i * vocab, vocab), kTolerance)
        << "position " << i;
  }
  EXPECT_EQ(testing::greedy_ids(*packed.model, f.prompt_ids, 16), testing::greedy_ids(dense, f.prompt_ids, 16));
}

// The metadata of a small llama GGUF written by the tests below (context 64, rope base 1e4).
void add_llama_metadata(GgufWriter& w, int64_t hidden, int64_t ffn, int64_t vocab, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, int layers) {
  w.add("general.architecture", gguf_string("llama"));
  w.add("llama.vocab_size", gguf_u32(static_cast<uint32_t>(vocab)));
  w.add("llama.context_length", gguf_u32(64));
  w.add("llama.embedding_length", gguf_u32(static_cast<uint32_t>(hidden)));
  w.add("llama.block_count", gguf_u32(static_cast<uint32_t>(layers)));
  w.add("llama.feed_forward_length", gguf_u32(static_cast<uint32_t>(ffn)));
  w.add("llama.attention.head_count", gguf_u32(static_cast<uint32_t>(heads)));
  w.add("llama.attention.head_count_kv", gguf_u32(static_cast<uint32_t>(kv_heads)));
  w.add("llama.attention.layer_norm_rms_epsilon", gguf_f32(1e-5f));
  w.add("llama.rope.freq_base", gguf_f32(10000.0f));
  w.add("llama.rope.dimension_count", gguf_u32(static_cast<uint32_t>(head_dim)));
}

// A random-weight Llama GGUF whose linear weights are the K-quants and Q8_0 (hidden 256 and FFN
// 512, so every input width is whole 256-weight super-blocks): q/k/o/gate Q4_K, v/up/down Q6_K,
// the LM head Q8_0 and the embedding Q4_K (as Q4_K_M files store it), written by the GGUF writer. It loads every one of them packed in its own
// format and computes what the same weights expanded to f32 compute: prompt logits within the
// f32 tolerance, the same 16 greedy tokens.
TEST(Conformance, GgufKQuantLinearWeightsRunPacked) {
  constexpr int64_t kHidden = 256, kFfn = 512, kVocab = 64, kHeads = 4, kKvHeads = 2, kHeadDim = 64;
  const testing::ExactQuantizedLinears exact;  // the weights' f32 function (Q8_0 has an integer path)
  GgufWriter w;
  add_llama_metadata(w, kHidden, kFfn, kVocab, kHeads, kKvHeads, kHeadDim, 2);
  std::mt19937 rng(testing::fresh_seed());
  auto add = [&](const std::string& name, std::vector<int64_t> shape, GgmlType type, float bound, float offset) {
    Tensor t = testing::random_tensor(shape, rng, offset - bound, offset + bound);
    ASSERT_TRUE(w.add_tensor(name, t, type).ok()) << name;
  };
  add("token_embd.weight", {kVocab, kHidden}, GgmlType::kQ4_K, 1.0f, 0.0f);  // read densely, as f32
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {kHidden}, GgmlType::kF32, 0.2f, 1.0f);
    add(b + "ffn_norm.weight", {kHidden}, GgmlType::kF32, 0.2f, 1.0f);
    add(b + "attn_q.weight", {kHeads * kHeadDim, kHidden}, GgmlType::kQ4_K, 0.12f, 0.0f);
    add(b + "attn_k.weight", {kKvHeads * kHeadDim, kHidden}, GgmlType::kQ4_K, 0.12f, 0.0f);
    add(b + "attn_v.weight", {kKvHeads * kHeadDim, kHidden}, GgmlType::kQ6_K, 0.12f, 0.0f);
    add(b + "attn_output.weight", {kHidden, kHeads * kHeadDim}, GgmlType::kQ4_K, 0.12f, 0.0f);
    add(b + "ffn_gate.weight", {kFfn, kHidden}, GgmlType::kQ4_K, 0.12f, 0.0f);
    add(b + "ffn_up.weight", {kFfn, kHidden}, GgmlType::kQ6_K, 0.12f, 0.0f);
    add(b + "ffn_down.weight", {kHidden, kFfn}, GgmlType::kQ6_K, 0.08f, 0.0f);
  }
  add("output_norm.weight", {kHidden}, GgmlType::kF32, 0.2f, 1.0f);
  add("output.weight", {kVocab, kHidden}, GgmlType::kQ8_0, 0.12f, 0.0f);
  const std::string path = testing::scratch_dir("gguf_kquants") + "/model-kquants.gguf";
  ASSERT_TRUE(w.write(path).ok());

  LoadedModel packed = testing::load_model_or_fail(path);
  // `tachyon info`'s account of the file: per stored type, packed or expanded (the embedding is
  // read densely, as f32).
  const std::vector<std::string> types = {"F32: 5 tensors, as stored",
                                          "Q4_K: 9 tensors, 1 expanded to f32 at load, 8 packed as q4_k",
                                          "Q6_K: 6 tensors, packed as q6_k", "Q8_0: 1 tensor, packed as q8_0"};
  EXPECT_EQ(packed.tensor_types, types) << fmt::format("{}", fmt::join(packed.tensor_types, " | "));
  ModelWeights expanded = packed.model->weights();
  const QuantFormat want[7] = {QuantFormat::kGgufQ4_K, QuantFormat::kGgufQ4_K, QuantFormat::kGgufQ6_K,
                               QuantFormat::kGgufQ4_K, QuantFormat::kGgufQ4_K, QuantFormat::kGgufQ6_K,
                               QuantFormat::kGgufQ6_K};
  auto expand = [](Weight& lw) {
    lw.dense = dequantize(*lw.quant);
    lw.quant = nullptr;
  };
  for (LayerWeights& l : expanded.layers) {
    Weight* lws[7] = {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj};
    for (int k = 0; k < 7; ++k) {
      ASSERT_TRUE(lws[k]->quant != nullptr && lws[k]->quant->format == want[k]) << "projection " << k;
      expand(*lws[k]);
    }
  }
  ASSERT_TRUE(expanded.lm_head.quant != nullptr && expanded.lm_head.quant->format == QuantFormat::kGgufQ8_0);
  expand(expanded.lm_head);
  const LlamaModel dense(packed.model->config(), std::move(expanded));
  const std::vector<int32_t> prompt = {1, 17, 5, 33, 60, 2, 9, 41, 23, 12};
  const int P = static_cast<int>(prompt.size());
  Session a = Session::make(*packed.model, P + 4), b = Session::make(dense, P + 4);
  const Tensor la = a.run(prompt), lb = b.run(prompt);
  for (int i = 0; i < P; ++i) {
    EXPECT_LE(relative_error(la.data<float>() + i * kVocab, lb.data<float>() + i * kVocab, kVocab), kTolerance)
        << "position " << i;
  }
  EXPECT_EQ(testing::greedy_ids(*packed.model, prompt, 16), testing::greedy_ids(dense, prompt, 16));
}

// A GGUF file whose linears mix block types as llama.cpp's quantizer writes them, one type per
// projection (`types`: attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, then the
// LM head; the embedding is `embd`): every linear loads packed in its own format, none expanded,
// and the model computes what the same weights dequantized to f32 compute — exactly through the
// f32 kernels, and within the activations' int8 rounding through the integer dot products.
void check_mixed_gguf_runs_packed(const std::string& tag, int64_t hidden, int64_t ffn, int64_t head_dim,
                                  const std::vector<std::vector<GgmlType>>& layer_types, GgmlType head_type,
                                  GgmlType embd) {
  const int64_t kVocab = 64, kHeads = hidden / head_dim, kKvHeads = kHeads / 2;
  const int num_layers = static_cast<int>(layer_types.size());
  GgufWriter w;
  add_llama_metadata(w, hidden, ffn, kVocab, kHeads, kKvHeads, head_dim, num_layers);
  std::mt19937 rng(testing::fresh_seed());
  auto add = [&](const std::string& name, std::vector<int64_t> shape, GgmlType type, float bound, float offset) {
    Tensor t = testing::random_tensor(shape, rng, offset - bound, offset + bound);
    ASSERT_TRUE(w.add_tensor(name, t, type).ok()) << name;
  };
  const char* names[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  const std::vector<int64_t> shapes[7] = {{kHeads * head_dim, hidden}, {kKvHeads * head_dim, hidden},
                                          {kKvHeads * head_dim, hidden}, {hidden, kHeads * head_dim},
                                          {ffn, hidden},                 {ffn, hidden},
                                          {hidden, ffn}};
  add("token_embd.weight", {kVocab, hidden}, embd, 1.0f, 0.0f);
  for (int l = 0; l < num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {hidden}, GgmlType::kF32, 0.2f, 1.0f);
    add(b + "ffn_norm.weight", {hidden}, GgmlType::kF32, 0.2f, 1.0f);
    for (int k = 0; k < 7; ++k) add(b + names[k] + ".weight", shapes[k], layer_types[l][k], k == 6 ? 0.08f : 0.12f, 0.0f);
  }
  add("output_norm.weight", {hidden}, GgmlType::kF32, 0.2f, 1.0f);
  add("output.weight", {kVocab, hidden}, head_type, 0.12f, 0.0f);
  const std::string path = testing::scratch_dir("gguf_mix_" + tag) + "/model.gguf";
  ASSERT_TRUE(w.write(path).ok());

  LoadedModel packed = testing::load_model_or_fail(path);
  const std::string embd_type = ggml_type_name(embd);
  for (const std::string& line : packed.tensor_types) {
    // Only the embedding (read densely) may be expanded; every linear is packed.
    if (line.starts_with("F32:")) continue;
    const bool expanded = line.find("expanded") != std::string::npos;
    EXPECT_TRUE(!expanded || (line.starts_with(embd_type + ":") && line.find("1 expanded") != std::string::npos))
        << line;
  }
  ModelWeights expanded = packed.model->weights();
  auto expand = [](Weight& lw, GgmlType stored) {
    ASSERT_TRUE(lw.quant != nullptr) << ggml_type_name(stored) << " loaded dense";
    // The stored type's packed format: Q4_0 runs as int4 group 32, the others as their own.
    std::string want = stored == GgmlType::kQ4_0 ? "int4" : ggml_type_name(stored);
    for (char& c : want) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(quant_format_name(lw.quant->format), want);
    lw.dense = dequantize(*lw.quant);
    lw.quant = nullptr;
  };
  for (int l = 0; l < num_layers; ++l) {
    LayerWeights& lw = expanded.layers[static_cast<size_t>(l)];
    Weight* lws[7] = {&lw.q_proj, &lw.k_proj, &lw.v_proj, &lw.o_proj, &lw.gate_proj, &lw.up_proj, &lw.down_proj};
    for (int k = 0; k < 7; ++k) expand(*lws[k], layer_types[l][k]);
  }
  expand(expanded.lm_head, head_type);
  const LlamaModel dense(packed.model->config(), std::move(expanded));
  const std::vector<int32_t> prompt = {1, 17, 5, 33, 60, 2, 9, 41, 23, 12};
  const int P = static_cast<int>(prompt.size());
  Tensor lb;
  {
    Session b = Session::make(dense, P + 4);
    lb = b.run(prompt);
  }
  {
    const testing::ExactQuantizedLinears exact;
    Session a = Session::make(*packed.model, P + 4);
    const Tensor la = a.run(prompt);
    for (int i = 0; i < P; ++i) {
      EXPECT_LE(relative_error(la.data<float>() + i * kVocab, lb.data<float>() + i * kVocab, kVocab), kTolerance)
          << "exact kernels, position " << i;
    }
    EXPECT_EQ(testing::greedy_ids(*packed.model, prompt, 16), testing::greedy_ids(dense, prompt, 16));
  }
  // The integer dot products (the default on x86-64): each activation rounded to 8 bits per
  // block of 32 moves the logits by about 1 %; 5 % bounds it with room.
  Session a = Session::make(*packed.model, P + 4);
  const Tensor la = a.run(prompt);
  for (int i = 0; i < P; ++i) {
    EXPECT_LE(relative_error(la.data<float>() + i * kVocab, lb.data<float>() + i * kVocab, kVocab), 5e-2)
        << "integer dot products, position " << i;
  }
}

// A Q4_K_M file of a model whose width is not a multiple of 256 (Qwen2.5-0.5B's 896, here 160):
// its 160-wide inputs fall back to Q5_0 (Q4_K's fallback) and Q8_0 (Q6_K's), the 512-wide down
// projections stay K-quants.
TEST(Conformance, GgufQ4_K_MMixWithFallbacksRunsPacked) {
  using G = GgmlType;
  check_mixed_gguf_runs_packed("q4_k_m", 160, 512, 40,
                               {{G::kQ5_0, G::kQ5_0, G::kQ8_0, G::kQ5_0, G::kQ5_0, G::kQ5_0, G::kQ6_K},
                                {G::kQ5_0, G::kQ5_0, G::kQ5_0, G::kQ5_0, G::kQ5_0, G::kQ5_0, G::kQ4_K}},
                               G::kQ8_0, G::kQ5_0);
}

// The other packed block types: Q5_K with its Q5_1 fallback (Q5_K_M files), Q4_1, IQ4_NL and Q4_0.
TEST(Conformance, GgufOtherBlockTypesRunPacked) {
  using G = GgmlType;
  check_mixed_gguf_runs_packed("q5_k_m", 256, 512, 64,
                               {{G::kQ5_K, G::kQ4_1, G::kQ5_1, G::kIQ4_NL, G::kQ5_K, G::kQ4_0, G::kQ5_K},
                                {G::kIQ4_NL, G::kQ5_1, G::kQ4_1, G::kQ5_K, G::kQ5_1, G::kIQ4_NL, G::kQ5_1}},
                               G::kIQ4_NL, G::kQ5_K);
}

// The block formats with no packed kernel (Q2_K, Q3_K: what Q3_K_M and Q2_K files hold) load
// their linear weights densely, decoded as core/ggml_blocks.h defines (checked against gguf-py
// in tests/io): every projection holds exactly the decoded values, and the model runs to finite
// logits. Blocks are random bytes with small f16 scales.
TEST(Conformance, GgufDecodedBlockFormatsLoadDense) {
  constexpr int64_t kHidden = 256, kFfn = 512, kVocab = 64, kHeads = 4, kKvHeads = 2, kHeadDim = 64;
  GgufWriter w;
  add_llama_metadata(w, kHidden, kFfn, kVocab, kHeads, kKvHeads, kHeadDim, 1);
  std::mt19937 rng(testing::fresh_seed());
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, GgmlType type, float bound, float offset) {
    ASSERT_TRUE(w.add_tensor(name, testing::random_tensor(shape, rng, offset - bound, offset + bound), type).ok()) << name;
  };
  struct Format {
    GgmlType type;
    int64_t block, bytes, d_offset;  // weights and bytes per block; where its f16 scales start
    int n_d;                         // f16 scales at d_offset (d, then dmin / m)
    void (*decode)(const uint8_t*, int64_t, float*);
  };
  const Format q2_k = {GgmlType::kQ2_K, 256, kQ2_KBytes, 80, 2, dequantize_q2_k};
  const Format q3_k = {GgmlType::kQ3_K, 256, kQ3_KBytes, 108, 1, dequantize_q3_k};
  const Format formats[] = {q2_k, q3_k, q2_k, q3_k, q2_k, q3_k, q2_k};
  const char* names[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  const std::vector<int64_t> shapes[7] = {{kHeads * kHeadDim, kHidden}, {kKvHeads * kHeadDim, kHidden},
                                          {kKvHeads * kHeadDim, kHidden}, {kHidden, kHeads * kHeadDim},
                                          {kFfn, kHidden},               {kFfn, kHidden},
                                          {kHidden, kFfn}};
  std::vector<float> decoded[7];
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(1e-4f, 2e-3f);
  add("token_embd.weight", {kVocab, kHidden}, GgmlType::kF32, 1.0f, 0.0f);
  add("blk.0.attn_norm.weight", {kHidden}, GgmlType::kF32, 0.2f, 1.0f);
  add("blk.0.ffn_norm.weight", {kHidden}, GgmlType::kF32, 0.2f, 1.0f);
  for (int k = 0; k < 7; ++k) {
    const Format& f = formats[k];
    const int64_t blocks = shapes[k][0] * shapes[k][1] / f.block;
    std::vector<uint8_t> bytes(static_cast<size_t>(blocks * f.bytes));
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
    for (int64_t b = 0; b < blocks; ++b) {
      for (int j = 0; j < f.n_d; ++j) {
        const uint16_t h = f32_to_f16(j == 1 && (f.type == GgmlType::kQ4_1 || f.type == GgmlType::kQ5_1) ? -scale(rng)
                                                                                                           : scale(rng));
        std::memcpy(bytes.data() + b * f.bytes + f.d_offset + 2 * j, &h, 2);
      }
    }
    decoded[k].resize(static_cast<size_t>(blocks * f.block));
    f.decode(bytes.data(), blocks, decoded[k].data());
    ASSERT_TRUE(w.add_raw_tensor(std::string("blk.0.") + names[k] + ".weight", shapes[k], f.type, bytes).ok()) << names[k];
  }
  add("output_norm.weight", {kHidden}, GgmlType::kF32, 0.2f, 1.0f);
  const std::string path = testing::scratch_dir("gguf_decoded") + "/model-decoded.gguf";
  ASSERT_TRUE(w.write(path).ok());

  LoadedModel m = testing::load_model_or_fail(path);
  // `tachyon info` says so: every block type of the file but F32 expanded at load.
  for (const std::string& line : m.tensor_types) {
    if (!line.starts_with("F32:")) EXPECT_TRUE(line.ends_with(", expanded to f32 at load")) << line;
  }
  EXPECT_GE(m.tensor_types.size(), 2u);
  const LayerWeights& l = m.model->weights().layers[0];
  const Weight* lws[7] = {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj};
  for (int k = 0; k < 7; ++k) {
    SCOPED_TRACE(names[k]);
    ASSERT_TRUE(lws[k]->quant == nullptr && lws[k]->dense.defined());
    const Tensor got = lws[k]->dense.to_f32();
    ASSERT_EQ(got.shape(), shapes[k]);
    for (int64_t i = 0; i < got.numel(); ++i) {
      ASSERT_EQ(got.data<float>()[i], decoded[k][static_cast<size_t>(i)]) << "element " << i;
    }
  }
  const std::vector<int32_t> prompt = {1, 17, 5, 33, 60, 2, 9};
  Session s = Session::make(*m.model, 16);
  const Tensor logits = s.run(prompt);
  for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.data<float>()[i])) << i;
}

// fuse_projections on packed weights (what a GPU load does to a quantized checkpoint): q/k/v and
// gate/up of the same format stack into one weight whose rows are the parts' rows, the parts
// become views of it, and the fused linear computes what the parts do; parts of different
// formats stay apart.
TEST(Conformance, PackedProjectionsFuse) {
  LoadedModel m = testing::load_model_or_fail(testing::source_dir() + "/models/tachyon-demo");
  for (const char* name : {"int4", "q6_k", "ternary", "fp8"}) {
    SCOPED_TRACE(name);
    auto spec = parse_quant_spec(name, 64);
    ASSERT_TRUE(spec.ok());
    ModelWeights w = m.model->weights();
    ASSERT_TRUE(quantize_linear_weights(w, *spec).ok());
    const ModelWeights separate = w;
    ASSERT_TRUE(fuse_projections(w).ok());
    LayerWeights& l = w.layers[0];
    ASSERT_TRUE(l.qkv_proj.quant != nullptr && l.gate_up_proj.quant != nullptr);
    const QuantWeight& qkv = *l.qkv_proj.quant;
    EXPECT_EQ(qkv.format, l.q_proj.quant->format);
    EXPECT_EQ(qkv.out_features, l.q_proj.out_features() + l.k_proj.out_features() + l.v_proj.out_features());
    EXPECT_EQ(l.k_proj.quant->packed.buffer(), qkv.packed.buffer()) << "k_proj is a view of qkv_proj";
    std::mt19937 rng(5);
    const Tensor x = testing::random_tensor({3, qkv.in_features}, rng);
    Tensor fused = Tensor::empty({3, qkv.out_features}, DType::kF32);
    ops::linear(x, l.qkv_proj, nullptr, fused);
    int64_t col = 0;
    for (const Weight* part : {&separate.layers[0].q_proj, &separate.layers[0].k_proj, &separate.layers[0].v_proj}) {
      Tensor y = Tensor::empty({3, part->out_features()}, DType::kF32);
      ops::linear(x, *part, nullptr, y);
      for (int64_t t = 0; t < 3; ++t) {
        for (int64_t o = 0; o < part->out_features(); ++o) {
          ASSERT_EQ(fused.data<float>()[t * qkv.out_features + col + o], y.data<float>()[t * part->out_features() + o])
              << "token " << t << " output " << col + o;
        }
      }
      col += part->out_features();
    }
  }
  // Different formats: not fused.
  ModelWeights w = m.model->weights();
  ASSERT_TRUE(quantize_linear_weights(w, *parse_quant_spec("int8", 128)).ok());
  w.layers[0].k_proj = m.model->weights().layers[0].k_proj;  // dense, as stored
  ASSERT_TRUE(fuse_projections(w).ok());
  EXPECT_FALSE(w.layers[0].qkv_proj.defined());
  EXPECT_TRUE(w.layers[1].qkv_proj.defined());
}

// Experts stored as Q8_0 3-D tensors run packed, as one stack per projection: the weights' f32
// function against a float64 numpy forward over the same dequantized weights.
TEST(Conformance, GgufQ8_0ExpertsRunPacked) {
  const ModelFixture f = testing::read_model_fixture("qwen3-moe");
  LoadedModel q8 = testing::load_model_or_fail(f.dir + "/model-q8_0.gguf");
  bool packed = false;
  for (const LayerWeights& l : q8.model->weights().layers) {
    if (l.is_moe()) packed = l.experts.gate.quant && l.experts.gate.quant->format == QuantFormat::kGgufQ8_0;
  }
  EXPECT_TRUE(packed);
  const testing::ExactQuantizedLinears exact;
  check_against_fixture(*q8.model, f, "gguf_q8_0_prompt_logits", false, kTolerance);
}

// --quant on a mixture of experts: each layer's expert stacks are packed (the routers stay f32),
// and the logits stay near transformers'. The three stacks of a layer must share one format.
TEST(Conformance, MoeExpertsQuantize) {
  const ModelFixture f = testing::read_model_fixture("qwen3-moe");
  LoadedModel m = testing::load_model_or_fail(f.dir);
  ModelWeights w = m.model->weights();
  QuantSpec spec;
  spec.format = QuantFormat::kInt8Channel;
  ASSERT_TRUE(quantize_linear_weights(w, spec).ok());
  for (const LayerWeights& l : w.layers) {
    if (!l.is_moe()) continue;
    for (const Weight* x : {&l.experts.gate, &l.experts.up, &l.experts.down}) {
      ASSERT_TRUE(x->quant && x->quant->format == QuantFormat::kInt8Channel);
    }
    EXPECT_FALSE(l.router.quant);
  }
  // The packed model computes what its weights dequantized to f32 compute.
  ModelWeights expanded = w;
  for (LayerWeights& l : expanded.layers) {
    for (Weight* x : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj,
                      &l.experts.gate, &l.experts.up, &l.experts.down}) {
      if (x->quant) *x = Weight{dequantize(*x->quant), nullptr};
    }
  }
  const LlamaModel packed(m.model->config(), w), dense(m.model->config(), expanded);
  const int P = static_cast<int>(f.prompt_ids.size());
  Session a = Session::make(packed, P + 4), b = Session::make(dense, P + 4);
  Tensor la, lb;
  {
    const testing::ExactQuantizedLinears exact;
    la = a.run(f.prompt_ids);
  }
  lb = b.run(f.prompt_ids);
  const int64_t vocab = m.model->config().vocab_size;
  for (int i = 0; i < P; ++i) {
    EXPECT_LE(relative_error(la.data<float>() + i * vocab, lb.data<float>() + i * vocab, vocab), kTolerance)
        << "position " << i;
  }
  ModelWeights mixed = m.model->weights();
  auto policy = QuantPolicy::parse("*.mlp.experts.up_proj int4:g32\n", "policy");
  ASSERT_TRUE(policy.ok()) << policy.status().to_string();
  const auto counts = quantize_linear_weights(mixed, *policy, spec);
  ASSERT_FALSE(counts.ok());
  EXPECT_NE(counts.status().message().find("mlp.experts"), std::string::npos) << counts.status().to_string();
}

// Two sequences in one flattened batch (a prefill chunk and a decode token) give the same
// logits as each run alone.
class BatchedEqualsAlone : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Models, BatchedEqualsAlone, ::testing::Values("qwen2", "qwen3-moe", "qwen2-moe", "mixtral"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

TEST_P(BatchedEqualsAlone, Logits) {
  const ModelFixture f = testing::read_model_fixture(GetParam());
  LoadedModel m = testing::load_model_or_fail(f.dir);
  const LlamaModel& model = *m.model;
  const int64_t vocab = model.config().vocab_size;
  const std::vector<int32_t> a(f.prompt_ids.begin(), f.prompt_ids.end());
  const std::vector<int32_t> b(f.prompt_ids.begin() + 3, f.prompt_ids.begin() + 11);

  Session alone_a = Session::make(model, 64), alone_b = Session::make(model, 64);
  Tensor la = alone_a.run(a);
  Tensor lb = alone_b.run(b);

  const ModelConfig& c = model.config();
  KvCacheConfig kv{c.num_layers, c.num_kv_heads, c.head_dim, 16, 16, DType::kF32, Device::cpu(), {}};
  KvCache cache = std::move(KvCache::create(kv)).value();
  BlockManager blocks({kv.num_blocks, 16, false, {}});
  BlockTable ta(16), tb(16);
  ASSERT_TRUE(blocks.grow_to(ta, static_cast<int>(a.size())).ok());
  ASSERT_TRUE(blocks.grow_to(tb, static_cast<int>(b.size())).ok());
  ForwardBatch batch = build_forward_batch({SequenceChunk{&ta, 0, a, LogitsWanted::kAll},
                                            SequenceChunk{&tb, 0, b, LogitsWanted::kAll}});
  Tensor both;
  ASSERT_TRUE(model.forward(batch, cache, both).ok());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(relative_error(both.data<float>() + static_cast<int64_t>(i) * vocab, la.data<float>() + static_cast<int64_t>(i) * vocab, vocab), 1e-5);
  }
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_LE(relative_error(both.data<float>() + static_cast<int64_t>(a.size() + i) * vocab,
                             lb.data<float>() + static_cast<int64_t>(i) * vocab, vocab),
              1e-5);
  }
}

}  // namespace
}  // namespace tachyon
