#include "cli/goodput.h"

#include <fmt/format.h>

namespace tachyon::cli {

bool meets_slo(const RequestLatency& r, const SloTargets& slo) {
  if (r.output_tokens < 1) return false;
  if (slo.ttft > 0.0 && !(r.ttft <= slo.ttft)) return false;
  if (slo.tpot > 0.0 && r.output_tokens > 1 && !(r.tpot <= slo.tpot)) return false;
  return true;
}

Goodput compute_goodput(const std::vector<RequestLatency>& requests, const SloTargets& slo, double duration_s) {
  Goodput g;
  g.requests = requests.size();
  for (const RequestLatency& r : requests) g.requests_meeting += meets_slo(r, slo) ? 1 : 0;
  if (g.requests > 0) g.fraction = static_cast<double>(g.requests_meeting) / static_cast<double>(g.requests);
  if (duration_s > 0.0) g.requests_per_s = static_cast<double>(g.requests_meeting) / duration_s;
  return g;
}

namespace {

std::string describe_seconds(double s) { return s >= 1.0 ? fmt::format("{:g} s", s) : fmt::format("{:g} ms", s * 1e3); }

}  // namespace

std::string describe_slo(const SloTargets& slo) {
  std::string out;
  if (slo.ttft > 0.0) out = "TTFT " + describe_seconds(slo.ttft);
  if (slo.tpot > 0.0) out += (out.empty() ? "TPOT " : ", TPOT ") + describe_seconds(slo.tpot);
  return out;
}

}  // namespace tachyon::cli
