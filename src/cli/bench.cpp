// `tachyon bench`: drives the engine in-process with a workload and reports what a user of a
// serving engine compares: requests/s, output tokens/s, TTFT, TPOT and inter-token latency
// percentiles, KV use, prefix-cache hit rate, preemptions and the scheduler's share of step time.
//
//   --workload latency     one request at a time: prompt P tokens, generate G (--iters runs after
//                          one warm-up); decode speed is also given as weight bytes streamed per s
//   --workload throughput  N requests; prompt and output lengths drawn from a seeded log-normal
//                          (ShareGPT-like spread), arrivals all at once or Poisson at --request-rate,
//                          at most --concurrency in flight, an optional shared prompt prefix
//
// Prompts are random token ids (no tokenizer needed, so synthetic models work), or with
// --prompt-text FILE slices of that text at seeded offsets (speculative decoding needs text that
// means something); EOS is ignored, so every request generates exactly its drawn length.
// With --spec-ngram or --draft-model the engine decodes speculatively; the acceptance figures, the
// draft's and the verify forward's shares of step time and the speed-up against the same requests
// decoded plainly first in the same process (--no-spec-baseline: not run) follow the summary line
// and go to the JSON under "spec". With --slo-ttft and/or --slo-tpot the
// throughput workload also reports goodput: the requests that finished within those targets, their
// share and their rate (JSON "goodput", cli/goodput.h). stdout gets one summary line, --json FILE
// everything (besides the percentiles, "samples": up to 2,000 order statistics each of TTFT, TPOT
// and ITL in seconds; in-process, "kv_timeline": [seconds, KV blocks used, blocks] per step, up
// to 2,000 of them; "spec": acceptance per draft position); a progress bar goes to stderr when
// stderr is a terminal or --progress is given. With --json-schema and the like (cli/constraint_args.h)
// every request decodes under that constraint, and "grammar" says what its token masks cost.
//
// With --url http://HOST:PORT the same workload goes to a running OpenAI-compatible server instead,
// as streaming /v1/completions requests from --client-threads event loops (loadgen/stream_load.h):
// -m is then the model name to send (default: the server's first in /v1/models), prompt ids stay
// below the vocabulary /v1/models reports (or --vocab), and against `tachyon serve
// --stream-timestamps` the delivery latency of every token (engine hand-over to the client's read)
// is reported too. Compared with the in-process run on the same workload, this is what HTTP costs.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/constraint_args.h"
#include "cli/goodput.h"
#include "cli/spec_args.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "report/report.h"
#include "net/http_client.h"
#include "loadgen/stream_load.h"

