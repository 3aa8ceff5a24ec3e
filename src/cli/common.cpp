#include "cli/common.h"

#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <random>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/quant_check.h"
#include "core/mapped_file.h"
#include "io/safetensors.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "model/quantize_weights.h"
#include "quant/quant_policy.h"
#include "ops/device_backends.h"
#include "ops/ops.h"

namespace tachyon::cli {

void add_common_options(CLI::App& cmd, CommonOptions& options) {
  cmd.add_option("-m,--model", options.model,
                 "HF directory, GGUF file, llama2.c checkpoint (or its directory), or synthetic:PRESET")
      ->required();
  cmd.add_option("-t,--threads", options.threads, "CPU threads (default: all cores)")->check(non_negative_int());
  cmd.add_option("--device", options.device,
                 "where the model runs: auto (a GPU when there is one, else the CPU; the default), cpu, cuda or "
                 "cuda:N");
  cmd.add_flag("-v,--verbose", options.verbose, "log what is loaded and which kernels run");
  cmd.add_option("--quant", options.quant,
                 "quantize the layers' linear weights when loading: int8 (per channel), int4 (group-wise, "
                 "asymmetric), w8a8 (int8 weights per channel and activations per token), fp8 (e4m3 per channel), "
                 "ternary ({-1, 0, +1} x a group absmean scale), or a GGUF block format (q8_0, q4_0, q4_1, q5_0, q5_1, "
                 "iq4_nl, q4_k, q5_k, q6_k; a K-quant falls back to q5_0, q5_1 or q8_0 where the input width is not a "
                 "multiple of 256); on a GPU int8, int4 and w8a8 are quantized there, the others on the host; "
                 "embedding and LM head stay 16-bit")
      ->check(CLI::IsMember({"int8", "int4", "w8a8", "fp8", "ternary", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl",
                             "q4_k", "q5_k", "q6_k"}));
  cmd.add_option("--quant-policy", options.quant_policy,
                 "per-module formats: lines 'PATTERN FORMAT' (glob over names like model.layers.3.mlp.gate_proj, "
                 "or lm_head; FORMAT a --quant name, int4:gN, or dense); modules no rule matches get --quant");
  cmd.add_option("--quant-lm-head", options.quant_lm_head,
                 "also quantize the LM head when loading: int8 (per channel; on a GPU quantized there), or q8_0 or "
                 "q6_k (GGUF blocks, as Q4_K_M / Q5_K_M files store it; q6_k falls back to q8_0 where the hidden "
                 "size is not a multiple of 256). Off by default: the head is the module most sensitive to "
                 "rounding, and a tied head gets a copy of its own")
      ->check(CLI::IsMember({"int8", "q8_0", "q6_k"}));
  cmd.add_option("--quant-guard-kl", options.quant_guard_kl,
                 "every quantized load runs a 16-token probe: non-finite logits, or a mean KL to the 16-bit model "
                 "above this (nats; default 0.5, 0: finiteness only), return modules to 16 bits, worst first, "
                 "with a warning naming them")
      ->check(non_negative_real());
  cmd.add_option("--quant-group", options.quant_group,
                 "inputs per scale of --quant int4 (32, 64 or 128) or ternary (also 256); default 128")
      ->check(CLI::IsMember({32, 64, 128, 256}));
}

Result<Device> parse_device(const std::string& text) {
  if (text == "auto") {
    const bool gpu = ops::has_device_backend(DeviceType::kCuda) && ops::available_devices(DeviceType::kCuda) > 0;
    return gpu ? Device::cuda(0) : Device::cpu();
  }
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos) {
    return Device::cuda(std::stoi(text.substr(5)));
  }
  return make_error(ErrorCode::kInvalidArgument, "--device '{}': expected auto, cpu, cuda or cuda:N", text);
}

