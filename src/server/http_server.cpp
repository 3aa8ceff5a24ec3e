// Connection handling: Beast parses requests; responses are written as raw bytes (status line,
// headers, then a Content-Length body or chunks) so that a stream's events go out in as few writes
// as possible. Every handler of a connection runs on its strand; the engine loop reaches a
// connection only by posting to that strand.
#include "server/http_server.h"

#include <algorithm>
#include <csignal>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>

#include "core/log.h"
#include "net/http_response.h"
#include "net/listener.h"
#include "server/completion_job.h"
#include "server/disagg_protocol.h"
#include "server/tokenize_api.h"

namespace tachyon::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using net::chunk;
using net::status_line;

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr size_t kMaxLingerBytes = size_t{64} << 20;
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

}  // namespace

class Session;

struct HttpServer::Impl {
  Impl(const HttpServerOptions& o, const ServingContext& c, std::unique_ptr<AsyncEngine> e, ServerMetrics& m,
       const DisaggContext& d)
      : options(o), context(c), metrics(m), disagg(d), access(o.access), created(std::time(nullptr)),
        engine(std::move(e)),
        ioc(std::max(1, o.io_threads)), acceptor(ioc), signals(ioc, SIGINT, SIGTERM), drain_timer(ioc),
        retry_timer(ioc) {
    if (context.grammars == nullptr) context.grammars = &grammars;
  }
  ~Impl() {
    ioc.stop();
    engine.reset();  // its loop may still post to connections: it goes before the io_context
  }

  void accept();
  // The engine loop's hand-over of one step's ready streams: a few posts to the I/O threads, each
  // notifying a slice of the streams, instead of one post (a lock and maybe a wake-up, paid by the
  // engine loop) per stream.
  void notify_ready(std::vector<std::shared_ptr<RequestStream>>&& ready);
  void on_signal(const error_code& ec, int signal);
  void begin_drain();
  void check_drained();
  void add(const std::shared_ptr<Session>& s);
  void remove(Session* s);

  // Everything a connection touches is declared before the io_context, so that it outlives the
  // connections the io_context's destructor frees.
  HttpServerOptions options;
  GrammarCache grammars;  // the context's, unless the caller gave one
  ServingContext context;
  ServerMetrics& metrics;
  DisaggContext disagg;
  AccessPolicy access;
  int64_t created;
  int port = 0;
  std::atomic<bool> draining{false};
  std::atomic<int> active{0};  // responses to generation requests not yet fully written
  int exit_code = 0;
  std::mutex sessions_mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  std::unique_ptr<AsyncEngine> engine;  // reset in ~Impl, before the io_context goes
  asio::io_context ioc;
  tcp::acceptor acceptor;
  asio::signal_set signals;
  asio::steady_timer drain_timer;
  asio::steady_timer retry_timer;
};