namespace tachyon::cli {
namespace {

// The layers' linear weights as they run, read from the weights (load-time --quant and checkpoints
// stored quantized alike): "dense", "int8", "int4-gN", or the formats present joined by '+' when a
// checkpoint mixes them (modules an error budget kept 16-bit).
std::string weight_format(const LlamaModel& model) {
  std::vector<std::string> formats;
  for (const LayerWeights& l : model.weights().layers) {
    for (const Weight* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      if (!w->defined()) continue;
      std::string f = "dense";
      if (w->quant && (w->quant->format == QuantFormat::kInt4Group || w->quant->format == QuantFormat::kTernary)) {
        f = std::string(quant_format_name(w->quant->format)) + "-g" + std::to_string(w->quant->group_size);
      } else if (w->quant) {
        f = quant_format_name(w->quant->format);
      }
      if (std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
    }
  }
  if (formats.empty()) return "dense";
  std::string out = formats[0];
  for (size_t i = 1; i < formats.size(); ++i) out += "+" + formats[i];
  return out;
}

using nlohmann::json;

struct BenchArgs {
  CommonOptions common;
  EngineArgs engine;
  SpecArgs spec;
  ConstraintArgs constraint;                 // every request's structured output
  std::shared_ptr<const Grammar> grammar;  // compiled from it (null: none)
  std::string prompt_text;      // file whose tokenized text the prompts are cut from; empty: random ids
  std::string workload = "throughput";
  std::string dtype = "bf16";
  // latency
  int prompt_len = 128;
  int output_len = 128;
  int iters = 3;
  // throughput
  int num_prompts = 64;
  int mean_prompt_len = 256;
  int mean_output_len = 128;
  double len_sigma = 0.5;       // log-normal sigma of both lengths (0: fixed lengths)
  int concurrency = 0;          // most requests in flight; 0 = no limit
  double request_rate = 0.0;    // Poisson arrivals per second; 0 = all at once
  double shared_prefix = 0.0;   // fraction of every prompt that is one common prefix
  SloTargets slo;               // goodput targets in seconds; 0 = none
  uint64_t seed = 0;
  // Sampling of every request (default greedy); request i is seeded with seed + i.
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  double bandwidth_gbps = 0.0;  // for the latency roofline fraction, if known
  // --url: drive a server instead of the engine in-process.
  std::string url;
  int client_threads = 0;  // 0: min(4, cores)
  int vocab = 0;           // prompt ids below this; 0: the server's vocab_size
  double request_timeout = 600.0;
  std::string json_path;
  std::string report_dir;  // --report DIR: DIR/index.html (report/report.h) of this run
  bool progress = false;
  // With speculative decoding: also run the workload plainly in this process first (the speed-up's
  // denominator); --no-spec-baseline skips it.
  bool spec_baseline = true;
};

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  size_t count = 0;
};

// --report DIR: the run's page, DIR/index.html (nothing when `dir` is empty).
Status write_run_report(const std::string& dir, const json& run) {
  if (dir.empty()) return Status::Ok();
  report::ReportOptions options;
  options.title = fmt::format("tachyon bench: {}", run.value("model", std::string("?")));
  TACHYON_ASSIGN_OR_RETURN(std::string page, report::render_report({run}, options));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = dir + "/index.html";
  std::ofstream out(path, std::ios::binary);
  out << page;
  if (ec || !out.flush()) return make_error(ErrorCode::kIo, "--report: cannot write {}", path);
  std::fprintf(stderr, "report: %s\n", path.c_str());
  return Status::Ok();
}

// At most `n` evenly spaced order statistics of `v` (all of it when shorter), ascending: a CDF's
// shape in a bounded size.
std::vector<double> order_statistics(std::vector<double> v, size_t n = 2000) {
  std::sort(v.begin(), v.end());
  if (v.size() <= n) return v;
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = v[i * (v.size() - 1) / (n - 1)];
  return out;
}

// At most `n` of `rows`, evenly spaced, the first and the last kept.
template <typename T>
std::vector<T> thin(const std::vector<T>& rows, size_t n = 2000) {
  if (rows.size() <= n) return rows;
  std::vector<T> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = rows[i * (rows.size() - 1) / (n - 1)];
  return out;
}

// after - before, element by element (before may be shorter).
std::vector<int64_t> difference(const std::vector<int64_t>& after, const std::vector<int64_t>& before) {
  std::vector<int64_t> out = after;
  for (size_t i = 0; i < std::min(out.size(), before.size()); ++i) out[i] -= before[i];
  return out;
}

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  p.count = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  p.max = v.back();
  return p;
}

json to_json_ms(const Percentiles& p) {
  return json{{"mean", p.mean * 1e3}, {"p50", p.p50 * 1e3}, {"p90", p.p90 * 1e3},
              {"p99", p.p99 * 1e3},   {"max", p.max * 1e3},  {"count", p.count}};
}

struct PlannedRequest {
  double arrival = 0.0;  // seconds after the start
  std::vector<int32_t> prompt;
  int output_len = 0;
};

class Progress {
 public:
  Progress(bool enabled, size_t total) : enabled_(enabled), total_(total) {}
  void update(size_t done, int64_t tokens, double seconds) {
    if (!enabled_ || seconds < 2.0 || (seconds - last_ < 0.25 && done < total_)) return;
    last_ = seconds;
    const int width = 30;
    const int filled = static_cast<int>(static_cast<double>(width) * static_cast<double>(done) /
                                        static_cast<double>(std::max<size_t>(total_, 1)));
    std::fprintf(stderr, "\r[%.*s%.*s] %zu/%zu requests, %.1f s, %.1f output tok/s ", filled,
                 "==============================", width - filled, "                              ", done, total_,
                 seconds, seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0);
    shown_ = true;
  }
  ~Progress() {
    if (shown_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  size_t total_;
  double last_ = -1.0;
  bool shown_ = false;
};

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int len, int vocab) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  // Skip the first ids: special tokens live there in most vocabularies.
  const int lo = std::min(vocab - 1, 16);
  std::uniform_int_distribution<int32_t> d(lo, vocab - 1);
  for (auto& t : p) t = d(rng);
  return p;
}

// `len` consecutive tokens of `text` from a seeded offset, or random ids when there is no text.
std::vector<int32_t> make_prompt(std::mt19937_64& rng, int len, int vocab, const std::vector<int32_t>& text) {
  if (text.empty()) return random_prompt(rng, len, vocab);
  std::vector<int32_t> p;
  p.reserve(static_cast<size_t>(len));
  size_t at = static_cast<size_t>(rng() % text.size());
  while (p.size() < static_cast<size_t>(len)) {
    p.push_back(text[at]);
    at = (at + 1) % text.size();
  }
  return p;
}

std::vector<PlannedRequest> plan_latency(const BenchArgs& a, int vocab, const std::vector<int32_t>& text) {
  std::mt19937_64 rng(a.seed);
  std::vector<PlannedRequest> plan;
  for (int i = 0; i < a.iters + 1; ++i) {  // the first one warms up
    PlannedRequest r;
    r.prompt = make_prompt(rng, a.prompt_len, vocab, text);
    r.output_len = a.output_len;
    plan.push_back(std::move(r));
  }
  return plan;
}

std::vector<PlannedRequest> plan_throughput(const BenchArgs& a, int vocab, int max_model_len,
                                            const std::vector<int32_t>& text) {
  std::mt19937_64 rng(a.seed);
  // Log-normal with the requested mean: mu = ln(mean) - sigma^2 / 2.
  const auto draw = [&](int mean) {
    if (a.len_sigma <= 0.0) return mean;
    std::lognormal_distribution<double> d(std::log(static_cast<double>(mean)) - a.len_sigma * a.len_sigma / 2,
                                          a.len_sigma);
    return std::max(1, static_cast<int>(std::lround(d(rng))));
  };
  const int prefix_len = static_cast<int>(a.shared_prefix * a.mean_prompt_len);
  const std::vector<int32_t> prefix = random_prompt(rng, prefix_len, vocab);
  std::exponential_distribution<double> gap(a.request_rate > 0 ? a.request_rate : 1.0);
  std::vector<PlannedRequest> plan;
  double t = 0.0;
  for (int i = 0; i < a.num_prompts; ++i) {
    PlannedRequest r;
    int p = std::max(draw(a.mean_prompt_len), prefix_len + 1);
    int o = draw(a.mean_output_len);
    p = std::min(p, max_model_len - 2);
    o = std::min(o, max_model_len - p);  // prompt + output within the context
    r.prompt = prefix;
    auto rest = make_prompt(rng, p - static_cast<int>(prefix.size()), vocab, text);
    r.prompt.insert(r.prompt.end(), rest.begin(), rest.end());
    r.output_len = o;
    if (a.request_rate > 0) t += gap(rng);
    r.arrival = t;
    plan.push_back(std::move(r));
  }
  return plan;
}

// What both the in-process and the --url runs report the same way.
json sampling_json(const BenchArgs& a) {
  return {{"temperature", a.temperature}, {"top_p", a.top_p}, {"top_k", a.top_k}, {"min_p", a.min_p},
          {"repetition_penalty", a.repetition_penalty}};
}

json workload_json(const BenchArgs& a, bool latency, size_t measured, int concurrency) {
  return {{"num_requests", measured},
          {"prompt_len", latency ? a.prompt_len : a.mean_prompt_len},
          {"output_len", latency ? a.output_len : a.mean_output_len},
          {"len_sigma", latency ? 0.0 : a.len_sigma},
          {"concurrency", concurrency},
          {"request_rate", a.request_rate},
          {"shared_prefix", a.shared_prefix},
          {"seed", a.seed}};
}

void put_latencies(json& j, const Percentiles& ttft, const Percentiles& tpot, const Percentiles& itl,
                   const Percentiles& e2e) {
  j["ttft_ms"] = to_json_ms(ttft);
  j["tpot_ms"] = to_json_ms(tpot);
  j["itl_ms"] = to_json_ms(itl);
  j["e2e_ms"] = to_json_ms(e2e);
}

// The goodput figures (when targets were given) into j; returns them for the summary line.
Goodput put_goodput(json& j, const std::vector<RequestLatency>& latencies, const SloTargets& slo, double duration) {
  const Goodput goodput = compute_goodput(latencies, slo, duration);
  if (slo.any()) {
    j["goodput"] = {{"slo_ttft_s", slo.ttft > 0 ? json(slo.ttft) : json(nullptr)},
                    {"slo_tpot_s", slo.tpot > 0 ? json(slo.tpot) : json(nullptr)},
                    {"requests", goodput.requests},
                    {"requests_meeting", goodput.requests_meeting},
                    {"fraction", goodput.fraction},
                    {"requests_per_s", goodput.requests_per_s}};
  }
  return goodput;
}

std::string goodput_summary(const Goodput& goodput, const SloTargets& slo) {
  if (!slo.any()) return {};
  return fmt::format(" | goodput {:.2f} req/s ({:.0f}% within {})", goodput.requests_per_s, 100.0 * goodput.fraction,
                     describe_slo(slo));
}

Status write_json(const std::string& path, const json& j) {
  if (path.empty()) return Status::Ok();
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) return make_error(ErrorCode::kIo, "cannot write {}", path);
  return Status::Ok();
}