namespace {

bool has_packed_linears(const ModelWeights& w) {
  for (const LayerWeights& l : w.layers) {
    for (const Weight* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      if (m->quant) return true;
    }
  }
  return w.lm_head.quant != nullptr;
}

// A checkpoint stored quantized: the guard (cli/quant_check.h) against the 16-bit model's probe
// logits that `tachyon quantize` stored beside it (finiteness only without them), falling back
// module by module to the source model its quantize_report.json names when the check fails.
Status guard_checkpoint(LoadedModel& loaded, const CommonOptions& options, const LoadOptions& lo) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::is_directory(loaded.path, ec) ? fs::path(loaded.path) : fs::path(loaded.path).parent_path();
  const ModelConfig config = loaded.model->config();
  std::vector<int32_t> probe = guard_probe_tokens(loaded.tokenizer.get(), loaded.bos_token_id, config.vocab_size);
  Tensor reference;
  if (fs::is_regular_file(dir / kQuantProbeFile, ec)) {
    auto file = SafetensorsFile::open((dir / kQuantProbeFile).string());
    if (!file.ok()) return file.status().with_context("the stored probe");
    auto tokens = (*file)->tensor("tokens");
    auto logits = (*file)->tensor("logits");
    if (!tokens.ok() || !logits.ok() || tokens->dtype() != DType::kI32 || tokens->dim() != 1 ||
        logits->dtype() != DType::kF32 || logits->dim() != 2 || logits->size(0) != tokens->size(0) ||
        logits->size(1) != config.vocab_size || tokens->size(0) < 1) {
      return make_error(ErrorCode::kCorruptFile, "{}: expected tokens [n] i32 and logits [n, {}] f32",
                        (dir / kQuantProbeFile).string(), config.vocab_size);
    }
    probe.assign(tokens->data<int32_t>(), tokens->data<int32_t>() + tokens->numel());
    for (int32_t t : probe) {
      if (t < 0 || t >= config.vocab_size) {
        return make_error(ErrorCode::kCorruptFile, "{}: token {} outside the vocabulary", (dir / kQuantProbeFile).string(), t);
      }
    }
    reference = logits->contiguous();
  }
  ModelWeights weights = loaded.model->weights();
  TACHYON_ASSIGN_OR_RETURN(QuantGuardResult g, guard_quantized_weights(config, weights, nullptr, probe, reference,
                                                                       options.quant_guard_kl));
  if (g.passed) {
    TACHYON_LOG_INFO("{}: quantized checkpoint: {} on a {}-token probe", loaded.path,
                     g.measured_kl ? fmt::format("KL {:.5f} nats to the stored model", g.kl) : "logits finite",
                     probe.size());
    return Status::Ok();
  }
  // The source model, when the report names one that is still there.
  std::string source;
  if (auto report_text = read_text_file((dir / "quantize_report.json").string()); report_text.ok()) {
    const auto j = nlohmann::json::parse(*report_text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("model") && j["model"].is_string()) source = j["model"].get<std::string>();
  }
  const std::string what = !g.finite ? g.first_non_finite : fmt::format("KL {:.4f} nats over the probe", g.kl);
  if (source.empty() || !fs::exists(source, ec)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: the quantized checkpoint fails the guard ({}, limit {} nats){}", loaded.path, what,
                      options.quant_guard_kl,
                      source.empty() ? "; it names no 16-bit source model to fall back to"
                                     : fmt::format("; its source model {} is not there to fall back to", source));
  }
  LoadOptions source_options = lo;
  source_options.path = source;
  auto stored = load_model(source_options);
  if (!stored.ok()) return stored.status().with_context(fmt::format("{}: loading its source model", loaded.path));
  const std::string format = "stored quantized";
  auto quantized = std::move(loaded.model);
  TACHYON_ASSIGN_OR_RETURN(bool kept, guard_quantized_load(loaded, std::move(quantized), &stored->model->weights(),
                                                           reference, format, options.quant_guard_kl));
  (void)kept;  // guard_quantized_load errs when nothing could be repaired
  return Status::Ok();
}

}  // namespace

