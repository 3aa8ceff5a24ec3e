// `tachyon quantize -m MODEL --method rtn-int4|awq-int4|int8|w8a8|fp8 [--group G] [--calib FILE]
// [--calib-tokens N] [--smooth-alpha A] [--act-observer OBS] [--max-layer-error E] -o OUTDIR`: quantizes a Hugging Face model's linear
// layers and writes OUTDIR as a Hugging Face directory that `-m OUTDIR` (and AutoAWQ-aware
// tools) load: config.json with a quantization_config, the tokenizer files, model.safetensors
// (int4 in the AutoAWQ GEMM layout, int8 as compressed-tensors per-channel int8, w8a8 the same
// with dynamic per-token int8 activations, SmoothQuant folded into the norms and rows, fp8 as
// compressed-tensors float-quantized; with --act-observer both get static per-tensor activation
// scales, <module>.input_scale), and
// quantize_report.json (per module: format, AWQ alpha, relative output error on calibration
// data; totals). Progress goes to stderr, one line per layer.
//
// `tachyon quantize -m MODEL --budget E --calib FILE [--formats LIST] -o OUTDIR`: mixed precision
// under an error budget (model/quantize_model.h measure_formats / choose_formats): every module
// gets the cheapest candidate whose relative output error is at most E. OUTDIR holds the model's
// own files (hard links where possible) and quant_policy.txt, the chosen rules, which loading
// `-m OUTDIR` applies on the CPU or a GPU, and quantize_report.json: every candidate's bytes and
// error per module, the KL to the 16-bit model on the calibration text measured and predicted, and
// what other budgets would choose.
#include <cmath>
#include <map>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/quant_check.h"
#include "cli/scoring.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "io/safetensors_writer.h"
#include "model/quantize_model.h"
#include "model/quantize_weights.h"
#include "model/quantized_checkpoint.h"
#include "core/log.h"
#include "quant/calib_audit.h"
#include "quant/quant_policy.h"