// --url: the workload through a server's streaming API.
int run_bench_http(BenchArgs& a, bool latency) {
  auto url = net::parse_http_url(a.url);
  if (!url.ok()) return report(url.status());
  if (!a.prompt_text.empty()) {
    return report(make_error(ErrorCode::kInvalidArgument, "--prompt-text needs the model's tokenizer: not with --url"));
  }
  if (a.client_threads < 0 || a.vocab < 0 || !(a.request_timeout > 0)) {
    return report(make_error(ErrorCode::kInvalidArgument,
                             "--client-threads and --vocab must not be negative, --request-timeout positive"));
  }
  auto models = net::http_fetch(*url, "GET", "/v1/models", "", 1 << 20, net::Millis(10'000));
  if (!models.ok()) return report(models.status().with_context("GET /v1/models"));
  const json list = json::parse(models->second, nullptr, false);
  if (models->first != 200 || list.is_discarded() || !list.contains("data") || !list["data"].is_array() ||
      list["data"].empty() || !list["data"][0].is_object()) {
    return report(make_error(ErrorCode::kIo, "GET {}/v1/models answered {}: {:.200}", url->to_string(), models->first,
                             models->second));
  }
  const json& card = list["data"][0];
  const std::string model = !a.common.model.empty() ? a.common.model : card.value("id", std::string());
  const int vocab = a.vocab > 0 ? a.vocab : card.value("vocab_size", 0);
  const int max_model_len = card.value("max_model_len", 0);
  if (vocab < 2) {
    return report(make_error(ErrorCode::kInvalidArgument,
                             "{} does not report vocab_size in /v1/models: give --vocab", url->to_string()));
  }
  if (max_model_len < 3) {
    return report(make_error(ErrorCode::kInvalidArgument, "{} does not report max_model_len in /v1/models",
                             url->to_string()));
  }
  if (latency && a.prompt_len + a.output_len > max_model_len) {
    return report(make_error(ErrorCode::kInvalidArgument, "prompt {} + output {} tokens exceed max_model_len {}",
                             a.prompt_len, a.output_len, max_model_len));
  }
  const std::vector<PlannedRequest> plan =
      latency ? plan_latency(a, vocab, {}) : plan_throughput(a, vocab, max_model_len, {});

  loadgen::StreamLoadOptions options;
  options.url = *url;
  options.model = model;
  options.concurrency = latency ? 1 : a.concurrency;
  options.threads = latency ? 1
                    : a.client_threads > 0
                        ? a.client_threads
                        : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  options.request_timeout_s = a.request_timeout;
  options.temperature = a.temperature;
  options.top_p = a.top_p;
  options.top_k = a.top_k;
  options.min_p = a.min_p;
  options.repetition_penalty = a.repetition_penalty;
  std::vector<loadgen::StreamLoadRequest> requests(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    requests[i].arrival = plan[i].arrival;
    requests[i].prompt = plan[i].prompt;
    requests[i].max_tokens = plan[i].output_len;
    requests[i].seed = a.seed + i;
  }
  auto results = loadgen::run_stream_load(options, requests);
  if (!results.ok()) return report(results.status());

  const size_t measured_from = latency ? 1 : 0;  // the latency workload's first request warms up
  std::vector<double> ttft, tpot, itl, e2e, delivery;
  std::vector<RequestLatency> latencies;
  int64_t output_tokens = 0, prompt_tokens = 0, usage_mismatches = 0;
  size_t failed = 0;
  std::string first_error;
  double begin = latency && !results->empty() ? (*results)[0].finished : 0.0, end = begin;
  for (size_t i = measured_from; i < results->size(); ++i) {
    const loadgen::StreamLoadResult& r = (*results)[i];
    end = std::max(end, r.ok ? r.finished : r.sent);
    if (!r.ok) {
      if (failed++ == 0) first_error = fmt::format("request {}: {}", i, r.error);
      latencies.emplace_back();  // a failed request meets no target
      continue;
    }
    RequestLatency& l = latencies.emplace_back();
    l.output_tokens = static_cast<int64_t>(r.token_times.size());
    l.ttft = r.first_token - r.sent;
    ttft.push_back(l.ttft);
    e2e.push_back(r.finished - r.sent);
    if (r.token_times.size() > 1) {
      l.tpot = (r.token_times.back() - r.token_times.front()) / static_cast<double>(r.token_times.size() - 1);
      tpot.push_back(l.tpot);
      for (size_t k = 1; k < r.token_times.size(); ++k) itl.push_back(r.token_times[k] - r.token_times[k - 1]);
    }
    delivery.insert(delivery.end(), r.delivery.begin(), r.delivery.end());
    output_tokens += l.output_tokens;
    prompt_tokens += r.prompt_tokens;
    if (r.completion_tokens != l.output_tokens) ++usage_mismatches;
  }
  const double duration = std::max(end - begin, 1e-9);
  const size_t measured = results->size() - measured_from;
  const Percentiles p_ttft = percentiles(ttft), p_tpot = percentiles(tpot), p_itl = percentiles(itl),
                    p_e2e = percentiles(e2e), p_delivery = percentiles(delivery);
  json j;
  j["bench"] = "http";
  j["workload"] = latency ? "latency" : "throughput";
  j["url"] = url->to_string();
  j["model"] = model;
  j["sampling"] = sampling_json(a);
  j["client_threads"] = options.threads;
  j["config"] = workload_json(a, latency, measured, options.concurrency);
  j["config"]["vocab"] = vocab;
  j["config"]["max_model_len"] = max_model_len;
  j["duration_s"] = duration;
  j["requests_failed"] = failed;
  if (failed > 0) j["first_error"] = first_error;
  j["requests_per_s"] = static_cast<double>(measured - failed) / duration;
  j["output_tokens"] = output_tokens;
  j["prompt_tokens"] = prompt_tokens;  // as the server's usage counted them
  j["usage_mismatches"] = usage_mismatches;  // requests whose usage disagrees with the tokens streamed
  j["output_tokens_per_s"] = static_cast<double>(output_tokens) / duration;
  j["total_tokens_per_s"] = static_cast<double>(output_tokens + prompt_tokens) / duration;
  put_latencies(j, p_ttft, p_tpot, p_itl, p_e2e);
  j["samples"] = {{"ttft_s", order_statistics(ttft)}, {"tpot_s", order_statistics(tpot)},
                  {"itl_s", order_statistics(itl)}};
  if (!delivery.empty()) j["delivery_ms"] = to_json_ms(p_delivery);
  const Goodput goodput = put_goodput(j, latencies, a.slo, duration);
  if (latency) j["decode_tokens_per_s"] = p_tpot.mean > 0 ? 1.0 / p_tpot.mean : 0.0;
  if (Status written = write_json(a.json_path, j); !written.ok()) return report(written);
  if (Status page = write_run_report(a.report_dir, j); !page.ok()) return report(page);
  const std::string delivered =
      delivery.empty() ? std::string()
                       : fmt::format(" | delivery p50 {:.2f} ms p99 {:.2f} ms max {:.2f} ms", p_delivery.p50 * 1e3,
                                     p_delivery.p99 * 1e3, p_delivery.max * 1e3);
  const std::string failures =
      failed == 0 ? std::string() : fmt::format(" | {} FAILED (first: {})", failed, first_error);
  if (latency) {
    std::printf("http latency: prompt %d, output %d | TTFT %.1f ms | TPOT %.2f ms (%.2f tok/s) | e2e %.1f ms%s%s\n",
                a.prompt_len, a.output_len, p_ttft.mean * 1e3, p_tpot.mean * 1e3,
                p_tpot.mean > 0 ? 1.0 / p_tpot.mean : 0.0, p_e2e.mean * 1e3, delivered.c_str(), failures.c_str());
  } else {
    std::printf("http throughput: %zu requests in %.1f s | %.2f req/s | %.1f output tok/s | TTFT p50 %.0f ms p99 %.0f "
                "ms | TPOT p50 %.1f ms | ITL p99 %.1f ms%s%s%s\n",
                measured, duration, static_cast<double>(measured - failed) / duration,
                static_cast<double>(output_tokens) / duration, p_ttft.p50 * 1e3, p_ttft.p99 * 1e3, p_tpot.p50 * 1e3,
                p_itl.p99 * 1e3, delivered.c_str(),
                goodput_summary(goodput, a.slo).c_str(),
                failures.c_str());
  }
  return failed == 0 ? 0 : 1;
}

// One pass of a planned workload through an engine: the measured requests' latencies and the
// engine's stats around them (the latency workload's first request warms up and is not counted).
struct Measured {
  std::vector<double> ttft, tpot, itl, e2e;
  std::vector<RequestLatency> latencies;  // per measured request, for goodput
  int64_t output_tokens = 0, prompt_tokens = 0;
  double duration = 0.0;
  EngineStats before{}, after{};
  size_t measured = 0;
  // Per engine step of the measured part: seconds since it began, KV blocks used and in all.
  std::vector<std::array<double, 3>> kv_timeline;
  // What a speed-up compares: decode tok/s (latency: 1 / mean TPOT) or output tok/s (throughput).
  double speed(bool latency) const;
};

double Measured::speed(bool latency) const {
  if (!latency) return duration > 0 ? static_cast<double>(output_tokens) / duration : 0.0;
  const double mean_tpot = percentiles(tpot).mean;
  return mean_tpot > 0 ? 1.0 / mean_tpot : 0.0;
}

Status run_plan(Engine& e, const std::vector<PlannedRequest>& plan, const BenchArgs& a, bool latency,
                Progress& progress, Measured& out) {
  out = Measured{};
  size_t next = 0, done = 0, in_flight = 0;
  const size_t measured_from = latency ? 1 : 0;  // the latency workload's first request warms up
  const bool speculating = !e.stats().spec.proposer.empty();
  const size_t limit = latency ? 1 : (a.concurrency > 0 ? static_cast<size_t>(a.concurrency) : plan.size());
  double start = e.now();
  Timer wall;
  while (done < plan.size()) {
    const double now = e.now() - start;
    while (next < plan.size() && in_flight < limit && plan[next].arrival <= now) {
      GenerationParams gp;
      gp.sampling.temperature = a.temperature;
      gp.sampling.top_p = a.top_p;
      gp.sampling.top_k = a.top_k;
      gp.sampling.min_p = a.min_p;
      gp.sampling.repetition_penalty = a.repetition_penalty;
      gp.sampling.seed = a.seed + next;
      gp.max_tokens = plan[next].output_len;
      gp.ignore_eos = true;
      gp.detokenize = false;
      gp.grammar = a.grammar;
      if (speculating) gp.draft = a.spec.request_draft;  // the plain baseline runs no draft
      TACHYON_RETURN_IF_ERROR(e.add_request(plan[next].prompt, gp).status());
      ++next;
      ++in_flight;
    }
    if (!e.has_unfinished()) {
      if (next < plan.size()) {
        std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, plan[next].arrival - now)));
      }
      continue;
    }
    TACHYON_ASSIGN_OR_RETURN(const std::vector<RequestOutput> outputs, e.step());
    announce_device(a.common, e.model().device());
    for (const RequestOutput& o : outputs) {
      if (!o.finished) continue;
      --in_flight;
      if (o.finish_reason == FinishReason::kError) return o.error;
      const size_t index = done++;
      if (latency && index == 0) {  // warm-up done: measure from here
        out.before = e.stats(/*fresh_experts=*/true);
        start = e.now();
        wall.reset();
        continue;
      }
      const RequestTiming& t = o.timing;
      RequestLatency& r = out.latencies.emplace_back();
      r.ttft = t.first_token - t.arrival;
      r.output_tokens = static_cast<int64_t>(t.token_times.size());
      out.ttft.push_back(r.ttft);
      out.e2e.push_back(t.finished - t.arrival);
      if (t.token_times.size() > 1) {
        r.tpot = (t.token_times.back() - t.token_times.front()) / static_cast<double>(t.token_times.size() - 1);
        out.tpot.push_back(r.tpot);
        for (size_t i = 1; i < t.token_times.size(); ++i) out.itl.push_back(t.token_times[i] - t.token_times[i - 1]);
      }
      out.output_tokens += o.num_generated_tokens;
      out.prompt_tokens += o.num_prompt_tokens;
    }
    progress.update(done - std::min(done, measured_from), out.output_tokens, wall.seconds());
    if (done > measured_from || !latency) {
      const EngineStats now = e.stats();
      out.kv_timeline.push_back({e.now() - start, static_cast<double>(now.kv_blocks_used),
                                 static_cast<double>(now.kv_blocks_total)});
    }
  }
  out.duration = wall.seconds();
  out.after = e.stats(/*fresh_experts=*/true);
  out.measured = plan.size() - measured_from;
  return Status::Ok();
}

