// `tachyon quantize -m MODEL --method rtn-int4|awq-int4|int8|w8a8|fp8 [--group G] [--calib FILE]
// [--calib-tokens N] [--smooth-alpha A] [--max-layer-error E] -o OUTDIR`: quantizes a Hugging Face model's linear
// layers and writes OUTDIR as a Hugging Face directory that `-m OUTDIR` (and AutoAWQ-aware
// tools) load: config.json with a quantization_config, the tokenizer files, model.safetensors
// (int4 in the AutoAWQ GEMM layout, int8 as compressed-tensors per-channel int8, w8a8 the same
// with dynamic per-token int8 activations, SmoothQuant folded into the norms and rows, fp8 as
// compressed-tensors float-quantized), and
// quantize_report.json (per module: format, AWQ alpha, relative output error on calibration
// data; totals). Progress goes to stderr, one line per layer.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "model/quantize_model.h"
#include "model/quantized_checkpoint.h"

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
  float smooth_alpha = 0.5f;
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
    line += ",";
  }
  line.pop_back();
  std::fprintf(stderr, "%s\n", line.c_str());
}

int run_quantize(const QuantizeArgs& a) {
  Timer total;
  auto method = parse_quant_method(a.method);
  if (!method.ok()) return report(method.status());
  if (!fs::is_directory(a.model) || !fs::exists(fs::path(a.model) / "config.json")) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: -m {}: expected a Hugging Face directory "
                             "(config.json + *.safetensors)", a.model));
  }
  std::error_code ec;
  if (fs::exists(a.out, ec) && fs::equivalent(a.model, a.out, ec)) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: -o {} is the source model's directory; choose "
                             "another", a.out));
  }
  if (*method == QuantMethod::kAwqInt4 && a.calib.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: awq-int4 needs calibration text (--calib FILE)"));
  }
  if (*method == QuantMethod::kW8A8 && a.smooth_alpha > 0.0f && a.calib.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: w8a8 with SmoothQuant needs calibration text "
                             "(--calib FILE), or --smooth-alpha 0 for plain w8a8"));
  }
  if (a.max_layer_error > 0.0 && a.calib.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "quantize: --max-layer-error needs calibration text "
                             "(--calib FILE) to measure errors on"));
  }
  CommonOptions common;
  common.model = a.model;
  common.threads = a.threads;
  common.verbose = a.verbose;
  auto loaded = load(common);
  if (!loaded.ok()) return report(loaded.status());

  std::vector<int32_t> calibration;
  if (!a.calib.empty()) {
    if (!loaded->tokenizer) return report(make_error(ErrorCode::kInvalidArgument, "{} has no tokenizer", loaded->path));
    auto text = read_text_file(a.calib);
    if (!text.ok()) return report(text.status());
    // A prefix of the text is enough: tokens average far fewer than 16 bytes.
    const size_t prefix = static_cast<size_t>(std::min<int64_t>(a.calib_tokens, int64_t{1} << 26)) * 16;
    calibration = loaded->tokenizer->encode(std::string_view(*text).substr(0, prefix));
    if (static_cast<int64_t>(calibration.size()) > a.calib_tokens) calibration.resize(static_cast<size_t>(a.calib_tokens));
    std::fprintf(stderr, "calibrating on %zu tokens of %s\n", calibration.size(), a.calib.c_str());
  }

  QuantizeModelOptions options;
  options.method = *method;
  options.group_size = a.group;
  options.max_layer_error = a.max_layer_error;
  options.smooth_alpha = a.smooth_alpha;
  options.awq_clip = !a.no_clip;
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
  auto saved = save_quantized_checkpoint(save, loaded->model->config(), quantized->weights);
  if (!saved.ok()) return report(saved.status());

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
                         {"clip_ratio", optional_number(m.clip_ratio)}});
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
      ->required()
      ->check(CLI::IsMember({"rtn-int4", "awq-int4", "int8", "w8a8", "fp8", "ternary"}));
  cmd->add_option("--group", args->group, "int4: inputs per scale, 32, 64 or 128; ternary also 256 (default 128)")
      ->check(CLI::IsMember({32, 64, 128, 256}));
  cmd->add_option("--calib", args->calib, "calibration text (plain text file)");
  cmd->add_option("--calib-tokens", args->calib_tokens, "calibration tokens used, from the start of --calib "
                  "(default 4096)")->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  cmd->add_flag("--no-clip", args->no_clip, "awq-int4: skip the search of each group's clipping range (scales only)");
  cmd->add_option("--smooth-alpha", args->smooth_alpha, "w8a8: SmoothQuant migration strength, 0..1 (default 0.5; "
                  "0: none)")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--max-layer-error", args->max_layer_error, "keep 16-bit any module whose relative output error on "
                  "the calibration data exceeds this (e.g. 0.05); needs --calib")->check(non_negative_real());
  cmd->add_option("-o,--output", args->out, "the directory to write (created if absent)")->required();
  cmd->add_option("-t,--threads", args->threads, "CPU threads (default: all cores)")->check(non_negative_int());
  cmd->add_flag("-v,--verbose", args->verbose, "log what is loaded and which kernels run");
  cmd->callback([args, &run]() { run = [args]() { return run_quantize(*args); }; });
}

}  // namespace tachyon::cli
