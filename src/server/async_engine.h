// AsyncEngine: the bridge between many connection threads and the one thread that drives an Engine.
//
//   submit()   any thread: queues a request (prompt ids + GenerationParams) and returns its
//              RequestStream at once; past --max-waiting queued requests it refuses (the server
//              answers 503)
//   abort()    any thread: the request is aborted before the next engine step (its KV blocks freed)
//   n > 1      the choices of one prompt: choice 0 runs first, the others join once it has its first
//              token, so they take the prompt's KV from the prefix cache (see set_leader())
//   the loop   its own thread: takes the queued submissions and aborts, aborts requests past their
//              deadline, runs Engine::step(), and pushes each RequestOutput to its stream. When the
//              engine has nothing to do it sleeps on a condition variable; it never spins.
//
// Backpressure: the loop never waits for a consumer. A stream buffers its outputs (at most one per
// generated token, so bounded by max_tokens) and calls its notify callback once when the buffer
// goes from empty to non-empty; the consumer takes everything buffered at once, so a slow client
// gets its tokens in larger pieces instead of slowing the engine down.
//
// Drain: begin_drain() refuses new submissions; the loop exits once every request has finished.
// The Engine belongs to the loop thread alone: nothing else may call it after start().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "server/metrics.h"

namespace tachyon::server {

struct AsyncEngineOptions {
  int max_waiting = 1024;         // queued requests not yet running, past which submit() refuses
  double request_timeout = 600.0; // seconds from submission; 0 = none. A late request is aborted.
};

// One request's outputs, from the loop thread to one consumer.
class RequestStream {
 public:
  RequestStream(std::vector<int32_t> prompt_ids, GenerationParams params)
      : prompt_ids_(std::move(prompt_ids)), params_(std::move(params)) {}

  // Called (on the loop thread) when outputs arrive and none were waiting; must not block. Set it
  // before submit().
  void set_notify(std::function<void()> notify);
  // Everything the loop delivered since the last call, in order.
  std::vector<RequestOutput> take();
  // Another request of the same prompt (choice 0 of an n > 1 request): this one is added to the
  // engine only once the leader has its first token, so that the prompt's full KV blocks come
  // from the prefix cache instead of being computed n times. Set before submit().
  void set_leader(std::shared_ptr<RequestStream> leader) { leader_ = std::move(leader); }
  // The request ran past its deadline and was aborted (its last output has kAbort).
  bool timed_out() const { return timed_out_.load(std::memory_order_acquire); }
  int num_prompt_tokens() const { return num_prompt_tokens_; }

 private:
  friend class AsyncEngine;
  void push(RequestOutput output);  // loop thread

  std::mutex mu_;
  std::vector<RequestOutput> pending_;
  bool notified_ = false;  // a notify was sent and take() has not run since
  std::function<void()> notify_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> timed_out_{false};
  // Set before submit(), then the loop thread's alone.
  std::vector<int32_t> prompt_ids_;
  GenerationParams params_;
  int num_prompt_tokens_ = static_cast<int>(prompt_ids_.size());
  std::shared_ptr<RequestStream> leader_;
  RequestId engine_id_ = 0;  // 0 until added to the engine
  double deadline_ = 0.0;    // engine clock; 0 = none
  bool started_ = false;     // an output arrived (the prompt is prefilled) or it finished
};

// Why submit() refused.
enum class SubmitError { kNone, kQueueFull, kDraining };

class AsyncEngine {
 public:
  AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options, ServerMetrics& metrics);
  ~AsyncEngine();  // drains nothing: aborts what is left and joins the loop
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Queues all of `streams` (the choices of one HTTP request) or none of them.
  SubmitError submit(const std::vector<std::shared_ptr<RequestStream>>& streams);
  void abort(const std::shared_ptr<RequestStream>& stream);
  // Refuses new submissions; the loop exits when every request has finished.
  void begin_drain();
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  // The loop has exited (after begin_drain(), once idle).
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  // Requests submitted and not finished (queued, waiting or running).
  int num_unfinished() const { return unfinished_.load(std::memory_order_acquire); }

  // Fixed at construction; safe from any thread.
  int max_model_len() const { return max_model_len_; }
  int vocab_size() const { return vocab_size_; }

 private:
  void loop();
  void admit(std::shared_ptr<RequestStream> stream, double now);
  void deliver(RequestOutput output);
  void finish_stream(const std::shared_ptr<RequestStream>& stream, RequestOutput output);
  void publish_stats();

  std::unique_ptr<Engine> engine_;
  AsyncEngineOptions options_;
  ServerMetrics& metrics_;
  const int max_model_len_;
  const int vocab_size_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<RequestStream>> submissions_;  // guarded by mu_
  std::vector<std::shared_ptr<RequestStream>> aborts_;       // guarded by mu_
  // submit() counts submissions_ + in_transit_ + engine_waiting_ as waiting; the loop updates the
  // last two together, so no request is counted twice or missed.
  size_t in_transit_ = 0;   // guarded by mu_: taken by the loop, not yet in the engine (held included)
  int engine_waiting_ = 0;  // guarded by mu_: the engine's waiting requests, published by the loop
  bool stop_now_ = false;   // guarded by mu_ (destructor)
  std::atomic<int> unfinished_{0};
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};

  // The loop thread's own.
  std::unordered_map<RequestId, std::shared_ptr<RequestStream>> streams_;
  std::vector<std::shared_ptr<RequestStream>> held_;  // followers waiting for their leader's prefill
  std::thread thread_;
};

}  // namespace tachyon::server