namespace {

Result<LoadedModel> load_model_as_asked(const CommonOptions& options, DType synthetic_dtype) {
  if (options.verbose) set_log_level(LogLevel::kInfo);
  if (options.threads > 0) set_num_threads(options.threads);
  TACHYON_ASSIGN_OR_RETURN(Device device, parse_device(options.device));
  QuantSpec quant;
  if (!options.quant.empty()) {
    TACHYON_ASSIGN_OR_RETURN(quant, parse_quant_spec(options.quant, options.quant_group));
  }
  if (!ops::has_device_backend(device.type)) {
    return make_error(ErrorCode::kUnsupported,
                      "--device {}: this build has no CUDA backend (configure with -DTACHYON_CUDA=ON where nvcc is)",
                      options.device);
  }
  TACHYON_RETURN_IF_ERROR(ops::start_device_backend(device));
  LoadOptions lo;
  lo.path = options.model;
  lo.synthetic_dtype = synthetic_dtype;
  lo.device = device;
  std::optional<QuantPolicy> policy;
  std::string policy_path = options.quant_policy;
  if (policy_path.empty() && options.quant.empty() && !options.as_stored) {
    // A directory `tachyon quantize --budget` wrote: the 16-bit weights and the rules it chose,
    // applied when loading (unless --quant or --quant-policy says otherwise).
    std::error_code ec;
    const std::filesystem::path dir_policy = std::filesystem::path(options.model) / kDirectoryQuantPolicy;
    if (std::filesystem::is_directory(options.model, ec) && std::filesystem::is_regular_file(dir_policy, ec)) {
      policy_path = dir_policy.string();
      TACHYON_LOG_INFO("{}: applying its {} (from tachyon quantize --budget)", options.model, kDirectoryQuantPolicy);
    }
  }
  if (!policy_path.empty()) {
    TACHYON_ASSIGN_OR_RETURN(policy, QuantPolicy::read_file(policy_path));
  }
  std::optional<QuantSpec> head_spec;
  if (!options.quant_lm_head.empty()) {
    TACHYON_ASSIGN_OR_RETURN(head_spec, parse_quant_spec(options.quant_lm_head, options.quant_group));
  }
  TACHYON_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(lo));
  if (options.quant.empty() && !policy && !head_spec) {
    if (has_packed_linears(loaded.model->weights())) TACHYON_RETURN_IF_ERROR(guard_checkpoint(loaded, options, lo));
    return loaded;
  }
  std::string what = policy ? "--quant-policy " + policy_path
                     : options.quant.empty() ? std::string()
                                             : "--quant " + options.quant;
  if (head_spec) what += (what.empty() ? "" : " ") + std::string("--quant-lm-head ") + options.quant_lm_head;
  Timer timer;
  ModelWeights weights = loaded.model->weights();
  const ModelConfig config = loaded.model->config();
  // Random weights compute no function worth falling back to: they are let go as they are
  // quantized (on a GPU, layer by layer), so a model whose 16-bit and packed weights would not fit
  // together still loads quantized.
  const bool synthetic = loaded.format == "synthetic";
  if (synthetic) loaded.model.reset();
  std::string format;
  if (!policy && options.quant.empty()) {
    format = "as stored";
  } else if (policy) {
    auto counts = quantize_linear_weights(weights, *policy,
                                          options.quant.empty() ? std::nullopt : std::optional<QuantSpec>(quant));
    if (!counts.ok()) return make_error(counts.status().code(), "{}: {}: {}", loaded.path, what, counts.status().message());
    for (const auto& [name, n] : *counts) format += fmt::format("{}{} {}", format.empty() ? "" : ", ", n, name);
    format = "a policy (" + format + ")";
  } else {
    if (Status s = quantize_linear_weights(weights, quant); !s.ok()) {
      return make_error(s.code(), "{}: {}: {}", loaded.path, what, s.message());
    }
    format = quant.format == QuantFormat::kInt4Group || quant.format == QuantFormat::kTernary
                 ? fmt::format("{} g{}", quant_format_name(quant.format), quant.group_size)
                 : std::string(quant_format_name(quant.format));
  }
  if (head_spec) {
    if (Status s = quantize_lm_head(weights, *head_spec); !s.ok()) {
      return make_error(s.code(), "{}: {}: {}", loaded.path, what, s.message());
    }
    format += fmt::format(", the LM head {}", quant_format_name(head_spec->format));
  }
  TACHYON_LOG_INFO("quantized the linear weights to {} in {:.2f} s", format, timer.seconds());
  // The model as stored (a file's) stays alive until the quantized one passes the finite-logits
  // check (its weights are held during quantization anyway, so the peak does not grow), and is what
  // runs if the check fails.
  auto quantized = std::make_unique<LlamaModel>(config, std::move(weights));
  // When the weights as stored are kept, a warning has said so.
  // Random weights compute no function worth keeping: their logits move by nats under any rounding,
  // and a benchmark must run the format it names. The guard checks them for finiteness only, with
  // nothing to fall back to.
  const auto kept = synthetic ? guard_quantized_load(loaded, std::move(quantized), nullptr, Tensor(), format, 0.0)
                              : keep_quantized_if_finite(loaded, std::move(quantized), format,
                                                         options.quant_guard_kl);
  if (!kept.ok()) {
    return make_error(kept.status().code(), "{}: {}: checking the quantized model: {}", loaded.path, what,
                      kept.status().message());
  }
  return loaded;
}

}  // namespace

Result<LoadedModel> load(const CommonOptions& options, DType synthetic_dtype) {
  return load_model_as_asked(options, synthetic_dtype);
}