namespace tachyon::cli {

namespace {

namespace fs = std::filesystem;

struct QuantizeArgs {
  std::string model;
  std::string method;
  int group = 128;
  std::string calib;
  int64_t calib_tokens = 4096;
  double max_layer_error = 0.0;
  double budget = 0.0;       // > 0: choose formats per module (no --method)
  std::string formats;       // --formats: the candidates, comma-separated (empty: the default list)
  std::string eval;          // --eval: held-out text for --budget's end-to-end check (default: the calibration text)
  float smooth_alpha = 0.5f;
  std::string act_observer;     // --act-observer: static activation scales (w8a8, fp8)
  double act_percentile = 99.99;
  double act_fallback_ratio = 3.0;
  bool no_clip = false;
  std::string out;
  int threads = 0;
  bool verbose = false;
};

const char* module_path(const std::string& name) {
  return name == "q_proj" || name == "k_proj" || name == "v_proj" || name == "o_proj" ? "self_attn" : "mlp";
}

nlohmann::json optional_number(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json();
}

// One stderr line per layer: each module's format, alpha and error.
void print_progress(const LayerQuantReport& r, int num_layers) {
  std::string line = fmt::format("layer {}/{} ({:.2f} s):", r.layer + 1, num_layers, r.seconds);
  for (const ModuleQuantReport& m : r.modules) {
    line += fmt::format(" {} {}", m.name, m.format);
    if (m.alpha) line += fmt::format(" a={:.2f}", *m.alpha);
    if (m.relative_error) line += fmt::format(" err={:.4f}", *m.relative_error);
    if (m.rtn_relative_error) line += fmt::format(" (rtn {:.4f})", *m.rtn_relative_error);
    if (m.clip_ratio) line += fmt::format(" clip={:.3f}", *m.clip_ratio);
    if (m.input_scale) line += fmt::format(" sx={:.4g}", *m.input_scale);
    if (m.static_error && !m.input_scale) line += fmt::format(" (static {:.4f}, fell back)", *m.static_error);
    line += ",";
  }
  line.pop_back();
  std::fprintf(stderr, "%s\n", line.c_str());
}

// -m a Hugging Face directory, -o not that directory.
Status check_directories(const QuantizeArgs& a) {
  if (!fs::is_directory(a.model) || !fs::exists(fs::path(a.model) / "config.json")) {
    return make_error(ErrorCode::kInvalidArgument, "quantize: -m {}: expected a Hugging Face directory "
                      "(config.json + *.safetensors)", a.model);
  }
  std::error_code ec;
  if (fs::exists(a.out, ec) && fs::equivalent(a.model, a.out, ec)) {
    return make_error(ErrorCode::kInvalidArgument, "quantize: -o {} is the source model's directory; choose another",
                      a.out);
  }
  return Status::Ok();
}

// The model to quantize, its weights as stored (no directory quant_policy.txt).
Result<LoadedModel> load_as_stored(const QuantizeArgs& a) {
  CommonOptions common;
  common.model = a.model;
  common.threads = a.threads;
  common.verbose = a.verbose;
  common.as_stored = true;
  return load(common);
}

// Calibration tokens: a prefix of the text (tokens average far fewer than 16 bytes), at most
// `max_tokens`.
Result<std::vector<int32_t>> calibration_tokens(const LoadedModel& loaded, const std::string& path,
                                                int64_t max_tokens) {
  if (!loaded.tokenizer) return make_error(ErrorCode::kInvalidArgument, "{} has no tokenizer", loaded.path);
  TACHYON_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  const size_t prefix = static_cast<size_t>(std::min<int64_t>(max_tokens, int64_t{1} << 26)) * 16;
  std::vector<int32_t> tokens = loaded.tokenizer->encode(std::string_view(text).substr(0, prefix));
  if (static_cast<int64_t>(tokens.size()) > max_tokens) tokens.resize(static_cast<size_t>(max_tokens));
  return tokens;
}

// "int4:g64,q5_k,int8" -> specs, in order.
Result<std::vector<QuantSpec>> parse_formats(const std::string& list) {
  std::vector<QuantSpec> specs;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string name = list.substr(begin, end - begin);
    // One policy line parses the name exactly as --quant-policy will read it back.
    TACHYON_ASSIGN_OR_RETURN(QuantPolicy p, QuantPolicy::parse("* " + name, "--formats"));
    if (p.rules().empty() || !p.rules()[0].spec) {
      return make_error(ErrorCode::kInvalidArgument, "--formats: '{}' is not a quantized format", name);
    }
    specs.push_back(*p.rules()[0].spec);
    begin = end + 1;
  }
  return specs;
}

// The end-to-end comparison of `model` with `reference` over the calibration tokens, in windows
// of `ctx` (non-overlapping, every position scored).
struct EndToEnd {
  double kl = 0.0;             // mean KL(reference || model), nats
  double top1 = 0.0;           // share of positions whose argmax agrees
  double perplexity = 0.0;     // of the model on the calibration text
  double reference_perplexity = 0.0;
  int64_t positions = 0;
};

Result<EndToEnd> compare_end_to_end(const LlamaModel& reference, const LlamaModel& model,
                                    std::span<const int32_t> tokens, int ctx) {
  TACHYON_ASSIGN_OR_RETURN(auto ref_runner, WindowRunner::create(reference, ctx));
  TACHYON_ASSIGN_OR_RETURN(auto runner, WindowRunner::create(model, ctx));
  const int64_t vocab = model.config().vocab_size;
  double kl = 0.0, nll = 0.0, ref_nll = 0.0;
  int64_t agree = 0, n = 0;
  for (const ScoreWindow& w : plan_windows(static_cast<int64_t>(tokens.size()) - 1, ctx, ctx)) {
    const auto input = tokens.subspan(static_cast<size_t>(w.begin), static_cast<size_t>(w.end - w.begin));
    Tensor ref_logits, logits;
    TACHYON_RETURN_IF_ERROR(ref_runner->run(input, 0, &ref_logits));
    TACHYON_RETURN_IF_ERROR(runner->run(input, 0, &logits));
    for (int64_t i = w.score_begin - w.begin; i < w.end - w.begin; ++i) {
      const std::span<const float> r(ref_logits.data<float>() + i * vocab, static_cast<size_t>(vocab));
      const std::span<const float> q(logits.data<float>() + i * vocab, static_cast<size_t>(vocab));
      const PositionComparison c = compare_distributions(r, q, tokens[static_cast<size_t>(w.begin + i + 1)]);
      kl += c.kl;
      nll += c.nll;
      ref_nll += c.reference_nll;
      agree += c.same_argmax ? 1 : 0;
      ++n;
    }
  }
  EndToEnd e;
  e.positions = n;
  if (n > 0) {
    e.kl = kl / n;
    e.top1 = static_cast<double>(agree) / n;
    e.perplexity = std::exp(nll / n);
    e.reference_perplexity = std::exp(ref_nll / n);
  }
  return e;
}

// The model with `choice`'s formats, quantized on the host as --quant-policy does.
Result<std::unique_ptr<LlamaModel>> apply_choice(const LlamaModel& model, const FormatChoice& choice) {
  TACHYON_ASSIGN_OR_RETURN(QuantPolicy policy, QuantPolicy::parse(format_policy_text(choice, "check"), "the choice"));
  ModelWeights weights = model.weights();
  TACHYON_RETURN_IF_ERROR(quantize_linear_weights(weights, policy, std::nullopt).status());
  return std::make_unique<LlamaModel>(model.config(), std::move(weights));
}

// Every file of the source directory into `out` (hard links where the file system allows, else
// copies), but a quant_policy.txt or report of its own.
Status copy_model_files(const std::string& source, const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return make_error(ErrorCode::kIo, "-o {}: {}", out, ec.message());
  for (const fs::directory_entry& e : fs::directory_iterator(source, ec)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    if (name == kDirectoryQuantPolicy || name == "quantize_report.json") continue;
    const fs::path dst = fs::path(out) / name;
    fs::remove(dst, ec);
    fs::create_hard_link(e.path(), dst, ec);
    if (ec) {
      ec.clear();
      fs::copy_file(e.path(), dst, fs::copy_options::overwrite_existing, ec);
      if (ec) return make_error(ErrorCode::kIo, "copying {} to {}: {}", e.path().string(), dst.string(), ec.message());
    }
  }
  if (ec) return make_error(ErrorCode::kIo, "reading {}: {}", source, ec.message());
  return Status::Ok();
}

nlohmann::json choice_json(const FormatChoice& c) {
  return {{"bytes", c.bytes},
          {"dense_bytes", c.dense_bytes},
          {"fewer_bytes", c.dense_bytes > 0 ? 1.0 - static_cast<double>(c.bytes) / c.dense_bytes : 0.0},
          {"sum_squared_error", c.sum_squared_error}};
}

int run_budget(const QuantizeArgs& a) {
  Timer total;
  if (a.calib.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: --budget needs calibration text (--calib FILE) to "
                             "measure errors on"));
  }
  if (Status s = check_directories(a); !s.ok()) return report(s);
  MeasureFormatsOptions options;
  if (!a.formats.empty()) {
    auto specs = parse_formats(a.formats);
    if (!specs.ok()) return report(specs.status());
    options.candidates = std::move(specs).value();
  }
  auto loaded = load_as_stored(a);
  if (!loaded.ok()) return report(loaded.status());
  auto calibration = calibration_tokens(*loaded, a.calib, a.calib_tokens);
  if (!calibration.ok()) return report(calibration.status());
  std::fprintf(stderr, "calibrating on %zu tokens of %s\n", calibration->size(), a.calib.c_str());
  const LlamaModel& model = *loaded->model;
  const int num_layers = model.config().num_layers;
  options.sequence_length = std::min(512, model.config().max_position_embeddings);
  options.on_layer = [num_layers](int layer, double seconds) {
    std::fprintf(stderr, "layer %d/%d measured (%.2f s)\n", layer + 1, num_layers, seconds);
  };
  auto measured = measure_formats(model, *calibration, options);
  if (!measured.ok()) return report(measured.status().with_context(loaded->path));

  const FormatChoice choice = choose_formats(*measured, a.budget);
  const FormatChoice cheapest = cheapest_formats(*measured);
  // End to end on the calibration text: the choice, and the cheapest format everywhere, whose KL
  // per unit of summed squared module error predicts the choice's KL from its own module errors.
  auto mix = apply_choice(model, choice);
  if (!mix.ok()) return report(mix.status());
  auto low = apply_choice(model, cheapest);
  if (!low.ok()) return report(low.status());
  std::vector<int32_t> held_out;
  if (!a.eval.empty()) {
    auto c = read_audit_document(a.calib);
    auto e = read_audit_document(a.eval);
    if (!e.ok()) return report(e.status().with_context("--eval"));
    if (c.ok()) {
      const AuditOptions audit;
      const OverlapReport r = audit_overlap({*c}, {*e}, audit);
      if (r.fails(audit)) {
        TACHYON_LOG_WARN("--calib {} overlaps --eval {}: {}; the end-to-end numbers flatter the choice (tachyon "
                         "calib-audit says more)", a.calib, a.eval, r.summary(audit));
      }
    }
    auto tokens = calibration_tokens(*loaded, a.eval, a.calib_tokens);
    if (!tokens.ok()) return report(tokens.status());
    held_out = std::move(tokens).value();
    if (held_out.size() < 2) return report(make_error(ErrorCode::kInvalidArgument, "--eval {}: too short", a.eval));
  }
  const std::vector<int32_t>& check_tokens = a.eval.empty() ? *calibration : held_out;
  auto mix_e2e = compare_end_to_end(model, **mix, check_tokens, options.sequence_length);
  if (!mix_e2e.ok()) return report(mix_e2e.status());
  auto low_e2e = compare_end_to_end(model, **low, check_tokens, options.sequence_length);
  if (!low_e2e.ok()) return report(low_e2e.status());
  const double kl_per_error = cheapest.sum_squared_error > 0.0 ? low_e2e->kl / cheapest.sum_squared_error : 0.0;
  const double predicted_kl = kl_per_error * choice.sum_squared_error;

  if (Status s = copy_model_files(loaded->path, a.out); !s.ok()) return report(s);
  const std::string what = fmt::format("budget {} on {} calibration tokens of {}", a.budget, calibration->size(), a.calib);
  const std::string policy_path = (fs::path(a.out) / kDirectoryQuantPolicy).string();
  {
    std::ofstream f(policy_path, std::ios::trunc);
    f << format_policy_text(choice, what);
    f.flush();
    if (!f) return report(make_error(ErrorCode::kIo, "{}: cannot write the policy", policy_path));
  }

  nlohmann::json modules = nlohmann::json::array();
  std::map<std::string, int> counts;
  for (size_t i = 0; i < choice.modules.size(); ++i) {
    const ModuleChoice& m = choice.modules[i];
    nlohmann::json candidates = nlohmann::json::array();
    for (const MeasuredFormat& f : measured->modules[i].measured) {
      candidates.push_back({{"format", quant_spec_name(f.spec)}, {"bytes", f.bytes}, {"relative_error", f.error}});
    }
    const std::string name = m.spec ? quant_spec_name(*m.spec) : std::string("dense");
    ++counts[name];
    modules.push_back({{"module", m.module}, {"format", name}, {"bytes", m.bytes}, {"dense_bytes", m.dense_bytes},
                       {"relative_error", m.error}, {"candidates", candidates}});
  }
  // What other budgets would choose (from the same measurements; no forward runs).
  nlohmann::json sweep = nlohmann::json::array();
  for (const double factor : {0.25, 0.5, 1.0, 2.0, 4.0}) {
    const FormatChoice c = choose_formats(*measured, a.budget * factor);
    sweep.push_back({{"budget", a.budget * factor}, {"bytes", c.bytes},
                     {"fewer_bytes", c.dense_bytes > 0 ? 1.0 - static_cast<double>(c.bytes) / c.dense_bytes : 0.0},
                     {"predicted_kl", kl_per_error * c.sum_squared_error}});
  }
  const auto e2e_json = [](const EndToEnd& e) {
    return nlohmann::json{{"kl", e.kl}, {"top1_agreement", e.top1}, {"perplexity", e.perplexity},
                          {"reference_perplexity", e.reference_perplexity}, {"positions", e.positions}};
  };
  nlohmann::json out = {
      {"model", loaded->path},
      {"output", a.out},
      {"budget", a.budget},
      {"relative_error", "||X Wq^T - X W^T|| / ||X W^T|| (Frobenius) over the calibration tokens, per module; "
                         "w8a8 with its activations rounded per token"},
      {"calibration", {{"file", a.calib}, {"tokens", measured->calibration_tokens}}},
      {"formats", counts},
      {"choice", choice_json(choice)},
      {"end_to_end", {{"text", a.eval.empty() ? a.calib : a.eval},
                      {"held_out", !a.eval.empty()},
                      {"choice", e2e_json(*mix_e2e)},
                      {"predicted_kl", predicted_kl},
                      {"cheapest_everywhere", e2e_json(*low_e2e)},
                      {"cheapest_choice", choice_json(cheapest)},
                      {"prediction", "KL = (KL of the cheapest format everywhere / its summed squared module errors) "
                                     "x the choice's summed squared module errors"}}},
      {"budgets", sweep},
      {"modules", modules},
      {"seconds", total.seconds()}};
  const std::string report_path = (fs::path(a.out) / "quantize_report.json").string();
  std::ofstream f(report_path, std::ios::trunc);
  f << out.dump(2) << "\n";
  f.flush();
  if (!f) return report(make_error(ErrorCode::kIo, "{}: cannot write the report", report_path));
  std::string formats;
  for (const auto& [name, n] : counts) formats += fmt::format("{}{} {}", formats.empty() ? "" : ", ", n, name);
  std::printf("wrote %s: budget %g: %s; linear weights %.2f MiB -> %.2f MiB (%.1f %% fewer); KL on the %s text "
              "%.5f (predicted %.5f), perplexity %.4f vs %.4f; %.2f s\n",
              a.out.c_str(), a.budget, formats.c_str(), static_cast<double>(choice.dense_bytes) / (1 << 20),
              static_cast<double>(choice.bytes) / (1 << 20),
              100.0 * (1.0 - static_cast<double>(choice.bytes) / std::max<int64_t>(choice.dense_bytes, 1)),
              a.eval.empty() ? "calibration" : "held-out", mix_e2e->kl,
              predicted_kl, mix_e2e->perplexity, mix_e2e->reference_perplexity, total.seconds());
  return 0;
}

