// Goodput of a benchmark run: how many requests finished within latency targets (SLOs) on time to
// first token and time per output token, and at what rate. A pure function of per-request timings,
// so that `tachyon bench` and its tests compute it the same way; bench/serve_load.py mirrors it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tachyon::cli {

// Latency targets in seconds; 0 means no target on that figure.
struct SloTargets {
  double ttft = 0.0;
  double tpot = 0.0;

  bool any() const { return ttft > 0.0 || tpot > 0.0; }
};

// One finished request as the benchmark measured it.
struct RequestLatency {
  double ttft = 0.0;          // seconds from arrival to the first token
  double tpot = 0.0;          // seconds per output token after the first: (e2e - ttft) / (output_tokens - 1)
  int64_t output_tokens = 0;  // tpot is read only when this is at least 2
};

struct Goodput {
  size_t requests = 0;          // all requests of the run
  size_t requests_meeting = 0;  // those that met every given target
  double fraction = 0.0;        // requests_meeting / requests; 0 for no requests
  double requests_per_s = 0.0;  // requests_meeting / the run's wall time
};

// A request meets the targets when it produced a token, its TTFT is within the TTFT target and its
// TPOT within the TPOT target; a one-token request has no TPOT and meets that target trivially.
bool meets_slo(const RequestLatency& request, const SloTargets& slo);
Goodput compute_goodput(const std::vector<RequestLatency>& requests, const SloTargets& slo, double duration_s);

// "TTFT 1 s, TPOT 50 ms": the given targets, each in s from one second up and in ms below.
std::string describe_slo(const SloTargets& slo);

}  // namespace tachyon::cli
