// Collects a RequestStream's outputs through its notify callback, as a connection does, for the
// AsyncEngine tests. Waits are bounded (2 minutes): a lost notification fails, never hangs; so is
// the wait for a draining loop to stop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/async_engine.h"
#include "wall_clock_scale.h"

namespace tachyon::testing {

struct StreamCollector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RequestOutput> outputs;
  bool finished = false;

  void attach(const std::shared_ptr<RequestStream>& s) {
    std::weak_ptr<RequestStream> weak = s;
    s->set_notify([this, weak] {
      auto strong = weak.lock();
      if (!strong) return;
      std::lock_guard lock(mu);
      for (auto& o : strong->take()) {
        finished = finished || o.finished;
        outputs.push_back(std::move(o));
      }
      cv.notify_all();
    });
  }
  bool wait_finished() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kWait, [&] { return finished; });
  }
  bool wait_outputs(size_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kWait, [&] { return outputs.size() >= n; });
  }
  // At least n tokens, or the end.
  bool wait_tokens(int n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kWait, [&] {
      int count = 0;
      for (const auto& o : outputs) count += static_cast<int>(o.new_token_ids.size());
      return count >= n || finished;
    });
  }
  std::vector<int32_t> tokens() {
    std::lock_guard lock(mu);
    std::vector<int32_t> t;
    for (const auto& o : outputs) t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    return t;
  }

  static constexpr std::chrono::seconds kWait{120};
};

// Waits for `engine`'s loop to exit after begin_drain(); false once 30 s (scaled for slow builds)
// have passed without it.
inline bool wait_stopped(const AsyncEngine& engine) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(30.0 * kWallClockScale);
  while (!engine.stopped()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace tachyon::testing