// One client connection.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl& server)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), server_(server) {}
  ~Session() {
    // Only reached with a job still running when the server stops without draining.
    if (job_ && server_.engine) abort_job();
    if (counted_) server_.active.fetch_sub(1);
    server_.remove(this);
  }

  // Runs the connection on its strand.
  void start() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      error_code ec;
      self->socket_.set_option(tcp::no_delay(true), ec);
      // For write_more's immediate send: a synchronous write that would block returns at once.
      self->socket_.non_blocking(true, ec);
      self->read_request();
    });
  }

  // From the server on a drain (any thread).
  void drain() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->on_drain(); });
  }

 private:
  // Idle connections close now, busy ones after their response.
  void on_drain() {
    if (state_ == State::kReading || state_ == State::kAwaitingRequest) close();
  }

  enum class State { kReading, kGenerating, kResponding, kAwaitingRequest, kLingering, kClosed };

  // --- timers: one deadline at a time (reading a request, or one write) ---
  void arm_timer(double seconds) {
    const uint64_t seq = ++timer_seq_;
    timer_.expires_after(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
    timer_.async_wait([self = shared_from_this(), seq](const error_code& ec) {
      if (ec || seq != self->timer_seq_) return;
      self->close();
    });
  }
  void disarm_timer() {
    ++timer_seq_;
    timer_.cancel();
  }

  // --- reading requests ---
  void read_request() {
    if (state_ == State::kClosed) return;
    if (server_.draining.load()) {
      close();
      return;
    }
    state_ = State::kReading;
    extra_headers_.clear();
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(server_.options.max_body);
    arm_timer(server_.options.keep_alive_timeout);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](const error_code& ec, size_t) { self->on_header(ec); });
  }

  void on_header(const error_code& ec) {
    if (state_ == State::kClosed) return;
    if (ec) {
      read_failed(ec);
      return;
    }
    auto& req = parser_->get();
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      asio::async_write(socket_, asio::buffer(kContinue.data(), kContinue.size()),
                       [self = shared_from_this()](const error_code& wec, size_t) {
                         if (wec) {
                           self->close();
                           return;
                         }
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    if (parser_->is_done()) {
      on_body(error_code{});
      return;
    }
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](const error_code& ec, size_t) { self->on_body(ec); });
  }

  void on_body(const error_code& ec) {
    if (state_ == State::kClosed) return;
    disarm_timer();
    if (ec) {
      read_failed(ec);
      return;
    }
    http::request<http::string_body> req = parser_->release();
    parser_.reset();
    keep_alive_ = req.keep_alive();
    http10_ = req.version() < 11;
    handle(std::move(req));
  }

  void read_failed(const error_code& ec) {
    if (ec == http::error::body_limit) {
      reply_error_and_close(413, fmt::format("the request body exceeds the server's limit of {} bytes",
                                             server_.options.max_body), "request_too_large");
    } else if (ec == http::error::header_limit) {
      // Beast takes the request line as soon as it is whole: no target yet means the line alone
      // passed the limit, and what is too long is the URL.
      if (parser_->get().target().empty()) {
        reply_error_and_close(414, fmt::format("the request line exceeds {} bytes", kMaxHeaderBytes), "");
      } else {
        reply_error_and_close(431, fmt::format("the request headers exceed {} bytes", kMaxHeaderBytes), "");
      }
    } else if (ec.category() == make_error_code(http::error::bad_target).category() && ec != http::error::end_of_stream &&
               ec != http::error::partial_message) {
      reply_error_and_close(400, fmt::format("malformed HTTP request: {}", ec.message()), "");
    } else {
      close();  // the client closed, timed out, or the server is draining
    }
  }

  // --- routing ---
  void handle(http::request<http::string_body> req) {
    std::string_view target(req.target().data(), req.target().size());
    const std::string path(target.substr(0, target.find('?')));
    const bool get = req.method() == http::verb::get;
    const bool post = req.method() == http::verb::post;
    const auto header = [&req](http::field name) {
      const auto v = req[name];
      return std::string_view(v.data(), v.size());
    };
    // CORS: every response to an allowed origin says so; its preflights are answered here, before
    // the API key (a browser sends none with them).
    const AccessPolicy& access = server_.access;
    const std::string_view origin = header(http::field::origin);
    extra_headers_ = access.cors_headers(origin);
    if (req.method() == http::verb::options && access.cors_enabled() && !origin.empty()) {
      if (!access.origin_allowed(origin)) return reply_error(403, "this origin is not allowed (--allowed-origins)", "");
      extra_headers_ = access.preflight_headers(origin, header(http::field::access_control_request_headers));
      return reply(200, "text/plain; charset=utf-8", "");
    }
    if (!access.authorized(path, header(http::field::authorization))) {
      const bool key_given = !header(http::field::authorization).empty();
      return reply(401, "application/json", AccessPolicy::unauthorized_body(key_given));
    }
    if (path == "/tokenize" || path == "/detokenize") {
      if (!post) return reply_error(405, fmt::format("{} needs POST", path), "method_not_allowed");
      const JsonReply r = path == "/tokenize" ? tokenize_reply(req.body(), server_.context)
                                              : detokenize_reply(req.body(), server_.context);
      return reply(r.status, "application/json", r.body);
    }
    if (path == "/v1/completions" || path == "/v1/chat/completions") {
      if (!post) return reply_error(405, fmt::format("{} needs POST", path), "method_not_allowed");
      if (server_.disagg.role == WorkerRole::kPrefill) {
        return reply_error(404, "this is a prefill worker (tachyon serve --role prefill): send requests to tachyon "
                                "router", "prefill_worker");
      }
      return start_generation(path == "/v1/chat/completions" ? Endpoint::kChatCompletions : Endpoint::kCompletions,
                              req.body());
    }
    if (path.rfind(kInternalPrefix, 0) == 0) return handle_internal(path.substr(kInternalPrefix.size()), req);
    if (path == "/health") {
      if (!get) return reply_error(405, "/health needs GET", "method_not_allowed");
      if (server_.draining.load()) return reply(503, "application/json", R"({"status":"draining"})");
      return reply(200, "application/json", R"({"status":"ok"})");
    }
    if (path == "/metrics") {
      if (!get) return reply_error(405, "/metrics needs GET", "method_not_allowed");
      return reply(200, "text/plain; version=0.0.4; charset=utf-8", server_.metrics.render());
    }
    if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
      if (!get) return reply_error(405, "/v1/models needs GET", "method_not_allowed");
      nlohmann::ordered_json model = nlohmann::ordered_json::object();
      model["id"] = server_.context.model_name;
      model["object"] = "model";
      model["created"] = server_.created;
      model["owned_by"] = "tachyon";
      model["max_model_len"] = server_.context.max_model_len;
      model["vocab_size"] = server_.context.vocab_size;  // what prompts given as token ids must stay below
      if (path != "/v1/models") {
        if (path.substr(11) != server_.context.model_name) {
          return reply_error(404, fmt::format("The model '{}' does not exist", path.substr(11)), "model_not_found");
        }
        return reply(200, "application/json", model.dump());
      }
      nlohmann::ordered_json list = nlohmann::ordered_json::object();
      list["object"] = "list";
      list["data"] = nlohmann::ordered_json::array({model});
      return reply(200, "application/json", list.dump());
    }
    reply_error(404, fmt::format("no route for {} {}", std::string_view(req.method_string().data(),
                                                                        req.method_string().size()), path), "");
  }

  void start_generation(Endpoint endpoint, const std::string& body) {
    ApiRequest request;
    if (auto error = parse_api_request(endpoint, body, server_.context, request)) {
      return reply(error->status, "application/json", error_body(*error));
    }
    run_job(std::make_shared<CompletionJob>(server_.context, std::move(request)), std::nullopt, "");
  }

  // GET /internal/v1/load, POST /internal/v1/{prefill,decode}/{completions,chat/completions}.
  void handle_internal(std::string_view route, const http::request<http::string_body>& req) {
    const WorkerRole role = server_.disagg.role;
    if (route == "load") {
      if (req.method() != http::verb::get) return reply_error(405, "/internal/v1/load needs GET", "method_not_allowed");
      const EngineStats stats = server_.metrics.engine_stats();
      WorkerLoadReport load;
      load.role = role;
      load.kv_blocks_total = stats.kv_blocks_total;
      // Cached blocks are reclaimable: they count as free for taking new work.
      load.kv_blocks_free = stats.kv_blocks_free + stats.kv_blocks_cached;
      load.num_running = stats.num_running;
      load.num_waiting = stats.num_waiting;
      load.pending_adoptions =
          server_.engine->num_pending_adoptions() +
          (server_.disagg.registry != nullptr ? static_cast<int>(server_.disagg.registry->size()) : 0);
      load.transfers_in_flight = server_.disagg.prefill != nullptr ? server_.disagg.prefill->transfers_in_flight() : 0;
      load.kv_port = server_.disagg.kv_port;
      return reply(200, "application/json", load_json(load));
    }
    const bool prefill = route.rfind("prefill/", 0) == 0;
    const bool decode = route.rfind("decode/", 0) == 0;
    const std::string_view rest = route.substr(prefill ? 8 : decode ? 7 : 0);
    if ((!prefill && !decode) || (rest != "completions" && rest != "chat/completions")) {
      return reply_error(404, fmt::format("no internal route /internal/v1/{}", route), "");
    }
    if (req.method() != http::verb::post) return reply_error(405, "internal generation routes need POST", "method_not_allowed");
    if ((prefill && role != WorkerRole::kPrefill) || (decode && role != WorkerRole::kDecode)) {
      return reply_error(404, fmt::format("this worker's role is {}; /internal/v1/{} needs a {} worker", role_name(role),
                                          route, prefill ? "prefill" : "decode"), "wrong_role");
    }
    const auto header = [&](const char* name) {
      const auto v = req[name];
      return std::string_view(v.data(), v.size());
    };
    const auto bad = [&](const Status& st) { reply_error(400, st.message(), "bad_internal_request"); };
    auto transfer_id = parse_transfer_id(header(kHeaderTransferId));
    if (!transfer_id.ok()) return bad(transfer_id.status().with_context(kHeaderTransferId));
    int64_t min_prompt_tokens = 0;
    if (!header(kHeaderMinPromptTokens).empty()) {
      auto n = parse_count(header(kHeaderMinPromptTokens), int64_t{1} << 30);
      if (!n.ok()) return bad(n.status().with_context(kHeaderMinPromptTokens));
      min_prompt_tokens = *n;
    }
    JobOptions jo;
    if (!header(kHeaderResponseId).empty()) {
      if (Status st = check_response_id(header(kHeaderResponseId)); !st.ok()) return bad(st);
      jo.id = std::string(header(kHeaderResponseId));
    }
    if (!header(kHeaderCreated).empty()) {
      auto created = parse_count(header(kHeaderCreated), int64_t{1} << 40);
      if (!created.ok()) return bad(created.status().with_context(kHeaderCreated));
      jo.created = *created;
    }
    std::optional<disagg::KvDestination> kv_to;
    if (prefill) {
      auto to = parse_host_port(header(kHeaderKvAddress));
      if (!to.ok()) return bad(to.status().with_context(kHeaderKvAddress));
      kv_to = *to;
    }
    const Endpoint endpoint = rest == "completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions;
    ApiRequest request;
    if (auto error = parse_api_request(endpoint, req.body(), server_.context, request)) {
      return reply(error->status, "application/json", error_body(*error));
    }
    // The router reads every part as a stream and builds plain responses itself: it has no place
    // for prompt logprobs, which a prefill worker could not hand over anyway.
    if (request.prompt_logprobs) {
      ApiError e{400, "'prompt_logprobs' is not supported through the router (a disaggregated deployment)",
                 "invalid_request_error", "prompt_logprobs", ""};
      return reply(400, "application/json", error_body(e));
    }
    // Tool calls are parsed out of a choice's whole text, which two workers write in parts.
    if (request.tools) {
      ApiError e{400, "'tools' are not supported through the router (a disaggregated deployment)",
                 "invalid_request_error", "tools", ""};
      return reply(400, "application/json", error_body(e));
    }
    request.stream = true;
    request.include_usage = true;
    const size_t choices = request.prompts.size() * static_cast<size_t>(request.n);
    const size_t prompt_tokens = request.prompts[0].ids.size();
    if (prefill) {
      if (choices != 1) {
        return reply_error(400, fmt::format("a prefill worker runs one choice per request, not {}", choices),
                           "bad_internal_request");
      }
      request.params.prefill_only = true;
      jo.part = JobPart::kFirstToken;
      auto job = std::make_shared<CompletionJob>(server_.context, std::move(request), jo);
      job->streams()[0]->set_transfer_target(TransferTarget{*kv_to, *transfer_id});
      return run_job(std::move(job), std::nullopt, "");
    }
    // Decode: several choices or a short prompt run here whole; else wait for the transfer.
    const bool colocated = choices != 1 || static_cast<int64_t>(prompt_tokens) < min_prompt_tokens;
    jo.part = colocated ? JobPart::kWhole : JobPart::kAfterFirstToken;
    const std::string control =
        colocated ? fmt::format(R"({{"mode":"colocated","prompt_tokens":{}}})", prompt_tokens)
                  : fmt::format(R"({{"mode":"disagg","kv_port":{},"prompt_tokens":{}}})", server_.disagg.kv_port,
                                prompt_tokens);
    const std::string preamble = fmt::format("event: {}\ndata: {}\n\n", kControlEvent, control);
    auto job = std::make_shared<CompletionJob>(server_.context, std::move(request), jo);
    if (colocated) return run_job(std::move(job), std::nullopt, preamble);
    run_job(std::move(job), *transfer_id, preamble);
  }

  // Starts a job's response: submits its streams to the engine, or (decode role, with a transfer
  // id) registers its one stream to wait for that transfer. `preamble`: bytes of the stream before
  // the job's own events.
  void run_job(std::shared_ptr<CompletionJob> job, std::optional<uint64_t> await_transfer, const std::string& preamble) {
    std::weak_ptr<Session> weak = weak_from_this();
    auto executor = socket_.get_executor();
    for (const auto& s : job->streams()) {
      // dispatch: inline when an I/O thread runs it with the strand free (the engine's batched
      // hand-over, see Impl::notify_ready); queued on the strand otherwise.
      s->set_notify([weak, executor] {
        asio::dispatch(executor, [weak] {
          if (auto self = weak.lock()) self->on_job_ready();
        });
      });
    }
    SubmitError submitted = SubmitError::kNone;
    if (await_transfer) {
      TransferRegistry& registry = *server_.disagg.registry;
      if (server_.draining.load() || server_.engine->draining()) {
        submitted = SubmitError::kDraining;
      } else if (registry.size() + static_cast<size_t>(server_.engine->num_pending_adoptions()) >=
                 static_cast<size_t>(server_.options.max_registered)) {
        submitted = SubmitError::kQueueFull;
      } else {
        const auto deadline = TransferRegistry::Clock::now() +
                              std::chrono::milliseconds(static_cast<int64_t>(server_.disagg.transfer_wait * 1000));
        if (Status st = registry.add(*await_transfer, job->streams()[0], deadline); !st.ok()) {
          return reply_error(409, st.message(), "duplicate_transfer_id");
        }
      }
    } else {
      submitted = server_.engine->submit(job->streams());
    }
    switch (submitted) {
      case SubmitError::kNone: break;
      case SubmitError::kQueueFull: {
        server_.metrics.record_rejected();
        ApiError e{503, "the server is overloaded: too many requests are waiting; retry later", "server_error", "",
                   "queue_full"};
        return reply(503, "application/json", error_body(e));
      }
      case SubmitError::kDraining: {
        server_.metrics.record_rejected();
        keep_alive_ = false;
        ApiError e{503, "the server is shutting down", "server_error", "", "shutting_down"};
        return reply(503, "application/json", error_body(e));
      }
    }
    job_ = std::move(job);
    state_ = State::kGenerating;
    counted_ = true;
    server_.active.fetch_add(1);
    if (job_->streaming()) {
      std::string head = status_line(200) +
                         "Content-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
                         "X-Accel-Buffering: no\r\n" + extra_headers_;
      if (http10_) {
        keep_alive_ = false;
        head += "Connection: close\r\n\r\n";
      } else {
        head += fmt::format("Transfer-Encoding: chunked\r\nConnection: {}\r\n\r\n", keep_alive_ ? "keep-alive" : "close");
      }
      server_.metrics.record_http_response(200);
      pending_ += head;
      if (!preamble.empty()) pending_ += http10_ ? preamble : chunk(preamble);
      on_job_ready();  // the opening events
    }
    watch();
  }

  // A read kept posted while a request generates: it completes when the client hangs up (or
  // sends its next request early, which then stays in the buffer for the parser).
  void watch() {
    if (watching_ || state_ == State::kClosed) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](const error_code& ec, size_t n) {
      self->watching_ = false;
      if (self->state_ == State::kClosed) return;
      if (ec) {
        self->close();  // aborts the job, if any
        return;
      }
      self->buffer_.commit(n);
      if (self->state_ == State::kAwaitingRequest) self->read_request();
    });
  }

  // The job's streams delivered outputs (or the job is to be driven once more).
  void on_job_ready() {
    if (!job_ || state_ == State::kClosed) return;
    std::string events = job_->poll();
    if (job_->failed()) abort_job();
    if (job_->streaming()) {
      if (!events.empty()) pending_ += http10_ ? events : chunk(events);
      if (job_->done()) {
        if (!http10_) pending_ += "0\r\n\r\n";
        finish_job();
      }
    } else if (job_->done()) {
      const int status = job_->status();
      finish_job();
      append_response(status, "application/json", job_body_);
    }
    write_more();
  }

  void finish_job() {
    if (!job_->streaming()) job_body_ = job_->body();
    job_.reset();
    state_ = State::kResponding;
  }

  void abort_job() {
    if (!job_) return;
    for (const auto& s : job_->streams()) server_.engine->abort(s);
  }

  // --- writing ---
  void append_response(int status, std::string_view content_type, std::string_view body) {
    server_.metrics.record_http_response(status);
    if (server_.draining.load()) keep_alive_ = false;
    pending_ += net::plain_response(status, content_type, body, keep_alive_, extra_headers_);
  }

  void reply(int status, std::string_view content_type, std::string_view body) {
    append_response(status, content_type, body);
    state_ = State::kResponding;
    write_more();
  }

  void reply_error(int status, std::string message, std::string code) {
    ApiError e;
    e.status = status;
    e.message = std::move(message);
    e.code = std::move(code);
    reply(status, "application/json", error_body(e));
  }

  // For a request whose body is not read (too large, malformed): the response, then a lingering
  // close, so that the client can finish sending and read the answer instead of a reset.
  void reply_error_and_close(int status, std::string message, std::string code) {
    keep_alive_ = false;
    linger_ = true;
    reply_error(status, std::move(message), std::move(code));
  }

  // Half-closes, then reads and drops what the client still sends until it closes (or a couple of
  // seconds, or kMaxLingerBytes): closing with unread input would reset the connection and could
  // destroy the response before the client read it.
  void linger() {
    state_ = State::kLingering;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    arm_timer(2.0);
    discard();
  }
  void discard() {
    socket_.async_read_some(buffer_.prepare(64 * 1024), [self = shared_from_this()](const error_code& ec, size_t n) {
      if (self->state_ != State::kLingering) return;
      self->lingered_ += n;
      if (ec || self->lingered_ > kMaxLingerBytes) {
        self->close();
        return;
      }
      self->discard();
    });
  }

  void write_more() {
    if (writing_ || state_ == State::kClosed) return;
    // A streamed token's chunk almost always fits the socket's send buffer: send it at once, with
    // no write timer and no completion handler. Only what the socket does not take waits for an
    // asynchronous write (and its timeout).
    if (!pending_.empty()) {
      error_code ec;
      const size_t sent = socket_.write_some(asio::buffer(pending_), ec);
      if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
        close();
        return;
      }
      pending_.erase(0, sent);
    }
    if (pending_.empty()) {
      if (state_ == State::kResponding) response_written();
      return;
    }
    out_.swap(pending_);
    pending_.clear();
    writing_ = true;
    arm_timer(server_.options.write_timeout);
    asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](const error_code& ec, size_t) {
      self->writing_ = false;
      self->disarm_timer();
      if (self->state_ == State::kClosed) return;
      if (ec) {
        self->close();
        return;
      }
      self->out_.clear();
      self->write_more();
    });
  }

  // The whole response is out: next request, or close.
  void response_written() {
    if (counted_) {
      counted_ = false;
      server_.active.fetch_sub(1);
    }
    if (!keep_alive_ || server_.draining.load()) {
      if (linger_ && !watching_) {
        linger();
      } else {
        close();
      }
      return;
    }
    if (watching_) {
      // The posted read will deliver the next request's first bytes (or the hang-up).
      state_ = State::kAwaitingRequest;
      arm_timer(server_.options.keep_alive_timeout);
      return;
    }
    read_request();
  }

  void close() {
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
    abort_job();
    job_.reset();
    if (counted_) {
      counted_ = false;
      server_.active.fetch_sub(1);
    }
    disarm_timer();
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  uint64_t timer_seq_ = 0;
  HttpServer::Impl& server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  State state_ = State::kReading;
  bool keep_alive_ = true;
  bool http10_ = false;
  bool watching_ = false;
  bool writing_ = false;
  bool counted_ = false;  // holds one of server_.active
  bool linger_ = false;   // the request's body was left unread: close gently
  size_t lingered_ = 0;
  std::shared_ptr<CompletionJob> job_;
  std::string job_body_;
  std::string extra_headers_;  // the current request's CORS header lines, on every response to it
  std::string pending_;  // bytes waiting for the current write to finish
  std::string out_;      // bytes being written
};

