#include "net/http_client.h"

#include <optional>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>

#include "net/asio_deadline.h"

namespace tachyon::net {
namespace {

constexpr size_t kMaxResponseHeader = 64 * 1024;

using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

}  // namespace

struct HttpClient::Impl {
  asio::io_context io{1};
  tcp::socket socket{io};
  std::string peer;
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::string_body>> parser;
  bool broken = false;

  Status fail(std::string what, const error_code& ec) {
    broken = true;
    error_code ignored;
    socket.close(ignored);
    if (ec == asio::error::operation_aborted) return make_error(ErrorCode::kIo, "http {}: {} timed out", peer, what);
    return make_error(ErrorCode::kIo, "http {}: {}: {}", peer, what, ec.message());
  }
};

HttpClient::HttpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpClient::~HttpClient() { close(); }

Result<std::unique_ptr<HttpClient>> HttpClient::connect(const HttpUrl& url, Millis timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  auto impl = std::make_unique<Impl>();
  impl->peer = url.to_string();
  tcp::resolver resolver(impl->io);
  bool done = false;
  error_code result;
  tcp::resolver::results_type endpoints;
  resolver.async_resolve(url.host, std::to_string(url.port), [&](const error_code& ec, tcp::resolver::results_type r) {
    result = ec;
    endpoints = std::move(r);
    done = true;
  });
  run_with_timeout(impl->io, done, remaining(deadline), [&] { resolver.cancel(); });
  if (result) return impl->fail("resolving the host", result);
  done = false;
  asio::async_connect(impl->socket, endpoints, [&](const error_code& ec, const tcp::endpoint&) {
    result = ec;
    done = true;
  });
  run_with_timeout(impl->io, done, remaining(deadline), [&] { impl->socket.close(); });
  if (result) return impl->fail("connecting", result);
  error_code ignored;
  impl->socket.set_option(tcp::no_delay(true), ignored);
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
}

Status HttpClient::send(std::string_view method, std::string_view target,
                        const std::vector<std::pair<std::string, std::string>>& headers, std::string_view body,
                        Millis timeout) {
  Impl& s = *impl_;
  if (s.broken) return make_error(ErrorCode::kIo, "http {}: the connection failed before", s.peer);
  std::string request = fmt::format("{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", method, target,
                                    s.peer.substr(7));
  for (const auto& [name, value] : headers) request += fmt::format("{}: {}\r\n", name, value);
  if (!body.empty() || method == "POST") {
    request += fmt::format("Content-Type: application/json\r\nContent-Length: {}\r\n", body.size());
  }
  request += "\r\n";
  request += body;
  bool done = false;
  error_code result;
  asio::async_write(s.socket, asio::buffer(request), [&](const error_code& ec, size_t) {
    result = ec;
    done = true;
  });
  run_with_timeout(s.io, done, timeout, [&] { s.socket.cancel(); });
  if (result) return s.fail("sending the request", result);
  return Status::Ok();
}

Result<HttpClientResponseHead> HttpClient::read_head(Millis timeout) {
  Impl& s = *impl_;
  if (s.broken) return make_error(ErrorCode::kIo, "http {}: the connection failed before", s.peer);
  s.parser.emplace();
  s.parser->header_limit(kMaxResponseHeader);
  s.parser->body_limit(boost::none);  // streamed bodies are consumed piece by piece
  bool done = false;
  error_code result;
  http::async_read_header(s.socket, s.buffer, *s.parser, [&](const error_code& ec, size_t) {
    result = ec;
    done = true;
  });
  run_with_timeout(s.io, done, timeout, [&] { s.socket.cancel(); });
  if (result) return s.fail("reading the response head", result);
  HttpClientResponseHead head;
  head.status = static_cast<int>(s.parser->get().result_int());
  const auto type = s.parser->get()[http::field::content_type];
  head.content_type.assign(type.data(), type.size());
  return head;
}

bool HttpClient::done() const { return impl_->parser && impl_->parser->is_done(); }

Result<std::string> HttpClient::read_some(Millis timeout) {
  Impl& s = *impl_;
  if (s.broken) return make_error(ErrorCode::kIo, "http {}: the connection failed before", s.peer);
  if (!s.parser) return make_error(ErrorCode::kInternal, "http {}: read_some before read_head", s.peer);
  std::string& body = s.parser->get().body();
  const Clock::time_point deadline = Clock::now() + timeout;
  while (body.empty() && !s.parser->is_done()) {
    bool done = false;
    error_code result;
    http::async_read_some(s.socket, s.buffer, *s.parser, [&](const error_code& ec, size_t) {
      result = ec;
      done = true;
    });
    run_with_timeout(s.io, done, remaining(deadline), [&] { s.socket.cancel(); });
    if (result == http::error::need_buffer) continue;
    if (result) return s.fail("reading the response body", result);
  }
  std::string out;
  out.swap(body);  // the parser appends at the body's end: emptying it between reads is safe
  return out;
}

Result<std::string> HttpClient::read_all(size_t max_bytes, Millis timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  std::string out;
  while (!done()) {
    TACHYON_ASSIGN_OR_RETURN(std::string piece, read_some(remaining(deadline)));
    out += piece;
    if (out.size() > max_bytes) {
      close();
      return make_error(ErrorCode::kCorruptFile, "http {}: a response body over {} bytes", impl_->peer, max_bytes);
    }
  }
  return out;
}

void HttpClient::close() {
  if (!impl_) return;
  error_code ignored;
  impl_->socket.shutdown(tcp::socket::shutdown_both, ignored);
  impl_->socket.close(ignored);
  impl_->broken = true;
}

Result<std::pair<int, std::string>> http_fetch(const HttpUrl& url, std::string_view method, std::string_view target,
                                               std::string_view body, size_t max_bytes, Millis timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  TACHYON_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> c, HttpClient::connect(url, timeout));
  TACHYON_RETURN_IF_ERROR(c->send(method, target, {}, body, remaining(deadline)));
  TACHYON_ASSIGN_OR_RETURN(HttpClientResponseHead head, c->read_head(remaining(deadline)));
  TACHYON_ASSIGN_OR_RETURN(std::string text, c->read_all(max_bytes, remaining(deadline)));
  return std::make_pair(head.status, std::move(text));
}

}  // namespace tachyon::net