int run_quantize(const QuantizeArgs& a) {
  if (a.budget > 0.0) {
    if (!a.method.empty() || a.max_layer_error > 0.0) {
      return report(make_error(ErrorCode::kInvalidArgument, "quantize: --budget chooses the format of every module; "
                               "it takes no --method or --max-layer-error"));
    }
    return run_budget(a);
  }
  if (a.method.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: give --method METHOD, or --budget E to choose "
                             "formats per module"));
  }
  if (!a.formats.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: --formats lists the candidates of --budget"));
  }
  Timer total;
  auto method = parse_quant_method(a.method);
  if (!method.ok()) return report(method.status());
  if (Status s = check_directories(a); !s.ok()) return report(s);
  if (*method == QuantMethod::kAwqInt4 && a.calib.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: awq-int4 needs calibration text (--calib FILE)"));
  }
  if (*method == QuantMethod::kW8A8 && a.smooth_alpha > 0.0f && a.calib.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: w8a8 with SmoothQuant needs calibration text "
                             "(--calib FILE), or --smooth-alpha 0 for plain w8a8"));
  }
  std::optional<ObserverOptions> observer;
  if (!a.act_observer.empty()) {
    if (*method != QuantMethod::kW8A8 && *method != QuantMethod::kFp8) {
      return report(make_error(ErrorCode::kInvalidArgument, "quantize: --act-observer calibrates the static "
                               "activation scales of w8a8 and fp8 (method {})", quant_method_name(*method)));
    }
    if (a.calib.empty()) {
      return report(make_error(ErrorCode::kInvalidArgument, "quantize: --act-observer needs calibration text "
                               "(--calib FILE)"));
    }
    auto kind = parse_observer(a.act_observer);
    if (!kind.ok()) return report(kind.status());
    ObserverOptions o;
    o.kind = *kind;
    o.percentile = a.act_percentile;
    observer = o;
  }
  if (a.max_layer_error > 0.0 && a.calib.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: --max-layer-error needs calibration text "
                             "(--calib FILE) to measure errors on"));
  }
  auto loaded = load_as_stored(a);
  if (!loaded.ok()) return report(loaded.status());

  std::vector<int32_t> calibration;
  if (!a.calib.empty()) {
    auto tokens = calibration_tokens(*loaded, a.calib, a.calib_tokens);
    if (!tokens.ok()) return report(tokens.status());
    calibration = std::move(tokens).value();
    std::fprintf(stderr, "calibrating on %zu tokens of %s\n", calibration.size(), a.calib.c_str());
  }

  QuantizeModelOptions options;
  options.method = *method;
  options.group_size = a.group;
  options.max_layer_error = a.max_layer_error;
  options.smooth_alpha = a.smooth_alpha;
  options.awq_clip = !a.no_clip;
  options.act_observer = observer;
  options.act_fallback_ratio = a.act_fallback_ratio;
  const int num_layers = loaded->model->config().num_layers;
  options.on_layer = [num_layers](const LayerQuantReport& r) { print_progress(r, num_layers); };
  Timer quantize_timer;
  auto quantized = quantize_model(*loaded->model, calibration, options);
  if (!quantized.ok()) return report(quantized.status().with_context(loaded->path));
  const double quantize_seconds = quantize_timer.seconds();

  SaveCheckpointOptions save;
  save.source_dir = loaded->path;
  save.out_dir = a.out;
  save.method = *method == QuantMethod::kInt8   ? CheckpointQuantMethod::kInt8Channel
                : *method == QuantMethod::kW8A8 ? CheckpointQuantMethod::kW8A8
                : *method == QuantMethod::kFp8  ? CheckpointQuantMethod::kFp8Channel
                : *method == QuantMethod::kTernary ? CheckpointQuantMethod::kTernary
                                                   : CheckpointQuantMethod::kAwqGemm;
  if (observer) save.activation_observer = observer_name(observer->kind);
  auto saved = save_quantized_checkpoint(save, loaded->model->config(), quantized->weights);
  if (!saved.ok()) return report(saved.status());
  // The 16-bit model's logits on the guard's probe: what loading the checkpoint checks it against.
  {
    const std::vector<int32_t> probe = guard_probe_tokens(loaded->tokenizer.get(), loaded->bos_token_id,
                                                          loaded->model->config().vocab_size);
    auto logits = probe_logits(*loaded->model, probe);
    if (!logits.ok()) return report(logits.status().with_context("the guard's probe"));
    Tensor tokens = Tensor::empty({static_cast<int64_t>(probe.size())}, DType::kI32);
    std::copy(probe.begin(), probe.end(), tokens.data<int32_t>());
    if (Status s = write_safetensors((fs::path(a.out) / kQuantProbeFile).string(),
                                     {NamedTensor{"tokens", tokens}, NamedTensor{"logits", *logits}});
        !s.ok()) {
      return report(s);
    }
  }

  nlohmann::json layers = nlohmann::json::array();
  int packed = 0, dense = 0;
  for (const LayerQuantReport& l : quantized->layers) {
    nlohmann::json modules = nlohmann::json::array();
    for (const ModuleQuantReport& m : l.modules) {
      (m.kept_dense ? dense : packed) += 1;
      modules.push_back({{"module", fmt::format("model.layers.{}.{}.{}", l.layer, module_path(m.name), m.name)},
                         {"method", m.kept_dense ? "16-bit" : quant_method_name(*method)},
                         {"format", m.format},
                         {"kept_16bit", m.kept_dense},
                         {"alpha", m.alpha ? nlohmann::json(std::round(*m.alpha * 1e4) / 1e4) : nlohmann::json()},
                         {"relative_error", optional_number(m.relative_error)},
                         {"rtn_relative_error", optional_number(m.rtn_relative_error)},
                         {"clip_ratio", optional_number(m.clip_ratio)},
                         {"input_scale", m.input_scale ? nlohmann::json(*m.input_scale) : nlohmann::json()},
                         {"static_relative_error", optional_number(m.static_error)}});
    }
    layers.push_back({{"layer", l.layer}, {"seconds", l.seconds}, {"modules", modules}});
  }
  const uint64_t bytes_before = loaded->model->weights().total_bytes();
  const double seconds = total.seconds();
  nlohmann::json out = {
      {"model", loaded->path},
      {"output", a.out},
      {"method", quant_method_name(*method)},
      {"group_size", *method == QuantMethod::kRtnInt4 || *method == QuantMethod::kAwqInt4 ||
                             *method == QuantMethod::kTernary
                         ? nlohmann::json(a.group)
                         : nlohmann::json()},
      {"smooth_alpha", *method == QuantMethod::kW8A8 ? nlohmann::json(a.smooth_alpha) : nlohmann::json()},
      {"awq_clip", *method == QuantMethod::kAwqInt4 ? nlohmann::json(!a.no_clip) : nlohmann::json()},
      {"activation_scales",
       *method == QuantMethod::kW8A8 || *method == QuantMethod::kFp8
           ? (observer ? nlohmann::json{{"static", true},
                                        {"observer", observer_name(observer->kind)},
                                        {"percentile", observer->kind == ObserverKind::kPercentile
                                                           ? nlohmann::json(observer->percentile)
                                                           : nlohmann::json()},
                                        {"fallback_ratio", a.act_fallback_ratio}}
                       : nlohmann::json{{"static", false}})
           : nlohmann::json()},
      {"checkpoint_format", saved->quantization.describe()},
      {"calibration", a.calib.empty() ? nlohmann::json()
                                      : nlohmann::json{{"file", a.calib}, {"tokens", quantized->calibration_tokens}}},
      {"max_layer_error", a.max_layer_error > 0.0 ? nlohmann::json(a.max_layer_error) : nlohmann::json()},
      {"relative_error", "||X Wq^T - X W^T|| / ||X W^T|| (Frobenius) over the calibration tokens, per module"},
      {"layers", layers},
      {"totals",
       {{"modules_quantized", packed},
        {"modules_16bit", dense},
        {"bytes_before", bytes_before},
        {"bytes_after", saved->weights_bytes},
        {"quantize_seconds", quantize_seconds},
        {"seconds", seconds}}}};
  const std::string report_path = (fs::path(a.out) / "quantize_report.json").string();
  std::ofstream f(report_path, std::ios::trunc);
  f << out.dump(2) << "\n";
  f.flush();
  if (!f) return report(make_error(ErrorCode::kIo, "{}: cannot write the report", report_path));
  std::printf("wrote %s (%s): %d modules quantized, %d kept 16-bit; weights %.2f MiB -> %.2f MiB; %.2f s\n",
              a.out.c_str(), saved->quantization.describe().c_str(), packed, dense,
              static_cast<double>(bytes_before) / (1 << 20), static_cast<double>(saved->weights_bytes) / (1 << 20),
              seconds);
  return 0;
}

}  // namespace

