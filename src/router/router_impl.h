// The router's state shared by its threads (router.h says what the router does): the workers as
// last polled, the held and in-flight counts, the counters, the listening socket and the client
// connections. router.cpp runs the threads, the polling and the routes; request_flow.cpp carries
// one generation request through the workers. Internal to router/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/asio/signal_set.hpp>

#include "net/http_url.h"
#include "router/client_connection.h"
#include "router/router.h"
#include "router/router_policy.h"
#include "server/disagg_protocol.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace tachyon::router {

// The most of a worker's answer the router reads when it only relays it (an error, /v1/models).
inline constexpr size_t kMaxWorkerErrorBody = 1 << 20;

struct Worker {
  net::HttpUrl url;
  server::WorkerRole role = server::WorkerRole::kBoth;
  WorkerState state;
  int kv_port = 0;
  bool ever_up = false;
};

// The router's counters.
struct RouterMetrics {
  std::mutex mu;
  int64_t disagg = 0, colocated = 0, failed = 0, rejected = 0, retries = 0, first_token_only = 0;
  std::map<int, int64_t> http_responses;
  server::Histogram ttft{{0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0}};
  server::Histogram e2e{{0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0}};
};

struct Router::Impl {
  explicit Impl(const RouterOptions& o) : options(o), signals(accept_io, SIGINT, SIGTERM), acceptor(accept_io) {}

  // -- threads --
  void poll_loop();
  void poll(const net::HttpUrl& url, size_t index, bool decode);
  void poll_all();
  void accept_loop();
  void serve(ClientConnection& conn);

  // -- one request --
  void handle(ClientConnection& conn, http::request<http::string_body>& req, bool keep_alive);
  void generate(ClientConnection& conn, server::Endpoint endpoint, const std::string& body, bool keep_alive);
  void reply(ClientConnection& conn, int status, const std::string& body, bool keep_alive,
             std::string_view content_type = "application/json");
  std::string render_metrics();

  // Picks a decode worker (holding while all are busy); its index, or the error status/message.
  std::optional<size_t> acquire_decode(const std::vector<size_t>& exclude, int& status, std::string& message);
  std::optional<size_t> acquire_prefill(const std::vector<size_t>& exclude);
  void mark_down(bool decode, size_t index, const std::string& why);
  net::HttpUrl worker_url(bool decode, size_t index);

  RouterOptions options;
  std::mutex mu;  // guards prefill, decode, held, in_flight
  std::condition_variable cv;
  std::vector<Worker> prefill, decode;
  int held = 0;
  int in_flight = 0;
  RouterMetrics metrics;
  std::atomic<bool> draining{false};
  std::atomic<bool> stop{false};
  int exit_code = 0;

  asio::io_context accept_io{1};
  asio::signal_set signals;
  tcp::acceptor acceptor;
  int port = 0;
  struct Connection {
    std::unique_ptr<ClientConnection> conn;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::list<Connection> connections;  // the accept thread's own
  std::thread poller;
};

}  // namespace tachyon::router
