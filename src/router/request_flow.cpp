// One generation request through the router (router.h tells the flow): its steps, in the order
// they run, are the methods of RequestFlow below: pick a decode worker, register the request
// there, prefill on a prefill worker, relay the workers' streams to the client; run() retries a
// failed handoff once while nothing has reached the client.
#include <chrono>
#include <ctime>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/log.h"
#include "net/http_client.h"
#include "router/response_sink.h"
#include "router/router_impl.h"

namespace tachyon::router {
namespace {

using net::HttpClient;
using net::HttpClientResponseHead;
using net::HttpUrl;
using server::kControlEvent;
using server::SseEvent;
using server::SseParser;
using Headers = std::vector<std::pair<std::string, std::string>>;

// Above any prompt (the workers accept up to 2^30): the decode worker runs the request whole.
constexpr int64_t kNoDisaggMinPrompt = int64_t{1} << 30;

uint64_t random_transfer_id() {
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32));
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

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

// One worker's side of an attempt: its connection stays open while the attempt lasts (closing it
// cancels the work there).
struct WorkerCall {
  size_t index = 0;
  HttpUrl url;
  std::unique_ptr<HttpClient> client;
};

class RequestFlow {
 public:
  RequestFlow(Router::Impl& router, ClientConnection& conn, server::Endpoint endpoint, bool keep_alive)
      : router_(router), conn_(conn), endpoint_(endpoint), keep_alive_(keep_alive),
        worker_timeout_(millis(router.options.worker_timeout)), connect_timeout_(millis(router.options.connect_timeout)) {}

  // Checks the client's body and makes the workers' request of it; false when the request was
  // answered here (400).
  bool prepare(const std::string& body_text);
  // The attempts, then the accounting; the client has its answer when this returns.
  void run();

 private:
  // Where an attempt stands after one of its steps.
  enum class Next { kGoOn, kRetry, kDone };
  // The outcome of the request for the metrics.
  enum class End { kOk, kFailed, kRejected };
  enum class PrefillEnd { kHandoff, kDone, kFailed, kRetry };

  Next attempt();
  // 0. A decode worker with room (held while all are busy); nullopt when the request was refused.
  std::optional<size_t> pick_worker();
  // 1. Registers the request with the decode worker, which checks it first and answers with its
  //    registration event (`mode`).
  Next register_request(WorkerCall& d, const Headers& headers, std::optional<EventReader>& events, SseEvent& mode);
  // 2b. Runs the prompt on a prefill worker, which ships the KV to the decode worker (`kv_port` on
  //     d's host), and relays its part of the stream up to the handoff.
  Next prefill(WorkerCall& p, const WorkerCall& d, Headers headers, int kv_port);
  PrefillEnd relay_prefill(EventReader& events, std::string& failure);
  // 4. The decode worker's stream to the client, to its end: [DONE] finishes the response; a
  //    stream that breaks (colocated or after a handoff alike) marks the worker down and fails the
  //    request.
  void relay_decode(EventReader& events, size_t worker);

  // Sends the request to a worker's internal route; its response head.
  Result<HttpClientResponseHead> open(WorkerCall& w, const std::string& prefix, const Headers& headers);
  // A worker's own error answer goes to the client as it is.
  void relay_error(int status, const Result<std::string>& text, const char* fallback);
  void forward(const SseEvent& e);
  void fail(int status, const std::string& message, const std::string& code);
  void finish();

  Router::Impl& router_;
  ClientConnection& conn_;
  const server::Endpoint endpoint_;
  const bool keep_alive_;
  const Millis worker_timeout_;
  const Millis connect_timeout_;
  const Clock::time_point arrival_ = Clock::now();

  std::string internal_;  // the workers' request body
  std::string route_;     // "completions" or "chat/completions"
  std::string response_id_;
  std::string created_;
  std::unique_ptr<ResponseSink> sink_;  // null once a worker's answer was relayed as it is

