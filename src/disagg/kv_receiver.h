// KvReceiver: the decode worker's side of KV transfers. It listens on the KV port; a thread per
// prefill worker connection waits (in short slices, so that it can stop) for the next transfer,
// receives and checks it whole (receive_kv), hands it to the handler, and sends the handler's
// outcome back as the ack. The handler (the server's glue) adopts the sequence into the engine and
// returns only once that succeeded or failed for good, so an Ok ack means "adopted".
//
// A transfer that fails on the wire (a checksum, a size, a model of another shape, a peer that
// stalls or closes) drops its connection: the prefill side sees the close and reports the failure;
// nothing was adopted. Connections are bounded (max_connections; more are closed at once) and
// every wait is bounded by the options below.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/status.h"
#include "disagg/kv_transfer.h"

namespace tachyon::disagg {

class TcpKvListener;
class TcpKvTransport;

struct KvReceiverOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;               // 0: a free one, see port()
  int max_connections = 64;
  Millis ack_timeout{5000};
  KvReceiveOptions receive;        // the layers' timeout, size limits, the expected model shape
};

class KvReceiver {
 public:
  // Runs on a connection thread for each transfer received whole; returns what to ack.
  using Handler = std::function<Status(ReceivedKv&&)>;

  static Result<std::unique_ptr<KvReceiver>> start(const KvReceiverOptions& options, Handler handler);
  ~KvReceiver();  // stops accepting and joins every thread (each within its slice or a transfer's timeout)
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  uint16_t port() const { return port_; }
  int64_t num_received() const { return received_.load(); }
  int64_t num_failed() const { return failed_.load(); }  // transfers that failed on the wire

 private:
  KvReceiver(const KvReceiverOptions& options, Handler handler, std::unique_ptr<TcpKvListener> listener);
  void accept_loop();
  void serve(TcpKvTransport& conn);

  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  const KvReceiverOptions options_;
  Handler handler_;
  std::unique_ptr<TcpKvListener> listener_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> received_{0};
  std::atomic<int64_t> failed_{0};
  std::list<Connection> connections_;  // the accept thread's own (and the destructor's, after the join)
  std::thread accept_thread_;
};

}  // namespace tachyon::disagg
