#include "server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace tachyon::server {
namespace {

// Prometheus floats: plain decimal, "+Inf" for infinity.
std::string number(double v) { return fmt::format("{}", v); }

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void gauge(std::string& out, const std::string& name, const char* help, double value) {
  header(out, name, "gauge", help);
  out += fmt::format("{} {}\n", name, number(value));
}

void counter(std::string& out, const std::string& name, const char* help, double value) {
  header(out, name, "counter", help);
  out += fmt::format("{} {}\n", name, number(value));
}

// Indexed by FinishReason, then timeouts.
constexpr const char* kFinishLabels[] = {"stop", "length", "context", "abort", "error", "transfer", "timeout"};
static_assert(static_cast<size_t>(FinishReason::kTransfer) == 5);

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(bounds_[i]), cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, number(sum_), name, count_);
}

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
             0.75, 1.0, 2.5, 5.0}),
      e2e_({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
            240.0, 480.0, 960.0}),
      queue_({0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0}) {}

void ServerMetrics::record_admitted(int num_prompt_tokens) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += num_prompt_tokens;
}

void ServerMetrics::record_finished(const RequestOutput& o, bool timed_out) {
  std::lock_guard lock(mu_);
  const size_t reason = timed_out ? finished_.size() - 1 : static_cast<size_t>(o.finish_reason);
  ++finished_[std::min<size_t>(reason, finished_.size() - 1)];
  const RequestTiming& t = o.timing;
  if (t.first_token >= 0) ttft_.observe(t.first_token - t.arrival);
  if (t.first_scheduled >= 0) queue_.observe(t.first_scheduled - t.arrival);
  if (t.token_times.size() > 1) {
    tpot_.observe((t.token_times.back() - t.token_times.front()) / static_cast<double>(t.token_times.size() - 1));
  }
  if (t.finished >= 0) e2e_.observe(t.finished - t.arrival);
}

void ServerMetrics::set_engine_stats(const EngineStats& stats) {
  std::lock_guard lock(mu_);
  engine_ = stats;
}

void ServerMetrics::record_transfer(bool ok) {
  std::lock_guard lock(mu_);
  ++transfers_[ok ? 1 : 0];
}

void ServerMetrics::record_exported(bool device_region, uint64_t bytes, double seconds) {
  std::lock_guard lock(mu_);
  transfer_bytes_[device_region ? 1 : 0] += bytes;
  export_seconds_[device_region ? 1 : 0] += seconds;
}

void ServerMetrics::record_adopted_bytes(bool device_region, uint64_t bytes, double seconds) {
  std::lock_guard lock(mu_);
  adopted_bytes_[device_region ? 1 : 0] += bytes;
  adopt_seconds_[device_region ? 1 : 0] += seconds;
}

void ServerMetrics::record_adoption(bool ok) {
  std::lock_guard lock(mu_);
  ++adoptions_[ok ? 1 : 0];
}

EngineStats ServerMetrics::engine_stats() const {
  std::lock_guard lock(mu_);
  return engine_;
}

void ServerMetrics::record_http_response(int status) {
  std::lock_guard lock(mu_);
  ++http_responses_[status];
}

void ServerMetrics::record_rejected() {
  std::lock_guard lock(mu_);
  ++rejected_;
}

