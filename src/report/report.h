// An offline HTML report of `tachyon bench --json` results: one self-contained page (inline CSS
// and SVG, no JavaScript, no external references) with a summary table of every run and the
// figures its data allows. It only reads the JSON; it never runs anything.
//
//   render_report(runs)          parsed JSON objects -> the page
//   write_report(files, dir)     reads each file (one object, or an array of them) -> DIR/index.html
//
// Inputs are recognised by their keys:
//   bench       "bench" (or "workload" with "config"): `tachyon bench --json`
//   perplexity  "perplexity" and "tokens_scored": `tachyon perplexity --json`
//   quantize    "layers" and "totals": quantize_report.json of `tachyon quantize --method`
//   budget      "budget" and "modules": quantize_report.json of `tachyon quantize --budget`
//   calib-audit "ngram_overlap" and "paragraph_overlap": `tachyon calib-audit --json`
// anything else is an error naming the input. Figures, each only when some run holds its data
// (data-figure ids; report/svg.h says what the markup holds):
//   throughput_vs_concurrency  output_tokens_per_s vs config.concurrency (config.max_seqs where
//                              that is 0), runs of workload "throughput" with config.request_rate
//                              0; one series per (model, weights, device)
//   latency_cdf_ttft, latency_cdf_tpot, latency_cdf_itl
//                              empirical CDFs (ms) of samples.ttft_s / tpot_s / itl_s, a series
//                              per run; a CDF of N distinct samples is a step line of 2N points
//                              (from (x1, 0) up to 1/N, across to x2, up to 2/N, ...; equal
//                              samples share a rise), at most kMaxCdfSteps rises per run
//   goodput_vs_rate            goodput.requests_per_s vs config.request_rate (> 0), one series
//                              per (model, weights, device, SLO targets)
//   kv_timeline                kv_timeline [[seconds, used_blocks, total_blocks], ...] as % used,
//                              a step line (data-n: the entries drawn)
//   spec_acceptance            spec.accepted_by_position[i] / spec.proposed_by_position[i], bars
//                              per run by draft position i + 1
//   quant_table                (an HTML section, not an svg) the tables of the quantize,
//                              perplexity and calib-audit inputs
// Tables (data-table ids): summary (one row per bench run, always), spec_summary, perplexity,
// quantize_modules, quantize_budget, quantize_budgets, calib_audit.
// An optional string "label" in a bench object names its run in legends instead of the default
// "#N workload c=C · model · weights · device".
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tachyon::report {

// Rises of a run's CDF past which the samples are thinned to every k-th order statistic.
inline constexpr size_t kMaxCdfSteps = 2000;

struct ReportOptions {
  std::string title = "Tachyon benchmark report";
  // The file each input came from, by index (shown as tooltips and in error messages); may be
  // empty or shorter than the inputs.
  std::vector<std::string> sources;
};

// runs: parsed JSON objects, bench results and the quantization inputs above, in display order.
// Errors: no inputs, an input that is not an object or not recognised.
Result<std::string> render_report(const std::vector<nlohmann::json>& runs, const ReportOptions& options = {});

// Reads each file (a JSON object, or an array of objects), renders them in order and writes
// DIR/index.html, creating DIR. Errors name the file: missing, unreadable, not JSON, an empty
// array, an element that is not an object; and what render_report refuses.
Status write_report(const std::vector<std::string>& json_files, const std::string& dir,
                    const ReportOptions& options = {});

}  // namespace tachyon::report