void HttpServer::Impl::add(const std::shared_ptr<Session>& s) {
  std::lock_guard lock(sessions_mu);
  sessions.emplace(s.get(), s);
}

void HttpServer::Impl::remove(Session* s) {
  std::lock_guard lock(sessions_mu);
  sessions.erase(s);
}

void HttpServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](const error_code& ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors and the like: wait a little instead of spinning.
      TACHYON_LOG_WARN("accept failed: {}", ec.message());
      retry_timer.expires_after(std::chrono::milliseconds(50));
      retry_timer.async_wait([this](const error_code&) { accept(); });
      return;
    }
    auto session = std::make_shared<Session>(std::move(socket), *this);
    add(session);
    session->start();
    accept();
  });
}

void HttpServer::Impl::on_signal(const error_code& ec, int signal) {
  if (ec) return;
  if (draining.load()) {
    TACHYON_LOG_WARN("second signal ({}): exiting without waiting for {} requests", signal, active.load());
    exit_code = 1;
    ioc.stop();
    return;
  }
  std::fprintf(stderr, "tachyon serve: signal %d: draining (no new connections; %d requests in flight)\n", signal,
               active.load());
  begin_drain();
  signals.async_wait([this](const error_code& e, int s) { on_signal(e, s); });
}

void HttpServer::Impl::begin_drain() {
  draining.store(true);
  error_code ec;
  acceptor.close(ec);
  engine->begin_drain();
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(sessions_mu);
    for (auto& [ptr, weak] : sessions) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) s->drain();
  check_drained();
}

