#include "disagg/tcp_transport.h"

#include <array>
#include <chrono>
#include <new>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

#include "net/asio_deadline.h"

namespace tachyon::disagg {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using Clock = std::chrono::steady_clock;
using net::remaining;
using net::run_with_timeout;

constexpr size_t kLengthBytes = 8;

std::string endpoint_string(const tcp::socket& s) {
  error_code ec;
  const tcp::endpoint e = s.remote_endpoint(ec);
  if (ec) return "?";
  return fmt::format("{}:{}", e.address().to_string(), e.port());
}

void encode_length(uint64_t n, uint8_t* out) {
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
}

uint64_t decode_length(const uint8_t* in) {
  uint64_t n = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) n |= static_cast<uint64_t>(in[i]) << (8 * i);
  return n;
}

}  // namespace

struct TcpKvTransport::Impl {
  asio::io_context io{1};
  tcp::socket socket{io};
  std::string peer;
  bool broken = false;  // an earlier call failed: the stream position is unknown

  Status fail(Status st) {
    broken = true;
    error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    return st;
  }

  // Reads exactly `size` bytes into `data` before `deadline`.
  Status read_exact(uint8_t* data, size_t size, Clock::time_point deadline, const char* what) {
    bool done = false;
    error_code result;
    size_t got = 0;
    asio::async_read(socket, asio::buffer(data, size), [&](const error_code& ec, size_t n) {
      result = ec;
      got = n;
      done = true;
    });
    run_with_timeout(io, done, remaining(deadline), [&] { socket.cancel(); });
    if (!result) return Status::Ok();
    if (result == asio::error::operation_aborted) {
      return fail(make_error(ErrorCode::kIo, "tcp {}: timed out with {} of {} bytes of {} received", peer, got, size,
                             what));
    }
    if (result == asio::error::eof) {
      return fail(make_error(ErrorCode::kIo, "tcp {}: the peer closed the connection after {} of {} bytes of {}", peer,
                             got, size, what));
    }
    return fail(make_error(ErrorCode::kIo, "tcp {}: reading {}: {}", peer, what, result.message()));
  }
};

TcpKvTransport::TcpKvTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpKvTransport::~TcpKvTransport() { close(); }

Result<std::unique_ptr<TcpKvTransport>> TcpKvTransport::connect(const std::string& host, uint16_t port,
                                                                Millis timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  auto impl = std::make_unique<Impl>();
  impl->peer = fmt::format("{}:{}", host, port);
  tcp::resolver resolver(impl->io);
  bool done = false;
  error_code result;
  tcp::resolver::results_type endpoints;
  resolver.async_resolve(host, std::to_string(port), [&](const error_code& ec, tcp::resolver::results_type r) {
    result = ec;
    endpoints = std::move(r);
    done = true;
  });
  run_with_timeout(impl->io, done, remaining(deadline), [&] { resolver.cancel(); });
  if (result == asio::error::operation_aborted) {
    return make_error(ErrorCode::kIo, "tcp {}: resolving the host timed out after {} ms", impl->peer, timeout.count());
  }
  if (result) return make_error(ErrorCode::kIo, "tcp {}: resolving the host: {}", impl->peer, result.message());

  done = false;
  asio::async_connect(impl->socket, endpoints, [&](const error_code& ec, const tcp::endpoint&) {
    result = ec;
    done = true;
  });
  run_with_timeout(impl->io, done, remaining(deadline), [&] { impl->socket.close(); });
  if (result == asio::error::operation_aborted) {
    return make_error(ErrorCode::kIo, "tcp {}: connecting timed out after {} ms", impl->peer, timeout.count());
  }
  if (result) return make_error(ErrorCode::kIo, "tcp {}: connecting: {}", impl->peer, result.message());
  error_code ignored;
  impl->socket.set_option(tcp::no_delay(true), ignored);
  impl->peer = endpoint_string(impl->socket);
  return std::unique_ptr<TcpKvTransport>(new TcpKvTransport(std::move(impl)));
}

Status TcpKvTransport::send(std::span<const uint8_t> message, Millis timeout) {
  Impl& s = *impl_;
  if (s.broken) return make_error(ErrorCode::kIo, "tcp {}: closed after an earlier error", s.peer);
  std::array<uint8_t, kLengthBytes> length;
  encode_length(message.size(), length.data());
  const std::array<asio::const_buffer, 2> buffers = {asio::buffer(length), asio::buffer(message.data(), message.size())};
  bool done = false;
  error_code result;
  size_t sent = 0;
  asio::async_write(s.socket, buffers, [&](const error_code& ec, size_t n) {
    result = ec;
    sent = n;
    done = true;
  });
  run_with_timeout(s.io, done, timeout, [&] { s.socket.cancel(); });
  if (!result) return Status::Ok();
  const size_t total = kLengthBytes + message.size();
  if (result == asio::error::operation_aborted) {
    return s.fail(make_error(ErrorCode::kIo, "tcp {}: sending timed out after {} ms with {} of {} bytes sent", s.peer,
                             timeout.count(), sent, total));
  }
  return s.fail(make_error(ErrorCode::kIo, "tcp {}: sending a message ({} of {} bytes sent): {}", s.peer, sent, total,
                           result.message()));
}

