// The server's counters, gauges and latency histograms, rendered for GET /metrics in the Prometheus
// text exposition format (version 0.0.4). Every name starts with `tachyon_`.
//
// The engine loop records each finished request and publishes an EngineStats snapshot after every
// step; connection threads count HTTP responses and render. One mutex guards everything: updates
// are a few additions per finished request, far below one engine step.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/async_engine_metrics.h"
#include "engine/engine.h"

namespace tachyon::server {

// Cumulative histogram with fixed upper bounds (seconds), as Prometheus expects.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // `name`_bucket{le=...}, `name`_sum, `name`_count lines.
  void render(const std::string& name, std::string& out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1]: the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServerMetrics : public AsyncEngineMetrics {
 public:
  ServerMetrics();

  // Engine loop (AsyncEngineMetrics).
  void record_admitted(int num_prompt_tokens) override;
  void record_finished(const RequestOutput& output, bool timed_out) override;
  void set_engine_stats(const EngineStats& stats) override;
  void record_adoption(bool ok) override;
  // Connection threads.
  void record_http_response(int status);
  void record_rejected();  // refused by the bounded queue or while draining
  // Disaggregation: a prefill worker's shipped transfers (acked by the decode worker or not); a
  // decode worker's adoptions of received ones are the loop's record_adoption().
  void record_transfer(bool ok);
  // Prefill role: K/V bytes exported for the sender and the seconds export_kv() took to copy them
  // out, by path (device memory a decode worker maps, or through the host over TCP).
  void record_exported(bool device_region, uint64_t bytes, double seconds);
  // Decode role: K/V bytes adopted into the cache and the seconds adopt() took to copy them in, by
  // where they came from (a mapped device region, or host memory received over TCP).
  void record_adopted_bytes(bool device_region, uint64_t bytes, double seconds);

  EngineStats engine_stats() const;

  std::string render() const;

 private:
  mutable std::mutex mu_;
  EngineStats engine_;
  int64_t prompt_tokens_ = 0;
  std::array<int64_t, 7> finished_{};  // by FinishReason, then timeouts
  std::array<int64_t, 2> transfers_{};  // failed, ok
  std::array<int64_t, 2> adoptions_{};  // failed, ok
  std::array<uint64_t, 2> transfer_bytes_{};  // tcp, cuda_ipc
  std::array<double, 2> export_seconds_{};
  std::array<uint64_t, 2> adopted_bytes_{};   // tcp, cuda_ipc
  std::array<double, 2> adopt_seconds_{};
  int64_t rejected_ = 0;
  std::map<int, int64_t> http_responses_;
  Histogram ttft_;
  Histogram tpot_;
  Histogram e2e_;
  Histogram queue_;
};

}  // namespace tachyon::server
