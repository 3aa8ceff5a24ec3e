// A blocking HTTP/1.1 client connection with a deadline on every call (Boost.Asio/Beast), for the
// router's calls to its workers, the bench's and the tests' requests. Like the KV transport, each
// call starts Asio's asynchronous form on the connection's own io_context and runs it for at most
// the time left (asio_deadline.h); an operation still pending then is cancelled and reported as
// kIo "timed out". No thread is started; one thread uses
// a connection at a time. Responses are read head first, then the body in pieces as they arrive
// (a streamed body is consumed while the worker writes it). Asio stays in http_client.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "net/http_url.h"

namespace tachyon::net {

using Millis = std::chrono::milliseconds;

struct HttpClientResponseHead {
  int status = 0;
  std::string content_type;
};

class HttpClient {
 public:
  static Result<std::unique_ptr<HttpClient>> connect(const HttpUrl& url, Millis timeout);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends one request ("POST", "/path", extra headers, body) within `timeout`.
  Status send(std::string_view method, std::string_view target,
              const std::vector<std::pair<std::string, std::string>>& headers, std::string_view body, Millis timeout);
  // The response's status line and headers, within `timeout`.
  Result<HttpClientResponseHead> read_head(Millis timeout);
  // The next piece of the body (waits up to `timeout` for at least one byte). Empty once the body
  // ended (then done() is true).
  Result<std::string> read_some(Millis timeout);
  // The rest of the body, at most `max_bytes`, within `timeout`.
  Result<std::string> read_all(size_t max_bytes, Millis timeout);
  bool done() const;
  void close();

 private:
  struct Impl;
  explicit HttpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// GET or POST in one go on a fresh connection: the status and the whole body (at most
// `max_bytes`), everything within `timeout`.
Result<std::pair<int, std::string>> http_fetch(const HttpUrl& url, std::string_view method, std::string_view target,
                                               std::string_view body, size_t max_bytes, Millis timeout);

}  // namespace tachyon::net
