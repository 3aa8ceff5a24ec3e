// KvSender: the prefill worker's side of KV transfers. The engine thread hands it one exported
// sequence and where it goes (a decode worker's KV address and the transfer id the router chose);
// a small pool of sender threads ships it with send_kv() over TCP and waits for the decode
// worker's ack, then reports the outcome through the transfer's callback. The engine thread never
// waits on the network.
//
// Connections: one transfer at a time per connection; idle connections are pooled per address
// (a few each) and checked before reuse: an idle decode worker sends nothing, so a pooled
// connection with bytes to read was closed by its peer (a restart) and is dropped for a new one.
// A connection that failed once is never reused (kv_transport.h).
//
// Every step is bounded (connect, send, ack: KvSenderOptions); the callback runs exactly once per
// transfer, on a sender thread, also for transfers still queued when the sender is destroyed
// (with kIo "shutting down"). The export is freed as soon as the transfer ends either way: the
// prefill worker keeps nothing after shipping.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "disagg/kv_export.h"
#include "disagg/kv_transport.h"

namespace tachyon::disagg {

class TcpKvTransport;

struct KvSenderOptions {
  int num_threads = 2;             // transfers in flight at once
  Millis connect_timeout{2000};
  Millis send_timeout{30000};      // the whole transfer, header and layers
  Millis ack_timeout{30000};       // from the last layer to the decode worker's ack (it adopts first)
  int max_idle_per_address = 4;    // pooled connections per decode worker
};

struct KvDestination {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const;  // "host:port"
};

class KvSender {
 public:
  using Done = std::function<void(const Status&)>;

  explicit KvSender(KvSenderOptions options = {});
  ~KvSender();
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  // Queues one transfer; `done` gets Ok once the decode worker acked the adoption, else why not.
  void send(KvDestination to, uint64_t transfer_id, KvExport kv, Done done);
  // Transfers queued or being sent.
  int num_in_flight() const;
  // Finishes the transfers being sent, fails the queued ones (and any sent from now on, at once),
  // and joins the threads. Idempotent; the destructor calls it.
  void shutdown();

 private:
  struct Job {
    KvDestination to;
    uint64_t transfer_id = 0;
    KvExport kv;
    Done done;
  };
  void run();
  Status ship(Job& job);
  // A pooled connection to `address` that still looks alive, else a new one.
  Result<std::unique_ptr<TcpKvTransport>> connection(const KvDestination& to);
  void give_back(const KvDestination& to, std::unique_ptr<TcpKvTransport> conn);

  const KvSenderOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;  // guarded by mu_
  int busy_ = 0;           // guarded by mu_: jobs being shipped
  bool stop_ = false;      // guarded by mu_
  std::map<std::string, std::vector<std::unique_ptr<TcpKvTransport>>> idle_;  // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace tachyon::disagg
