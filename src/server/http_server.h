// The OpenAI-compatible HTTP/1.1 server: Boost.Asio/Beast, a small fixed pool of I/O threads,
// one strand per connection, no thread per connection. Routes:
//
//   POST /v1/completions, POST /v1/chat/completions   (streaming as server-sent events, or not)
//   GET  /v1/models, /v1/models/{name}, /health, /metrics
//   POST /tokenize, /detokenize      (vLLM's; server/tokenize_api.h)
//   OPTIONS                          CORS preflights, when --allowed-origins allows the origin
//   /internal/v1/...   the disaggregated workers' protocol with the router (disagg_protocol.h):
//                      load on every role, decode/* on a decode worker, prefill/* on a prefill
//                      worker. A prefill worker refuses the /v1 generation routes (404): its
//                      requests come from the router.
//
// Connections are kept alive between requests; streamed responses use chunked transfer encoding.
// While a request generates, the connection keeps a read posted, so a client that hangs up is
// seen at once and its requests are aborted (their KV blocks freed by the next engine step);
// a write that stalls past the write timeout closes the connection the same way.
//
// Access (server/access_policy.h): with an API key, /v1/* without "Authorization: Bearer KEY" gets
// 401; with allowed origins, responses to those origins carry the CORS headers.
//
// Limits and errors: bodies over max_body get 413 before they are read, oversized headers 431,
// malformed requests 400, a full waiting queue 503 (the engine never blocks on the network).
// SIGINT/SIGTERM drain: the listening socket closes, idle connections close, requests in flight
// finish and are written out, then run() returns 0. A second signal ends at once (returns 1).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/status.h"
#include "engine/async_engine.h"
#include "server/access_policy.h"
#include "server/disagg_worker.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace tachyon::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0: a free port, see HttpServer::port()
  int io_threads = 2;
  size_t max_body = size_t{8} << 20;  // bytes of one request body
  double keep_alive_timeout = 65.0;   // seconds a connection may idle between requests
  double write_timeout = 120.0;       // seconds one write may stall before the client counts as gone
  int max_registered = 1024;          // decode role: requests waiting for their transfer, past which 503
  AccessOptions access;               // API key and CORS origins
};

class HttpServer {
 public:
  // Binds and listens. The server owns `engine` from here on; `context` and `metrics` must
  // outlive it.
  static Result<std::unique_ptr<HttpServer>> create(const HttpServerOptions& options, const ServingContext& context,
                                                    std::unique_ptr<AsyncEngine> engine, ServerMetrics& metrics,
                                                    const DisaggContext& disagg = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Serves until SIGINT or SIGTERM, then drains; the process exit code.
  int run();

  struct Impl;  // in http_server.cpp, with the connections

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tachyon::server
