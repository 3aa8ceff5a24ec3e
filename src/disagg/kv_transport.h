// KvTransport: an ordered, reliable channel of whole messages between two disaggregated workers
// (a prefill worker and a decode worker). kv_transfer.h puts a sequence's KV on it as a header
// message followed by one message per layer; the transport knows nothing of KV, engines or models.
//
// Implementations: TCP (tcp_transport.h, works everywhere) and an in-process pair (below, for
// tests and for a single process that plays both roles). K/V that stay on a GPU (CUDA IPC between
// processes of one host, kv_staging.h) still use a transport for the header and the region's
// handle; only the bytes take the other road. NCCL send/recv (GPUs across hosts) is not built.
//
// Every call is bounded by its timeout and reports failure as a Status (kIo for a closed peer, a
// timeout or a refused connection; kCorruptFile for a message longer than the receiver allows).
// After any failure the channel's position in the stream is unknown: the transport refuses every
// later call, and the caller drops it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"

namespace tachyon::disagg {

using Millis = std::chrono::milliseconds;

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  // Sends `message` whole, in order after the ones sent before, within `timeout`.
  virtual Status send(std::span<const uint8_t> message, Millis timeout) = 0;
  // The next message, whole, within `timeout`. A message longer than `max_bytes` is an error
  // (kCorruptFile) raised before anything of that size is allocated.
  virtual Result<std::vector<uint8_t>> receive(size_t max_bytes, Millis timeout) = 0;
  // Ends the channel: the peer's pending and later receive() calls fail with kIo once they have
  // taken what was sent before. Idempotent.
  virtual void close() = 0;
};

// Two connected in-process ends: what one sends, the other receives. Either may live on its own
// thread; each end is used by one thread at a time.
std::pair<std::unique_ptr<KvTransport>, std::unique_ptr<KvTransport>> make_local_transport_pair();

}  // namespace tachyon::disagg