int run_bench(BenchArgs& a) {
  if (a.workload != "latency" && a.workload != "throughput") {
    return report(make_error(ErrorCode::kInvalidArgument, "--workload '{}': latency or throughput", a.workload));
  }
  if (a.prompt_len < 1 || a.output_len < 1 || a.num_prompts < 1 || a.mean_prompt_len < 1 || a.mean_output_len < 1 ||
      a.iters < 1 || a.len_sigma < 0 || a.len_sigma > 3 || a.request_rate < 0 || a.concurrency < 0 ||
      !(a.shared_prefix >= 0 && a.shared_prefix < 1)) {
    return report(make_error(ErrorCode::kInvalidArgument,
                             "lengths, --num-prompts and --iters must be positive, --len-sigma in [0, 3], "
                             "--shared-prefix in [0, 1), rates and concurrency not negative"));
  }
  if (!(a.slo.ttft >= 0) || !(a.slo.tpot >= 0)) {
    return report(make_error(ErrorCode::kInvalidArgument, "--slo-ttft {} and --slo-tpot {} must not be negative",
                             a.slo.ttft, a.slo.tpot));
  }
  if (a.workload == "latency" && a.slo.any()) {
    return report(make_error(ErrorCode::kInvalidArgument, "--slo-ttft and --slo-tpot apply to --workload throughput"));
  }
  if (!a.url.empty()) {
    const ConstraintArgs& c = a.constraint;
    if (!c.json_schema_file.empty() || c.json_object || !c.regex.empty() || !c.grammar_file.empty() ||
        !c.choices.empty()) {
      return report(make_error(ErrorCode::kInvalidArgument,
                               "structured output flags apply to the in-process engine, not to --url"));
    }
    return run_bench_http(a, a.workload == "latency");
  }
  if (a.common.model.empty()) return report(make_error(ErrorCode::kInvalidArgument, "-m MODEL is required"));
  const auto dtype = parse_dtype(a.dtype);
  if (!dtype) return report(make_error(ErrorCode::kInvalidArgument, "--dtype '{}' is not a dtype", a.dtype));
  auto eo = engine_options(a.engine);
  if (!eo.ok()) return report(eo.status());
  auto grammar = constraint_grammar(a.constraint);
  if (!grammar.ok()) return report(grammar.status());
  a.grammar = *grammar;
  auto loaded = load(a.common, *dtype);
  if (!loaded.ok()) return report(loaded.status());
  LoadedModel& m = *loaded;
  if (Status vocab = apply_constraint_vocabulary(m, a.grammar != nullptr, *eo); !vocab.ok()) return report(vocab);
  SpecModels drafts;  // --draft-model, alive as long as the engine
  Status spec = apply_spec_options(a.spec, m, drafts, *eo);
  if (!spec.ok()) return report(spec);
  std::vector<int32_t> text;
  if (!a.prompt_text.empty()) {
    if (!m.tokenizer) {
      return report(make_error(ErrorCode::kInvalidArgument, "{} has no tokenizer: --prompt-text needs one", m.path));
    }
    auto contents = read_text_file(a.prompt_text);
    if (!contents.ok()) return report(contents.status());
    EncodeOptions enc;
    enc.add_bos = false;
    text = m.tokenizer->encode(*contents, enc);
    if (text.empty()) return report(make_error(ErrorCode::kInvalidArgument, "--prompt-text {} is empty", a.prompt_text));
  }
  auto engine = Engine::create(*m.model, nullptr, {}, *eo);
  if (!engine.ok()) return report(engine.status());
  const int vocab = m.model->config().vocab_size;
  const bool latency = a.workload == "latency";
  const int max_model_len = (*engine)->max_model_len();
  if (latency && a.prompt_len + a.output_len > max_model_len) {
    return report(make_error(ErrorCode::kInvalidArgument, "prompt {} + output {} tokens exceed max_model_len {}",
                             a.prompt_len, a.output_len, max_model_len));
  }
  std::vector<PlannedRequest> plan =
      latency ? plan_latency(a, vocab, text) : plan_throughput(a, vocab, max_model_len, text);
  Measured plain;  // the same requests decoded plainly, where speculative decoding is measured
  if (eo->spec.method != SpecMethod::kNone && a.spec_baseline) {
    // By an engine of its own, while the speculative one is gone (each takes its share of memory).
    engine->reset();
    EngineOptions plain_options = *eo;
    plain_options.spec = SpecDecodeOptions{};
    auto plain_engine = Engine::create(*m.model, nullptr, {}, plain_options);
    if (!plain_engine.ok()) return report(plain_engine.status());
    Progress quiet(false, 0);
    if (Status s = run_plan(**plain_engine, plan, a, latency, quiet, plain); !s.ok()) return report(s);
    plain_engine->reset();
    engine = Engine::create(*m.model, nullptr, {}, *eo);
    if (!engine.ok()) return report(engine.status());
  }
  Engine& e = **engine;
  Progress progress(a.progress || isatty(STDERR_FILENO) != 0, plan.size() - (latency ? 1 : 0));
  Measured run;
  if (Status s = run_plan(e, plan, a, latency, progress, run); !s.ok()) return report(s);
  const std::vector<double>&ttft = run.ttft, &tpot = run.tpot, &itl = run.itl, &e2e = run.e2e;
  const std::vector<RequestLatency>& latencies = run.latencies;
  const int64_t output_tokens = run.output_tokens, prompt_tokens = run.prompt_tokens;
  const double duration = run.duration;
  const EngineStats &before = run.before, &after = run.after;
  const size_t measured = run.measured;

  const Percentiles p_ttft = percentiles(ttft), p_tpot = percentiles(tpot), p_itl = percentiles(itl),
                    p_e2e = percentiles(e2e);
  const int64_t steps = after.num_steps - before.num_steps;
  const double sched = after.schedule_seconds - before.schedule_seconds;
  const double fwd = after.forward_seconds - before.forward_seconds;
  const double samp = after.sample_seconds - before.sample_seconds;
  const double step_total = sched + fwd + samp;
  const double weight_bytes =
      static_cast<double>(m.model->weights().decode_bytes_per_token(m.model->config().num_experts_per_tok));
  const double decode_tok_s = p_tpot.mean > 0 ? 1.0 / p_tpot.mean : 0.0;

  json j;
  j["bench"] = "engine";
  j["workload"] = a.workload;
  j["sampling"] = sampling_json(a);
  j["model"] = a.common.model;
  j["weights"] = m.weight_dtypes;
  j["weight_format"] = weight_format(*m.model);
  j["device"] = m.model->device().to_string();
  j["threads"] = num_threads();
  j["config"] = workload_json(a, latency, measured, a.concurrency);
  j["config"].update({{"max_batched_tokens", eo->scheduler.max_batched_tokens},
                 {"max_seqs", eo->scheduler.max_seqs},
                 {"chunked_prefill", eo->scheduler.chunked_prefill},
                 {"prefix_caching", eo->kv.prefix_caching},
                 {"block_size", eo->kv.block_size},
                 {"kv_dtype", dtype_name(e.kv_cache().config().dtype)},
                 {"kv_window", e.kv_config().tiers.window},
                 {"kv_history", kv_history_name(e.kv_config().tiers.history)},
                 {"kv_blocks", after.kv_blocks_total},
                 {"kv_history_blocks", after.kv_history_blocks_total},
                 {"sparse_budget", eo->sparse_budget},
                 {"kv_tokens", static_cast<int64_t>(after.kv_blocks_total) * eo->kv.block_size},
                 {"kv_cache_bytes", after.kv_cache_bytes},
                 {"max_model_len", e.max_model_len()}});
  j["duration_s"] = duration;
  j["requests_per_s"] = static_cast<double>(measured) / duration;
  j["output_tokens"] = output_tokens;
  j["prompt_tokens"] = prompt_tokens;
  j["output_tokens_per_s"] = static_cast<double>(output_tokens) / duration;
  j["total_tokens_per_s"] = static_cast<double>(output_tokens + prompt_tokens) / duration;
  put_latencies(j, p_ttft, p_tpot, p_itl, p_e2e);
  j["samples"] = {{"ttft_s", order_statistics(ttft)}, {"tpot_s", order_statistics(tpot)},
                  {"itl_s", order_statistics(itl)}};
  j["kv_timeline"] = thin(run.kv_timeline);
  j["kv_peak_blocks"] = after.kv_blocks_used_peak;
  j["kv_peak_fraction"] = after.kv_blocks_total > 0 ? static_cast<double>(after.kv_blocks_used_peak) / after.kv_blocks_total : 0.0;
  j["prefix_hit_rate"] = (after.prefix.query_tokens - before.prefix.query_tokens) > 0
                             ? static_cast<double>(after.prefix.hit_tokens - before.prefix.hit_tokens) /
                                   static_cast<double>(after.prefix.query_tokens - before.prefix.query_tokens)
                             : 0.0;
  j["preemptions"] = after.num_preemptions - before.num_preemptions;
  j["steps"] = steps;
  j["step_ms_mean"] = steps > 0 ? step_total / static_cast<double>(steps) * 1e3 : 0.0;
  j["schedule_fraction"] = step_total > 0 ? sched / step_total : 0.0;  // scheduling + batch planning
  j["sample_fraction"] = step_total > 0 ? samp / step_total : 0.0;
  j["forward_fraction"] = step_total > 0 ? fwd / step_total : 0.0;
  j["weight_bytes_per_token"] = weight_bytes;
  if (eo->spec.method != SpecMethod::kNone) {
    const SpecStats& s1 = after.spec;
    const SpecStats& s0 = before.spec;
    const int64_t proposed = s1.num_proposed - s0.num_proposed, accepted = s1.num_accepted - s0.num_accepted;
    const int64_t verify_steps = s1.num_verify_steps - s0.num_verify_steps;
    j["spec"] = {{"proposer", s1.proposer},
                 {"draft_model", fmt::format("{}", fmt::join(a.spec.draft_models, ","))},
                 {"k", eo->spec.k},
                 {"k_max", eo->spec.k_max},
                 {"tree_nodes", eo->spec.tree_nodes},
                 {"proposed", proposed},
                 {"accepted", accepted},
                 {"acceptance_rate", proposed > 0 ? static_cast<double>(accepted) / static_cast<double>(proposed) : 0.0},
                 {"verify_steps", verify_steps},
                 {"mean_accepted_length",
                  verify_steps > 0 ? static_cast<double>(accepted) / static_cast<double>(verify_steps) : 0.0},
                 {"propose_seconds", s1.propose_seconds - s0.propose_seconds},
                 {"tree_steps", s1.num_tree_steps - s0.num_tree_steps},
                 {"gated_steps", s1.num_gated_steps - s0.num_gated_steps},
                 {"proposed_by_position", difference(s1.proposed_by_position, s0.proposed_by_position)},
                 {"accepted_by_position", difference(s1.accepted_by_position, s0.accepted_by_position)}};
    // Per proposer (named drafts) and per kind of prompt (with a classifier), over this run.
    const auto breakdown = [](const std::map<std::string, SpecCounts>& after_by,
                              const std::map<std::string, SpecCounts>& before_by) {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& [label, c1] : after_by) {
        SpecCounts c = c1;
        if (auto b = before_by.find(label); b != before_by.end()) {
          c.num_verify_steps -= b->second.num_verify_steps;
          c.num_proposed -= b->second.num_proposed;
          c.num_accepted -= b->second.num_accepted;
          c.num_emitted -= b->second.num_emitted;
          c.propose_seconds -= b->second.propose_seconds;
        }
        out[label] = {{"verify_steps", c.num_verify_steps}, {"proposed", c.num_proposed},
                      {"accepted", c.num_accepted},         {"acceptance_rate", c.acceptance_rate()},
                      {"mean_accepted_length", c.mean_accepted_length()},
                      {"tokens_per_verify_step", c.tokens_per_step()}};
        if (c.propose_seconds > 0) out[label]["propose_seconds"] = c.propose_seconds;
      }
      return out;
    };
    j["spec"]["by_proposer"] = breakdown(s1.by_proposer, s0.by_proposer);
    if (!s1.by_kind.empty()) j["spec"]["by_kind"] = breakdown(s1.by_kind, s0.by_kind);
    // Where a step's time goes: the draft (proposing) and the target's verifying forward, as
    // shares of proposing + scheduling + forward + sampling.
    const double propose = s1.propose_seconds - s0.propose_seconds, spec_total = step_total + propose;
    j["spec"]["draft_time_fraction"] = spec_total > 0 ? propose / spec_total : 0.0;
    j["spec"]["verify_time_fraction"] = spec_total > 0 ? fwd / spec_total : 0.0;
    if (a.spec_baseline) {
      const double plain_speed = plain.speed(latency), spec_speed = run.speed(latency);
      j["spec"]["plain"] = {{latency ? "decode_tokens_per_s" : "output_tokens_per_s", plain_speed},
                            {"tpot_ms_mean", percentiles(plain.tpot).mean * 1e3}};
      j["spec"]["speedup"] = plain_speed > 0 ? spec_speed / plain_speed : 0.0;
    }
  }
  if (m.model->config().is_moe()) {
    // The experts a step reads: each sparse layer's distinct chosen experts (measured, prefill
    // steps included), whose bytes join the rest of the weights'.
    const ModelConfig& c = m.model->config();
    const ModelWeights& w = m.model->weights();
    const int64_t calls = after.moe_layer_calls - before.moe_layer_calls;
    const double distinct =
        calls > 0 ? static_cast<double>(after.moe_distinct_experts - before.moe_distinct_experts) / calls : 0.0;
    const double rest = static_cast<double>(w.decode_bytes_per_token(0));
    const double one_expert = static_cast<double>(w.decode_bytes_per_token(1)) - rest;  // in every sparse layer
    j["moe"] = {{"experts", c.num_experts},
                {"top_k", c.num_experts_per_tok},
                {"distinct_experts_per_layer_step", distinct},
                {"load_imbalance", after.moe_load_imbalance},
                {"layer_calls", calls},
                {"non_expert_bytes", rest},
                {"expert_bytes_all_layers", one_expert},
                {"step_bytes_at_distinct", rest + distinct * one_expert}};
  }
  if (a.grammar) {
    // Structured output: the host's time computing token masks, per step that masked any row (on
    // a GPU it runs beside the forward; the step time against a run without a grammar shows what
    // it costs).
    const int64_t mask_steps = after.grammar_mask_steps - before.grammar_mask_steps;
    const double mask_s = after.grammar_mask_seconds - before.grammar_mask_seconds;
    j["grammar"] = {{"mask_steps", mask_steps},
                    {"masked_rows", after.grammar_masked_rows - before.grammar_masked_rows},
                    {"mask_ms_per_step", mask_steps > 0 ? mask_s / static_cast<double>(mask_steps) * 1e3 : 0.0},
                    {"mask_fraction_of_step", step_total > 0 ? mask_s / step_total : 0.0},
                    {"vocab_source", m.tokenizer ? "tokenizer" : "synthetic"}};
  }
  if (!a.prompt_text.empty()) j["prompt_text"] = a.prompt_text;
  const Goodput goodput = put_goodput(j, latencies, a.slo, duration);
  if (latency) {
    j["decode_tokens_per_s"] = decode_tok_s;
    j["prefill_tokens_per_s"] = p_ttft.mean > 0 ? a.prompt_len / p_ttft.mean : 0.0;
    j["decode_weight_gbps"] = decode_tok_s * weight_bytes / 1e9;
    if (a.bandwidth_gbps > 0) j["decode_fraction_of_roofline"] = decode_tok_s * weight_bytes / 1e9 / a.bandwidth_gbps;
  }
  if (Status written = write_json(a.json_path, j); !written.ok()) return report(written);
  if (Status page = write_run_report(a.report_dir, j); !page.ok()) return report(page);
  if (latency) {
    std::printf("latency: prompt %d, output %d | TTFT %.1f ms | TPOT %.2f ms (%.2f tok/s, %.2f GB/s of weights%s) | "
                "e2e %.1f ms\n",
                a.prompt_len, a.output_len, p_ttft.mean * 1e3, p_tpot.mean * 1e3, decode_tok_s,
                decode_tok_s * weight_bytes / 1e9,
                a.bandwidth_gbps > 0
                    ? fmt::format(", {:.0f}% of {:.1f} GB/s", 100.0 * decode_tok_s * weight_bytes / 1e9 / a.bandwidth_gbps,
                                  a.bandwidth_gbps)
                          .c_str()
                    : "",
                p_e2e.mean * 1e3);
  } else {
    std::printf("throughput: %zu requests in %.1f s | %.2f req/s | %.1f output tok/s | TTFT p50 %.0f ms p99 %.0f ms | "
                "TPOT p50 %.1f ms | ITL p99 %.1f ms | peak KV %.0f%% | prefix hits %.0f%% | %lld preemptions | "
                "scheduler %.2f%% of step time%s\n",
                measured, duration, static_cast<double>(measured) / duration,
                static_cast<double>(output_tokens) / duration, p_ttft.p50 * 1e3, p_ttft.p99 * 1e3, p_tpot.p50 * 1e3,
                p_itl.p99 * 1e3, 100.0 * j["kv_peak_fraction"].get<double>(), 100.0 * j["prefix_hit_rate"].get<double>(),
                static_cast<long long>(j["preemptions"].get<int64_t>()), 100.0 * j["schedule_fraction"].get<double>(),
                goodput_summary(goodput, a.slo).c_str());
  }
  if (j.contains("grammar")) {
    const json& g = j["grammar"];
    std::printf("structured output: %.3f ms of token masks per step (%.1f%% of step time, %lld rows over %lld steps, "
                "%s vocabulary)\n",
                g["mask_ms_per_step"].get<double>(), 100.0 * g["mask_fraction_of_step"].get<double>(),
                static_cast<long long>(g["masked_rows"].get<int64_t>()),
                static_cast<long long>(g["mask_steps"].get<int64_t>()), g["vocab_source"].get<std::string>().c_str());
  }
  if (j.contains("moe")) {
    const json& x = j["moe"];
    std::printf("experts (%d, top %d): %.1f distinct per layer-step (over %lld layer calls), load imbalance %.2f, "
                "%.2f GB of weights per step at that count\n",
                x["experts"].get<int>(), x["top_k"].get<int>(), x["distinct_experts_per_layer_step"].get<double>(),
                static_cast<long long>(x["layer_calls"].get<int64_t>()), x["load_imbalance"].get<double>(),
                x["step_bytes_at_distinct"].get<double>() / 1e9);
  }
  if (j.contains("spec")) {
    const json& s = j["spec"];
    std::string k = eo->spec.k > 0 ? fmt::format("K {}", eo->spec.k) : fmt::format("K dynamic <= {}", eo->spec.k_max);
    if (eo->spec.tree_nodes > 0) k += fmt::format(", trees <= {} nodes", eo->spec.tree_nodes);
    const int64_t gated = s["gated_steps"].get<int64_t>();
    std::string versus;
    if (s.contains("speedup")) {
      versus = fmt::format(" | plain decode in this process {:.2f} {}: {:.2f}x",
                           s["plain"].begin().value().get<double>(), latency ? "tok/s" : "output tok/s",
                           s["speedup"].get<double>());
    }
    std::printf("speculative (%s, %s): %lld proposed, %lld accepted (%.1f%%), %.2f accepted per verify step, "
                "%.2f s proposing (draft %.0f%%, verify %.0f%% of step time)%s%s\n",
                s["proposer"].get<std::string>().c_str(), k.c_str(), static_cast<long long>(s["proposed"].get<int64_t>()),
                static_cast<long long>(s["accepted"].get<int64_t>()), 100.0 * s["acceptance_rate"].get<double>(),
                s["mean_accepted_length"].get<double>(), s["propose_seconds"].get<double>(),
                100.0 * s["draft_time_fraction"].get<double>(), 100.0 * s["verify_time_fraction"].get<double>(),
                gated > 0 ? fmt::format(", {} steps held plain (measured slower)", gated).c_str() : "", versus.c_str());
    const auto lines = [](const char* what, const nlohmann::json& by) {
      for (const auto& [label, c] : by.items()) {
        std::printf("  %s %s: %lld proposed, %.1f%% accepted, %.2f accepted per verify step, %.2f tokens per verify "
                    "step, %lld verify steps\n",
                    what, label.c_str(), static_cast<long long>(c["proposed"].get<int64_t>()),
                    100.0 * c["acceptance_rate"].get<double>(), c["mean_accepted_length"].get<double>(),
                    c["tokens_per_verify_step"].get<double>(), static_cast<long long>(c["verify_steps"].get<int64_t>()));
      }
    };
    if (s["by_proposer"].size() > 1) lines("proposer", s["by_proposer"]);
    if (s.contains("by_kind")) lines("prompt kind", s["by_kind"]);
  }
  return 0;
}

}  // namespace