Result<std::vector<uint8_t>> TcpKvTransport::receive(size_t max_bytes, Millis timeout) {
  Impl& s = *impl_;
  if (s.broken) return make_error(ErrorCode::kIo, "tcp {}: closed after an earlier error", s.peer);
  const Clock::time_point deadline = Clock::now() + timeout;
  std::array<uint8_t, kLengthBytes> length;
  TACHYON_RETURN_IF_ERROR(s.read_exact(length.data(), length.size(), deadline, "a message length"));
  const uint64_t size = decode_length(length.data());
  if (size > max_bytes) {
    return s.fail(make_error(ErrorCode::kCorruptFile, "tcp {}: a message of {} bytes; at most {} expected here", s.peer,
                             size, max_bytes));
  }
  std::vector<uint8_t> message;
  try {
    message.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    return s.fail(make_error(ErrorCode::kOutOfMemory, "tcp {}: no memory for a message of {} bytes", s.peer, size));
  }
  TACHYON_RETURN_IF_ERROR(s.read_exact(message.data(), message.size(), deadline, "a message"));
  return message;
}

Result<bool> TcpKvTransport::wait_readable(Millis timeout) {
  Impl& s = *impl_;
  if (s.broken) return make_error(ErrorCode::kIo, "tcp {}: closed after an earlier error", s.peer);
  error_code ec;
  if (s.socket.available(ec) > 0 && !ec) return true;
  bool done = false;
  error_code result;
  s.socket.async_wait(tcp::socket::wait_read, [&](const error_code& e) {
    result = e;
    done = true;
  });
  run_with_timeout(s.io, done, timeout, [&] { s.socket.cancel(); });
  if (result == asio::error::operation_aborted) return false;  // cancelled by the timeout: nothing consumed
  if (result) return s.fail(make_error(ErrorCode::kIo, "tcp {}: waiting for data: {}", s.peer, result.message()));
  return true;
}

void TcpKvTransport::close() {
  if (!impl_ || !impl_->socket.is_open()) return;
  error_code ignored;
  impl_->socket.shutdown(tcp::socket::shutdown_both, ignored);
  impl_->socket.close(ignored);
  impl_->broken = true;
}

std::string TcpKvTransport::peer() const { return impl_->socket.is_open() ? impl_->peer : std::string(); }

struct TcpKvListener::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
};

TcpKvListener::TcpKvListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpKvListener::~TcpKvListener() = default;

Result<std::unique_ptr<TcpKvListener>> TcpKvListener::listen(const std::string& address, uint16_t port) {
  error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) return make_error(ErrorCode::kInvalidArgument, "tcp: '{}' is not an IP address: {}", address, ec.message());
  auto impl = std::make_unique<Impl>();
  const tcp::endpoint endpoint(ip, port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return make_error(ErrorCode::kIo, "tcp: listening on {}:{}: {}", address, port, ec.message());
  return std::unique_ptr<TcpKvListener>(new TcpKvListener(std::move(impl)));
}

uint16_t TcpKvListener::port() const {
  error_code ec;
  const tcp::endpoint e = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : e.port();
}

Result<std::unique_ptr<TcpKvTransport>> TcpKvListener::accept(Millis timeout) {
  auto conn = std::make_unique<TcpKvTransport::Impl>();
  bool done = false;
  error_code result;
  impl_->acceptor.async_accept(conn->socket, [&](const error_code& ec) {
    result = ec;
    done = true;
  });
  run_with_timeout(impl_->io, done, timeout, [&] { impl_->acceptor.cancel(); });
  if (result == asio::error::operation_aborted) {
    return make_error(ErrorCode::kIo, "tcp: no connection on port {} within {} ms", port(), timeout.count());
  }
  if (result) return make_error(ErrorCode::kIo, "tcp: accepting on port {}: {}", port(), result.message());
  error_code ignored;
  conn->socket.set_option(tcp::no_delay(true), ignored);
  conn->peer = endpoint_string(conn->socket);
  return std::unique_ptr<TcpKvTransport>(new TcpKvTransport(std::move(conn)));
}

}  // namespace tachyon::disagg
