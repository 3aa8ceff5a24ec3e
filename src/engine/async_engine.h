// AsyncEngine: the bridge between many connection threads and the one thread that drives an Engine.
//
//   submit()   any thread: queues a request (prompt ids + GenerationParams) and returns its
//              RequestStream at once; past max_waiting queued requests it refuses (a server
//              answers 503)
//   abort()    any thread: the request is aborted before the next engine step (its KV blocks freed)
//   n > 1      the choices of one prompt: choice 0 runs first, the others join once it has its first
//              token, so they take the prompt's KV from the prefix cache (see set_leader())
//   the loop   its own thread: takes the queued submissions and aborts, aborts requests past their
//              deadline, runs Engine::step(), and pushes each RequestOutput to its stream. When the
//              engine has nothing to do it sleeps on a condition variable; it never spins.
//
// Disaggregation (the loop only calls back; server/disagg_worker.h wires the callbacks to
// disagg/kv_export.h and the KV transport):
//   prefill   a request run with GenerationParams::prefill_only ends with FinishReason::kTransfer
//              after its first token: the loop has AsyncEngineOptions::on_transfer take the
//              request's KV out of the engine at once (the blocks are freed), delivers that token
//              (as a not-finished output), then calls the shipper on_transfer returned; whoever
//              ships it ends the stream with RequestStream::finish_handoff(). A stream cancelled
//              by then is not shipped.
//   decode     submit_adoption(): a sequence received for a stream the server registered; the
//              loop calls its ImportedSequence::adopt and the stream then runs like any other. No
//              room now (kOutOfRange while other requests run) is backpressure: the adoption is
//              retried after each step, for at most adopt_wait seconds; then, or on any other
//              error, the stream ends with an error. `done` reports the outcome once (for the
//              transfer's ack).
//
// Backpressure: the loop never waits for a consumer. A stream buffers its outputs (at most one per
// generated token, so bounded by max_tokens) and is notified once when the buffer goes from empty
// to non-empty; the consumer takes everything buffered at once, so a slow client gets its tokens
// in larger pieces instead of slowing the engine down.
//
// Hand-over: the loop delivers a whole step before notifying anyone, then passes the step's
// newly ready streams to the set_notify_ready() callback in one call (without one, each stream's
// notify runs in turn). A server with many streams uses it to wake its I/O threads once per step
// instead of once per stream: the loop's cost per step then stays flat in the number of streams.
//
// Drain: begin_drain() refuses new submissions; the loop exits once every request has finished.
// The Engine belongs to the loop thread alone: nothing else may call it after start().
#pragma once

#include <any>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/async_engine_metrics.h"
#include "engine/engine.h"

namespace tachyon {

class RequestStream;

// Prefill role: ships a request's KV, already taken out of the engine, to where its stream's
// transfer target says (on the loop thread; must not block).
using ShipTransfer = std::function<void(std::shared_ptr<RequestStream> stream)>;

struct AsyncEngineOptions {
  int max_waiting = 1024;         // queued requests not yet running, past which submit() refuses
  double request_timeout = 600.0; // seconds from submission; 0 = none. A late request is aborted.
  // Prefill role, on the loop thread (must not block): takes the KV of request `id`, which ended
  // with kTransfer, out of `engine` (its blocks are free when this returns, whatever happened) and
  // returns what ships it, which the loop calls once it delivered the request's first token; or
  // the error that ends the request's stream.
  std::function<Result<ShipTransfer>(Engine& engine, RequestId id)> on_transfer;
  double adopt_wait = 10.0;       // seconds a received transfer may wait for room in the engine
};

// Decode role: a sequence another engine prefilled, for submit_adoption().
struct ImportedSequence {
  std::vector<int32_t> tokens;  // the prompt, then the tokens the other engine generated (and reported)
  int num_prompt_tokens = 0;
  // On the loop thread: adopts the sequence into `engine` with `params`, the registered request's,
  // as Engine::adopt_sequence() does (its id; kOutOfRange with nothing changed when there is no
  // room now).
  std::function<Result<RequestId>(Engine& engine, const GenerationParams& params)> adopt;
};

// One request's outputs, from the loop thread to one consumer.
class RequestStream {
 public:
  // Made when the request has been read (and tokenized): its arrival, for the engine's timings.
  RequestStream(std::vector<int32_t> prompt_ids, GenerationParams params)
      : prompt_ids_(std::move(prompt_ids)), params_(std::move(params)), created_(std::chrono::steady_clock::now()) {}

  // Called when outputs arrive and none were waiting (by notify(): on the loop thread, or where
  // set_notify_ready() sends it); must not block. Set it before submit(); it does
  // not change after.
  void set_notify(std::function<void()> notify);
  // Runs the notify callback (if any).
  void notify() const {
    if (notify_) notify_();
  }
  // Everything the loop delivered since the last call, in order.
  std::vector<RequestOutput> take();
  // Another request of the same prompt (choice 0 of an n > 1 request): this one is added to the
  // engine only once the leader has its first token, so that the prompt's full KV blocks come
  // from the prefix cache instead of being computed n times. Set before submit().
  void set_leader(std::shared_ptr<RequestStream> leader) { leader_ = std::move(leader); }
  // The request ran past its deadline and was aborted (its last output has kAbort).
  bool timed_out() const { return timed_out_.load(std::memory_order_acquire); }
  int num_prompt_tokens() const { return num_prompt_tokens_; }

