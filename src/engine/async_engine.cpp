#include "engine/async_engine.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "core/log.h"

namespace tachyon {

void RequestStream::set_notify(std::function<void()> notify) {
  std::lock_guard lock(mu_);
  notify_ = std::move(notify);
}

std::vector<RequestOutput> RequestStream::take() {
  std::vector<RequestOutput> out;
  std::lock_guard lock(mu_);
  out.swap(pending_);
  notified_ = false;
  return out;
}

bool RequestStream::queue(RequestOutput output) {
  output.handed_over_at =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::lock_guard lock(mu_);
  pending_.push_back(std::move(output));
  if (notified_ || !notify_) return false;
  notified_ = true;
  return true;
}

void RequestStream::push(RequestOutput output) {
  if (queue(std::move(output))) notify();
}

void RequestStream::finish_handoff(const Status& outcome) {
  RequestOutput out;
  out.id = engine_id_;
  out.finished = true;
  out.finish_reason = FinishReason::kTransfer;
  out.error = outcome;
  push(std::move(out));
}

void RequestStream::fail(const Status& error) {
  RequestOutput out;
  out.finished = true;
  out.finish_reason = FinishReason::kError;
  out.error = error;
  push(std::move(out));
}

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options, AsyncEngineMetrics& metrics)
    : engine_(std::move(engine)),
      options_(options),
      metrics_(metrics),
      max_model_len_(engine_->max_model_len()),
      vocab_size_(engine_->model().config().vocab_size) {
  metrics_.set_engine_stats(engine_->stats());
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() {
  {
    std::lock_guard lock(mu_);
    stop_now_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

SubmitError AsyncEngine::submit(const std::vector<std::shared_ptr<RequestStream>>& streams) {
  {
    std::lock_guard lock(mu_);
    if (draining_.load(std::memory_order_acquire) || stop_now_) return SubmitError::kDraining;
    const size_t waiting = submissions_.size() + in_transit_ + static_cast<size_t>(engine_waiting_);
    if (waiting + streams.size() > static_cast<size_t>(options_.max_waiting)) return SubmitError::kQueueFull;
    for (const auto& s : streams) submissions_.push_back(s);
    unfinished_.fetch_add(static_cast<int>(streams.size()), std::memory_order_acq_rel);
  }
  cv_.notify_one();
  return SubmitError::kNone;
}

void AsyncEngine::abort(const std::shared_ptr<RequestStream>& stream) {
  if (stream->cancelled_.exchange(true, std::memory_order_acq_rel)) return;
  {
    std::lock_guard lock(mu_);
    aborts_.push_back(stream);
  }
  cv_.notify_one();
}

void AsyncEngine::begin_drain() {
  {
    std::lock_guard lock(mu_);
    draining_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
}

void AsyncEngine::finish_stream(const std::shared_ptr<RequestStream>& stream, RequestOutput output) {
  stream->started_ = true;
  metrics_.record_finished(output, stream->timed_out());
  unfinished_.fetch_sub(1, std::memory_order_acq_rel);
  push_later(stream, std::move(output));
}

void AsyncEngine::push_later(const std::shared_ptr<RequestStream>& stream, RequestOutput output) {
  if (stream->queue(std::move(output))) ready_.push_back(stream);
}

void AsyncEngine::set_notify_ready(NotifyReady notify_ready) {
  std::lock_guard lock(mu_);
  new_notify_ready_ = std::move(notify_ready);
  has_new_notify_ready_ = true;
}

void AsyncEngine::flush_ready() {
  if (ready_.empty()) return;
  if (notify_ready_) {
    notify_ready_(std::move(ready_));
  } else {
    for (const auto& s : ready_) s->notify();
  }
  ready_.clear();  // moved-from: valid, and emptied here either way
}

void AsyncEngine::submit_adoption(std::shared_ptr<RequestStream> stream, ImportedSequence seq,
                                  std::function<void(const Status&)> done) {
  {
    std::lock_guard lock(mu_);
    if (!loop_exited_ && !stop_now_) {
      adoptions_.push_back(Adoption{std::move(stream), std::move(seq), std::move(done)});
      unfinished_.fetch_add(1, std::memory_order_acq_rel);
      pending_adoption_count_.fetch_add(1, std::memory_order_acq_rel);
      cv_.notify_one();
      return;
    }
  }
  const Status error = make_error(ErrorCode::kIo, "the decode worker is shutting down");
  stream->fail(error);
  done(error);
}

void AsyncEngine::adopt_pending(double now) {
  std::vector<Adoption> left;
  for (Adoption& a : pending_adoptions_) {
    RequestStream& s = *a.stream;
    if (s.cancelled()) {
      unfinished_.fetch_sub(1, std::memory_order_acq_rel);
      pending_adoption_count_.fetch_sub(1, std::memory_order_acq_rel);
      metrics_.record_adoption(false);
      a.done(make_error(ErrorCode::kIo, "the request was cancelled before its KV was adopted"));
      continue;
    }
    if (a.deadline == 0.0) a.deadline = now + options_.adopt_wait;
    Result<RequestId> id = make_error(ErrorCode::kInvalidArgument,
                                      "kv import: the transfer's prompt ({} tokens) is not this request's ({} tokens)",
                                      a.seq.num_prompt_tokens, s.prompt_ids_.size());
    const bool same_prompt = a.seq.num_prompt_tokens >= 0 &&
                             static_cast<size_t>(a.seq.num_prompt_tokens) == s.prompt_ids_.size() &&
                             a.seq.tokens.size() >= s.prompt_ids_.size() &&
                             std::equal(s.prompt_ids_.begin(), s.prompt_ids_.end(), a.seq.tokens.begin());
    if (same_prompt) id = a.seq.adopt(*engine_, s.params_);
    if (id.ok()) {
      s.engine_id_ = *id;
      s.imported_tokens_.assign(a.seq.tokens.begin() + a.seq.num_prompt_tokens, a.seq.tokens.end());
      if (options_.request_timeout > 0) s.deadline_ = now + options_.request_timeout;
      metrics_.record_admitted(s.num_prompt_tokens_);
      metrics_.record_adoption(true);
      streams_.emplace(*id, a.stream);
      pending_adoption_count_.fetch_sub(1, std::memory_order_acq_rel);
      a.done(Status::Ok());
      continue;
    }
    // No room now: worth another try after a step frees some, while anything runs.
    if (id.status().code() == ErrorCode::kOutOfRange && engine_->has_unfinished() && now < a.deadline) {
      left.push_back(std::move(a));
      continue;
    }
    Status error = id.status();
    if (error.code() == ErrorCode::kOutOfRange) {
      error = engine_->has_unfinished()
                  ? error.with_context(fmt::format("no room in the decode worker's engine within {:g} s",
                                                   options_.adopt_wait))
                  : error.with_context("the decode worker's engine cannot hold it");
    }
    TACHYON_LOG_WARN("adoption failed: {}", error.to_string());
    metrics_.record_adoption(false);
    pending_adoption_count_.fetch_sub(1, std::memory_order_acq_rel);
    RequestOutput out;
    out.finished = true;
    out.finish_reason = FinishReason::kError;
    out.error = error;
    finish_stream(a.stream, std::move(out));
    a.done(error);
  }
  pending_adoptions_.swap(left);
}

void AsyncEngine::hand_over(std::shared_ptr<RequestStream> s, RequestOutput output) {
  const RequestId id = output.id;
  if (s->cancelled() || !options_.on_transfer || !s->transfer_target_.has_value()) {
    engine_->abort(id);  // frees the blocks held for the transfer
    const bool cancelled = s->cancelled();
    output.finish_reason = cancelled ? FinishReason::kAbort : FinishReason::kError;
    if (!cancelled) {
      output.error = make_error(ErrorCode::kInternal, "a prefill-only request without a transfer target");
    }
    finish_stream(s, std::move(output));
    return;
  }
  Result<ShipTransfer> ship = options_.on_transfer(*engine_, id);  // the blocks are free from here on, whatever happened
  if (!ship.ok()) {
    output.finish_reason = FinishReason::kError;
    output.error = ship.status();
    finish_stream(s, std::move(output));
    return;
  }
  // The engine's part is over: count it finished (as a transfer), deliver the first token as
  // news, and let the shipper end the stream.
  metrics_.record_finished(output, false);
  unfinished_.fetch_sub(1, std::memory_order_acq_rel);
  output.finished = false;
  push_later(s, std::move(output));
  (*ship)(std::move(s));
}

void AsyncEngine::deliver(RequestOutput output) {
  auto it = streams_.find(output.id);
  if (it == streams_.end()) {
    // Aborted by its consumer: nobody listens. A held transfer still has blocks to free.
    if (output.finished && output.finish_reason == FinishReason::kTransfer) engine_->abort(output.id);
    return;
  }
  it->second->started_ = true;
  if (!output.finished) {
    push_later(it->second, std::move(output));
    return;
  }
  std::shared_ptr<RequestStream> stream = std::move(it->second);
  streams_.erase(it);
  if (output.finish_reason == FinishReason::kTransfer) {
    hand_over(std::move(stream), std::move(output));
    return;
  }
  finish_stream(stream, std::move(output));
}

void AsyncEngine::publish_stats() {
  const EngineStats stats = engine_->stats();
  {
    std::lock_guard lock(mu_);
    engine_waiting_ = stats.num_waiting;
  }
  metrics_.set_engine_stats(stats);
}

// Adds a submission to the engine, or holds it while its leader's prompt is being prefilled.
void AsyncEngine::admit(std::shared_ptr<RequestStream> s, double now) {
  if (s->cancelled_.load(std::memory_order_acquire)) {
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);
    return;
  }
  // Holding is worth it only when there is a full block to share.
  const RequestStream* leader = s->leader_.get();
  const bool shareable = engine_->options().kv.prefix_caching &&
                         s->prompt_ids_.size() > static_cast<size_t>(engine_->kv_config().block_size);
  if (leader != nullptr && shareable && !leader->started_ && !leader->cancelled_.load(std::memory_order_acquire)) {
    held_.push_back(std::move(s));
    return;
  }
  s->leader_.reset();
  // Its timings count from when the server read it, not from here: the wait for this loop (the
  // step that was running when it came) is part of its TTFT.
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - s->created_).count();
  auto id = engine_->add_request(std::move(s->prompt_ids_), std::move(s->params_), engine_->now() - waited);
  if (!id.ok()) {
    RequestOutput out;
    out.finished = true;
    out.finish_reason = FinishReason::kError;
    out.error = id.status();
    finish_stream(s, std::move(out));
    return;
  }
  s->engine_id_ = *id;
  if (options_.request_timeout > 0) s->deadline_ = now + options_.request_timeout;
  metrics_.record_admitted(s->num_prompt_tokens_);
  streams_.emplace(*id, std::move(s));
}

void AsyncEngine::run_step() {
  auto outputs = engine_->step();
  if (!outputs.ok()) {
    // The step failed as a whole (the forward): fail every request, keep serving.
    TACHYON_LOG_ERROR("engine step failed: {}", outputs.status().to_string());
    std::vector<RequestId> ids;
    for (const auto& [id, s] : streams_) ids.push_back(id);
    for (RequestId id : ids) {
      engine_->abort(id);
      std::shared_ptr<RequestStream> s = std::move(streams_.at(id));
      streams_.erase(id);
      RequestOutput out;
      out.id = id;
      out.finished = true;
      out.finish_reason = FinishReason::kError;
      out.error = outputs.status();
      finish_stream(s, std::move(out));
    }
    return;
  }
  // The step admitted requests: count them out of the queue before any client hears of it, so
  // that a submit() prompted by a first token never sees them as still waiting.
  {
    const int waiting = engine_->stats().num_waiting;
    std::lock_guard lock(mu_);
    engine_waiting_ = waiting;
  }
  for (RequestOutput& o : *outputs) deliver(std::move(o));
}

void AsyncEngine::loop() {
  std::vector<std::shared_ptr<RequestStream>> submitted, aborted, released;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stop_now_ || !submissions_.empty() || !aborts_.empty() || !held_.empty() || !adoptions_.empty() ||
               !pending_adoptions_.empty() || engine_->has_unfinished() ||
               (draining_.load(std::memory_order_acquire) && streams_.empty());
      });
      if (stop_now_) break;
      if (draining_.load(std::memory_order_acquire) && submissions_.empty() && aborts_.empty() && streams_.empty() &&
          held_.empty() && adoptions_.empty() && pending_adoptions_.empty() && !engine_->has_unfinished()) {
        break;
      }
      in_transit_ = submissions_.size() + held_.size();
      if (has_new_notify_ready_) {
        notify_ready_ = std::move(new_notify_ready_);
        has_new_notify_ready_ = false;
      }
      submitted.swap(submissions_);
      aborted.swap(aborts_);
      for (Adoption& a : adoptions_) pending_adoptions_.push_back(std::move(a));
      adoptions_.clear();
    }
    // Aborts first: a request cancelled before it was added is skipped by admit(). An aborted
    // request stays in streams_ until the next step reports it, so that it is counted like any other.
    for (const auto& s : aborted) {
      if (s->engine_id_ != 0 && streams_.count(s->engine_id_) != 0) engine_->abort(s->engine_id_);
    }
    aborted.clear();
    const double now = engine_->now();
    // Followers whose leader has its first token (so its prompt's full blocks are in the prefix
    // cache) or will never get one.
    released.clear();
    for (auto it = held_.begin(); it != held_.end();) {
      const RequestStream& leader = *(*it)->leader_;
      if (leader.started_ || leader.cancelled_.load(std::memory_order_acquire) ||
          (*it)->cancelled_.load(std::memory_order_acquire)) {
        released.push_back(std::move(*it));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& s : released) admit(std::move(s), now);
    for (auto& s : submitted) admit(std::move(s), now);
    submitted.clear();
    if (!pending_adoptions_.empty()) adopt_pending(now);
    {
      const int waiting = engine_->stats().num_waiting;
      std::lock_guard lock(mu_);  // both at once: submit() must never count a request twice
      engine_waiting_ = waiting;
      in_transit_ = held_.size();
    }
    if (options_.request_timeout > 0) {
      for (auto& [id, s] : streams_) {
        if (s->deadline_ > 0 && now > s->deadline_ && !s->timed_out_.load(std::memory_order_acquire)) {
          s->timed_out_.store(true, std::memory_order_release);
          engine_->abort(id);  // reported with kAbort by the step below
          TACHYON_LOG_WARN("request timed out after {:g} s; aborted", options_.request_timeout);
        }
      }
    }
    if (engine_->has_unfinished()) run_step();
    flush_ready();
    publish_stats();
  }
  end_remaining();
}

void AsyncEngine::end_remaining() {
  {
    std::lock_guard lock(mu_);
    loop_exited_ = true;
    for (Adoption& a : adoptions_) pending_adoptions_.push_back(std::move(a));
    adoptions_.clear();
  }
  for (Adoption& a : pending_adoptions_) {
    const Status error = make_error(ErrorCode::kIo, "the decode worker is shutting down");
    pending_adoption_count_.fetch_sub(1, std::memory_order_acq_rel);
    RequestOutput out;
    out.finished = true;
    out.finish_reason = FinishReason::kAbort;
    finish_stream(a.stream, std::move(out));
    a.done(error);
  }
  pending_adoptions_.clear();
  for (auto& [id, s] : streams_) {
    engine_->abort(id);
    RequestOutput out;
    out.id = id;
    out.finished = true;
    out.finish_reason = FinishReason::kAbort;
    finish_stream(s, std::move(out));
  }
  streams_.clear();
  for (auto& s : held_) {
    RequestOutput out;
    out.finished = true;
    out.finish_reason = FinishReason::kAbort;
    finish_stream(s, std::move(out));
  }
  held_.clear();
  flush_ready();
  publish_stats();
  stopped_.store(true, std::memory_order_release);
}

}  // namespace tachyon
