// The guard of quantized weights, run by every quantized load (cli::load: --quant, --quant-policy, a
// directory's quant_policy.txt, and checkpoints stored quantized). One short forward over a fixed
// probe must give finite logits, and logits close to the model as stored: the mean KL divergence
// from the stored model's next-token distributions to the quantized one's over the probe's
// positions at most `max_kl` (`--quant-guard-kl`; 0 checks finiteness only). A NaN or Inf (a scale
// that overflowed, a corrupted checkpoint) or a model quantized past what it survives would
// otherwise surface as garbage text far from its cause.
//
// When the check fails and the 16-bit weights are at hand (the model as stored for load-time
// quantization; for a checkpoint, the source model its quantize_report.json names), the guard
// falls back module by module: it measures each quantized module's own damage (the probe's KL with
// that module alone quantized; infinite when its logits are not finite), then returns modules to
// 16 bits, worst first, until the check passes. A fused projection (qkv, gate_up) is one module
// here. The warning names the modules; never a silent fallback. Header-only so that tests call
// it directly.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/scoring.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"

namespace tachyon::cli {

// Beside a checkpoint `tachyon quantize` wrote: the probe's tokens ("tokens" [n] i32) and the 16-bit
// model's logits on them ("logits" [n, vocab] f32), the guard's reference at load.
inline constexpr const char* kQuantProbeFile = "quant_probe.safetensors";

// Tokens of the probe forward, at most.
constexpr int kFiniteCheckTokens = 16;
// The default of --quant-guard-kl: nats of mean KL over the probe. Round-to-nearest int4 g128
// gives about 0.07 on the bundled model's held-out text, int8 0.0004; a model that lost its
// function gives several nats.
constexpr double kDefaultGuardKl = 0.5;

// BOS (token 0 when the model names none), then a fixed English sentence through the tokenizer,
// or without one ids spread over the vocabulary; kFiniteCheckTokens in all at most.
inline std::vector<int32_t> guard_probe_tokens(const Tokenizer* tokenizer, int32_t bos_token_id, int32_t vocab) {
  std::vector<int32_t> tokens{bos_token_id >= 0 && bos_token_id < vocab ? bos_token_id : 0};
  if (tokenizer != nullptr) {
    for (int32_t id : tokenizer->encode("The quick brown fox jumps over the lazy dog, and then it runs home to")) {
      if (static_cast<int>(tokens.size()) == kFiniteCheckTokens) break;
      if (id >= 0 && id < vocab) tokens.push_back(id);
    }
  }
  for (int i = 1; static_cast<int>(tokens.size()) < kFiniteCheckTokens; ++i) {
    tokens.push_back(static_cast<int32_t>(int64_t{vocab} * i / kFiniteCheckTokens));
  }
  return tokens;
}

// [tokens, vocab] f32 on the host: the logits of `model` at every probe position.
inline Result<Tensor> probe_logits(const LlamaModel& model, std::span<const int32_t> tokens) {
  TACHYON_ASSIGN_OR_RETURN(std::unique_ptr<WindowRunner> runner,
                           WindowRunner::create(model, static_cast<int>(tokens.size())));
  Tensor logits;
  TACHYON_RETURN_IF_ERROR(runner->run(tokens, 0, &logits));
  return logits;
}

struct ProbeVerdict {
  bool finite = true;
  std::string first_non_finite;  // "logit 17 at position 3 is nan" when !finite
  double kl = 0.0;               // mean over positions against the reference (0 without one)
};

inline ProbeVerdict judge_probe(const Tensor& logits, const Tensor* reference) {
  ProbeVerdict v;
  const int64_t vocab = logits.size(1);
  const float* row = logits.data<float>();
  for (int64_t i = 0; i < logits.numel() && v.finite; ++i) {
    if (!std::isfinite(row[i])) {
      v.finite = false;
      v.first_non_finite = fmt::format("logit {} at position {} is {}", i % vocab, i / vocab, row[i]);
    }
  }
  if (!v.finite) {
    v.kl = std::numeric_limits<double>::infinity();
  } else if (reference != nullptr && reference->defined()) {
    double sum = 0.0;
    for (int64_t p = 0; p < logits.size(0); ++p) {
      const std::span<const float> r(reference->data<float>() + p * vocab, static_cast<size_t>(vocab));
      const std::span<const float> q(row + p * vocab, static_cast<size_t>(vocab));
      sum += kl_divergence(r, q);
    }
    v.kl = sum / static_cast<double>(logits.size(0));
  }
  return v;
}

// The old name of the finiteness half, kept for its callers: the probe and its verdict alone.
struct FiniteCheck {
  bool finite = true;
  std::string first_non_finite;
  double seconds = 0.0;
};
inline Result<FiniteCheck> check_finite_logits(const LlamaModel& model, int32_t bos_token_id,
                                               const Tokenizer* tokenizer = nullptr) {
  Timer timer;
  const std::vector<int32_t> tokens = guard_probe_tokens(tokenizer, bos_token_id, model.config().vocab_size);
  TACHYON_ASSIGN_OR_RETURN(Tensor logits, probe_logits(model, tokens));
  const ProbeVerdict v = judge_probe(logits, nullptr);
  return FiniteCheck{v.finite, v.first_non_finite, timer.seconds()};
}

// A module the guard can return to 16 bits: the slots it fills in a quantized model's weights
// (a fused projection fills its own and its parts'), and what each holds quantized and dense.
struct GuardModule {
  std::string name;
  std::vector<Weight*> slots;
  std::vector<Weight> quantized;
  std::vector<Weight> dense;
  void set(bool to_dense) {
    for (size_t i = 0; i < slots.size(); ++i) *slots[i] = to_dense ? dense[i] : quantized[i];
  }
};

// The quantized modules of `w` whose 16-bit form `dense` has in the same shape (a fused
// projection only where `dense` has it fused too).
inline std::vector<GuardModule> guard_modules(ModelWeights& w, const ModelWeights& dense) {
  std::vector<GuardModule> out;
  const auto add = [&](const std::string& name, std::vector<Weight*> slots, std::vector<const Weight*> from) {
    if (slots.empty() || slots[0]->quant == nullptr) return;
    GuardModule m;
    m.name = name;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (from[i] == nullptr || from[i]->quant != nullptr || !from[i]->dense.defined()) return;
      if (from[i]->out_features() != slots[i]->out_features() || from[i]->in_features() != slots[i]->in_features()) {
        return;
      }
      m.quantized.push_back(*slots[i]);
      m.dense.push_back(*from[i]);
    }
    m.slots = std::move(slots);
    out.push_back(std::move(m));
  };
  const size_t layers = std::min(w.layers.size(), dense.layers.size());
  for (size_t i = 0; i < layers; ++i) {
    LayerWeights& l = w.layers[i];
    const LayerWeights& d = dense.layers[i];
    const std::string p = fmt::format("model.layers.{}.", i);
    if (l.qkv_proj.defined() && l.qkv_proj.quant) {
      if (d.qkv_proj.defined()) {
        add(p + "self_attn.qkv_proj", {&l.qkv_proj, &l.q_proj, &l.k_proj, &l.v_proj},
            {&d.qkv_proj, &d.q_proj, &d.k_proj, &d.v_proj});
      }
    } else {
      add(p + "self_attn.q_proj", {&l.q_proj}, {&d.q_proj});
      add(p + "self_attn.k_proj", {&l.k_proj}, {&d.k_proj});
      add(p + "self_attn.v_proj", {&l.v_proj}, {&d.v_proj});
    }
    add(p + "self_attn.o_proj", {&l.o_proj}, {&d.o_proj});
    if (l.gate_up_proj.defined() && l.gate_up_proj.quant) {
      if (d.gate_up_proj.defined()) {
        add(p + "mlp.gate_up_proj", {&l.gate_up_proj, &l.gate_proj, &l.up_proj},
            {&d.gate_up_proj, &d.gate_proj, &d.up_proj});
      }
    } else {
      add(p + "mlp.gate_proj", {&l.gate_proj}, {&d.gate_proj});
      add(p + "mlp.up_proj", {&l.up_proj}, {&d.up_proj});
    }
    add(p + "mlp.down_proj", {&l.down_proj}, {&d.down_proj});
    // A layer's experts are one module: their three stacks share one format.
    if (l.is_moe()) {
      add(p + "mlp.experts", {&l.experts.gate, &l.experts.up, &l.experts.down},
          {&d.experts.gate, &d.experts.up, &d.experts.down});
    }
  }
  add("lm_head", {&w.lm_head}, {&dense.lm_head});
  return out;
}

