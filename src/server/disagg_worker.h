// The glue between a disaggregated worker's HTTP side, its AsyncEngine and the KV transport
// (disagg/). `tachyon serve --role prefill|decode` builds one of these; `--role both` none.
//
//   PrefillWorker   AsyncEngineOptions::on_transfer: each request held for transfer is exported
//                   (disagg::export_kv(), into the KvExportArena where it has room) and goes to
//                   the KvSender, addressed by the request's TransferTarget; the transfer's
//                   outcome (acked or not) ends the request's stream (RequestStream::finish_handoff).
//   TransferRegistry  decode role: transfer id -> the request (its stream, with the client's
//                   GenerationParams) registered by POST /internal/v1/decode/*, waiting for its KV.
//                   A registration that sees no transfer within its timeout ends with an error;
//                   one whose client went away is dropped.
//   DecodeWorker    the KV port: a KvReceiver whose handler takes the registration of each received
//                   transfer and hands both to AsyncEngine::submit_adoption(), to be adopted with
//                   disagg::adopt(); the ack tells the prefill worker whether the engine adopted
//                   it. Unknown transfer ids are refused.
//
// Lifetimes: the registry outlives the HTTP server (its sessions register); the DecodeWorker must be
// destroyed (its threads joined) before the AsyncEngine it feeds; the PrefillWorker must outlive
// the AsyncEngine that calls it; the ServerMetrics outlive them all.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/status.h"
#include "disagg/kv_export.h"
#include "disagg/kv_receiver.h"
#include "disagg/kv_sender.h"
#include "engine/async_engine.h"
#include "server/disagg_protocol.h"
#include "server/metrics.h"

namespace tachyon::server {

// Where a prefill-only request's KV goes: what RequestStream::set_transfer_target() holds.
struct TransferTarget {
  disagg::KvDestination to;
  uint64_t transfer_id = 0;
};

class PrefillWorker {
 public:
  // `arena`, when given: exports go into its device memory where it has room (CUDA IPC to a decode
  // worker on the same host), else to the host.
  PrefillWorker(ServerMetrics& metrics, disagg::KvSenderOptions options,
                std::shared_ptr<disagg::KvExportArena> arena = nullptr);
  // For AsyncEngineOptions::on_transfer.
  std::function<Result<ShipTransfer>(Engine&, RequestId)> on_transfer();
  int transfers_in_flight() const { return sender_.num_in_flight(); }
  // Ends shipping (disagg::KvSender::shutdown): call it once the HTTP server stopped and before
  // it is destroyed, so that no transfer outcome reaches a stream after its connection is gone.
  void stop() { sender_.shutdown(); }

 private:
  ServerMetrics& metrics_;
  std::shared_ptr<disagg::KvExportArena> arena_;
  disagg::KvSender sender_;
};

class TransferRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  // kInvalidArgument for an id already registered.
  Status add(uint64_t transfer_id, std::shared_ptr<RequestStream> stream, Clock::time_point deadline);
  // The registration of `transfer_id`, removed; null when unknown, expired or cancelled.
  std::shared_ptr<RequestStream> take(uint64_t transfer_id);
  // Ends registrations past their deadline with an error, drops cancelled ones.
  void expire(Clock::time_point now);
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<RequestStream> stream;
    Clock::time_point deadline;
  };
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_;
};

struct DecodeWorkerOptions {
  disagg::KvReceiverOptions receiver;
  double adopt_wait = 10.0;  // as AsyncEngineOptions::adopt_wait: bounds the wait for the ack
};

class DecodeWorker {
 public:
  static Result<std::unique_ptr<DecodeWorker>> start(AsyncEngine& engine, TransferRegistry& registry,
                                                     ServerMetrics& metrics, const DecodeWorkerOptions& options);
  ~DecodeWorker();  // stops the KV port and the expiry thread
  DecodeWorker(const DecodeWorker&) = delete;
  DecodeWorker& operator=(const DecodeWorker&) = delete;

  uint16_t kv_port() const { return receiver_->port(); }

 private:
  DecodeWorker(AsyncEngine& engine, TransferRegistry& registry, ServerMetrics& metrics,
               const DecodeWorkerOptions& options);
  Status adopt(disagg::ReceivedKv&& received);

  AsyncEngine& engine_;
  TransferRegistry& registry_;
  ServerMetrics& metrics_;
  DecodeWorkerOptions options_;
  std::unique_ptr<disagg::KvReceiver> receiver_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread expiry_;
};

// What the HTTP server needs to know about its worker role.
struct DisaggContext {
  WorkerRole role = WorkerRole::kBoth;
  TransferRegistry* registry = nullptr;  // decode
  int kv_port = 0;                       // decode
  double transfer_wait = 30.0;           // decode: seconds a registration waits for its transfer
  const PrefillWorker* prefill = nullptr;
};

}  // namespace tachyon::server
