// What an AsyncEngine's loop reported (AsyncEngineMetrics), kept for the tests to read from any
// thread.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "engine/async_engine_metrics.h"

namespace tachyon::testing {

class RecordingMetrics : public AsyncEngineMetrics {
 public:
  void record_admitted(int num_prompt_tokens) override {
    std::lock_guard lock(mu_);
    prompt_tokens_ += num_prompt_tokens;
  }
  // As the server counts them: a request aborted at its deadline counts as a timeout, not by its
  // finish reason.
  void record_finished(const RequestOutput& output, bool timed_out) override {
    std::lock_guard lock(mu_);
    ++(timed_out ? timed_out_ : finished_[static_cast<size_t>(output.finish_reason)]);
  }
  void set_engine_stats(const EngineStats& stats) override {
    std::lock_guard lock(mu_);
    stats_ = stats;
  }
  void record_adoption(bool ok) override {
    std::lock_guard lock(mu_);
    ++adoptions_[ok ? 1 : 0];
  }

  EngineStats engine_stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  int64_t finished(FinishReason reason) const {
    std::lock_guard lock(mu_);
    return finished_[static_cast<size_t>(reason)];
  }
  int64_t timed_out() const {
    std::lock_guard lock(mu_);
    return timed_out_;
  }
  int64_t adoptions(bool ok) const {
    std::lock_guard lock(mu_);
    return adoptions_[ok ? 1 : 0];
  }

 private:
  mutable std::mutex mu_;
  EngineStats stats_;
  int64_t prompt_tokens_ = 0;
  std::array<int64_t, 6> finished_{};  // by FinishReason
  int64_t timed_out_ = 0;
  std::array<int64_t, 2> adoptions_{};  // failed, ok
};

}  // namespace tachyon::testing