void announce_device(const CommonOptions& options, Device device) {
  static bool said = false;
  if (said || options.device != "auto") return;
  said = true;
  const std::string why = device.is_cpu() ? (ops::has_device_backend(DeviceType::kCuda) ? "no GPU found"
                                                                                         : "a build without CUDA")
                                          : ops::device_description(device);
  std::fprintf(stderr, "tachyon: device %s (%s; --device cpu|cuda chooses)\n", device.to_string().c_str(), why.c_str());
}

namespace {

// An integer in [lo, INT_MAX] written in decimal, else the error CLI11 prints after the option name.
std::string check_int(const std::string& text, long long lo) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > INT_MAX) {
    return fmt::format("'{}' is not an integer in [{}, {}]", excerpt(text, 40), lo, INT_MAX);
  }
  return "";
}

}  // namespace

const CLI::Validator& non_negative_int() {
  static const CLI::Validator v([](std::string& s) { return check_int(s, 0); }, "INT>=0");
  return v;
}

const CLI::Validator& positive_int() {
  static const CLI::Validator v([](std::string& s) { return check_int(s, 1); }, "INT>0");
  return v;
}

const CLI::Validator& non_negative_real() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(x) || x < 0.0) {
          return fmt::format("'{}' is not a finite number >= 0", excerpt(s, 40));
        }
        return "";
      },
      "REAL>=0");
  return v;
}

const CLI::Validator& fraction() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !(x > 0.0 && x <= 1.0)) {  // NaN fails the comparison
          return fmt::format("'{}' is not a fraction in (0, 1]", excerpt(s, 40));
        }
        return "";
      },
      "(0,1]");
  return v;
}

const CLI::Validator& seed_value() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        uint64_t seed = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), seed);
        if (ec != std::errc() || end != s.data() + s.size()) {
          return fmt::format("'{}' is not a seed (an integer in [0, 18446744073709551615])", excerpt(s, 40));
        }
        return "";
      },
      "UINT64");
  return v;
}

uint64_t seed_or_random(const std::string& text) {
  uint64_t seed = 0;
  if (!text.empty() && std::from_chars(text.data(), text.data() + text.size(), seed).ec == std::errc()) return seed;
  return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

void add_engine_options(CLI::App& cmd, EngineArgs& a) {
  cmd.add_option("--kv-cache-mem", a.kv_cache_mem, "KV cache size, e.g. 2GiB (default: a fraction of free memory)");
  cmd.add_option("--kv-cache-fraction", a.kv_cache_fraction,
                 "fraction of available memory for the KV cache when --kv-cache-mem is not given (default 0.25 of "
                 "the host's, 0.9 of a GPU's free memory)")
      ->check(fraction());
  cmd.add_option("--kv,--kv-dtype", a.kv_dtype,
                 "KV cache dtype: f32, f16, bf16, or quantized int8 / fp8 (e4m3, a scale per token and head) "
                 "(default: f32 on the CPU, bf16 on a GPU)");
  cmd.add_option("--block-size", a.block_size, fmt::format("tokens per KV block (default {})", kDefaultBlockSize))->check(CLI::Range(1, 1024));
  cmd.add_option("--max-model-len", a.max_model_len, "context length (default: the model's)")
      ->check(non_negative_int());
  cmd.add_option("--max-batched-tokens", a.max_batched_tokens, "tokens per engine step (default 2048)")
      ->check(positive_int());
  cmd.add_option("--max-seqs", a.max_seqs, "sequences running at once (default 256)")->check(positive_int());
  cmd.add_flag("--no-chunked-prefill", a.no_chunked_prefill, "run each prompt in one step");
  cmd.add_flag("--no-prefix-caching", a.no_prefix_caching, "do not reuse the KV of earlier prompts");
  cmd.add_flag("--batch-invariant", a.batch_invariant,
               "outputs independent of what else is batched (bit-identical; slower)");
  cmd.add_flag("--enforce-eager", a.enforce_eager, "on a GPU, run every step eagerly (no CUDA graphs)");
  add_kv_tier_options(cmd, a.kv_window, a.kv_history);
  add_sparse_option(cmd, a.sparse_budget);
}

void add_sparse_option(CLI::App& cmd, int& budget) {
  cmd.add_option("--sparse-budget", budget,
                 "block-sparse decode attention (needs --kv-history int8 or int4): each decode query attends to the "
                 "history blocks of about this many tokens whose key bounds score highest, the first history block "
                 "and the window; 0: dense (requests may set their own 'sparse_budget')")
      ->check(non_negative_int());
}

void add_kv_tier_options(CLI::App& cmd, int& window, std::string& history) {
  cmd.add_option("--kv-window", window,
                 "long context: the newest positions each sequence keeps in the KV cache dtype (0: all)")
      ->check(non_negative_int());
  cmd.add_option("--kv-history", history,
                 "what becomes of positions older than --kv-window: same (kept as they are), drop (freed: a "
                 "sliding window of --kv-window positions), int8 or int4 (re-quantized into a pool of history "
                 "blocks, a scale (and int4: a minimum) per token and head; attention still sees every position)");
}

Result<KvTierOptions> parse_kv_tiers(int window, const std::string& history) {
  KvTierOptions t;
  t.window = window;
  if (history == "same") {
    t.history = KvHistory::kSame;
  } else if (history == "drop") {
    t.history = KvHistory::kDrop;
  } else if (history == "int8") {
    t.history = KvHistory::kInt8;
  } else if (history == "int4") {
    t.history = KvHistory::kInt4;
  } else {
    return make_error(ErrorCode::kInvalidArgument, "--kv-history '{}' (same, drop, int8 or int4)", excerpt(history, 40));
  }
  if (t.history != KvHistory::kSame && window <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "--kv-history {} needs --kv-window (the positions kept)", history);
  }
  return t;
}

