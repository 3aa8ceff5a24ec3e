// The router's connections and request flow (router.h says what it does). Client connections are
// served by one thread each with blocking calls under deadlines, so that a request's flow reads
// top to bottom: pick, register, prefill, relay. Worker calls go through HttpClient.
#include "router/router.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <ctime>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "net/asio_deadline.h"
#include "net/http_client.h"
#include "net/http_response.h"
#include "net/listener.h"
#include "server/disagg_protocol.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/response_assembler.h"

namespace tachyon::router {
namespace {

// Above any prompt (the workers accept up to 2^30): the decode worker runs the request whole.
constexpr int64_t kNoDisaggMinPrompt = int64_t{1} << 30;


namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;
using net::chunk;
using net::HttpClient;
using net::HttpClientResponseHead;
using net::HttpUrl;
using net::Millis;
using net::remaining;
using net::run_with_timeout;
using net::status_line;
using server::ApiError;
using server::Endpoint;
using server::Histogram;
using server::kControlEvent;
using server::kHeaderCreated;
using server::kHeaderKvAddress;
using server::kHeaderMinPromptTokens;
using server::kHeaderResponseId;
using server::kHeaderTransferId;
using server::kMaxJsonDepth;
using server::ResponseAssembler;
using server::SseEvent;
using server::SseParser;
using server::WorkerLoadReport;
using server::WorkerRole;

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr size_t kMaxWorkerErrorBody = 1 << 20;
constexpr Millis kSlice{100};

Millis millis(double seconds) { return Millis(static_cast<int64_t>(seconds * 1000)); }

std::string error_json_body(std::string message, std::string type, std::string code) {
  ApiError e;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return error_body(e);
}

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32));
  std::string out;
  while (out.size() < n) {
    uint64_t bits = rng();
    for (int i = 0; i < 16 && out.size() < n; ++i, bits >>= 4) out += "0123456789abcdef"[bits & 15];
  }
  return out;
}

uint64_t random_transfer_id() {
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32));
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

// One client connection: blocking reads and writes with deadlines on its own io_context.
class ClientConnection {
 public:
  asio::io_context io{1};
  tcp::socket socket{io};
  beast::flat_buffer buffer;
  bool gone = false;  // a write failed or timed out: the client counts as gone

  // Waits for the next request's first bytes in slices, so that a drain can end an idle
  // connection; false when the connection should close.
  bool wait_for_request(double keep_alive, const std::atomic<bool>& draining) {
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

  // The request, or the status to answer with (0: close silently).
  std::optional<http::request<http::string_body>> read_request(size_t max_body, Millis timeout, int& error_status,
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

  bool write(std::string_view bytes, double timeout) {
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

  void close() {
    error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }
};

}  // namespace

// ---- state shared by the threads ----

struct Worker {
  HttpUrl url;
  WorkerRole role = WorkerRole::kBoth;
  WorkerState state;
  int kv_port = 0;
  bool ever_up = false;
};

// Where one client request stands, written back to the client by one of these two.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // One chunk's JSON for the client.
  virtual void event(const std::string& data, const ojson& parsed) = 0;
  // The last chunk went out ("data: [DONE]" for a stream).
  virtual void done() = 0;
  // Ends the request with an error (an HTTP status before anything was sent, else an error chunk).
  virtual void fail(int status, const std::string& message, const std::string& code) = 0;
  // Something reached the client: the request can no longer be retried.
  virtual bool committed() const = 0;
  bool client_gone() const { return conn_.gone; }

 protected:
  ResponseSink(ClientConnection& conn, double write_timeout, bool keep_alive)
      : conn_(conn), write_timeout_(write_timeout), keep_alive_(keep_alive) {}
  void write_plain(int status, const std::string& body) {
    conn_.write(net::plain_response(status, "application/json", body, keep_alive_), write_timeout_);
    status_ = status;
  }

 public:
  int status() const { return status_; }

 protected:
  ClientConnection& conn_;
  double write_timeout_;
  bool keep_alive_;
  int status_ = 0;
};

class StreamSink final : public ResponseSink {
 public:
  StreamSink(ClientConnection& conn, double write_timeout, bool keep_alive, bool include_usage)
      : ResponseSink(conn, write_timeout, keep_alive), include_usage_(include_usage) {}
  void event(const std::string& data, const ojson& parsed) override {
    // The workers always send usage; the client gets it only when it asked.
    if (!include_usage_ && parsed.is_object() && parsed.contains("usage") && !parsed["usage"].is_null() &&
        parsed.contains("choices") && parsed["choices"].is_array() && parsed["choices"].empty()) {
      return;
    }
    commit();
    conn_.write(chunk("data: " + data + "\n\n"), write_timeout_);
  }
  void done() override {
    commit();
    conn_.write(chunk("data: [DONE]\n\n") + "0\r\n\r\n", write_timeout_);
  }
  void fail(int status, const std::string& message, const std::string& code) override {
    const std::string body = error_json_body(message, status < 500 ? "invalid_request_error" : "server_error", code);
    if (!committed_) {
      committed_ = true;
      write_plain(status, body);
      return;
    }
    conn_.write(chunk("data: " + body + "\n\n" + "data: [DONE]\n\n") + "0\r\n\r\n", write_timeout_);
  }
  bool committed() const override { return committed_; }

