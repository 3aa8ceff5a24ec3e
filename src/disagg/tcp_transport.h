// KvTransport over one TCP connection (Boost.Asio). A message goes out as an 8-byte little-endian
// length and then its bytes; the receiver checks the length against its limit before it allocates.
//
// Blocking calls with deadlines: each operation starts Asio's asynchronous form on the
// transport's own io_context and runs that context for at most the remaining time; an operation
// still pending then is cancelled and reported as a timeout. No thread is started. Writes to a
// peer that has gone away fail with an error (never SIGPIPE: Asio sends with MSG_NOSIGNAL).
//
// One connection carries any number of transfers one after another; a worker keeps one per peer.
// Asio stays inside tcp_transport.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "disagg/kv_transport.h"

namespace tachyon::disagg {

class TcpKvTransport final : public KvTransport {
 public:
  // Connects to host:port (a name or a numeric address) within `timeout`.
  static Result<std::unique_ptr<TcpKvTransport>> connect(const std::string& host, uint16_t port, Millis timeout);
  ~TcpKvTransport() override;
  TcpKvTransport(const TcpKvTransport&) = delete;
  TcpKvTransport& operator=(const TcpKvTransport&) = delete;

  Status send(std::span<const uint8_t> message, Millis timeout) override;
  Result<std::vector<uint8_t>> receive(size_t max_bytes, Millis timeout) override;
  void close() override;
  // Waits up to `timeout` for bytes to read (or the peer's close) without taking any: true when
  // receive() would not block, false when the timeout passed. A timeout here leaves the stream
  // where it was, unlike receive(). A worker uses it to wait for the next transfer in short
  // slices (so that it can stop), and to see that a pooled idle connection was closed by its
  // peer (an idle peer sends nothing, so readable means closed) before reusing it.
  Result<bool> wait_readable(Millis timeout);
  // "127.0.0.1:40123" of the other end (empty once closed).
  std::string peer() const;

 private:
  friend class TcpKvListener;
  struct Impl;
  explicit TcpKvTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Accepts connections on one address and port.
class TcpKvListener {
 public:
  // Listens on address:port ("127.0.0.1", "0.0.0.0", "::1"); port 0 picks a free one.
  static Result<std::unique_ptr<TcpKvListener>> listen(const std::string& address, uint16_t port);
  ~TcpKvListener();
  TcpKvListener(const TcpKvListener&) = delete;
  TcpKvListener& operator=(const TcpKvListener&) = delete;

  uint16_t port() const;
  // The next connection, within `timeout`.
  Result<std::unique_ptr<TcpKvTransport>> accept(Millis timeout);

 private:
  struct Impl;
  explicit TcpKvListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tachyon::disagg
