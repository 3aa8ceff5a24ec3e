#include "server/disagg_worker.h"

#include <any>
#include <chrono>
#include <future>

#include <fmt/format.h>

#include "core/log.h"

namespace tachyon::server {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

PrefillWorker::PrefillWorker(ServerMetrics& metrics, disagg::KvSenderOptions options,
                             std::shared_ptr<disagg::KvExportArena> arena)
    : metrics_(metrics), arena_(std::move(arena)), sender_(options) {}

std::function<Result<ShipTransfer>(Engine&, RequestId)> PrefillWorker::on_transfer() {
  return [this](Engine& engine, RequestId id) -> Result<ShipTransfer> {
    const auto copy_start = std::chrono::steady_clock::now();
    TACHYON_ASSIGN_OR_RETURN(disagg::KvExport kv, disagg::export_kv(engine, id, arena_.get()));
    metrics_.record_exported(kv.device.has_value(), kv.total_bytes(), seconds_since(copy_start));
    return ShipTransfer([this, kv = std::move(kv)](std::shared_ptr<RequestStream> stream) mutable {
      const auto& target = std::any_cast<const TransferTarget&>(stream->transfer_target());
      sender_.send(target.to, target.transfer_id, std::move(kv), [this, stream](const Status& outcome) {
        metrics_.record_transfer(outcome.ok());
        stream->finish_handoff(outcome);
      });
    });
  };
}

Status TransferRegistry::add(uint64_t transfer_id, std::shared_ptr<RequestStream> stream, Clock::time_point deadline) {
  std::lock_guard lock(mu_);
  if (!entries_.emplace(transfer_id, Entry{std::move(stream), deadline}).second) {
    return make_error(ErrorCode::kInvalidArgument, "transfer id {} is already registered", transfer_id);
  }
  return Status::Ok();
}

std::shared_ptr<RequestStream> TransferRegistry::take(uint64_t transfer_id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(transfer_id);
  if (it == entries_.end()) return nullptr;
  std::shared_ptr<RequestStream> stream = std::move(it->second.stream);
  entries_.erase(it);
  return stream->cancelled() ? nullptr : stream;
}

void TransferRegistry::expire(Clock::time_point now) {
  std::vector<std::shared_ptr<RequestStream>> late;
  {
    std::lock_guard lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.stream->cancelled()) {
        it = entries_.erase(it);
      } else if (now > it->second.deadline) {
        late.push_back(std::move(it->second.stream));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : late) {
    TACHYON_LOG_WARN("a registered transfer did not arrive in time; the request fails");
    s->fail(make_error(ErrorCode::kIo, "the KV transfer from the prefill worker did not arrive in time"));
  }
}

size_t TransferRegistry::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

DecodeWorker::DecodeWorker(AsyncEngine& engine, TransferRegistry& registry, ServerMetrics& metrics,
                           const DecodeWorkerOptions& options)
    : engine_(engine), registry_(registry), metrics_(metrics), options_(options) {}

Result<std::unique_ptr<DecodeWorker>> DecodeWorker::start(AsyncEngine& engine, TransferRegistry& registry,
                                                          ServerMetrics& metrics, const DecodeWorkerOptions& options) {
  std::unique_ptr<DecodeWorker> w(new DecodeWorker(engine, registry, metrics, options));
  DecodeWorker* self = w.get();
  auto receiver = disagg::KvReceiver::start(options.receiver,
                                            [self](disagg::ReceivedKv&& r) { return self->adopt(std::move(r)); });
  if (!receiver.ok()) return receiver.status().with_context("the decode worker's KV port");
  w->receiver_ = std::move(receiver).value();
  w->expiry_ = std::thread([self] {
    std::unique_lock lock(self->mu_);
    while (!self->stop_) {
      self->cv_.wait_for(lock, std::chrono::milliseconds(100));
      lock.unlock();
      self->registry_.expire(TransferRegistry::Clock::now());
      lock.lock();
    }
  });
  return w;
}

DecodeWorker::~DecodeWorker() {
  receiver_.reset();  // joins the connection threads (each ends within its slice or transfer)
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (expiry_.joinable()) expiry_.join();
}

Status DecodeWorker::adopt(disagg::ReceivedKv&& received) {
  std::shared_ptr<RequestStream> stream = registry_.take(received.transfer_id);
  if (!stream) {
    return make_error(ErrorCode::kNotFound, "transfer {} is not registered here (unknown, cancelled or expired)",
                      received.transfer_id);
  }
  ImportedSequence seq;
  seq.tokens = received.kv.tokens;
  seq.num_prompt_tokens = received.kv.num_prompt_tokens;
  // The metrics, not this worker: they outlive the engine, which may try it after this returned.
  seq.adopt = [metrics = &metrics_, kv = std::move(received.kv)](Engine& engine, const GenerationParams& params) {
    const auto copy_start = std::chrono::steady_clock::now();
    Result<RequestId> id = disagg::adopt(engine, kv, params);
    // adopt() returns once its copies ran: its time is the K/V's way into this cache.
    if (id.ok()) metrics->record_adopted_bytes(kv.device.has_value(), kv.total_bytes(), seconds_since(copy_start));
    return id;
  };
  auto outcome = std::make_shared<std::promise<Status>>();
  std::future<Status> result = outcome->get_future();
  engine_.submit_adoption(std::move(stream), std::move(seq), [outcome](const Status& st) { outcome->set_value(st); });
  // The loop answers within adopt_wait (plus a step); the margin only bounds a stuck engine.
  const auto limit = std::chrono::duration<double>(options_.adopt_wait + 30.0);
  if (result.wait_for(limit) != std::future_status::ready) {
    return make_error(ErrorCode::kIo, "transfer {}: the engine did not adopt it within {:g} s", received.transfer_id,
                      limit.count());
  }
  return result.get();
}

}  // namespace tachyon::server