 private:
  void commit() {
    if (committed_) return;
    committed_ = true;
    status_ = 200;
    conn_.write(status_line(200) +
                    fmt::format("Content-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
                                "Transfer-Encoding: chunked\r\nConnection: {}\r\n\r\n",
                                keep_alive_ ? "keep-alive" : "close"),
                write_timeout_);
  }
  bool include_usage_;
  bool committed_ = false;
};

class PlainSink final : public ResponseSink {
 public:
  PlainSink(ClientConnection& conn, double write_timeout, bool keep_alive, Endpoint endpoint)
      : ResponseSink(conn, write_timeout, keep_alive), assembler_(endpoint) {}
  void event(const std::string& data, const ojson&) override {
    if (!bad_.ok()) return;
    bad_ = assembler_.add(data);
  }
  void done() override {
    if (!bad_.ok()) return fail(502, bad_.message(), "bad_worker_response");
    if (assembler_.failed()) return write_plain(assembler_.error_status(), assembler_.error_body());
    write_plain(200, assembler_.body());
  }
  void fail(int status, const std::string& message, const std::string& code) override {
    write_plain(status, error_json_body(message, status < 500 ? "invalid_request_error" : "server_error", code));
  }
  bool committed() const override { return false; }  // nothing is written before the end

 private:
  ResponseAssembler assembler_;
  Status bad_;
};

// The router's counters.
struct RouterMetrics {
  std::mutex mu;
  int64_t disagg = 0, colocated = 0, failed = 0, rejected = 0, retries = 0, first_token_only = 0;
  std::map<int, int64_t> http_responses;
  Histogram ttft{{0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0}};
  Histogram e2e{{0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0}};
};

struct Router::Impl {
  explicit Impl(const RouterOptions& o) : options(o), signals(accept_io, SIGINT, SIGTERM), acceptor(accept_io) {}

  // -- threads --
  void poll_loop();
  void poll(const HttpUrl& url, size_t index, bool decode);
  void poll_all();
  void accept_loop();
  void serve(ClientConnection& conn);

  // -- one request --
  void handle(ClientConnection& conn, http::request<http::string_body>& req, bool keep_alive);
  void generate(ClientConnection& conn, Endpoint endpoint, const std::string& body, bool keep_alive);
  void reply(ClientConnection& conn, int status, const std::string& body, bool keep_alive,
             std::string_view content_type = "application/json");
  std::string render_metrics();

  // Picks a decode worker (holding while all are busy); its index, or the error status/message.
  std::optional<size_t> acquire_decode(const std::vector<size_t>& exclude, int& status, std::string& message);
  std::optional<size_t> acquire_prefill(const std::vector<size_t>& exclude);
  void mark_down(bool decode, size_t index, const std::string& why);

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

// ---- one request ----

namespace {

// Reads one worker's event stream.
class EventReader {
 public:
  EventReader(HttpClient& client, Millis timeout) : client_(client), timeout_(timeout) {}
  // The next event; nullopt when the body ended.
  Result<std::optional<SseEvent>> next() {
    for (;;) {
      if (auto e = parser_.next()) return std::optional<SseEvent>(std::move(*e));
      if (client_.done()) return std::optional<SseEvent>();
      TACHYON_ASSIGN_OR_RETURN(std::string piece, client_.read_some(timeout_));
      TACHYON_RETURN_IF_ERROR(parser_.feed(piece));
    }
  }