  // Prefill role: where this request's KV goes after its first token (server/disagg_worker.h's
  // TransferTarget), for the shipper. Opaque to the loop, which hands over only requests that have
  // one. Set before submit().
  void set_transfer_target(std::any target) { transfer_target_ = std::move(target); }
  const std::any& transfer_target() const { return transfer_target_; }
  // Decode role: the generated tokens that came with an adopted transfer (reported by the prefill
  // worker); set before the stream's first output, so read it after take().
  const std::vector<int32_t>& imported_tokens() const { return imported_tokens_; }
  // The end of a handed-off stream (any thread, once): a finished output with kTransfer and the
  // transfer's outcome as its error (Ok: the decode worker adopted it).
  void finish_handoff(const Status& outcome);
  // Ends a stream that never reached the engine (a transfer that did not come) with an error.
  void fail(const Status& error);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  friend class AsyncEngine;
  // Buffers an output; true when the consumer must now be notified (the buffer was empty and no
  // notification is outstanding). push() notifies at once; the loop uses queue() and notifies per
  // step.
  bool queue(RequestOutput output);
  void push(RequestOutput output);

  std::mutex mu_;
  std::vector<RequestOutput> pending_;
  bool notified_ = false;  // a notify was sent and take() has not run since
  std::function<void()> notify_;  // set before submit(), then read only
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> timed_out_{false};
  // Set before submit(), then the loop thread's alone. The prompt and parameters are handed over
  // (moved) to the engine's request when it is added: from then on the engine's record is their
  // one owner (an adoption keeps its parameters until the engine has room).
  std::vector<int32_t> prompt_ids_;
  GenerationParams params_;
  std::chrono::steady_clock::time_point created_;  // when the request was read
  int num_prompt_tokens_ = static_cast<int>(prompt_ids_.size());
  std::shared_ptr<RequestStream> leader_;
  RequestId engine_id_ = 0;  // 0 until added to the engine
  double deadline_ = 0.0;    // engine clock; 0 = none
  bool started_ = false;     // an output arrived (the prompt is prefilled) or it finished
  std::any transfer_target_;
  std::vector<int32_t> imported_tokens_;
};

// Why submit() refused.
enum class SubmitError { kNone, kQueueFull, kDraining };

class AsyncEngine {
 public:
  AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options, AsyncEngineMetrics& metrics);
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
  // Decode role: continue `stream` from a received sequence (see the top of this file). `done`
  // runs once, on the loop thread (or here, when the loop has exited), with the adoption's outcome.
  void submit_adoption(std::shared_ptr<RequestStream> stream, ImportedSequence seq,
                       std::function<void(const Status&)> done);
  // Received transfers not yet adopted (queued or waiting for room).
  int num_pending_adoptions() const { return pending_adoption_count_.load(std::memory_order_acquire); }

  // The streams one step made ready, in delivery order, are handed to `notify_ready` (on the loop
  // thread; it must not block), which must see that each gets its RequestStream::notify() call.
  // Any thread, any time; it applies from the loop's next step. Whatever `notify_ready` captures
  // must outlive this engine.
  using NotifyReady = std::function<void(std::vector<std::shared_ptr<RequestStream>>&&)>;
  void set_notify_ready(NotifyReady notify_ready);

  // Fixed at construction; safe from any thread.
  int max_model_len() const { return max_model_len_; }
  int vocab_size() const { return vocab_size_; }

 private:
  void loop();
  // One Engine::step(), its outputs delivered; a failed step fails every request.
  void run_step();
  // After the loop (destruction without a drain): whatever is left ends as aborted, then stopped().
  void end_remaining();
  void admit(std::shared_ptr<RequestStream> stream, double now);
  void deliver(RequestOutput output);
  // Queues an output on a stream (loop thread); the stream is notified at the next flush_ready().
  void push_later(const std::shared_ptr<RequestStream>& stream, RequestOutput output);
  void flush_ready();
  void finish_stream(const std::shared_ptr<RequestStream>& stream, RequestOutput output);
  void publish_stats();
  struct Adoption {
    std::shared_ptr<RequestStream> stream;
    ImportedSequence seq;
    std::function<void(const Status&)> done;
    double deadline = 0.0;  // engine clock; set when the loop first tries it
  };
  // Tries each adoption; keeps those with no room yet (while anything runs, until their deadline).
  void adopt_pending(double now);
  // A kTransfer output: take the KV out and hand it over (or drop it for a cancelled stream).
  void hand_over(std::shared_ptr<RequestStream> stream, RequestOutput output);

  std::unique_ptr<Engine> engine_;
  AsyncEngineOptions options_;
  AsyncEngineMetrics& metrics_;
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
  bool loop_exited_ = false;  // guarded by mu_
  std::vector<Adoption> adoptions_;  // guarded by mu_: submitted, not yet taken by the loop
  NotifyReady new_notify_ready_;      // guarded by mu_: set, not yet taken by the loop
  bool has_new_notify_ready_ = false;  // guarded by mu_
  std::atomic<int> pending_adoption_count_{0};
  std::atomic<int> unfinished_{0};
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};

  // The loop thread's own.
  std::unordered_map<RequestId, std::shared_ptr<RequestStream>> streams_;
  std::vector<std::shared_ptr<RequestStream>> held_;  // followers waiting for their leader's prefill
  std::vector<Adoption> pending_adoptions_;            // taken, waiting for room
  std::vector<std::shared_ptr<RequestStream>> ready_;  // queued outputs, not yet notified
  NotifyReady notify_ready_;
  std::thread thread_;
};

}  // namespace tachyon
