#include "router/client_connection.h"

#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <fmt/format.h>

#include "net/asio_deadline.h"

namespace tachyon::router {
namespace {

using net::remaining;
using net::run_with_timeout;

constexpr size_t kMaxHeaderBytes = 64 * 1024;

}  // namespace

bool ClientConnection::wait_for_request(double keep_alive, const std::atomic<bool>& draining) {
  if (buffer.size() > 0) return true;
  const Clock::time_point deadline = Clock::now() + millis(keep_alive);
  while (!draining.load() && Clock::now() < deadline) {
    bool done = false;
    error_code result;
    socket.async_wait(tcp::socket::wait_read, [&](const error_code& ec) {
      result = ec;
      done = true;
    });
    run_with_timeout(io, done, std::min(kSlice, remaining(deadline)), [&] { socket.cancel(); });
    if (result == asio::error::operation_aborted) continue;
    return !result;
  }
  return false;
}

std::optional<http::request<http::string_body>> ClientConnection::read_request(size_t max_body, Millis timeout,
                                                                               int& error_status,
                                                                               std::string& error_message) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(max_body);
  const Clock::time_point deadline = Clock::now() + timeout;
  bool done = false;
  error_code result;
  http::async_read_header(socket, buffer, parser, [&](const error_code& ec, size_t) {
    result = ec;
    done = true;
  });
  run_with_timeout(io, done, remaining(deadline), [&] { socket.cancel(); });
  // A client that asks first (curl, for larger bodies) gets its go-ahead instead of a stall.
  if (!result && beast::iequals(parser.get()[http::field::expect], "100-continue")) {
    constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    if (!write(kContinue, std::chrono::duration<double>(remaining(deadline)).count())) return std::nullopt;
  }
  if (!result && !parser.is_done()) {
    done = false;
    http::async_read(socket, buffer, parser, [&](const error_code& ec, size_t) {
      result = ec;
      done = true;
    });
    run_with_timeout(io, done, remaining(deadline), [&] { socket.cancel(); });
  }
  error_status = 0;
  if (!result) return parser.release();
  if (result == http::error::body_limit) {
    error_status = 413;
    error_message = fmt::format("the request body exceeds the router's limit of {} bytes", max_body);
  } else if (result == http::error::header_limit) {
    error_status = 431;
    error_message = "the request headers are too large";
  } else if (result.category() == make_error_code(http::error::bad_target).category() &&
             result != http::error::end_of_stream && result != http::error::partial_message) {
    error_status = 400;
    error_message = fmt::format("malformed HTTP request: {}", result.message());
  }
  return std::nullopt;
}

bool ClientConnection::write(std::string_view bytes, double timeout) {
  if (gone) return false;
  bool done = false;
  error_code result;
  asio::async_write(socket, asio::buffer(bytes.data(), bytes.size()), [&](const error_code& ec, size_t) {
    result = ec;
    done = true;
  });
  run_with_timeout(io, done, millis(timeout), [&] { socket.cancel(); });
  if (result) gone = true;
  return !gone;
}

void ClientConnection::close() {
  error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

}  // namespace tachyon::router