 private:
  HttpClient& client_;
  Millis timeout_;
  SseParser parser_;
};

// A control event's JSON object (empty object when malformed).
ojson control_json(const SseEvent& e) {
  ojson j = ojson::parse(e.data, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : ojson::object();
}

bool has_content(const ojson& chunk) {
  if (!chunk.is_object() || !chunk.contains("choices") || !chunk["choices"].is_array()) return false;
  for (const ojson& c : chunk["choices"]) {
    if (!c.is_object()) continue;
    if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) return true;
    if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
        c["delta"]["content"].is_string() && !c["delta"]["content"].get<std::string>().empty()) {
      return true;
    }
    if (c.contains("finish_reason") && !c["finish_reason"].is_null()) return true;
  }
  return false;
}

}  // namespace

void Router::Impl::reply(ClientConnection& conn, int status, const std::string& body, bool keep_alive,
                         std::string_view content_type) {
  {
    std::lock_guard lock(metrics.mu);
    ++metrics.http_responses[status];
  }
  conn.write(net::plain_response(status, content_type, body, keep_alive), options.write_timeout);
}

void Router::Impl::generate(ClientConnection& conn, Endpoint endpoint, const std::string& body_text, bool keep_alive) {
  const Clock::time_point arrival = Clock::now();
  const auto client_error = [&](int status, const std::string& message) {
    reply(conn, status, error_json_body(message, "invalid_request_error", ""), keep_alive);
  };
  if (server::json_nesting_depth(body_text, kMaxJsonDepth) > kMaxJsonDepth) {
    return client_error(400, fmt::format("the request body nests deeper than {} levels", kMaxJsonDepth));
  }
  ojson body = ojson::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) return client_error(400, "the request body must be a JSON object");
  bool stream = false, include_usage = false;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return client_error(400, "'stream' must be a boolean");
    stream = body["stream"].get<bool>();
  }
  if (stream && body.contains("stream_options") && body["stream_options"].is_object()) {
    const ojson& so = body["stream_options"];
    include_usage = so.contains("include_usage") && so["include_usage"].is_boolean() && so["include_usage"].get<bool>();
  }
  // The workers always stream, with usage; the router gives the client what it asked for.
  body["stream"] = true;
  body["stream_options"] = ojson{{"include_usage", true}};
  const std::string internal = body.dump(-1, ' ', false, ojson::error_handler_t::replace);
  const bool chat = endpoint == Endpoint::kChatCompletions;
  const std::string route = chat ? "chat/completions" : "completions";
  const std::string response_id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(32);
  const std::string created = std::to_string(static_cast<int64_t>(std::time(nullptr)));

  std::unique_ptr<ResponseSink> sink;
  if (stream) {
    sink = std::make_unique<StreamSink>(conn, options.write_timeout, keep_alive, include_usage);
  } else {
    sink = std::make_unique<PlainSink>(conn, options.write_timeout, keep_alive, endpoint);
  }
  {
    std::lock_guard lock(mu);
    ++in_flight;
  }
  bool first_token_seen = false;
  bool saw_error = false;  // a worker's error chunk went to the client
  const auto forward = [&](const SseEvent& e) {
    const ojson parsed = ojson::parse(e.data, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.contains("error")) saw_error = true;
    if (!first_token_seen && has_content(parsed)) {
      first_token_seen = true;
      std::lock_guard lock(metrics.mu);
      metrics.ttft.observe(std::chrono::duration<double>(Clock::now() - arrival).count());
    }
    sink->event(e.data, parsed);
  };
  // The outcome of the request for the metrics.
  enum class End { kOk, kFailed, kRejected } end = End::kFailed;
  std::vector<size_t> tried_decode, tried_prefill;
  std::string last_failure;  // why the last attempt failed, if one did
  const auto fail = [&](int status, const std::string& message, const std::string& code) {
    // Refused before anything was tried (503: no worker, rate matching), or failed. A rejection is
    // counted before the 503 goes out, so that a client reading /metrics after it sees it.
    end = status == 503 && last_failure.empty() ? End::kRejected : End::kFailed;
    if (end == End::kRejected) {
      std::lock_guard lock(metrics.mu);
      ++metrics.rejected;
    }
    sink->fail(status, message, code);
  };
  // A decode worker's stream to the client, to its end: [DONE] finishes the response; a stream
  // that breaks (colocated or after a handoff alike) marks the worker down and fails the request.
  const auto relay_decode = [&](EventReader& events, size_t worker) {
    for (;;) {
      auto e = events.next();
      if (!e.ok() || !*e) {
        const std::string why = e.ok() ? std::string("its stream ended early") : e.status().message();
        mark_down(true, worker, why);
        fail(502, "the decode worker failed mid-stream: " + why, "decode_worker_failed");
        return;
      }
      if ((*e)->event == kControlEvent) continue;
      if ((*e)->data == "[DONE]") {
        sink->done();
        end = saw_error ? End::kFailed : End::kOk;
        return;
      }
      forward(**e);
      if (sink->client_gone()) return;
    }
  };
  const Millis worker_timeout = millis(options.worker_timeout);
  const Millis connect_timeout = millis(options.connect_timeout);

  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt > 0) {
      std::lock_guard lock(metrics.mu);
      ++metrics.retries;
    }
    int status = 0;
    std::string message;
    const std::optional<size_t> d = acquire_decode(tried_decode, status, message);
    if (!d) {
      fail(status, last_failure.empty() ? message : message + " (after: " + last_failure + ")", "no_decode_worker");
      break;
    }
    tried_decode.push_back(*d);
    HttpUrl d_url;
    {
      std::lock_guard lock(mu);
      d_url = decode[*d].url;
    }
    const uint64_t transfer_id = random_transfer_id();
    // 1. Register with the decode worker (it checks the request first).
    std::vector<std::pair<std::string, std::string>> headers = {
        {kHeaderTransferId, std::to_string(transfer_id)},
        // Without prefill workers every request runs whole on its decode worker (a colocated pool).
        {kHeaderMinPromptTokens, std::to_string(prefill.empty() ? kNoDisaggMinPrompt : options.disagg_min_prompt)},
        {kHeaderResponseId, response_id},
        {kHeaderCreated, created}};
    auto d_client = HttpClient::connect(d_url, connect_timeout);
    Status st = d_client.ok() ? (*d_client)->send("POST", "/internal/v1/decode/" + route, headers, internal, worker_timeout)
                              : d_client.status();
    Result<HttpClientResponseHead> d_head = st.ok() ? (*d_client)->read_head(worker_timeout) : Result<HttpClientResponseHead>(st);
    if (!d_head.ok()) {
      last_failure = "decode worker " + d_url.to_string() + ": " + d_head.status().message();
      mark_down(true, *d, d_head.status().message());
      continue;  // retry on another decode worker
    }
    if (d_head->status != 200) {
      auto text = (*d_client)->read_all(kMaxWorkerErrorBody, worker_timeout);
      if (d_head->status == 503) {  // overloaded or draining: another may take it
        last_failure = "decode worker " + d_url.to_string() + " answered 503";
        continue;
      }
      // The request's own fault (4xx) or the worker's: relayed as is.
      reply(conn, d_head->status, text.ok() ? *text : error_json_body("the decode worker failed", "server_error", ""),
            keep_alive);
      end = d_head->status < 500 ? End::kOk : End::kFailed;
      sink.reset();
      break;
    }
    EventReader d_events(**d_client, worker_timeout);
    auto mode_event = d_events.next();
    if (!mode_event.ok() || !*mode_event || (*mode_event)->event != kControlEvent) {
      last_failure = "decode worker " + d_url.to_string() + ": no registration event";
      mark_down(true, *d, last_failure);
      continue;
    }
    const ojson mode = control_json(**mode_event);
    const bool colocated = mode.value("mode", "") == "colocated";
    // 2a. Colocated: the decode worker streams it all.
    if (colocated) {
      {
        std::lock_guard lock(metrics.mu);
        ++metrics.colocated;
      }
      relay_decode(d_events, *d);
      break;
    }
    const int kv_port = mode.value("kv_port", 0);
    if (mode.value("mode", "") != "disagg" || kv_port <= 0 || kv_port > 65535) {
      fail(502, "the decode worker sent a bad registration event: " + (*mode_event)->data, "bad_worker_response");
      break;
    }
    // 2b. Prefill on a prefill worker, which ships the KV to the decode worker.
    const std::optional<size_t> p = acquire_prefill(tried_prefill);
    if (!p) {
      fail(503, "no prefill worker is reachable; retry later", "no_prefill_worker");
      break;
    }
    HttpUrl p_url;
    {
      std::lock_guard lock(mu);
      p_url = prefill[*p].url;
    }
    headers.emplace_back(kHeaderKvAddress, disagg::KvDestination{d_url.host, static_cast<uint16_t>(kv_port)}.to_string());
    auto p_client = HttpClient::connect(p_url, connect_timeout);
    st = p_client.ok() ? (*p_client)->send("POST", "/internal/v1/prefill/" + route, headers, internal, worker_timeout)
                       : p_client.status();
    Result<HttpClientResponseHead> p_head = st.ok() ? (*p_client)->read_head(worker_timeout) : Result<HttpClientResponseHead>(st);
    if (!p_head.ok() || p_head->status == 503) {
      last_failure = "prefill worker " + p_url.to_string() + ": " + (p_head.ok() ? std::string("503") : p_head.status().message());
      if (!p_head.ok()) mark_down(false, *p, p_head.status().message());
      tried_prefill.push_back(*p);
      tried_decode.pop_back();  // the decode worker was fine
      continue;
    }
    if (p_head->status != 200) {
      auto text = (*p_client)->read_all(kMaxWorkerErrorBody, worker_timeout);
      reply(conn, p_head->status, text.ok() ? *text : error_json_body("the prefill worker failed", "server_error", ""),
            keep_alive);
      end = End::kFailed;
      sink.reset();
      break;
    }
    {
      std::lock_guard lock(metrics.mu);
      ++metrics.disagg;
    }
    // 3. The prefill worker's part: opening chunks and the first token, then the handoff.
    EventReader p_events(**p_client, worker_timeout);
    enum class PrefillEnd { kHandoff, kDone, kFailed, kRetry } p_end = PrefillEnd::kFailed;
    std::string p_failure;
    for (;;) {
      auto e = p_events.next();
      if (!e.ok() || !*e) {
        p_failure = "the prefill worker failed: " + (e.ok() ? std::string("its stream ended early") : e.status().message());
        p_end = sink->committed() ? PrefillEnd::kFailed : PrefillEnd::kRetry;
        break;
      }
      if ((*e)->event == kControlEvent) {
        if (control_json(**e).value("handoff", "") == "ok") {
          p_end = PrefillEnd::kHandoff;
          break;
        }
        continue;
      }
      if ((*e)->data == "[DONE]") {  // the first token ended the request: nothing was shipped
        p_end = PrefillEnd::kDone;
        break;
      }
      const ojson parsed = ojson::parse((*e)->data, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object() && parsed.contains("error")) {
        const ojson& err = parsed["error"];
        p_failure = err.is_object() && err.contains("message") && err["message"].is_string()
                        ? err["message"].get<std::string>()
                        : (*e)->data;
        p_end = sink->committed() ? PrefillEnd::kFailed : PrefillEnd::kRetry;
        break;
      }
      forward(**e);
      if (sink->client_gone()) break;
    }
    if (sink->client_gone()) break;  // closing both workers' connections cancels their work
    if (p_end == PrefillEnd::kDone) {
      std::lock_guard lock(metrics.mu);
      ++metrics.first_token_only;
    }
    if (p_end == PrefillEnd::kDone) {
      sink->done();
      end = End::kOk;
      break;
    }
    if (p_end == PrefillEnd::kRetry) {
      last_failure = p_failure;
      TACHYON_LOG_WARN("router: handoff via {} -> {} failed before the client saw anything: {}", p_url.to_string(),
                       d_url.to_string(), p_failure);
      continue;  // the next attempt excludes this decode worker
    }
    if (p_end == PrefillEnd::kFailed) {
      fail(502, p_failure.empty() ? "the prefill worker failed" : p_failure, "handoff_failed");
      break;
    }
    // 4. The decode worker's part: the rest of the tokens.
    relay_decode(d_events, *d);
    break;
  }
  if (sink && sink->status() == 0 && !sink->client_gone()) {
    // Both attempts failed before anything was sent.
    fail(502, "handing the request over failed twice: " + last_failure, "handoff_failed");
  }
  {
    std::lock_guard lock(mu);
    --in_flight;
  }
  cv.notify_all();
  std::lock_guard lock(metrics.mu);
  if (sink && sink->status() != 0) ++metrics.http_responses[sink->status()];
  if (end == End::kFailed || (sink && sink->client_gone())) ++metrics.failed;
  if (end == End::kOk) metrics.e2e.observe(std::chrono::duration<double>(Clock::now() - arrival).count());
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
