// `tachyon perplexity -m MODEL -f TEXT`: how well a model predicts a text, and with --kl how far a
// quantized model's next-token distributions are from the model as stored.
//
// The text is tokenized with the model's tokenizer (BOS as its config says) and scored with
// sliding windows of --ctx tokens every --stride tokens (cli/scoring.h: each window scores only
// the tokens the previous one did not, so every scored token past the first window has at least
// ctx - stride tokens of context). A window's context part runs without logits; the scored part
// runs in chunks whose logits stay under kMaxLogitBytes on the host. Per position: the negative
// log-likelihood of the next token in double through a max-shifted log-softmax; with --kl also
// KL(P_stored || P_quantized) over the full vocabulary and whether the two argmaxes agree.
// perplexity = exp(mean NLL).
//
// --kl loads the model twice through cli::load: once as stored (the reference) and once with
// --quant. stdout ends with exactly one line `perplexity: X` (4 decimals; the quantized model's
// under --kl); progress goes to stderr; --json FILE gets every figure.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/scoring.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "quant/calib_audit.h"

namespace tachyon::cli {
namespace {

using nlohmann::json;

// --ctx default: the model's context, at most this (a longer window costs quadratic attention
// and adds little: by then nearly every token already has plenty of context).
constexpr int kDefaultMaxContext = 2048;
// Host logits of one chunk of scored rows, per model: [rows, vocab] f32.
constexpr size_t kMaxLogitBytes = size_t{256} << 20;

struct PerplexityArgs {
  CommonOptions common;
  std::string text_path;
  std::optional<int> ctx;          // unset: the model's context, at most kDefaultMaxContext
  std::optional<int> stride;       // unset: ctx / 2
  std::optional<int64_t> max_tokens;  // unset: every token of the text
  std::string kv_dtype;            // --kv: the scored run's KV cache dtype (empty: the default)
  int kv_window = 0;               // --kv-window / --kv-history: the scored run's KV tiers
  std::string kv_history = "same";
  int sparse_budget = 0;           // --sparse-budget: block-sparse attention over the history
  bool kl = false;
  bool no_bos = false;
  std::string json_path;
};

// The layers' linear weights as they run, named as `tachyon bench --json` names them: "dense",
// "int8" or "int4-gN". Read from the weights, so a quantized model that was dropped at load time
// (cli/quant_check.h) shows as dense.
std::string weight_format(const ModelWeights& weights) {
  if (weights.layers.empty() || weights.layers[0].q_proj.quant == nullptr) return "dense";
  const QuantWeight& q = *weights.layers[0].q_proj.quant;
  if (q.format == QuantFormat::kInt8Channel) return "int8";
  if (q.format == QuantFormat::kInt4Group || q.format == QuantFormat::kTernary) {
    return fmt::format("{}-g{}", quant_format_name(q.format), q.group_size);
  }
  return quant_format_name(q.format);
}

// Linear interpolation between closest ranks.
double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(pos), hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

struct Totals {
  int64_t scored = 0;
  double nll = 0.0;            // sums over scored tokens
  double reference_nll = 0.0;  // --kl
  int64_t same_argmax = 0;     // --kl
  std::vector<double> kl;      // --kl: per scored token
};

class Progress {
 public:
  explicit Progress(size_t windows) : windows_(windows), tty_(isatty(STDERR_FILENO) != 0) {}
  // After each window; at most one line a second, and always the last.
  void update(size_t done, const Totals& t, double seconds) {
    if (done < windows_ && seconds - last_ < 1.0) return;
    last_ = seconds;
    std::fprintf(stderr, "%swindow %zu/%zu, %lld tokens scored, perplexity so far %.4f, %.0f tok/s%s",
                 tty_ ? "\r" : "", done, windows_, static_cast<long long>(t.scored),
                 std::exp(t.nll / static_cast<double>(std::max<int64_t>(t.scored, 1))),
                 seconds > 0 ? static_cast<double>(t.scored) / seconds : 0.0, tty_ && done < windows_ ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  size_t windows_;
  bool tty_;
  double last_ = -1.0;
};

Status validate_before_load(const PerplexityArgs& a) {
  std::error_code ec;
  const bool dir_policy =
      std::filesystem::is_regular_file(std::filesystem::path(a.common.model) / kDirectoryQuantPolicy, ec);
  if (a.kl && a.common.quant.empty() && a.common.quant_policy.empty() && a.kv_dtype.empty() && !dir_policy &&
      a.kv_history == "same") {
    return make_error(ErrorCode::kInvalidArgument,
                      "--kl compares a quantized model (or KV cache) with the model as stored: give --quant FORMAT, "
                      "--quant-policy FILE, --kv int8|fp8 or --kv-history");
  }
  if (!a.kv_dtype.empty()) TACHYON_RETURN_IF_ERROR(parse_kv_dtype(a.kv_dtype).status());
  TACHYON_ASSIGN_OR_RETURN(const KvTierOptions tiers, parse_kv_tiers(a.kv_window, a.kv_history));
  if (a.sparse_budget > 0 && tiers.history_bits() == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--sparse-budget picks among history blocks: it needs --kv-window and --kv-history int8 or int4");
  }
  if (a.ctx && *a.ctx < 2) {
    return make_error(ErrorCode::kInvalidArgument, "--ctx {}: a window needs at least 2 tokens", *a.ctx);
  }
  if (a.stride && *a.stride <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "--stride {}: must be at least 1", *a.stride);
  }
  if (a.max_tokens && *a.max_tokens <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "--max-tokens {}: must be at least 1", *a.max_tokens);
  }
  return Status::Ok();
}

// A model `tachyon quantize` wrote names its calibration text in quantize_report.json: scoring it
// on text that overlaps that (quant/calib_audit.h) flatters the quantized model, so say so.
void warn_if_calibrated_on(const std::string& model, const std::string& text_path) {
  std::error_code ec;
  const std::filesystem::path report_path = std::filesystem::path(model) / "quantize_report.json";
  if (!std::filesystem::is_regular_file(report_path, ec)) return;
  auto report_text = read_text_file(report_path.string());
  if (!report_text.ok()) return;
  const auto j = nlohmann::json::parse(*report_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("calibration") || !j["calibration"].is_object() ||
      !j["calibration"].contains("file") || !j["calibration"]["file"].is_string()) {
    return;
  }
  const std::string calib = j["calibration"]["file"].get<std::string>();
  auto c = read_audit_document(calib);
  auto e = read_audit_document(text_path);
  if (!c.ok() || !e.ok()) return;  // the calibration file moved: nothing to compare
  const AuditOptions options;
  const OverlapReport r = audit_overlap({*c}, {*e}, options);
  if (r.fails(options)) {
    TACHYON_LOG_WARN("{} was calibrated on {}, which overlaps -f {}: {}; these scores flatter the quantized model "
                     "(tachyon calib-audit says more)", model, calib, text_path, r.summary(options));
  }
}

Result<std::string> read_text(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return make_error(ErrorCode::kInvalidArgument, "-f {}: is a directory, not a text file", path);
  }
  auto text = read_text_file(path);
  if (!text.ok()) return make_error(text.status().code(), "-f {}", text.status().message());
  if (text->empty()) return make_error(ErrorCode::kInvalidArgument, "-f {}: the text file is empty", path);
  return text;
}

int run_perplexity(const PerplexityArgs& a) {
  if (Status s = validate_before_load(a); !s.ok()) return report(s);
  auto text = read_text(a.text_path);
  if (!text.ok()) return report(text.status());
  warn_if_calibrated_on(a.common.model, a.text_path);

  // The model under test (with --quant / --quant-policy), and under --kl the same model as stored.
  auto model = load(a.common);
  if (!model.ok()) return report(model.status());
  std::optional<LoadedModel> reference;
  if (a.kl) {
    CommonOptions stored = a.common;
    stored.quant.clear();
    stored.quant_policy.clear();
    stored.as_stored = true;  // not the directory's quant_policy.txt either
    auto r = load(stored);
    if (!r.ok()) return report(r.status());
    reference = std::move(r).value();
  }
  if (!model->tokenizer) {
    return report(make_error(ErrorCode::kInvalidArgument, "{} has no tokenizer to read the text with", model->path));
  }
  const ModelConfig& config = model->model->config();
  const int model_context = config.max_position_embeddings;
  const int ctx = a.ctx.value_or(std::min(model_context, kDefaultMaxContext));
  if (ctx > model_context) {
    return report(make_error(ErrorCode::kInvalidArgument, "--ctx {} is longer than the model's context ({} tokens)",
                             ctx, model_context));
  }
  const int stride = a.stride.value_or(std::max(1, ctx / 2));
  if (stride > ctx) {
    return report(make_error(ErrorCode::kInvalidArgument,
                             "--stride {} is longer than the window (--ctx {}): tokens between windows would go "
                             "unscored",
                             stride, ctx));
  }
  EncodeOptions encode;
  if (a.no_bos) encode.add_bos = false;
  const std::vector<int32_t> ids = model->tokenizer->encode(*text, encode);
  if (ids.size() < 2) {
    return report(make_error(ErrorCode::kInvalidArgument,
                             "-f {}: the text is {} token(s); at least 2 are needed to score one", a.text_path,
                             ids.size()));
  }
  const int64_t num_targets = std::min<int64_t>(static_cast<int64_t>(ids.size()) - 1,
                                                a.max_tokens.value_or(std::numeric_limits<int64_t>::max()));
  const std::vector<ScoreWindow> windows = plan_windows(num_targets, ctx, stride);

  const int vocab = config.vocab_size;
  const int64_t chunk_rows =
      std::clamp<int64_t>(static_cast<int64_t>(kMaxLogitBytes / (sizeof(float) * static_cast<size_t>(vocab))), 1, ctx);
  std::optional<DType> kv_dtype;
  if (!a.kv_dtype.empty()) kv_dtype = parse_kv_dtype(a.kv_dtype).value();  // checked before loading
  const KvTierOptions tiers = parse_kv_tiers(a.kv_window, a.kv_history).value();  // checked before loading
  auto runner = WindowRunner::create(*model->model, ctx, kv_dtype, tiers, a.sparse_budget);
  if (!runner.ok()) return report(runner.status());
  std::unique_ptr<WindowRunner> reference_runner;
  if (reference) {
    auto r = WindowRunner::create(*reference->model, ctx);
    if (!r.ok()) return report(r.status());
    reference_runner = std::move(r).value();
  }

  Totals totals;
  std::vector<PositionComparison> rows(static_cast<size_t>(chunk_rows));
  Tensor logits, reference_logits;
  Progress progress(windows.size());
  Timer timer;
  for (size_t w = 0; w < windows.size(); ++w) {
    const ScoreWindow& win = windows[w];
    const std::span<const int32_t> tokens(ids.data() + win.begin, static_cast<size_t>(win.end - win.begin));
    const int context = static_cast<int>(win.score_begin - win.begin);
    if (context > 0) {
      if (Status s = (*runner)->run(tokens.first(static_cast<size_t>(context)), 0, nullptr); !s.ok()) return report(s);
      if (reference_runner) {
        if (Status s = reference_runner->run(tokens.first(static_cast<size_t>(context)), 0, nullptr); !s.ok()) {
          return report(s);
        }
      }
    }
    for (int64_t from = context; from < static_cast<int64_t>(tokens.size()); from += chunk_rows) {
      const int64_t n = std::min<int64_t>(chunk_rows, static_cast<int64_t>(tokens.size()) - from);
      const auto chunk = tokens.subspan(static_cast<size_t>(from), static_cast<size_t>(n));
      if (Status s = (*runner)->run(chunk, static_cast<int>(from), &logits); !s.ok()) return report(s);
      if (reference_runner) {
        if (Status s = reference_runner->run(chunk, static_cast<int>(from), &reference_logits); !s.ok()) return report(s);
      }
      // Input i of the chunk predicts text token win.begin + from + i + 1.
      const int32_t* targets = ids.data() + win.begin + from + 1;
      parallel_for(n, 8, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const std::span<const float> row(logits.data<float>() + i * vocab, static_cast<size_t>(vocab));
          PositionComparison& c = rows[static_cast<size_t>(i)];
          if (reference_runner) {
            const std::span<const float> ref(reference_logits.data<float>() + i * vocab, static_cast<size_t>(vocab));
            c = compare_distributions(ref, row, targets[i]);
          } else {
            c.nll = token_nll(row, targets[i]);
          }
        }
      });
      for (int64_t i = 0; i < n; ++i) {  // in order: the sums do not depend on the thread count
        const PositionComparison& c = rows[static_cast<size_t>(i)];
        if (!std::isfinite(c.nll) || (reference_runner && !(std::isfinite(c.reference_nll) && std::isfinite(c.kl)))) {
          return report(make_error(ErrorCode::kInternal,
                                   "non-finite logits predicting token {} of the text (window {} of {}): nll {}{}",
                                   win.begin + from + i + 1, w + 1, windows.size(), c.nll,
                                   reference_runner ? fmt::format(", reference nll {}, kl {}", c.reference_nll, c.kl)
                                                    : std::string()));
        }
        totals.nll += c.nll;
        if (reference_runner) {
          totals.reference_nll += c.reference_nll;
          totals.same_argmax += c.same_argmax ? 1 : 0;
          totals.kl.push_back(c.kl);
        }
      }
      totals.scored += n;
    }
    progress.update(w + 1, totals, timer.seconds());
  }
  const double seconds = timer.seconds();

  const double count = static_cast<double>(totals.scored);
  const double nll = totals.nll / count;
  json j;
  j["model"] = a.common.model;
  j["text"] = a.text_path;
  j["text_tokens"] = ids.size();
  j["tokens_scored"] = totals.scored;
  j["windows"] = windows.size();
  j["ctx"] = ctx;
  j["stride"] = stride;
  j["nll"] = nll;
  j["perplexity"] = std::exp(nll);
  j["weight_format"] = weight_format(model->model->weights());
  j["weights"] = model->weight_dtypes;
  j["kv_dtype"] = kv_dtype ? dtype_name(*kv_dtype) : "default";
  j["kv_window"] = tiers.window;
  j["kv_history"] = kv_history_name(tiers.history);
  j["sparse_budget"] = a.sparse_budget;
  j["device"] = model->model->device().to_string();
  j["threads"] = num_threads();
  j["seconds"] = seconds;
  j["load_seconds"] = model->load_seconds;
  double kl_mean = 0.0, kl_p99 = 0.0, kl_max = 0.0, top1 = 0.0, reference_nll = 0.0;
  if (reference) {
    for (double k : totals.kl) kl_mean += k;
    kl_mean /= count;
    kl_p99 = quantile(totals.kl, 0.99);
    kl_max = *std::max_element(totals.kl.begin(), totals.kl.end());
    top1 = static_cast<double>(totals.same_argmax) / count;
    reference_nll = totals.reference_nll / count;
    j["reference_weights"] = reference->weight_dtypes;
    j["reference_nll"] = reference_nll;
    j["reference_perplexity"] = std::exp(reference_nll);
    j["kl_mean"] = kl_mean;
    j["kl_p99"] = kl_p99;
    j["kl_max"] = kl_max;
    j["top1_agreement"] = top1;
  }
  if (!a.json_path.empty()) {
    std::ofstream f(a.json_path);
    f << j.dump(2) << "\n";
    if (!f) return report(make_error(ErrorCode::kIo, "cannot write {}", a.json_path));
  }

  const std::string tier_text =
      tiers.active() ? fmt::format(" (window {}, history {}{})", tiers.window, kv_history_name(tiers.history),
                                   a.sparse_budget > 0 ? fmt::format(", sparse budget {}", a.sparse_budget) : "")
                     : "";
  std::printf("model: %s | weights %s | kv %s%s | %s, %d threads\n", a.common.model.c_str(),
              model->weight_dtypes.c_str(), j["kv_dtype"].get<std::string>().c_str(), tier_text.c_str(),
              j["device"].get<std::string>().c_str(), num_threads());
  std::printf("text: %s | %lld of %zu tokens scored in %zu windows of <= %d (stride %d) | %.2f s, %.0f tok/s\n",
              a.text_path.c_str(), static_cast<long long>(totals.scored), ids.size(), windows.size(), ctx, stride,
              seconds, seconds > 0 ? count / seconds : 0.0);
  std::printf("nll: %.6f nats/token\n", nll);
  if (reference) {
    std::printf("vs %s: KL mean %.6f, p99 %.6f, max %.6f nats | top-1 agreement %.2f%% | reference perplexity %.4f\n",
                reference->weight_dtypes.c_str(), kl_mean, kl_p99, kl_max, 100.0 * top1, std::exp(reference_nll));
  }
  std::printf("perplexity: %.4f\n", std::exp(nll));
  return 0;
}

}  // namespace