void add_bench(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "benchmark the engine on a latency or throughput workload");
  add_common_options(*cmd, a->common);
  cmd->get_option("-m")->required(false);  // with --url it names the server's model, and may be left out
  add_engine_options(*cmd, a->engine);
  add_spec_options(*cmd, a->spec);
  add_constraint_options(*cmd, a->constraint);
  cmd->add_option("--prompt-text", a->prompt_text, "cut prompts from this text file (tokenized) instead of random ids");
  cmd->add_option("--workload", a->workload, "latency or throughput (default throughput)");
  cmd->add_option("--dtype", a->dtype, "weight dtype of synthetic models (default bf16)");
  cmd->add_option("--prompt-len", a->prompt_len, "latency: prompt tokens (default 128)");
  cmd->add_option("--output-len", a->output_len, "latency: generated tokens (default 128)");
  cmd->add_option("--iters", a->iters, "latency: measured requests after one warm-up (default 3)");
  cmd->add_option("-n,--num-prompts", a->num_prompts, "throughput: requests (default 64)");
  cmd->add_option("--mean-prompt-len", a->mean_prompt_len, "throughput: mean prompt tokens (default 256)");
  cmd->add_option("--mean-output-len", a->mean_output_len, "throughput: mean generated tokens (default 128)");
  cmd->add_option("--len-sigma", a->len_sigma, "throughput: log-normal sigma of the lengths; 0 = fixed (default 0.5)");
  cmd->add_option("--concurrency", a->concurrency, "throughput: requests in flight at most; 0 = all (default 0)");
  cmd->add_option("--request-rate", a->request_rate, "throughput: Poisson arrivals per second; 0 = all at once");
  cmd->add_option("--shared-prefix", a->shared_prefix, "throughput: fraction of each prompt shared by all (default 0)");
  cmd->add_option("--slo-ttft", a->slo.ttft, "throughput: goodput target on time to first token, seconds (default 0: none)");
  cmd->add_option("--slo-tpot", a->slo.tpot, "throughput: goodput target on mean time per output token, seconds "
                  "(default 0: none)");
  cmd->add_option("--seed", a->seed, "workload seed (default 0); request i samples with seed + i")
      ->check(seed_value());
  cmd->add_option("--temperature", a->temperature, "sampling temperature of every request (default 0: greedy)");
  cmd->add_option("--top-p", a->top_p, "nucleus sampling (default 1: off)");
  cmd->add_option("--top-k", a->top_k, "top-k sampling (default 0: off)");
  cmd->add_option("--min-p", a->min_p, "min-p sampling (default 0: off)");
  cmd->add_option("--repetition-penalty", a->repetition_penalty, "repetition penalty (default 1: off)");
  cmd->add_option("--bandwidth-gbps", a->bandwidth_gbps, "latency: memory bandwidth for the roofline fraction");
  cmd->add_option("--url", a->url, "drive a running server at http://HOST:PORT through streaming /v1/completions "
                  "instead of the engine in-process (-m: the model name to send; engine options do not apply)");
  cmd->add_option("--client-threads", a->client_threads, "--url: client event loops (default: min(4, cores))");
  cmd->add_option("--vocab", a->vocab, "--url: prompt ids are drawn below this (default: the server's vocab_size)");
  cmd->add_option("--request-timeout", a->request_timeout, "--url: seconds before an unfinished request fails "
                  "(default 600)");
  cmd->add_option("--json", a->json_path, "write every figure to FILE as JSON");
  cmd->add_option("--report", a->report_dir,
                  "write DIR/index.html: the run's figures as an offline HTML page (tachyon report joins runs)");
  cmd->add_flag("--progress", a->progress, "progress bar on stderr even when it is not a terminal");
  cmd->add_flag("!--no-spec-baseline", a->spec_baseline,
                "with speculative decoding, skip the plain run of the same requests that the speed-up is measured "
                "against");
  cmd->callback([a, &run]() { run = [a]() { return run_bench(*a); }; });
}

}  // namespace tachyon::cli
