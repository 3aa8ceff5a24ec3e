// The report page: classifies the inputs, draws each figure from the bench runs that hold its data
// and assembles one HTML document. Everything the inputs say reaches the page through escape_xml
// (directly or via report/svg.h and report/table.h); numbers are read through report/fields.h, so
// a malformed field shows as "—" or leaves a point out, never throws.
#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "report/fields.h"
#include "report/quant_tables.h"
#include "report/svg.h"
#include "report/table.h"

namespace tachyon::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kCss = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1120px; margin: 2em auto;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
.meta { color: #666; }
nav ul { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; }
figure { margin: 1em 0; } figcaption { color: #444; font-size: 0.92em; max-width: 760px; }
svg.chart { max-width: 100%; height: auto; display: block; }
.table-wrap { overflow-x: auto; margin: 1em 0; }
table { border-collapse: collapse; font-size: 0.88em; }
caption { text-align: left; color: #444; padding-bottom: 0.4em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; white-space: nowrap; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.chosen { font-weight: bold; background: #e8f0fa; }
tbody tr:nth-child(even) { background: #fafafa; }
)";

const char* const kDash = "\xE2\x80\x94";
const char* const kDot = " \xC2\xB7 ";

struct Run {
  const json* j = nullptr;
  size_t number = 0;   // 1-based among the bench runs
  std::string source;  // file it came from; may be empty
  std::string group;   // "model · weights · device"
  std::string label;   // legend name
};

bool is_bench(const json& j) {
  const json* bench = field(j, {"bench"});
  if (bench != nullptr && bench->is_string()) return true;
  const json* workload = field(j, {"workload"});
  const json* config = field(j, {"config"});
  return workload != nullptr && workload->is_string() && config != nullptr && config->is_object();
}

std::string group_name(const json& j) {
  std::string out;
  for (const char* key : {"model", "weights", "device"}) {
    const std::string part = text(j, {key});
    if (!part.empty()) out += (out.empty() ? "" : kDot) + part;
  }
  return out;
}

// config.concurrency, or config.max_seqs where that is 0 (the engine's own bound).
std::optional<double> concurrency(const json& j) {
  const auto c = number(j, {"config", "concurrency"});
  if (c && *c > 0) return c;
  const auto m = number(j, {"config", "max_seqs"});
  if (m && *m > 0) return m;
  return std::nullopt;
}

double request_rate(const json& j) { return number(j, {"config", "request_rate"}).value_or(0.0); }

std::string run_label(const json& j, size_t n, const std::string& group) {
  const std::string custom = text(j, {"label"});
  std::string what = custom;
  if (what.empty()) {
    const std::string workload = text(j, {"workload"});
    what = workload.empty() ? std::string("run") : workload;
    if (workload == "throughput") {
      if (const auto c = concurrency(j)) what += " c=" + format_tick(*c);
      if (request_rate(j) > 0) what += " @ " + format_tick(request_rate(j)) + " req/s";
    } else if (workload == "latency") {
      const auto p = number(j, {"config", "prompt_len"}), g = number(j, {"config", "output_len"});
      if (p && g) what += fmt::format(" {}+{} tokens", format_tick(*p), format_tick(*g));
    }
  }
  std::string out = fmt::format("#{} {}", n, what);
  if (custom.empty() && !group.empty()) out += kDot + group;
  return out;
}

std::string section(const std::string& id, const std::string& heading, const std::string& inner) {
  return fmt::format("<section id=\"fig-{}\">\n<h2>{}</h2>\n{}</section>\n", escape_xml(id), escape_xml(heading),
                     inner);
}

std::string figure_block(const std::string& svg, const std::string& caption) {
  return fmt::format("<figure>\n{}<figcaption>{}</figcaption>\n</figure>\n", svg, escape_xml(caption));
}

std::string figure(const std::string& id, const std::string& heading, const std::string& svg,
                   const std::string& caption) {
  return section(id, heading, figure_block(svg, caption));
}

// Seconds from `describe_slo` in cli/goodput.h's manner: "1 s" from one second up, else "50 ms".
std::string describe_seconds(double s) {
  return s >= 1.0 ? fmt::format("{:g} s", s) : fmt::format("{:g} ms", s * 1e3);
}

std::string describe_slo(const json& goodput) {
  std::string out;
  if (const auto t = number(goodput, {"slo_ttft_s"}); t && *t > 0) out = "TTFT " + describe_seconds(*t);
  if (const auto t = number(goodput, {"slo_tpot_s"}); t && *t > 0) {
    out += (out.empty() ? "TPOT " : ", TPOT ") + describe_seconds(*t);
  }
  return out.empty() ? std::string("no targets") : out;
}

std::string summary_table(const std::vector<Run>& runs) {
  Table t;
  t.id = "summary";
  t.caption = runs.empty() ? std::string("No tachyon bench runs among the inputs")
                           : "One row per run; latencies in ms (p50 / p99); roofline: decode weight bytes/s "
                             "over the --bandwidth given to bench";
  t.header = {"run",         "workload",   "model",      "weights",   "device",       "concurrency",
              "rate req/s",  "requests/s", "output tok/s", "TTFT p50", "TTFT p99",    "TPOT p50",
              "TPOT p99",    "decode tok/s", "roofline",  "goodput req/s", "KV peak"};
  for (const Run& r : runs) {
    const json& j = *r.j;
    const auto num = [](std::optional<double> v) { return Cell{format_value(v), "num", {}}; };
    std::string goodput = kDash;
    if (const json* g = field(j, {"goodput"}); g != nullptr && g->is_object()) {
      goodput = fmt::format("{} ({} within {})", format_value(number(*g, {"requests_per_s"})),
                            format_percent(number(*g, {"fraction"})), describe_slo(*g));
    }
    std::string weights = text(j, {"weights"});
    const std::string format = text(j, {"weight_format"});
    if (!format.empty() && format != "dense" && format != weights) weights += (weights.empty() ? "" : " / ") + format;
    const double rate = request_rate(j);
    t.rows.push_back({Cell{fmt::format("#{}", r.number), {}, r.source.empty() ? r.label : r.source},
                      Cell{text(j, {"workload"}), {}, {}}, Cell{text(j, {"model"}), {}, {}}, Cell{weights, {}, {}},
                      Cell{text(j, {"device"}), {}, {}}, num(concurrency(j)),
                      Cell{rate > 0 ? format_value(rate) : std::string("all at once"), "num", {}},
                      num(number(j, {"requests_per_s"})), num(number(j, {"output_tokens_per_s"})),
                      num(number(j, {"ttft_ms", "p50"})), num(number(j, {"ttft_ms", "p99"})),
                      num(number(j, {"tpot_ms", "p50"})), num(number(j, {"tpot_ms", "p99"})),
                      num(number(j, {"decode_tokens_per_s"})),
                      Cell{format_percent(number(j, {"decode_fraction_of_roofline"})), "num", {}},
                      Cell{goodput, {}, {}}, Cell{format_percent(number(j, {"kv_peak_fraction"})), "num", {}}});
  }
  return fmt::format("<section id=\"fig-summary\">\n<h2>Runs</h2>\n{}</section>\n", render_table(t));
}

// Groups in order of first appearance, each with its points sorted by x.
std::vector<LineSeries> grouped_series(const std::vector<std::pair<std::string, Point>>& points) {
  std::vector<LineSeries> series;
  for (const auto& [name, p] : points) {
    auto it = std::find_if(series.begin(), series.end(), [&](const LineSeries& s) { return s.name == name; });
    if (it == series.end()) {
      series.push_back(LineSeries{name, {}, LineShape::kStraight, true, -1});
      it = series.end() - 1;
    }
    it->points.push_back(p);
  }
  for (LineSeries& s : series) {
    std::stable_sort(s.points.begin(), s.points.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
  }
  return series;
}

// Log scale when every value is positive and they span at least `ratio`.
bool wants_log(const std::vector<LineSeries>& series, double ratio, bool on_x) {
  double lo = 0.0, hi = 0.0;
  bool any = false;
  for (const LineSeries& s : series) {
    for (const Point& p : s.points) {
      const double v = on_x ? p.x : p.y;
      if (!(v > 0.0)) return false;
      lo = any ? std::min(lo, v) : v;
      hi = any ? std::max(hi, v) : v;
      any = true;
    }
  }
  return any && hi / lo >= ratio;
}

std::string throughput_figure(const std::vector<Run>& runs) {
  std::vector<std::pair<std::string, Point>> points;
  size_t paced = 0;
  for (const Run& r : runs) {
    const json& j = *r.j;
    if (text(j, {"workload"}) != "throughput") continue;
    const auto c = concurrency(j);
    const auto tok_s = number(j, {"output_tokens_per_s"});
    if (!c || !tok_s) continue;
    if (request_rate(j) > 0) {
      ++paced;
      continue;
    }
    points.push_back({r.group.empty() ? std::string("runs") : r.group, Point{*c, *tok_s}});
  }
  if (points.empty()) return {};
  LineChart chart;
  chart.id = "throughput_vs_concurrency";
  chart.title = "Output tokens/s vs concurrency";
  chart.series = grouped_series(points);
  chart.x = AxisSpec{"concurrency (requests in flight)", wants_log(chart.series, 8.0, true), false, {}, {}};
  chart.y = AxisSpec{"output tokens/s", false, true, {}, {}};
  std::string caption =
      "Throughput-workload runs with every request arriving at once; concurrency is config.concurrency, or "
      "config.max_seqs where that is 0. One line per model" + std::string(kDot) + "weights" + kDot + "device.";
  if (paced > 0) caption += fmt::format(" {} run(s) paced by a request rate are in the goodput figure instead.", paced);
  return figure(chart.id, "Throughput vs concurrency", render_line_chart(chart), caption);
}

// The empirical CDF of `ms` as step-series points: (x1, 0), then (x, share at or below x) for each
// distinct value x (every k-th one past kMaxCdfSteps, and always the largest).
LineSeries cdf_series(const std::string& name, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  std::vector<std::pair<double, size_t>> steps;  // distinct value, samples at or below it
  for (size_t i = 0; i < ms.size(); ++i) {
    if (!steps.empty() && steps.back().first == ms[i]) {
      steps.back().second = i + 1;
    } else {
      steps.push_back({ms[i], i + 1});
    }
  }
  const size_t every = (steps.size() + kMaxCdfSteps - 1) / kMaxCdfSteps;
  LineSeries s{name, {}, LineShape::kStep, false, static_cast<int64_t>(ms.size())};
  if (steps.empty()) return s;
  const double n = static_cast<double>(ms.size());
  s.points.push_back({steps[0].first, 0.0});
  for (size_t i = 0; i < steps.size(); ++i) {
    if ((i + 1) % every != 0 && i + 1 != steps.size()) continue;
    s.points.push_back({steps[i].first, static_cast<double>(steps[i].second) / n});
  }
  return s;
}

std::string latency_cdf_figures(const std::vector<Run>& runs) {
  struct Metric {
    const char* key;
    const char* id;
    const char* name;
    const char* short_name;
    const char* slo_key;
  };
  const Metric metrics[] = {
      {"ttft_s", "latency_cdf_ttft", "TTFT (time to first token)", "TTFT", "slo_ttft_s"},
      {"tpot_s", "latency_cdf_tpot", "TPOT (time per output token)", "TPOT", "slo_tpot_s"},
      {"itl_s", "latency_cdf_itl", "ITL (inter-token latency)", "ITL", nullptr}};
  std::string out;
  for (const Metric& m : metrics) {
    LineChart chart;
    chart.id = m.id;
    chart.title = fmt::format("CDF of {}", m.name);
    std::vector<double> slos;
    for (const Run& r : runs) {
      const json* samples = field(*r.j, {"samples", m.key});
      if (samples == nullptr || !samples->is_array()) continue;
      std::vector<double> ms;
      for (const json& v : *samples) {
        if (const auto s = as_number(&v)) ms.push_back(*s * 1e3);
      }
      if (ms.empty()) continue;
      chart.series.push_back(cdf_series(r.label, std::move(ms)));
      if (m.slo_key == nullptr) continue;
      if (const auto slo = number(*r.j, {"goodput", m.slo_key}); slo && *slo > 0) {
        if (std::find(slos.begin(), slos.end(), *slo) == slos.end()) slos.push_back(*slo);
      }
    }
    if (chart.series.empty()) continue;
    const bool log_x = wants_log(chart.series, 100.0, true);
    chart.x = AxisSpec{std::string(m.short_name) + " (ms" + (log_x ? ", log scale)" : ")"), log_x, false, {}, {}};
    chart.y = AxisSpec{"share of samples at or below", false, true, 0.0, 1.0};
    chart.references = {{ReferenceAxis::kY, 0.5, "p50"}, {ReferenceAxis::kY, 0.99, "p99"}};
    for (double slo : slos) chart.references.push_back({ReferenceAxis::kX, slo * 1e3, "SLO " + describe_seconds(slo)});
    const std::string caption =
        fmt::format("Empirical CDF of samples.{} per run, in ms: a rise of 1/N at each of a run's N samples "
                    "(the count is each line's data-n).{}",
                    m.key, slos.empty() ? "" : " Dashed vertical lines: the runs' SLO targets.");
    out += figure(chart.id, chart.title, render_line_chart(chart), caption);
  }
  return out;
}

std::string goodput_figure(const std::vector<Run>& runs) {
  std::vector<std::pair<std::string, Point>> points;
  std::vector<std::string> slos;
  for (const Run& r : runs) {
    const json* g = field(*r.j, {"goodput"});
    if (g == nullptr || !g->is_object()) continue;
    const auto good = number(*g, {"requests_per_s"});
    const double rate = request_rate(*r.j);
    if (!good || !(rate > 0)) continue;
    const std::string slo = describe_slo(*g);
    if (std::find(slos.begin(), slos.end(), slo) == slos.end()) slos.push_back(slo);
    points.push_back({(r.group.empty() ? std::string("runs") : r.group) + " (" + slo + ")", Point{rate, *good}});
  }
  if (points.empty()) return {};
  LineChart chart;
  chart.id = "goodput_vs_rate";
  chart.title = "Goodput vs request rate";
  chart.series = grouped_series(points);
  chart.x = AxisSpec{"request rate (req/s, Poisson arrivals)", false, true, {}, {}};
  chart.y = AxisSpec{"goodput (req/s meeting the SLOs)", false, true, {}, {}};
  chart.references = {{ReferenceAxis::kIdentity, 0.0, "every request within the SLOs"}};
  std::string targets;
  for (const std::string& s : slos) targets += (targets.empty() ? "" : "; ") + s;
  const std::string caption = fmt::format(
      "Requests per second that finished within every SLO target (goodput.requests_per_s) against the offered "
      "rate (config.request_rate); dashed: goodput equal to the offered rate. SLO targets: {}. One line per "
      "model{}weights{}device and targets.",
      targets, kDot, kDot);
  return figure(chart.id, chart.title, render_line_chart(chart), caption);
}

std::string kv_figure(const std::vector<Run>& runs) {
  LineChart chart;
  chart.id = "kv_timeline";
  chart.title = "KV-cache use over time";
  size_t skipped = 0;
  for (const Run& r : runs) {
    const json* timeline = field(*r.j, {"kv_timeline"});
    if (timeline == nullptr || !timeline->is_array() || timeline->empty()) continue;
    // Occupancy changes at engine steps and holds between them (a paced run idles for a while).
    LineSeries s{r.label, {}, LineShape::kStep, false, -1};
    for (const json& e : *timeline) {
      std::optional<double> t, used, total;
      if (e.is_array() && e.size() >= 3) {
        t = as_number(&e[0]);
        used = as_number(&e[1]);
        total = as_number(&e[2]);
      }
      if (!t || !used || !total || !(*total > 0)) {
        ++skipped;
        continue;
      }
      s.points.push_back({*t, 100.0 * *used / *total});
    }
    if (!s.points.empty()) chart.series.push_back(std::move(s));
  }
  if (chart.series.empty()) return {};
  chart.x = AxisSpec{"seconds since the run's start", false, true, {}, {}};
  // The axis follows the data (a run that uses 2 % of a large pool still shows its shape); a run
  // near the pool's end gets the capacity drawn.
  chart.y = AxisSpec{"KV blocks in use (%)", false, true, {}, {}};
  double peak = 0.0;
  for (const LineSeries& s : chart.series) {
    for (const Point& p : s.points) peak = std::max(peak, p.y);
  }
  if (peak >= 80.0) chart.references.push_back({ReferenceAxis::kY, 100.0, "all blocks"});
  std::string caption = "used_blocks / total_blocks of the KV cache's pool over each run (kv_timeline), each "
                        "entry's value held until the next; the summary's KV peak is the largest share.";
  if (skipped > 0) caption += fmt::format(" {} malformed entries left out.", skipped);
  return figure(chart.id, chart.title, render_line_chart(chart), caption);
}

std::string spec_section(const std::vector<Run>& runs) {
  BarChart chart;
  chart.id = "spec_acceptance";
  chart.title = "Speculative acceptance by draft position";
  chart.x_label = "position in the draft";
  chart.y = AxisSpec{"acceptance rate", false, true, 0.0, 1.0};
  Table t;
  t.id = "spec_summary";
  t.caption = "Speculative decoding per run (spec); speed-up against the same requests decoded plainly";
  t.header = {"run",        "proposer",        "draft model",       "k",          "proposed",
              "accepted",   "acceptance rate", "mean accepted length", "draft time", "speed-up"};
  size_t positions = 0;
  for (const Run& r : runs) {
    const json* spec = field(*r.j, {"spec"});
    if (spec == nullptr || !spec->is_object()) continue;
    const auto num = [](std::optional<double> v) { return Cell{format_value(v), "num", {}}; };
    const auto speedup = number(*spec, {"speedup"});
    t.rows.push_back({Cell{r.label, {}, r.source}, Cell{text(*spec, {"proposer"}), {}, {}},
                      Cell{text(*spec, {"draft_model"}), {}, {}}, num(number(*spec, {"k"})),
                      num(number(*spec, {"proposed"})), num(number(*spec, {"accepted"})),
                      Cell{format_percent(number(*spec, {"acceptance_rate"})), "num", {}},
                      num(number(*spec, {"mean_accepted_length"})),
                      Cell{format_percent(number(*spec, {"draft_time_fraction"})), "num", {}},
                      Cell{speedup ? fmt::format("{:.2f}x", *speedup) : std::string(kDash), "num", {}}});
    const json* accepted = field(*spec, {"accepted_by_position"});
    const json* proposed = field(*spec, {"proposed_by_position"});
    if (accepted == nullptr || proposed == nullptr || !accepted->is_array() || !proposed->is_array()) continue;
    BarSeries s{r.label, {}};
    const size_t n = std::min(accepted->size(), proposed->size());
    for (size_t i = 0; i < n; ++i) {
      const auto a = as_number(&(*accepted)[i]), p = as_number(&(*proposed)[i]);
      s.values.push_back(a && p && *p > 0 ? *a / *p : std::nan(""));
    }
    if (s.values.empty()) continue;
    positions = std::max(positions, s.values.size());
    chart.series.push_back(std::move(s));
  }
  if (t.rows.empty()) return {};
  if (chart.series.empty()) return section("spec_summary", "Speculative decoding", render_table(t));
  for (size_t i = 0; i < positions; ++i) chart.categories.push_back(std::to_string(i + 1));
  const std::string block = figure_block(render_bar_chart(chart),
                                         "Share of the tokens drafted at each position that the target accepted "
                                         "(spec.accepted_by_position / spec.proposed_by_position); one bar per run "
                                         "and position, none where nothing was proposed.");
  return section(chart.id, "Speculative decoding", block + render_table(t));
}

std::string page(const std::string& title, const std::vector<std::pair<std::string, std::string>>& toc,
                 const std::string& meta, const std::string& body) {
  std::string nav;
  for (const auto& [id, heading] : toc) {
    nav += fmt::format("<li><a href=\"#fig-{}\">{}</a></li>", escape_xml(id), escape_xml(heading));
  }
  return fmt::format("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                     "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n"
                     "<style>{}</style>\n</head>\n<body>\n<h1>{}</h1>\n<p class=\"meta\">{}</p>\n<nav><ul>{}</ul>"
                     "</nav>\n{}</body>\n</html>\n",
                     escape_xml(title), kCss, escape_xml(title), escape_xml(meta), nav, body);
}

std::string input_name(const ReportOptions& options, size_t i) {
  return i < options.sources.size() && !options.sources[i].empty() ? options.sources[i]
                                                                   : fmt::format("input {}", i + 1);
}

std::string keys_of(const json& j) {
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  return keys.empty() ? std::string("none") : excerpt(keys, 120);
}

}  // namespace

Result<std::string> render_report(const std::vector<json>& runs, const ReportOptions& options) {
  if (runs.empty()) return make_error(ErrorCode::kInvalidArgument, "report: no inputs to report on");
  std::vector<Run> bench;
  std::vector<QuantSource> quant;
  for (size_t i = 0; i < runs.size(); ++i) {
    const json& j = runs[i];
    const std::string name = input_name(options, i);
    if (!j.is_object()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: a JSON {} where a JSON object was expected", name,
                        j.type_name());
    }
    const std::string source = i < options.sources.size() ? options.sources[i] : std::string();
    if (is_bench(j)) {
      Run r;
      r.j = &j;
      r.number = bench.size() + 1;
      r.source = source;
      r.group = group_name(j);
      r.label = run_label(j, r.number, r.group);
      bench.push_back(std::move(r));
    } else if (quant_input_kind(j) != QuantInput::kNone) {
      quant.push_back(QuantSource{&j, source});
    } else {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: neither a `tachyon bench --json` result nor a quantize_report.json, perplexity or "
                        "calib-audit JSON (its keys: {})",
                        name, keys_of(j));
    }
  }
  std::vector<std::pair<std::string, std::string>> toc = {{"summary", "Runs"}};
  std::string body = summary_table(bench);
  const auto add = [&](const std::string& html, const std::string& id, const std::string& heading) {
    if (html.empty()) return;
    body += html;
    toc.push_back({id, heading});
  };
  add(throughput_figure(bench), "throughput_vs_concurrency", "Throughput");
  const std::string cdfs = latency_cdf_figures(bench);
  if (!cdfs.empty()) {
    body += cdfs;
    for (const auto& [m, name] : {std::pair{"ttft", "TTFT"}, std::pair{"tpot", "TPOT"}, std::pair{"itl", "ITL"}}) {
      if (cdfs.find(fmt::format("data-figure=\"latency_cdf_{}\"", m)) == std::string::npos) continue;
      toc.push_back({fmt::format("latency_cdf_{}", m), fmt::format("{} CDF", name)});
    }
  }
  add(goodput_figure(bench), "goodput_vs_rate", "Goodput");
  add(kv_figure(bench), "kv_timeline", "KV cache");
  const std::string spec = spec_section(bench);
  add(spec, spec.find("data-figure=\"spec_acceptance\"") != std::string::npos ? "spec_acceptance" : "spec_summary",
      "Speculative decoding");
  add(render_quant_section(quant), "quant_table", "Quantization");
  const std::string meta = fmt::format("{} bench run{}, {} quantization input{}; written by tachyon report.",
                                       bench.size(), bench.size() == 1 ? "" : "s", quant.size(),
                                       quant.size() == 1 ? "" : "s");
  return page(options.title, toc, meta, body);
}

Status write_report(const std::vector<std::string>& json_files, const std::string& dir, const ReportOptions& options) {
  if (json_files.empty()) return make_error(ErrorCode::kInvalidArgument, "report: no JSON files given");
  if (dir.empty()) return make_error(ErrorCode::kInvalidArgument, "report: no output directory given");
  std::vector<json> runs;
  ReportOptions render_options = options;
  render_options.sources.clear();
  for (const std::string& path : json_files) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) return make_error(ErrorCode::kNotFound, "{}: no such file", path);
    if (fs::is_directory(st)) return make_error(ErrorCode::kInvalidArgument, "{}: a directory, not a JSON file", path);
    std::ifstream f(path, std::ios::binary);
    std::stringstream contents;
    contents << f.rdbuf();
    if (!f || f.bad()) return make_error(ErrorCode::kIo, "{}: cannot read", path);
    const std::string textual = contents.str();
    if (textual.find_first_not_of(" \t\r\n") == std::string::npos) {
      return make_error(ErrorCode::kCorruptFile, "{}: empty file, not JSON", path);
    }
    json parsed;
    try {
      parsed = json::parse(textual);
    } catch (const json::exception& e) {
      return make_error(ErrorCode::kCorruptFile, "{}: not valid JSON: {}", path, excerpt(e.what()));
    }
    if (parsed.is_array()) {
      if (parsed.empty()) return make_error(ErrorCode::kInvalidArgument, "{}: an empty JSON array", path);
      for (size_t i = 0; i < parsed.size(); ++i) {
        if (!parsed[i].is_object()) {
          return make_error(ErrorCode::kInvalidArgument, "{}: element {} is a JSON {}, not an object", path, i,
                            parsed[i].type_name());
        }
        runs.push_back(std::move(parsed[i]));
        render_options.sources.push_back(fmt::format("{}[{}]", path, i));
      }
    } else {
      runs.push_back(std::move(parsed));
      render_options.sources.push_back(path);
    }
  }
  auto html = render_report(runs, render_options);
  if (!html.ok()) return html.status();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return make_error(ErrorCode::kIo, "{}: cannot create the output directory{}", dir,
                      ec ? ": " + ec.message() : std::string());
  }
  const std::string out_path = (fs::path(dir) / "index.html").string();
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  out << *html;
  out.flush();
  if (!out) return make_error(ErrorCode::kIo, "{}: cannot write", out_path);
  return Status::Ok();
}

}  // namespace tachyon::report
