// `tachyon router`: an OpenAI-compatible front for disaggregated workers (`tachyon serve --role
// prefill` and `--role decode`), speaking the internal protocol of server/disagg_protocol.h to them.
//
//   POST /v1/completions, /v1/chat/completions   streamed or not
//   GET  /v1/models (a worker's), /health (200 while a prefill and a decode worker are up),
//        /metrics (tachyon_router_*: requests by mode, errors, retries, both queues, workers)
//
// One request: the router picks a decode worker (router_policy.h: shortest queue, most free KV;
// held while every decode worker is busy), registers the request there under a fresh transfer id
// (the decode worker checks the request and may choose to run it whole, "colocated", when its
// prompt is shorter than --disagg-min-prompt tokens or it has several choices), then sends it to a
// prefill worker with the decode worker's KV address. The prefill worker's opening chunks and
// first token go to the client at once; after its handoff event the decode worker's chunks follow.
// A plain (not streamed) request is read the same way and assembled into one response.
//
// Failures: a decode worker that cannot be reached or refuses the registration (503) is marked
// down and the request is retried once on another; so is a failed handoff while nothing has
// reached the client yet (a plain request). Otherwise the request ends with an error: a 5xx before
// anything was sent, else an {"error": ...} event and [DONE]. Closing a worker connection cancels
// the work there (the prefill worker frees its blocks at export in any case). Every wait on a
// worker or a client is bounded.
//
// Threads: one accepting (and watching for SIGINT/SIGTERM), one polling the workers'
// /internal/v1/load, and one per client connection (at most max_connections; blocking I/O with
// deadlines). SIGINT/SIGTERM stop accepting, let requests in flight finish, and run() returns 0.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "net/http_url.h"
#include "router/router_policy.h"

namespace tachyon::router {

struct RouterOptions {
  std::vector<net::HttpUrl> prefill;
  std::vector<net::HttpUrl> decode;
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0: a free one, see Router::port()
  int disagg_min_prompt = 0;          // shorter prompts run colocated on a decode worker
  RatePolicy policy;
  double poll_interval = 0.1;         // seconds between load polls of each worker
  double connect_timeout = 2.0;       // seconds to connect to a worker
  double worker_timeout = 60.0;       // seconds any one wait for a worker's next bytes may take
  double hold_timeout = 30.0;         // seconds a request may wait for a decode worker with room
  double keep_alive_timeout = 65.0;   // seconds a client connection may idle
  double write_timeout = 60.0;        // seconds one write to a client may stall
  size_t max_body = size_t{8} << 20;  // bytes of one request body
  int max_connections = 1024;
};

class Router {
 public:
  static Result<std::unique_ptr<Router>> create(const RouterOptions& options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  int port() const;
  // Serves until SIGINT or SIGTERM, then drains; the process exit code.
  int run();

  struct Impl;

 private:
  explicit Router(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tachyon::router