std::string ServerMetrics::render() const {
  std::lock_guard lock(mu_);
  const EngineStats& s = engine_;
  std::string out;
  out.reserve(8192);
  gauge(out, "tachyon_num_requests_running", "Requests in the running batch (prefilling or decoding).", s.num_running);
  gauge(out, "tachyon_num_requests_waiting", "Requests waiting to run, preempted ones included.", s.num_waiting);
  gauge(out, "tachyon_kv_cache_usage_ratio", "Fraction of KV cache blocks held by requests (0 to 1).",
        s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
  gauge(out, "tachyon_kv_cache_blocks_total", "KV cache blocks in all.", s.kv_blocks_total);
  gauge(out, "tachyon_kv_cache_blocks_used", "KV cache blocks held by requests.", s.kv_blocks_used);
  gauge(out, "tachyon_kv_cache_blocks_cached", "Unreferenced KV cache blocks kept for prefix hits.",
        s.kv_blocks_cached);
  gauge(out, "tachyon_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache over prompt tokens admitted.",
        s.prefix.hit_rate());
  counter(out, "tachyon_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          static_cast<double>(s.prefix.query_tokens));
  counter(out, "tachyon_prefix_cache_hits_total", "Prompt tokens served from the prefix cache.",
          static_cast<double>(s.prefix.hit_tokens));
  counter(out, "tachyon_prompt_tokens_total", "Prompt tokens of admitted requests.",
          static_cast<double>(prompt_tokens_));
  counter(out, "tachyon_prefill_tokens_computed_total",
          "Prompt tokens run through the model (prefix-cache hits excluded, recomputation included).",
          static_cast<double>(s.prompt_tokens_computed));
  counter(out, "tachyon_generation_tokens_total", "Tokens generated.", static_cast<double>(s.generated_tokens));
  counter(out, "tachyon_num_preemptions_total", "Requests preempted to free KV cache blocks.",
          static_cast<double>(s.num_preemptions));
  counter(out, "tachyon_failed_steps_total",
          "Engine steps whose forward or sampling failed (their requests ended with an error; serving went on).",
          static_cast<double>(s.num_failed_steps));
  counter(out, "tachyon_failed_proposals_total",
          "Speculative proposals that failed (the step ran without drafts).", static_cast<double>(s.num_failed_proposals));
  counter(out, "tachyon_engine_steps_total", "Engine steps run.", static_cast<double>(s.num_steps));
  counter(out, "tachyon_requests_rejected_total", "Requests refused because the waiting queue was full or the "
          "server was draining.", static_cast<double>(rejected_));

  if (!s.expert_tokens.empty()) {  // mixtures of experts: the load per expert (refreshed once a second)
    header(out, "tachyon_moe_expert_tokens_total", "counter",
           "Tokens routed to each expert (one per chosen expert), summed over the sparse layers.");
    for (size_t e = 0; e < s.expert_tokens.size(); ++e) {
      out += fmt::format("tachyon_moe_expert_tokens_total{{expert=\"{}\"}} {}\n", e,
                         number(static_cast<double>(s.expert_tokens[e])));
    }
    gauge(out, "tachyon_moe_load_imbalance",
          "Busiest expert's tokens over the mean expert's, averaged over the sparse layers (1: even).",
          s.moe_load_imbalance);
    gauge(out, "tachyon_moe_distinct_experts_per_layer_step",
          "Distinct experts a sparse layer ran per forward, averaged since start (weights read per step).",
          s.moe_layer_calls > 0 ? static_cast<double>(s.moe_distinct_experts) / s.moe_layer_calls : 0.0);
  }

  if (!s.spec.proposer.empty()) {  // speculative decoding, labelled by proposer
    const SpecStats& sp = s.spec;
    const auto spec_line = [&](const char* name, const char* type, const char* help, double value) {
      header(out, name, type, help);
      out += fmt::format("{}{{proposer=\"{}\"}} {}\n", name, sp.proposer, number(value));
    };
    spec_line("tachyon_spec_proposed_tokens_total", "counter", "Draft tokens proposed and verified.",
              static_cast<double>(sp.num_proposed));
    spec_line("tachyon_spec_accepted_tokens_total", "counter", "Draft tokens the target accepted.",
              static_cast<double>(sp.num_accepted));
    spec_line("tachyon_spec_verify_steps_total", "counter", "Sequence-steps that verified a draft.",
              static_cast<double>(sp.num_verify_steps));
    spec_line("tachyon_spec_acceptance_rate", "gauge", "Accepted over proposed draft tokens, since start.",
              sp.acceptance_rate());
    spec_line("tachyon_spec_mean_accepted_length", "gauge",
              "Accepted draft tokens per verify step, since start (the target's own token not counted).",
              sp.mean_accepted_length());
    spec_line("tachyon_spec_tree_steps_total", "counter", "Verify steps that verified a token tree (--spec-tree).",
              static_cast<double>(sp.num_tree_steps));
    spec_line("tachyon_spec_off_first_branch_total", "counter",
              "Tree verify steps whose accepted path left the tree's first branch.",
              static_cast<double>(sp.num_off_first_branch));
    spec_line("tachyon_spec_gated_steps_total", "counter",
              "Steps held plain because speculating steps were measured slower at that batch size.",
              static_cast<double>(sp.num_gated_steps));
    // Per proposer (each named draft model) and per kind of prompt text (with a classifier).
    const auto by_line = [&](const char* name, const char* type, const char* help, const char* label,
                             const std::map<std::string, SpecCounts>& by, double (*value)(const SpecCounts&)) {
      if (by.empty()) return;
      header(out, name, type, help);
      for (const auto& [key, c] : by) out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, key, number(value(c)));
    };
    const auto proposed = [](const SpecCounts& c) { return static_cast<double>(c.num_proposed); };
    const auto accepted = [](const SpecCounts& c) { return static_cast<double>(c.num_accepted); };
    const auto steps = [](const SpecCounts& c) { return static_cast<double>(c.num_verify_steps); };
    const auto emitted = [](const SpecCounts& c) { return static_cast<double>(c.num_emitted); };
    by_line("tachyon_spec_proposer_proposed_tokens_total", "counter", "Draft tokens proposed and verified, by proposer.",
            "proposer", sp.by_proposer, proposed);
    by_line("tachyon_spec_proposer_accepted_tokens_total", "counter", "Draft tokens accepted, by proposer.", "proposer",
            sp.by_proposer, accepted);
    by_line("tachyon_spec_proposer_verify_steps_total", "counter", "Sequence-steps that verified a draft, by proposer.",
            "proposer", sp.by_proposer, steps);
    by_line("tachyon_spec_proposer_emitted_tokens_total", "counter",
            "Tokens verify steps emitted (accepted and the target's own), by proposer.", "proposer", sp.by_proposer,
            emitted);
    by_line("tachyon_spec_kind_proposed_tokens_total", "counter",
            "Draft tokens proposed and verified, by the kind of the prompt's text.", "kind", sp.by_kind, proposed);
    by_line("tachyon_spec_kind_accepted_tokens_total", "counter", "Draft tokens accepted, by the kind of the prompt's text.",
            "kind", sp.by_kind, accepted);
    by_line("tachyon_spec_kind_verify_steps_total", "counter",
            "Sequence-steps that verified a draft, by the kind of the prompt's text.", "kind", sp.by_kind, steps);
    by_line("tachyon_spec_kind_emitted_tokens_total", "counter",
            "Tokens verify steps emitted (accepted and the target's own), by the kind of the prompt's text.", "kind",
            sp.by_kind, emitted);
  }
  header(out, "tachyon_requests_finished_total", "counter", "Finished requests by finish reason.");
  for (size_t i = 0; i < finished_.size(); ++i) {
    out += fmt::format("tachyon_requests_finished_total{{finish_reason=\"{}\"}} {}\n", kFinishLabels[i], finished_[i]);
  }
  // A counter of two samples: `label` = each of `values` (the index the arrays are kept by).
  const auto pair = [&out](const char* name, const char* help, const char* label, const char* const (&values)[2],
                           const auto& counts) {
    header(out, name, "counter", help);
    for (int i = 0; i < 2; ++i) out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, values[i], counts[i]);
  };
  const char* const kOutcome[2] = {"error", "ok"};
  const char* const kVia[2] = {"tcp", "cuda_ipc"};
  pair("tachyon_kv_transfers_total",
       "Prefill role: exported sequences shipped to a decode worker, by outcome (ok: adopted there).", "outcome", kOutcome,
       transfers_);
  pair("tachyon_kv_transfer_bytes_total",
       "Prefill role: K/V bytes shipped, by path (cuda_ipc: device memory the decode worker maps; tcp: via the host).",
       "via", kVia, transfer_bytes_);
  pair("tachyon_kv_export_copy_seconds_total",
       "Prefill role: seconds exports spent copying K/V out of the cache (to the host or the staging memory).", "via",
       kVia, export_seconds_);
  pair("tachyon_kv_adopted_bytes_total", "Decode role: K/V bytes copied into the cache by adoptions, by where they came from.",
       "via", kVia, adopted_bytes_);
  pair("tachyon_kv_adopt_copy_seconds_total",
       "Decode role: seconds adoptions spent copying K/V into the cache (bytes / seconds: the copy rate).", "via", kVia,
       adopt_seconds_);
  pair("tachyon_kv_adoptions_total", "Decode role: received transfers adopted into the engine, by outcome.", "outcome",
       kOutcome, adoptions_);
  header(out, "tachyon_http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [status, n] : http_responses_) {
    out += fmt::format("tachyon_http_responses_total{{code=\"{}\"}} {}\n", status, n);
  }
  header(out, "tachyon_time_to_first_token_seconds", "histogram", "Time from arrival to the first generated token.");
  ttft_.render("tachyon_time_to_first_token_seconds", out);
  header(out, "tachyon_time_per_output_token_seconds", "histogram",
         "Mean time between generated tokens of one request (requests with two tokens or more).");
  tpot_.render("tachyon_time_per_output_token_seconds", out);
  header(out, "tachyon_e2e_request_latency_seconds", "histogram", "Time from arrival to the end of a request.");
  e2e_.render("tachyon_e2e_request_latency_seconds", out);
  header(out, "tachyon_request_queue_time_seconds", "histogram", "Time from arrival to first being scheduled.");
  queue_.render("tachyon_request_queue_time_seconds", out);
  return out;
}

}  // namespace tachyon::server
