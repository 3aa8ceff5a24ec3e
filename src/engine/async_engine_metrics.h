// What AsyncEngine's loop reports as it runs (engine/async_engine.h); the server's ServerMetrics
// (server/metrics.h) renders it for GET /metrics. Calls come from the loop thread; whatever an
// implementation shows to other threads it guards itself.
#pragma once

#include "engine/engine.h"
#include "engine/request.h"

namespace tachyon {

class AsyncEngineMetrics {
 public:
  virtual ~AsyncEngineMetrics() = default;
  // A request entered the engine (added or adopted) with `num_prompt_tokens` prompt tokens.
  virtual void record_admitted(int num_prompt_tokens) = 0;
  // A request's part in this engine ended (`timed_out`: aborted at its deadline). For a
  // hand-off (kTransfer), once its KV left the engine.
  virtual void record_finished(const RequestOutput& output, bool timed_out) = 0;
  // The engine's counters, after every step.
  virtual void set_engine_stats(const EngineStats& stats) = 0;
  // Decode role: a received sequence was adopted, or refused for good.
  virtual void record_adoption(bool ok) = 0;
};

}  // namespace tachyon