struct QuantGuardResult {
  bool passed = true;          // the weights as they end up
  bool finite = true;          // the weights as given
  std::string first_non_finite;
  double kl = 0.0;             // of the weights as given (infinite when not finite)
  double final_kl = 0.0;
  bool measured_kl = false;    // a reference was at hand
  std::vector<std::string> fell_back;  // modules returned to 16 bits, worst first
  int probes = 0;
  double seconds = 0.0;
};

// Checks `weights` (quantized) and falls back as the header says, in place. `dense`: the same
// model's 16-bit weights, on the same device (nullptr: no fallback possible; then a failure is
// reported, not repaired). `reference`: the stored model's probe logits on `probe` (undefined:
// computed from `dense`, or finiteness only without either). max_kl <= 0: finiteness only.
inline Result<QuantGuardResult> guard_quantized_weights(const ModelConfig& config, ModelWeights& weights,
                                                         const ModelWeights* dense, std::span<const int32_t> probe,
                                                         Tensor reference, double max_kl) {
  Timer timer;
  QuantGuardResult r;
  const auto run = [&](const ModelWeights& w) -> Result<ProbeVerdict> {
    ++r.probes;
    const LlamaModel m(config, w);
    TACHYON_ASSIGN_OR_RETURN(Tensor logits, probe_logits(m, probe));
    return judge_probe(logits, reference.defined() ? &reference : nullptr);
  };
  const auto passes = [&](const ProbeVerdict& v) { return v.finite && (max_kl <= 0.0 || v.kl <= max_kl); };
  if (!reference.defined() && dense != nullptr && max_kl > 0.0) {
    ++r.probes;
    const LlamaModel stored(config, *dense);
    TACHYON_ASSIGN_OR_RETURN(reference, probe_logits(stored, probe));
    if (!judge_probe(reference, nullptr).finite) {
      return make_error(ErrorCode::kInvalidArgument, "the weights as stored give non-finite logits on the probe");
    }
  }
  r.measured_kl = reference.defined() && max_kl > 0.0;
  TACHYON_ASSIGN_OR_RETURN(const ProbeVerdict given, run(weights));
  r.finite = given.finite;
  r.first_non_finite = given.first_non_finite;
  r.kl = r.final_kl = given.kl;
  r.passed = passes(given);
  if (r.passed || dense == nullptr) {
    r.seconds = timer.seconds();
    return r;
  }
  // Each module's own damage: the probe with that module alone quantized.
  std::vector<GuardModule> modules = guard_modules(weights, *dense);
  std::vector<double> damage(modules.size());
  for (GuardModule& m : modules) m.set(/*to_dense=*/true);
  for (size_t i = 0; i < modules.size(); ++i) {
    modules[i].set(false);
    TACHYON_ASSIGN_OR_RETURN(const ProbeVerdict v, run(weights));
    damage[i] = v.finite ? v.kl : std::numeric_limits<double>::infinity();
    modules[i].set(true);
  }
  for (GuardModule& m : modules) m.set(false);
  std::vector<size_t> order(modules.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return damage[a] > damage[b]; });
  // Worst first, until the check passes.
  for (const size_t i : order) {
    modules[i].set(true);
    r.fell_back.push_back(modules[i].name);
    TACHYON_ASSIGN_OR_RETURN(const ProbeVerdict v, run(weights));
    r.final_kl = v.kl;
    if (passes(v)) {
      r.passed = true;
      break;
    }
  }
  r.seconds = timer.seconds();
  return r;
}

