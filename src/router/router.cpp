// The router's threads and routes (router.h says what the router does): accepting client
// connections (one thread each), polling the workers' load, and the routes other than generation,
// which request_flow.cpp carries through the workers.
#include "router/router.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <fmt/format.h>

#include "core/log.h"
#include "net/http_client.h"
#include "net/http_response.h"
#include "net/listener.h"
#include "router/response_sink.h"
#include "router/router_impl.h"

namespace tachyon::router {
namespace {

using net::HttpUrl;
using server::Endpoint;
using server::WorkerLoadReport;
using server::WorkerRole;

}  // namespace

// ---- polling ----

void Router::Impl::poll(const HttpUrl& url, size_t index, bool is_decode) {
  auto r = net::http_fetch(url, "GET", "/internal/v1/load", "", 64 * 1024, millis(std::max(0.5, options.connect_timeout)));
  Result<WorkerLoadReport> load = make_error(ErrorCode::kIo, "no answer");
  if (r.ok() && r->first == 200) {
    load = server::parse_load_json(r->second);
  } else if (r.ok()) {
    load = make_error(ErrorCode::kIo, "GET /internal/v1/load answered {}", r->first);
  } else {
    load = r.status();
  }
  const WorkerRole want = is_decode ? WorkerRole::kDecode : WorkerRole::kPrefill;
  if (load.ok() && load->role != want) {
    load = make_error(ErrorCode::kInvalidArgument, "it is a {} worker, listed as {}", role_name(load->role),
                      role_name(want));
  }
  std::lock_guard lock(mu);
  Worker& live = is_decode ? decode[index] : prefill[index];
  if (!load.ok()) {
    if (live.state.up) TACHYON_LOG_WARN("router: {} worker {} is down: {}", role_name(want), live.url.to_string(), load.status().to_string());
    live.state.up = false;
    return;
  }
  if (!live.state.up) {
    TACHYON_LOG_INFO("router: {} worker {} is up", role_name(want), live.url.to_string());
    if (!live.ever_up) std::fprintf(stderr, "tachyon router: %s worker %s is up\n", role_name(want), live.url.to_string().c_str());
  }
  live.ever_up = true;
  live.role = load->role;
  live.kv_port = load->kv_port;
  WorkerState& s = live.state;
  s.up = true;
  s.kv_blocks_total = load->kv_blocks_total;
  s.kv_blocks_free = load->kv_blocks_free;
  s.num_waiting = load->num_waiting;
  s.num_running = load->num_running;
  s.pending = is_decode ? load->pending_adoptions : load->transfers_in_flight;
  s.assigned = 0;  // the report counts what was sent before it
}

void Router::Impl::poll_all() {
  std::vector<HttpUrl> p, d;
  {
    std::lock_guard lock(mu);
    for (const Worker& w : prefill) p.push_back(w.url);
    for (const Worker& w : decode) d.push_back(w.url);
  }
  for (size_t i = 0; i < p.size() && !stop.load(); ++i) poll(p[i], i, false);
  for (size_t i = 0; i < d.size() && !stop.load(); ++i) poll(d[i], i, true);
  cv.notify_all();
}

// run() polled once before starting this thread.
void Router::Impl::poll_loop() {
  while (!stop.load()) {
    {
      std::unique_lock lock(mu);
      cv.wait_for(lock, millis(options.poll_interval), [&] { return stop.load(); });
    }
    if (!stop.load()) poll_all();
  }
}

void Router::Impl::mark_down(bool is_decode, size_t index, const std::string& why) {
  std::lock_guard lock(mu);
  Worker& w = is_decode ? decode[index] : prefill[index];
  if (w.state.up) TACHYON_LOG_WARN("router: {} worker {} marked down: {}", is_decode ? "decode" : "prefill", w.url.to_string(), why);
  w.state.up = false;
}

std::optional<size_t> Router::Impl::acquire_decode(const std::vector<size_t>& exclude, int& status,
                                                   std::string& message) {
  const Clock::time_point deadline = Clock::now() + millis(options.hold_timeout);
  std::unique_lock lock(mu);
  bool holding = false;
  for (;;) {
    std::vector<WorkerState> states;
    for (const Worker& w : decode) states.push_back(w.state);
    const WorkerPick pick = pick_decode_worker(states, options.policy, exclude);
    const Admission a = admit(pick.kind, held - (holding ? 1 : 0), options.policy);
    if (a == Admission::kStart) {
      if (holding) --held;
      ++decode[pick.index].state.assigned;
      return pick.index;
    }
    const bool late = holding && Clock::now() >= deadline;
    if (a == Admission::kRefuse || late || draining.load()) {
      if (holding) --held;
      status = 503;
      if (pick.kind == Pick::kNoneUp) {
        message = "no decode worker is reachable; retry later";
      } else if (late) {
        message = fmt::format("every decode worker stayed busy for {:g} s; retry later", options.hold_timeout);
      } else {
        message = fmt::format("every decode worker is busy and {} requests are already waiting; retry later", held);
      }
      return std::nullopt;
    }
    if (!holding) {
      holding = true;
      ++held;
    }
    cv.wait_until(lock, std::min(deadline, Clock::now() + kSlice));
  }
}

std::optional<size_t> Router::Impl::acquire_prefill(const std::vector<size_t>& exclude) {
  std::lock_guard lock(mu);
  std::vector<WorkerState> states;
  for (const Worker& w : prefill) states.push_back(w.state);
  const WorkerPick pick = pick_prefill_worker(states, exclude);
  if (pick.kind != Pick::kChosen) return std::nullopt;
  ++prefill[pick.index].state.assigned;
  return pick.index;
}

void Router::Impl::reply(ClientConnection& conn, int status, const std::string& body, bool keep_alive,
                         std::string_view content_type) {
  {
    std::lock_guard lock(metrics.mu);
    ++metrics.http_responses[status];
  }
  conn.write(net::plain_response(status, content_type, body, keep_alive), options.write_timeout);
}

std::string Router::Impl::render_metrics() {
  std::string out;
  const auto line = [&](const std::string& name, const char* type, const char* help, double value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  int prefill_queue = 0, decode_queue_total = 0, held_now = 0, in_flight_now = 0;
  std::string workers;
  {
    std::lock_guard lock(mu);
    held_now = held;
    in_flight_now = in_flight;
    for (const Worker& w : prefill) prefill_queue += w.state.num_waiting + w.state.num_running + w.state.assigned;
    for (const Worker& w : decode) decode_queue_total += decode_queue(w.state);
    const auto worker_lines = [&](const std::vector<Worker>& list, const char* role) {
      for (const Worker& w : list) {
        const std::string labels = fmt::format("{{role=\"{}\",url=\"{}\"}}", role, w.url.to_string());
        workers += fmt::format("tachyon_router_worker_up{} {}\n", labels, w.state.up ? 1 : 0);
        workers += fmt::format("tachyon_router_worker_kv_blocks_free{} {}\n", labels, w.state.kv_blocks_free);
        workers += fmt::format("tachyon_router_worker_queue{} {}\n", labels,
                               std::string_view(role) == "decode" ? decode_queue(w.state)
                                                                  : w.state.num_waiting + w.state.num_running);
      }
    };
    worker_lines(prefill, "prefill");
    worker_lines(decode, "decode");
  }
  line("tachyon_router_requests_in_flight", "gauge", "Client requests being served.", in_flight_now);
  line("tachyon_router_requests_held", "gauge", "Requests waiting for a decode worker with room (rate matching).",
       held_now);
  line("tachyon_router_prefill_queue", "gauge",
       "Prefill workers' requests waiting or running, plus those sent since their last load report.", prefill_queue);
  line("tachyon_router_decode_queue", "gauge",
       "Decode workers' waiting requests and pending transfers, plus those sent since their last load report.",
       decode_queue_total);
  out += "# HELP tachyon_router_worker_up Whether the worker answered its last load poll.\n"
         "# TYPE tachyon_router_worker_up gauge\n"
         "# HELP tachyon_router_worker_kv_blocks_free Free (or reclaimable) KV blocks in the worker's last report.\n"
         "# TYPE tachyon_router_worker_kv_blocks_free gauge\n"
         "# HELP tachyon_router_worker_queue The worker's queue as the router counts it.\n"
         "# TYPE tachyon_router_worker_queue gauge\n";
  out += workers;
  std::lock_guard lock(metrics.mu);
  out += "# HELP tachyon_router_requests_total Requests routed, by mode.\n# TYPE tachyon_router_requests_total counter\n";
  out += fmt::format("tachyon_router_requests_total{{mode=\"disagg\"}} {}\n", metrics.disagg);
  out += fmt::format("tachyon_router_requests_total{{mode=\"colocated\"}} {}\n", metrics.colocated);
  line("tachyon_router_requests_first_token_only_total", "counter",
       "Disaggregated requests that ended at their first token (nothing shipped).", metrics.first_token_only);
  line("tachyon_router_requests_failed_total", "counter", "Requests that ended with an error after routing began.",
       metrics.failed);
  line("tachyon_router_requests_rejected_total", "counter", "Requests refused with 503 (no worker, or rate matching).",
       metrics.rejected);
  line("tachyon_router_handoff_retries_total", "counter", "Requests retried on another decode worker.",
       metrics.retries);
  out += "# HELP tachyon_router_http_responses_total HTTP responses by status code.\n"
         "# TYPE tachyon_router_http_responses_total counter\n";
  for (const auto& [status, n] : metrics.http_responses) {
    out += fmt::format("tachyon_router_http_responses_total{{code=\"{}\"}} {}\n", status, n);
  }
  out += "# HELP tachyon_router_time_to_first_token_seconds Time from arrival to the first token sent.\n"
         "# TYPE tachyon_router_time_to_first_token_seconds histogram\n";
  metrics.ttft.render("tachyon_router_time_to_first_token_seconds", out);
  out += "# HELP tachyon_router_e2e_request_latency_seconds Time from arrival to the end of a request.\n"
         "# TYPE tachyon_router_e2e_request_latency_seconds histogram\n";
  metrics.e2e.render("tachyon_router_e2e_request_latency_seconds", out);
  return out;
}

void Router::Impl::handle(ClientConnection& conn, http::request<http::string_body>& req, bool keep_alive) {
  std::string_view target(req.target().data(), req.target().size());
  const std::string path(target.substr(0, target.find('?')));
  const bool get = req.method() == http::verb::get;
  const bool post = req.method() == http::verb::post;
  const auto error = [&](int status, const std::string& message, const std::string& code) {
    reply(conn, status, error_json_body(message, status < 500 ? "invalid_request_error" : "server_error", code),
          keep_alive);
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!post) return error(405, path + " needs POST", "method_not_allowed");
    if (draining.load()) return error(503, "the router is shutting down", "shutting_down");
    return generate(conn, path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions, req.body(),
                    keep_alive);
  }
  if (!get) return error(405, path + " needs GET", "method_not_allowed");
  if (path == "/health") {
    int p = 0, d = 0;
    {
      std::lock_guard lock(mu);
      for (const Worker& w : prefill) p += w.state.up;
      for (const Worker& w : decode) d += w.state.up;
    }
    const bool ok = (p > 0 || prefill.empty()) && d > 0 && !draining.load();
    return reply(conn, ok ? 200 : 503,
                 fmt::format(R"({{"status":"{}","prefill_up":{},"decode_up":{}}})",
                             draining.load() ? "draining" : ok ? "ok" : "degraded", p, d),
                 keep_alive);
  }
  if (path == "/metrics") return reply(conn, 200, render_metrics(), keep_alive, "text/plain; version=0.0.4; charset=utf-8");
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    // The workers serve the same model: ask one that is up.
    std::vector<HttpUrl> candidates;
    {
      std::lock_guard lock(mu);
      for (const Worker& w : decode) if (w.state.up) candidates.push_back(w.url);
      for (const Worker& w : prefill) if (w.state.up) candidates.push_back(w.url);
    }
    for (const HttpUrl& url : candidates) {
      auto r = net::http_fetch(url, "GET", path, "", kMaxWorkerErrorBody, millis(options.worker_timeout));
      if (r.ok()) return reply(conn, r->first, r->second, keep_alive);
    }
    return error(503, "no worker is reachable", "no_worker");
  }
  error(404, "no route for " + path, "");
}