// Done when the engine loop has finished every request and every response is written.
void HttpServer::Impl::check_drained() {
  if (engine->stopped() && active.load() == 0) {
    std::fprintf(stderr, "tachyon serve: drained; exiting\n");
    ioc.stop();
    return;
  }
  drain_timer.expires_after(std::chrono::milliseconds(20));
  drain_timer.async_wait([this](const error_code& ec) {
    if (!ec) check_drained();
  });
}

void HttpServer::Impl::notify_ready(std::vector<std::shared_ptr<RequestStream>>&& ready) {
  // At least this many streams per post: below it, one I/O thread notifies them sooner than a
  // second one wakes up.
  constexpr size_t kMinPerPost = 32;
  const size_t n = ready.size();
  const size_t posts = std::clamp<size_t>(n / kMinPerPost, 1, static_cast<size_t>(std::max(1, options.io_threads)));
  if (posts == 1) {
    asio::post(ioc, [ready = std::move(ready)] {
      for (const auto& s : ready) s->notify();
    });
    return;
  }
  for (size_t p = 0; p < posts; ++p) {
    std::vector<std::shared_ptr<RequestStream>> slice(ready.begin() + static_cast<ptrdiff_t>(n * p / posts),
                                                      ready.begin() + static_cast<ptrdiff_t>(n * (p + 1) / posts));
    asio::post(ioc, [slice = std::move(slice)] {
      for (const auto& s : slice) s->notify();
    });
  }
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;

int HttpServer::port() const { return impl_->port; }

Result<std::unique_ptr<HttpServer>> HttpServer::create(const HttpServerOptions& options, const ServingContext& context,
                                                       std::unique_ptr<AsyncEngine> engine, ServerMetrics& metrics,
                                                       const DisaggContext& disagg) {
  if (disagg.role == WorkerRole::kDecode && disagg.registry == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "a decode worker needs its transfer registry");
  }
  if (options.io_threads < 1) {
    return make_error(ErrorCode::kInvalidArgument, "io threads = {} must be at least 1", options.io_threads);
  }
  if (options.port < 0 || options.port > 65535) {
    return make_error(ErrorCode::kInvalidArgument, "port {} must be in [0, 65535]", options.port);
  }
  auto impl = std::make_unique<Impl>(options, context, std::move(engine), metrics, disagg);
  TACHYON_RETURN_IF_ERROR(net::listen_on(impl->acceptor, options.host, options.port));
  impl->port = impl->acceptor.local_endpoint().port();
  Impl* raw = impl.get();  // the engine is reset first in ~Impl: the callback never outlives it
  raw->engine->set_notify_ready([raw](std::vector<std::shared_ptr<RequestStream>>&& ready) {
    raw->notify_ready(std::move(ready));
  });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::run() {
  Impl& s = *impl_;
  s.signals.async_wait([&s](const error_code& ec, int signal) { s.on_signal(ec, signal); });
  s.accept();
  std::vector<std::thread> threads;
  for (int i = 1; i < s.options.io_threads; ++i) threads.emplace_back([&s] { s.ioc.run(); });
  s.ioc.run();
  for (auto& t : threads) t.join();
  return s.exit_code;
}

}  // namespace tachyon::server