void add_perplexity(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "score a text: perplexity, and with --kl a quantized model's "
                                                   "distance from the model as stored");
  add_common_options(*cmd, a->common);
  cmd->add_option("-f,--file", a->text_path, "the text to score (UTF-8)")->required();
  cmd->add_option("--ctx", a->ctx, "tokens per window (default: the model's context, at most 2048)");
  cmd->add_option("--stride", a->stride, "tokens between window starts; each window scores only the tokens the "
                                         "previous one did not (default ctx / 2)");
  cmd->add_option("--max-tokens", a->max_tokens, "score only the first T tokens of the text (default: all)");
  cmd->add_option("--kv", a->kv_dtype, "KV cache dtype of the scored run: f32, f16, bf16, int8, fp8 (default: f32 "
                                       "on the CPU, bf16 on a GPU; the --kl reference always keeps the default)");
  add_kv_tier_options(*cmd, a->kv_window, a->kv_history);
  add_sparse_option(*cmd, a->sparse_budget);
  cmd->add_flag("--kl", a->kl, "also load the model as stored and report KL(stored || quantized) per token, top-1 "
                               "agreement and both perplexities (needs --quant or --kv)");
  cmd->add_flag("--no-bos", a->no_bos, "do not add the BOS token in front of the text");
  cmd->add_option("--json", a->json_path, "write every figure to FILE as JSON");
  cmd->callback([a, &run]() { run = [a]() { return run_perplexity(*a); }; });
}

}  // namespace tachyon::cli