Result<size_t> parse_bytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' || text[i] == 'e' ||
                             text[i] == 'E' || text[i] == '+')) {
    ++i;
  }
  std::string number = text.substr(0, i), unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  char* end = nullptr;
  const double value = number.empty() ? -1.0 : std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !(value >= 0.0) || !std::isfinite(value)) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is not a size (e.g. 2GiB, 512M, 1e9)", text);
  }
  double scale = 1.0;
  if (!unit.empty()) {
    const char p = static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
    const std::string rest = unit.substr(1);
    const int power = p == 'K' ? 1 : p == 'M' ? 2 : p == 'G' ? 3 : p == 'T' ? 4 : p == 'B' && rest.empty() ? 0 : -1;
    const bool binary = rest == "iB" || rest == "i" || rest == "ib";
    if (power < 0 || !(rest.empty() || rest == "B" || rest == "b" || binary)) {
      return make_error(ErrorCode::kInvalidArgument, "'{}': unknown unit '{}' (B, K, M, G, T, KiB, MiB, GiB, TiB)",
                        text, unit);
    }
    scale = std::pow(binary ? 1024.0 : 1000.0, power);
  }
  const double bytes = value * scale;
  if (bytes > 1e18) return make_error(ErrorCode::kInvalidArgument, "'{}' is too large", text);
  return static_cast<size_t>(bytes);
}

Result<DType> parse_kv_dtype(const std::string& name) {
  const auto dtype = parse_dtype(name);
  if (!dtype || !ops::is_kv_cache_dtype(*dtype)) {
    return make_error(ErrorCode::kInvalidArgument, "--kv '{}' is not a KV cache dtype (f32, f16, bf16, int8, fp8)",
                      name);
  }
  return *dtype;
}

Result<EngineOptions> engine_options(const EngineArgs& a) {
  EngineOptions o;
  if (!a.kv_cache_mem.empty()) {
    TACHYON_ASSIGN_OR_RETURN(o.kv.bytes, parse_bytes(a.kv_cache_mem));
    if (o.kv.bytes == 0) return make_error(ErrorCode::kInvalidArgument, "--kv-cache-mem must be positive");
  }
  o.kv.fraction = a.kv_cache_fraction;
  if (a.kv_dtype != "auto") {
    TACHYON_ASSIGN_OR_RETURN(o.kv.dtype, parse_kv_dtype(a.kv_dtype));
  }
  o.kv.block_size = a.block_size;
  o.max_model_len = a.max_model_len;
  o.scheduler.max_batched_tokens = a.max_batched_tokens;
  o.scheduler.max_seqs = a.max_seqs;
  o.scheduler.chunked_prefill = !a.no_chunked_prefill;
  o.kv.prefix_caching = !a.no_prefix_caching;
  o.batch_invariant = a.batch_invariant;
  o.cuda_graphs = !a.enforce_eager;
  TACHYON_ASSIGN_OR_RETURN(o.kv.tiers, parse_kv_tiers(a.kv_window, a.kv_history));
  o.sparse_budget = a.sparse_budget;
  return o;
}

int report(const Status& status) {
  std::fprintf(stderr, "tachyon: error: %s\n", status.to_string().c_str());
  return 1;
}

}  // namespace tachyon::cli