void Router::Impl::serve(ClientConnection& conn) {
  error_code ec;
  conn.socket.set_option(tcp::no_delay(true), ec);
  for (;;) {
    if (!conn.wait_for_request(options.keep_alive_timeout, draining)) break;
    int error_status = 0;
    std::string error_message;
    auto req = conn.read_request(options.max_body, millis(options.worker_timeout), error_status, error_message);
    if (!req) {
      if (error_status != 0) reply(conn, error_status, error_json_body(error_message, "invalid_request_error", ""), false);
      break;
    }
    const bool keep_alive = req->keep_alive() && !draining.load();
    handle(conn, *req, keep_alive);
    if (!keep_alive || conn.gone) break;
  }
  conn.close();
}

void Router::Impl::accept_loop() {
  signals.async_wait([this](const error_code& ec, int signal) {
    if (ec) return;
    std::fprintf(stderr, "tachyon router: signal %d: draining\n", signal);
    draining.store(true);
    error_code ignored;
    acceptor.close(ignored);
    signals.async_wait([](const error_code& e, int) {
      if (e) return;
      // A second signal: exit now, without waiting for the requests in flight.
      std::fprintf(stderr, "tachyon router: second signal: exiting without draining\n");
      std::fflush(stderr);
      std::_Exit(1);
    });
  });
  // One accept always pending while serving; its handler starts the next, so that any number of
  // connections are taken within one slice of the loop below.
  std::unique_ptr<ClientConnection> next;
  std::function<void()> start_accept = [&] {
    next = std::make_unique<ClientConnection>();
    acceptor.async_accept(next->socket, [this, &next, &start_accept](const error_code& ec) {
      if (ec) {
        if (acceptor.is_open() && !draining.load()) start_accept();  // a transient failure (out of descriptors)
        return;
      }
      if (static_cast<int>(connections.size()) >= options.max_connections) {
        const std::string body = error_json_body("the router has too many connections; retry later", "server_error", "");
        next->write(net::plain_response(503, "application/json", body, /*keep_alive=*/false), 1.0);
        next->close();
      } else {
        Connection& c = connections.emplace_back();
        c.conn = std::move(next);
        c.thread = std::thread([this, &c] {
          serve(*c.conn);
          c.done.store(true);
        });
      }
      if (!draining.load()) start_accept();
    });
  };
  start_accept();
  while (!stop.load()) {
    for (auto it = connections.begin(); it != connections.end();) {
      if (it->done.load()) {
        it->thread.join();
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
    if (draining.load() && connections.empty()) break;
    accept_io.restart();
    accept_io.run_for(kSlice);
  }
  error_code ignored;
  acceptor.close(ignored);
  signals.cancel(ignored);
  accept_io.restart();
  accept_io.poll();
  for (Connection& c : connections) {
    if (c.thread.joinable()) c.thread.join();
  }
  connections.clear();
}

Router::Router(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Router::~Router() {
  impl_->stop.store(true);
  impl_->cv.notify_all();
  if (impl_->poller.joinable()) impl_->poller.join();
}

int Router::port() const { return impl_->port; }

Result<std::unique_ptr<Router>> Router::create(const RouterOptions& options) {
  if (options.decode.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "the router needs at least one --decode worker");
  }
  if (options.port < 0 || options.port > 65535) {
    return make_error(ErrorCode::kInvalidArgument, "port {} must be in [0, 65535]", options.port);
  }
  if (options.disagg_min_prompt < 0 || options.poll_interval <= 0 || options.connect_timeout <= 0 ||
      options.worker_timeout <= 0 || options.hold_timeout < 0 || options.keep_alive_timeout <= 0 ||
      options.write_timeout <= 0 || options.max_connections < 1 || options.policy.max_decode_queue < 1 ||
      options.policy.max_held < 0 || options.policy.min_decode_free_kv < 0 || options.policy.min_decode_free_kv > 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "router options out of range (times must be positive, --decode-max-queue at least 1, "
                      "--decode-min-free-kv in [0, 1])");
  }
  auto impl = std::make_unique<Impl>(options);
  for (const HttpUrl& u : options.prefill) impl->prefill.push_back(Worker{u, WorkerRole::kPrefill, {}, 0, false});
  for (const HttpUrl& u : options.decode) impl->decode.push_back(Worker{u, WorkerRole::kDecode, {}, 0, false});
  TACHYON_RETURN_IF_ERROR(net::listen_on(impl->acceptor, options.host, options.port));
  impl->port = impl->acceptor.local_endpoint().port();
  return std::unique_ptr<Router>(new Router(std::move(impl)));
}

int Router::run() {
  Impl& s = *impl_;
  s.poll_all();  // so that workers already up serve the first request
  s.poller = std::thread([&s] { s.poll_loop(); });
  s.accept_loop();
  s.stop.store(true);
  s.cv.notify_all();
  if (s.poller.joinable()) s.poller.join();
  if (s.exit_code == 0) std::fprintf(stderr, "tachyon router: drained; exiting\n");
  return s.exit_code;
}

}  // namespace tachyon::router
