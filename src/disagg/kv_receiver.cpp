#include "disagg/kv_receiver.h"

#include "core/log.h"
#include "disagg/tcp_transport.h"

namespace tachyon::disagg {
namespace {

// How often waiting threads look at the stop flag.
constexpr Millis kSlice{100};

}  // namespace

Result<std::unique_ptr<KvReceiver>> KvReceiver::start(const KvReceiverOptions& options, Handler handler) {
  if (options.max_connections < 1) {
    return make_error(ErrorCode::kInvalidArgument, "kv receiver: max_connections = {} must be at least 1",
                      options.max_connections);
  }
  TACHYON_ASSIGN_OR_RETURN(std::unique_ptr<TcpKvListener> listener, TcpKvListener::listen(options.address, options.port));
  return std::unique_ptr<KvReceiver>(new KvReceiver(options, std::move(handler), std::move(listener)));
}

KvReceiver::KvReceiver(const KvReceiverOptions& options, Handler handler, std::unique_ptr<TcpKvListener> listener)
    : options_(options), handler_(std::move(handler)), listener_(std::move(listener)) {
  port_ = listener_->port();
  accept_thread_ = std::thread([this] { accept_loop(); });
}

KvReceiver::~KvReceiver() {
  stop_.store(true);
  if (accept_thread_.joinable()) accept_thread_.join();
  for (Connection& c : connections_) {
    if (c.thread.joinable()) c.thread.join();
  }
}

void KvReceiver::accept_loop() {
  while (!stop_.load()) {
    // Reap the threads of closed connections.
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->done.load()) {
        it->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    auto conn = listener_->accept(kSlice);
    if (!conn.ok()) continue;  // the slice passed (or a transient accept error)
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      TACHYON_LOG_WARN("kv receiver: {} connections open; refusing {}", connections_.size(), (*conn)->peer());
      continue;  // closed as it goes out of scope
    }
    Connection& c = connections_.emplace_back();
    c.thread = std::thread([this, &c, transport = std::shared_ptr<TcpKvTransport>(std::move(conn).value())] {
      serve(*transport);
      c.done.store(true);
    });
  }
}

void KvReceiver::serve(TcpKvTransport& conn) {
  const std::string peer = conn.peer();
  while (!stop_.load()) {
    auto readable = conn.wait_readable(kSlice);
    if (!readable.ok()) return;
    if (!*readable) continue;
    auto received = receive_kv(conn, options_.receive);
    if (!received.ok()) {
      // A closed idle connection is the peer going away, not a failed transfer.
      const bool idle_close = received.status().code() == ErrorCode::kIo &&
                              received.status().message().find("after 0 of 8 bytes of a message length") !=
                                  std::string::npos;
      if (!idle_close) {
        failed_.fetch_add(1);
        TACHYON_LOG_WARN("kv receiver: from {}: {}", peer, received.status().to_string());
      }
      return;  // the stream position is unknown: drop the connection
    }
    received_.fetch_add(1);
    const uint64_t id = received->transfer_id;
    const Status outcome = handler_(std::move(received).value());
    if (!send_kv_ack(conn, id, outcome, options_.ack_timeout).ok()) return;
  }
}

}  // namespace tachyon::disagg