  bool first_token_seen_ = false;
  bool saw_error_ = false;  // a worker's error chunk went to the client
  End end_ = End::kFailed;
  std::vector<size_t> tried_decode_, tried_prefill_;
  std::string last_failure_;  // why the last attempt failed, if one did
};

bool RequestFlow::prepare(const std::string& body_text) {
  const auto client_error = [&](int status, const std::string& message) {
    router_.reply(conn_, status, error_json_body(message, "invalid_request_error", ""), keep_alive_);
    return false;
  };
  if (server::json_nesting_depth(body_text, server::kMaxJsonDepth) > server::kMaxJsonDepth) {
    return client_error(400, fmt::format("the request body nests deeper than {} levels", server::kMaxJsonDepth));
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
  internal_ = body.dump(-1, ' ', false, ojson::error_handler_t::replace);
  const bool chat = endpoint_ == server::Endpoint::kChatCompletions;
  route_ = chat ? "chat/completions" : "completions";
  response_id_ = server::new_response_id(endpoint_);
  created_ = std::to_string(static_cast<int64_t>(std::time(nullptr)));
  const double write_timeout = router_.options.write_timeout;
  if (stream) {
    sink_ = std::make_unique<StreamSink>(conn_, write_timeout, keep_alive_, include_usage);
  } else {
    sink_ = std::make_unique<PlainSink>(conn_, write_timeout, keep_alive_, endpoint_);
  }
  return true;
}

void RequestFlow::run() {
  {
    std::lock_guard lock(router_.mu);
    ++router_.in_flight;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt > 0) {
      std::lock_guard lock(router_.metrics.mu);
      ++router_.metrics.retries;
    }
    if (this->attempt() != Next::kRetry) break;
  }
  if (sink_ && sink_->status() == 0 && !sink_->client_gone()) {
    // Both attempts failed before anything was sent.
    fail(502, "handing the request over failed twice: " + last_failure_, "handoff_failed");
  }
  finish();
}

RequestFlow::Next RequestFlow::attempt() {
  const std::optional<size_t> d_index = pick_worker();
  if (!d_index) return Next::kDone;
  tried_decode_.push_back(*d_index);
  WorkerCall d{*d_index, router_.worker_url(true, *d_index), nullptr};
  const uint64_t transfer_id = random_transfer_id();
  const Headers headers = {
      {server::kHeaderTransferId, std::to_string(transfer_id)},
      // Without prefill workers every request runs whole on its decode worker (a colocated pool).
      {server::kHeaderMinPromptTokens,
       std::to_string(router_.prefill.empty() ? kNoDisaggMinPrompt : router_.options.disagg_min_prompt)},
      {server::kHeaderResponseId, response_id_},
      {server::kHeaderCreated, created_}};
  std::optional<EventReader> d_events;
  SseEvent mode_event;
  // 1. Register with the decode worker.
  if (const Next next = register_request(d, headers, d_events, mode_event); next != Next::kGoOn) return next;
  const ojson mode = control_json(mode_event);
  // 2a. Colocated: the decode worker streams it all.
  if (mode.value("mode", "") == "colocated") {
    {
      std::lock_guard lock(router_.metrics.mu);
      ++router_.metrics.colocated;
    }
    relay_decode(*d_events, d.index);
    return Next::kDone;
  }
  const int kv_port = mode.value("kv_port", 0);
  if (mode.value("mode", "") != "disagg" || kv_port <= 0 || kv_port > 65535) {
    fail(502, "the decode worker sent a bad registration event: " + mode_event.data, "bad_worker_response");
    return Next::kDone;
  }
  // 2b and 3. Prefill on a prefill worker, up to the handoff.
  WorkerCall p;
  if (const Next next = prefill(p, d, headers, kv_port); next != Next::kGoOn) return next;
  // 4. The decode worker's part: the rest of the tokens.
  relay_decode(*d_events, d.index);
  return Next::kDone;
}

std::optional<size_t> RequestFlow::pick_worker() {
  int status = 0;
  std::string message;
  const std::optional<size_t> d = router_.acquire_decode(tried_decode_, status, message);
  if (!d) {
    fail(status, last_failure_.empty() ? message : message + " (after: " + last_failure_ + ")", "no_decode_worker");
  }
  return d;
}

RequestFlow::Next RequestFlow::register_request(WorkerCall& d, const Headers& headers,
                                                std::optional<EventReader>& events, SseEvent& mode) {
  const Result<HttpClientResponseHead> head = open(d, "/internal/v1/decode/", headers);
  if (!head.ok()) {
    last_failure_ = "decode worker " + d.url.to_string() + ": " + head.status().message();
    router_.mark_down(true, d.index, head.status().message());
    return Next::kRetry;  // on another decode worker
  }
  if (head->status != 200) {
    const auto text = d.client->read_all(kMaxWorkerErrorBody, worker_timeout_);
    if (head->status == 503) {  // overloaded or draining: another may take it
      last_failure_ = "decode worker " + d.url.to_string() + " answered 503";
      return Next::kRetry;
    }
    // The request's own fault (4xx) or the worker's: relayed as is.
    relay_error(head->status, text, "the decode worker failed");
    end_ = head->status < 500 ? End::kOk : End::kFailed;
    return Next::kDone;
  }
  events.emplace(*d.client, worker_timeout_);
  auto mode_event = events->next();
  if (!mode_event.ok() || !*mode_event || (*mode_event)->event != kControlEvent) {
    last_failure_ = "decode worker " + d.url.to_string() + ": no registration event";
    router_.mark_down(true, d.index, last_failure_);
    return Next::kRetry;
  }
  mode = std::move(**mode_event);
  return Next::kGoOn;
}

RequestFlow::Next RequestFlow::prefill(WorkerCall& p, const WorkerCall& d, Headers headers, int kv_port) {
  const std::optional<size_t> p_index = router_.acquire_prefill(tried_prefill_);
  if (!p_index) {
    fail(503, "no prefill worker is reachable; retry later", "no_prefill_worker");
    return Next::kDone;
  }
  p.index = *p_index;
  p.url = router_.worker_url(false, p.index);
  headers.emplace_back(server::kHeaderKvAddress,
                       disagg::KvDestination{d.url.host, static_cast<uint16_t>(kv_port)}.to_string());
  const Result<HttpClientResponseHead> head = open(p, "/internal/v1/prefill/", headers);
  if (!head.ok() || head->status == 503) {
    last_failure_ = "prefill worker " + p.url.to_string() + ": " + (head.ok() ? std::string("503") : head.status().message());
    if (!head.ok()) router_.mark_down(false, p.index, head.status().message());
    tried_prefill_.push_back(p.index);
    tried_decode_.pop_back();  // the decode worker was fine
    return Next::kRetry;
  }
  if (head->status != 200) {
    relay_error(head->status, p.client->read_all(kMaxWorkerErrorBody, worker_timeout_), "the prefill worker failed");
    end_ = End::kFailed;
    return Next::kDone;
  }
  {
    std::lock_guard lock(router_.metrics.mu);
    ++router_.metrics.disagg;
  }
  // 3. The prefill worker's part: opening chunks and the first token, then the handoff.
  EventReader events(*p.client, worker_timeout_);
  std::string failure;
  const PrefillEnd end = relay_prefill(events, failure);
  if (sink_->client_gone()) return Next::kDone;  // closing both workers' connections cancels their work
  switch (end) {
    case PrefillEnd::kHandoff:
      return Next::kGoOn;
    case PrefillEnd::kDone: {
      {
        std::lock_guard lock(router_.metrics.mu);
        ++router_.metrics.first_token_only;
      }
      sink_->done();
      end_ = End::kOk;
      return Next::kDone;
    }
    case PrefillEnd::kRetry:
      last_failure_ = failure;
      TACHYON_LOG_WARN("router: handoff via {} -> {} failed before the client saw anything: {}", p.url.to_string(),
                       d.url.to_string(), failure);
      return Next::kRetry;  // the next attempt excludes this decode worker
    case PrefillEnd::kFailed:
      break;
  }
  fail(502, failure.empty() ? "the prefill worker failed" : failure, "handoff_failed");
  return Next::kDone;
}

RequestFlow::PrefillEnd RequestFlow::relay_prefill(EventReader& events, std::string& failure) {
  for (;;) {
    auto e = events.next();
    if (!e.ok() || !*e) {
      failure = "the prefill worker failed: " + (e.ok() ? std::string("its stream ended early") : e.status().message());
      return sink_->committed() ? PrefillEnd::kFailed : PrefillEnd::kRetry;
    }
    if ((*e)->event == kControlEvent) {
      if (control_json(**e).value("handoff", "") == "ok") return PrefillEnd::kHandoff;
      continue;
    }
    if ((*e)->data == "[DONE]") return PrefillEnd::kDone;  // the first token ended the request: nothing was shipped
    const ojson parsed = ojson::parse((*e)->data, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.contains("error")) {
      const ojson& err = parsed["error"];
      failure = err.is_object() && err.contains("message") && err["message"].is_string()
                    ? err["message"].get<std::string>()
                    : (*e)->data;
      return sink_->committed() ? PrefillEnd::kFailed : PrefillEnd::kRetry;
    }
    forward(**e);
    if (sink_->client_gone()) return PrefillEnd::kFailed;
  }
}

void RequestFlow::relay_decode(EventReader& events, size_t worker) {
  for (;;) {
    auto e = events.next();
    if (!e.ok() || !*e) {
      const std::string why = e.ok() ? std::string("its stream ended early") : e.status().message();
      router_.mark_down(true, worker, why);
      fail(502, "the decode worker failed mid-stream: " + why, "decode_worker_failed");
      return;
    }
    if ((*e)->event == kControlEvent) continue;
    if ((*e)->data == "[DONE]") {
      sink_->done();
      end_ = saw_error_ ? End::kFailed : End::kOk;
      return;
    }
    forward(**e);
    if (sink_->client_gone()) return;
  }
}

Result<HttpClientResponseHead> RequestFlow::open(WorkerCall& w, const std::string& prefix, const Headers& headers) {
  auto client = HttpClient::connect(w.url, connect_timeout_);
  if (!client.ok()) return client.status();
  w.client = std::move(*client);
  TACHYON_RETURN_IF_ERROR(w.client->send("POST", prefix + route_, headers, internal_, worker_timeout_));
  return w.client->read_head(worker_timeout_);
}

void RequestFlow::relay_error(int status, const Result<std::string>& text, const char* fallback) {
  router_.reply(conn_, status, text.ok() ? *text : error_json_body(fallback, "server_error", ""), keep_alive_);
  sink_.reset();  // the reply counted its status
}

void RequestFlow::forward(const SseEvent& e) {
  const ojson parsed = ojson::parse(e.data, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object() && parsed.contains("error")) saw_error_ = true;
  if (!first_token_seen_ && has_content(parsed)) {
    first_token_seen_ = true;
    std::lock_guard lock(router_.metrics.mu);
    router_.metrics.ttft.observe(std::chrono::duration<double>(Clock::now() - arrival_).count());
  }
  sink_->event(e.data, parsed);
}

void RequestFlow::fail(int status, const std::string& message, const std::string& code) {
  // Refused before anything was tried (503: no worker, rate matching), or failed. A rejection is
  // counted before the 503 goes out, so that a client reading /metrics after it sees it.
  end_ = status == 503 && last_failure_.empty() ? End::kRejected : End::kFailed;
  if (end_ == End::kRejected) {
    std::lock_guard lock(router_.metrics.mu);
    ++router_.metrics.rejected;
  }
  sink_->fail(status, message, code);
}

void RequestFlow::finish() {
  {
    std::lock_guard lock(router_.mu);
    --router_.in_flight;
  }
  router_.cv.notify_all();
  RouterMetrics& m = router_.metrics;
  std::lock_guard lock(m.mu);
  if (sink_ && sink_->status() != 0) ++m.http_responses[sink_->status()];
  if (end_ == End::kFailed || (sink_ && sink_->client_gone())) ++m.failed;
  if (end_ == End::kOk) m.e2e.observe(std::chrono::duration<double>(Clock::now() - arrival_).count());
}

}  // namespace

void Router::Impl::generate(ClientConnection& conn, server::Endpoint endpoint, const std::string& body,
                            bool keep_alive) {
  RequestFlow flow(*this, conn, endpoint, keep_alive);
  if (flow.prepare(body)) flow.run();
}

net::HttpUrl Router::Impl::worker_url(bool is_decode, size_t index) {
  std::lock_guard lock(mu);
  return (is_decode ? decode : prefill)[index].url;
}

}  // namespace tachyon::router