void add_quantize(CLI::App& app, std::function<int()>& run) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand("quantize", "quantize a Hugging Face model's linear layers and save the result");
  cmd->add_option("-m,--model", args->model, "the Hugging Face model directory to quantize")->required();
  cmd->add_option("--method", args->method, "rtn-int4, awq-int4 (needs --calib), int8, w8a8 (int8 weights and "
                  "activations; SmoothQuant needs --calib), fp8 (e4m3 weights per channel), or ternary ({-1, 0, +1} "
                  "x a group absmean scale; the engine's own checkpoint layout)")
      ->check(CLI::IsMember({"rtn-int4", "awq-int4", "int8", "w8a8", "fp8", "ternary"}));
  cmd->add_option("--budget", args->budget, "instead of --method: measure every candidate format of every linear "
                  "module on the calibration data (--calib) and give each the cheapest whose relative output error "
                  "is at most this (e.g. 0.05), else 16 bits; writes -o as the model plus quant_policy.txt, which "
                  "loading applies")->check(non_negative_real());
  cmd->add_option("--eval", args->eval, "--budget: held-out text for the end-to-end check (KL, perplexity, top-1 "
                  "against the model as stored); default the calibration text. Warns when it overlaps --calib");
  cmd->add_option("--formats", args->formats, "--budget's candidates, comma-separated (default "
                  "int4:g128,q4_k,int4:g64,q5_k,int4:g32,q6_k,int8,q8_0,w8a8,fp8; among equal sizes the first listed)");
  cmd->add_option("--group", args->group, "int4: inputs per scale, 32, 64 or 128; ternary also 256 (default 128)")
      ->check(CLI::IsMember({32, 64, 128, 256}));
  cmd->add_option("--calib", args->calib, "calibration text (plain text file)");
  cmd->add_option("--calib-tokens", args->calib_tokens, "calibration tokens used, from the start of --calib "
                  "(default 4096)")->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  cmd->add_flag("--no-clip", args->no_clip, "awq-int4: skip the search of each group's clipping range (scales only)");
  cmd->add_option("--smooth-alpha", args->smooth_alpha, "w8a8: SmoothQuant migration strength, 0..1 (default 0.5; "
                  "0: none)")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--act-observer", args->act_observer, "w8a8, fp8: static activation scales, one per module "
                  "input, calibrated on --calib by minmax, moving-average, percentile or entropy (TensorRT's KL "
                  "calibration); stored as each module's input_scale. Default: none (w8a8 per token, fp8 16-bit "
                  "activations)")
      ->check(CLI::IsMember({"minmax", "moving-average", "percentile", "entropy"}));
  cmd->add_option("--act-fallback-ratio", args->act_fallback_ratio, "--act-observer: an input group (q/k/v, o, "
                  "gate/up, down) whose static scale gives some module more than this many times the output error "
                  "of per-token (w8a8) or unrounded (fp8) activations keeps those (default 3; 0: every module "
                  "static)")->check(non_negative_real());
  cmd->add_option("--act-percentile", args->act_percentile, "--act-observer percentile: the percentile of |x| kept "
                  "(default 99.99)")->check(CLI::Range(1e-6, 100.0));
  cmd->add_option("--max-layer-error", args->max_layer_error, "keep 16-bit any module whose relative output error on "
                  "the calibration data exceeds this (e.g. 0.05); needs --calib")->check(non_negative_real());
  cmd->add_option("-o,--output", args->out, "the directory to write (created if absent)")->required();
  cmd->add_option("-t,--threads", args->threads, "CPU threads (default: all cores)")->check(non_negative_int());
  cmd->add_flag("-v,--verbose", args->verbose, "log what is loaded and which kernels run");
  cmd->callback([args, &run]() { run = [args]() { return run_quantize(*args); }; });
}

}  // namespace tachyon::cli