// The end of a quantized load: `quantized` (made from or read as `format`, e.g. "int8" or
// "int4 g128") is guarded against `dense` (the 16-bit weights, or nullptr) and replaces
// loaded.model when it passes, possibly with some modules returned to 16 bits (a warning names
// them). A failure nothing repairs keeps the weights as stored when there are any (`dense` is
// loaded.model's, a warning says so), else is an error naming what failed. Returns whether the
// quantized model (whole or in part) was kept.
inline Result<bool> guard_quantized_load(LoadedModel& loaded, std::unique_ptr<LlamaModel> quantized,
                                         const ModelWeights* dense, Tensor reference, const std::string& format,
                                         double max_kl) {
  const std::vector<int32_t> probe =
      guard_probe_tokens(loaded.tokenizer.get(), loaded.bos_token_id, quantized->config().vocab_size);
  ModelWeights weights = quantized->weights();
  const ModelConfig config = quantized->config();
  quantized.reset();
  TACHYON_ASSIGN_OR_RETURN(const QuantGuardResult g,
                           guard_quantized_weights(config, weights, dense, probe, std::move(reference), max_kl));
  const std::string what = !g.finite ? g.first_non_finite : fmt::format("KL {:.4f} nats over the probe", g.kl);
  if (!g.passed) {
    const bool stored_at_hand = dense != nullptr && loaded.model && &loaded.model->weights() == dense;
    if (stored_at_hand) {
      TACHYON_LOG_WARN("{}: the {} weights fail the guard ({}, limit {}); running the weights as stored ({}) instead",
                       loaded.path, format, what, max_kl, loaded.weight_dtypes);
      return false;
    }
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: the {} weights fail the guard ({}, limit {} nats) and no 16-bit weights are at hand to "
                      "fall back to", loaded.path, format, what, max_kl);
  }
  std::string fell_back;
  if (!g.fell_back.empty()) {
    constexpr size_t kNamed = 12;  // the worst ones by name, then a count
    for (size_t i = 0; i < g.fell_back.size() && i < kNamed; ++i) fell_back += (i ? ", " : "") + g.fell_back[i];
    if (g.fell_back.size() > kNamed) fell_back += fmt::format(" and {} more", g.fell_back.size() - kNamed);
    TACHYON_LOG_WARN("{}: the {} weights failed the guard ({}, limit {}); {} module{} back to 16 bits: {} (KL now "
                     "{:.4f})", loaded.path, format, what, max_kl, g.fell_back.size(),
                     g.fell_back.size() == 1 ? "" : "s", fell_back, g.final_kl);
  } else {
    TACHYON_LOG_INFO("{} weights: {} on a {}-token probe ({} forward{}, {:.1f} ms)", format,
                     g.measured_kl ? fmt::format("KL {:.5f} nats", g.kl) : std::string("logits finite"),
                     probe.size(), g.probes, g.probes == 1 ? "" : "s", g.seconds * 1e3);
  }
  const std::string dtypes = loaded.weight_dtypes;
  loaded.model = std::make_unique<LlamaModel>(config, std::move(weights));
  loaded.weight_dtypes = g.fell_back.empty()
                             ? fmt::format("{} (embedding, lm head: {})", format, dtypes)
                             : fmt::format("{}, {} module{} 16-bit (embedding, lm head: {})", format,
                                           g.fell_back.size(), g.fell_back.size() == 1 ? "" : "s", dtypes);
  return true;
}

// Load-time quantization's guard: against the weights as stored (loaded.model), which stay the
// fallback.
inline Result<bool> keep_quantized_if_finite(LoadedModel& loaded, std::unique_ptr<LlamaModel> quantized,
                                             const std::string& format, double max_kl = kDefaultGuardKl) {
  const ModelWeights* stored = &loaded.model->weights();
  return guard_quantized_load(loaded, std::move(quantized), stored, Tensor(), format, max_kl);
}

}  // namespace tachyon::cli
