#include "loadgen/stream_load.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tachyon::loadgen {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxHead = 64 * 1024;
constexpr size_t kMaxErrorBody = 4096;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

double seconds_since_epoch(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

}  // namespace

std::string stream_load_body(const StreamLoadOptions& options, const StreamLoadRequest& request) {
  nlohmann::json j;
  j["model"] = options.model;
  j["prompt"] = request.prompt;
  j["max_tokens"] = request.max_tokens;
  j["temperature"] = options.temperature;
  if (options.top_p != 1.0f) j["top_p"] = options.top_p;
  if (options.top_k > 0) j["top_k"] = options.top_k;
  if (options.min_p > 0.0f) j["min_p"] = options.min_p;
  if (options.repetition_penalty != 1.0f) j["repetition_penalty"] = options.repetition_penalty;
  j["seed"] = request.seed;
  j["ignore_eos"] = true;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  j["logprobs"] = 0;
  return j.dump();
}

// ---- SseResponseParser -----------------------------------------------------------------------

bool SseResponseParser::fail(std::string why) {
  phase_ = Phase::kFailed;
  result_.ok = false;
  if (result_.error.empty()) result_.error = std::move(why);
  return false;
}

bool SseResponseParser::head(std::string_view text) {
  // Status line: HTTP/1.x NNN reason
  const size_t eol = text.find("\r\n");
  const std::string_view status_line = text.substr(0, eol);
  if (status_line.size() < 12 || status_line.substr(0, 7) != "HTTP/1.") return fail("not an HTTP/1.x response");
  if (status_line[7] == '0') closes_ = true;
  const auto [ptr, ec] = std::from_chars(status_line.data() + 9, status_line.data() + 12, status_);
  if (ec != std::errc() || ptr != status_line.data() + 12) return fail("malformed HTTP status line");
  bool chunked = false;
  std::optional<uint64_t> length;
  size_t at = eol == std::string_view::npos ? text.size() : eol + 2;
  while (at < text.size()) {
    size_t end = text.find("\r\n", at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(at, end - at);
    at = end + 2;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = trim(line.substr(0, colon));
    const std::string_view value = trim(line.substr(colon + 1));
    if (iequals(name, "transfer-encoding")) {
      chunked = value.size() >= 7 && iequals(value.substr(value.size() - 7), "chunked");
    } else if (iequals(name, "content-length")) {
      uint64_t n = 0;
      const auto r = std::from_chars(value.data(), value.data() + value.size(), n);
      if (r.ec != std::errc() || r.ptr != value.data() + value.size()) return fail("malformed Content-Length");
      length = n;
    } else if (iequals(name, "connection")) {
      if (iequals(value, "close")) closes_ = true;
      if (iequals(value, "keep-alive")) closes_ = false;
    }
  }
  if (chunked) {
    phase_ = Phase::kChunkSize;
  } else if (length) {
    phase_ = Phase::kLength;
    left_ = *length;
  } else {
    phase_ = Phase::kUntilClose;
    closes_ = true;
  }
  return true;
}

void SseResponseParser::event(std::string_view data, double arrival) {
  size_t at = 0;
  while (at < data.size()) {
    size_t end = data.find('\n', at);
    if (end == std::string_view::npos) end = data.size();
    std::string_view line = data.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) != "data:") continue;  // comments, event names, ids
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (line == "[DONE]") {
      saw_done_ = true;
      result_.finished = arrival;
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      fail(fmt::format("an event is not JSON: {:.200}", line));
      return;
    }
    if (const auto e = j.find("error"); e != j.end()) {
      const std::string message = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                                      ? (*e)["message"].get<std::string>()
                                      : e->dump();
      fail("error event: " + message);
      return;
    }
    if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
      result_.prompt_tokens = u->value("prompt_tokens", int64_t{0});
      result_.completion_tokens = u->value("completion_tokens", int64_t{0});
    }
    size_t tokens = 0;
    if (const auto choices = j.find("choices"); choices != j.end() && choices->is_array()) {
      for (const auto& c : *choices) {
        const auto lp = c.find("logprobs");
        if (lp != c.end() && lp->is_object() && lp->contains("tokens") && (*lp)["tokens"].is_array()) {
          tokens += (*lp)["tokens"].size();
        } else if (const auto text = c.find("text");
                   text != c.end() && text->is_string() && !text->get_ref<const std::string&>().empty()) {
          tokens += 1;  // a server that sends no logprobs: count the event
        }
      }
    }
    if (tokens == 0) continue;
    if (result_.token_times.empty()) result_.first_token = arrival;
    result_.token_times.insert(result_.token_times.end(), tokens, arrival);
    if (const auto stamp = j.find("tachyon_handed_over"); stamp != j.end() && stamp->is_number()) {
      result_.delivery.insert(result_.delivery.end(), tokens, start_clock_ + arrival - stamp->get<double>());
    }
  }
}

void SseResponseParser::body(std::string_view data, double arrival) {
  if (status_ != 200) {
    error_body_.append(data.substr(0, kMaxErrorBody - std::min(kMaxErrorBody, error_body_.size())));
    return;
  }
  events_.append(data);
  size_t at = 0;
  for (;;) {
    const size_t end = events_.find("\n\n", at);
    if (end == std::string::npos) break;
    event(std::string_view(events_).substr(at, end - at), arrival);
    if (phase_ == Phase::kFailed) return;
    at = end + 2;
  }
  events_.erase(0, at);
}

void SseResponseParser::finish(double arrival) {
  if (status_ != 200) {
    fail(fmt::format("HTTP {}: {}", status_, trim(error_body_)));
    return;
  }
  if (!trim(events_).empty()) event(events_, arrival);  // a last event without its blank line
  if (phase_ == Phase::kFailed) return;
  if (!saw_done_) {
    fail("the stream ended without data: [DONE]");
    return;
  }
  phase_ = Phase::kDone;
  result_.ok = true;
}

bool SseResponseParser::feed(std::string_view bytes, double arrival) {
  if (phase_ == Phase::kDone || phase_ == Phase::kFailed) return false;
  in_.append(bytes);
  size_t at = 0;
  const auto more = [&] {  // keep what is not consumed, ask for more bytes
    in_.erase(0, at);
    return true;
  };
  for (;;) {
    const std::string_view rest = std::string_view(in_).substr(at);
    switch (phase_) {
      case Phase::kHead: {
        const size_t end = rest.find("\r\n\r\n");
        if (end == std::string_view::npos) {
          if (rest.size() > kMaxHead) return fail("response head over 64 KiB");
          return more();
        }
        if (!head(rest.substr(0, end + 2))) return false;
        at += end + 4;
        break;
      }
      case Phase::kChunkSize: {
        const size_t end = rest.find("\r\n");
        if (end == std::string_view::npos) {
          if (rest.size() > 1024) return fail("malformed chunk size line");
          return more();
        }
        std::string_view digits = rest.substr(0, std::min(end, rest.find(';')));
        digits = trim(digits);
        uint64_t n = 0;
        const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), n, 16);
        if (digits.empty() || r.ec != std::errc() || r.ptr != digits.data() + digits.size()) {
          return fail("malformed chunk size");
        }
        at += end + 2;
        left_ = n;
        phase_ = n == 0 ? Phase::kTrailer : Phase::kChunkData;
        break;
      }
      case Phase::kChunkData:
      case Phase::kLength:
      case Phase::kUntilClose: {
        const size_t n = phase_ == Phase::kUntilClose ? rest.size() : static_cast<size_t>(std::min<uint64_t>(left_, rest.size()));
        if (n > 0) body(rest.substr(0, n), arrival);
        if (phase_ == Phase::kFailed) return false;
        at += n;
        if (phase_ == Phase::kUntilClose) return more();
        left_ -= n;
        if (left_ > 0) return more();
        if (phase_ == Phase::kLength) {
          finish(arrival);
          return false;
        }
        phase_ = Phase::kChunkEnd;
        break;
      }
      case Phase::kChunkEnd:
        if (rest.size() < 2) return more();
        if (rest.substr(0, 2) != "\r\n") return fail("chunk not followed by CRLF");
        at += 2;
        phase_ = Phase::kChunkSize;
        break;
      case Phase::kTrailer: {
        const size_t end = rest.find("\r\n");
        if (end == std::string_view::npos) return more();
        at += end + 2;
        if (end == 0) {
          finish(arrival);
          return false;
        }
        break;
      }
      case Phase::kDone:
      case Phase::kFailed:
        return false;
    }
  }
}

void SseResponseParser::end_of_stream(double arrival) {
  if (phase_ == Phase::kUntilClose) {
    finish(arrival);
  } else if (phase_ != Phase::kDone && phase_ != Phase::kFailed) {
    fail(phase_ == Phase::kHead && in_.empty() ? "the server closed the connection before answering"
                                               : "the server closed the connection mid-response");
  }
}

// ---- the event loops -------------------------------------------------------------------------

namespace {

struct Shared {
  const StreamLoadOptions& options;
  const std::vector<StreamLoadRequest>& requests;
  std::vector<StreamLoadResult>& results;
  Clock::time_point start;
  double start_clock = 0.0;
  tcp::endpoint endpoint;

  double now() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
};

class Loop;

// One keep-alive connection; carries one request at a time.
class Connection {
 public:
  Connection(Loop& loop, asio::io_context& io) : loop_(loop), socket_(io), deadline_(io) {}
  void start(size_t index);

 private:
  void connect();
  void write();
  void read();
  void done(bool reuse);
  void failed(const std::string& why);

  Loop& loop_;
  tcp::socket socket_;
  asio::steady_timer deadline_;
  bool connected_ = false;
  bool reused_ = false;  // this request went out on a connection an earlier one used
  bool retried_ = false;
  bool received_ = false;
  bool timed_out_ = false;
  size_t index_ = 0;
  std::string out_;
  std::optional<SseResponseParser> parser_;
  std::array<char, 16384> buf_{};
};

class Loop {
 public:
  Loop(Shared& shared, std::vector<size_t> mine, int limit) : shared_(shared), mine_(std::move(mine)), limit_(limit) {}

  void run() {
    timer_.emplace(io_);
    launch();
    io_.run();
  }
  Shared& shared() { return shared_; }
  asio::io_context& io() { return io_; }

  // A connection finished its request and is free for the next.
  void release(Connection* c) {
    idle_.push_back(c);
    --in_flight_;
    launch();
  }

 private:
  void launch() {
    while (next_ < mine_.size() && in_flight_ < limit_) {
      const double wait = shared_.requests[mine_[next_]].arrival - shared_.now();
      if (wait > 0) {
        if (!timer_armed_) {
          timer_armed_ = true;
          timer_->expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait)));
          timer_->async_wait([this](const error_code&) {
            timer_armed_ = false;
            launch();
          });
        }
        return;
      }
      Connection* c;
      if (!idle_.empty()) {
        c = idle_.back();
        idle_.pop_back();
      } else {
        connections_.push_back(std::make_unique<Connection>(*this, io_));
        c = connections_.back().get();
      }
      ++in_flight_;
      c->start(mine_[next_++]);
    }
  }

  Shared& shared_;
  std::vector<size_t> mine_;
  int limit_;
  size_t next_ = 0;
  int in_flight_ = 0;
  asio::io_context io_{1};
  std::optional<asio::steady_timer> timer_;
  bool timer_armed_ = false;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<Connection*> idle_;
};

void Connection::start(size_t index) {
  index_ = index;
  reused_ = connected_;
  retried_ = false;
  received_ = false;
  timed_out_ = false;
  Shared& s = loop_.shared();
  const StreamLoadRequest& r = s.requests[index];
  const std::string body = stream_load_body(s.options, r);
  out_ = fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nAccept: "
      "text/event-stream\r\nContent-Length: {}\r\n\r\n",
      s.options.url.host, s.options.url.port, body.size());
  out_ += body;
  StreamLoadResult& result = s.results[index];
  result = StreamLoadResult{};
  parser_.emplace(result, s.start_clock);
  deadline_.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.options.request_timeout_s)));
  deadline_.async_wait([this](const error_code& ec) {
    if (ec) return;  // cancelled: the request ended in time
    timed_out_ = true;
    error_code ignored;
    socket_.close(ignored);
  });
  if (connected_) {
    write();
  } else {
    connect();
  }
}

void Connection::connect() {
  socket_.async_connect(loop_.shared().endpoint, [this](const error_code& ec) {
    if (ec) return failed(timed_out_ ? "timed out" : "connect: " + ec.message());
    connected_ = true;
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    write();
  });
}

void Connection::write() {
  loop_.shared().results[index_].sent = loop_.shared().now();
  asio::async_write(socket_, asio::buffer(out_), [this](const error_code& ec, size_t) {
    if (ec) return failed(timed_out_ ? "timed out" : "write: " + ec.message());
    read();
  });
}

void Connection::read() {
  socket_.async_read_some(asio::buffer(buf_), [this](const error_code& ec, size_t n) {
    const double arrival = loop_.shared().now();
    if (ec == asio::error::eof) {
      parser_->end_of_stream(arrival);
      connected_ = false;
      error_code ignored;
      socket_.close(ignored);
      if (parser_->done()) return done(false);
      return failed(loop_.shared().results[index_].error);
    }
    if (ec) return failed(timed_out_ ? "timed out" : "read: " + ec.message());
    received_ = true;
    if (parser_->feed(std::string_view(buf_.data(), n), arrival)) return read();
    if (parser_->done()) return done(!parser_->closes());
    return failed(loop_.shared().results[index_].error);
  });
}

void Connection::done(bool reuse) {
  deadline_.cancel();
  if (!reuse) {
    error_code ignored;
    socket_.close(ignored);
    connected_ = false;
  }
  loop_.release(this);
}

void Connection::failed(const std::string& why) {
  error_code ignored;
  socket_.close(ignored);
  connected_ = false;
  // A keep-alive connection the server closed while idle fails before any byte comes back: send the
  // request again, once, on a fresh connection.
  if (reused_ && !retried_ && !received_ && !timed_out_) {
    retried_ = true;
    reused_ = false;
    StreamLoadResult& result = loop_.shared().results[index_];
    result = StreamLoadResult{};
    parser_.emplace(result, loop_.shared().start_clock);
    return connect();
  }
  deadline_.cancel();
  StreamLoadResult& result = loop_.shared().results[index_];
  result.ok = false;
  if (result.error.empty() || timed_out_) {
    result.error = timed_out_ ? fmt::format("timed out after {} s", loop_.shared().options.request_timeout_s) : why;
  }
  if (result.error.empty()) result.error = "failed";
  loop_.release(this);
}

}  // namespace

Result<std::vector<StreamLoadResult>> run_stream_load(const StreamLoadOptions& options,
                                                      const std::vector<StreamLoadRequest>& requests) {
  if (options.threads < 1 || options.concurrency < 0 || !(options.request_timeout_s > 0)) {
    return make_error(ErrorCode::kInvalidArgument, "stream load: threads {} must be positive, concurrency {} not "
                      "negative, timeout {} s positive", options.threads, options.concurrency, options.request_timeout_s);
  }
  for (size_t i = 1; i < requests.size(); ++i) {
    if (requests[i].arrival < requests[i - 1].arrival) {
      return make_error(ErrorCode::kInvalidArgument, "stream load: requests must be sorted by arrival");
    }
  }
  error_code ec;
  asio::io_context resolver_io;
  tcp::resolver resolver(resolver_io);
  const auto endpoints = resolver.resolve(options.url.host, std::to_string(options.url.port), ec);
  if (ec || endpoints.empty()) {
    return make_error(ErrorCode::kIo, "stream load: cannot resolve {}: {}", options.url.to_string(), ec.message());
  }
  std::vector<StreamLoadResult> results(requests.size());
  const size_t total = requests.size();
  const int threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(options.threads), std::max<size_t>(total, 1)));
  const size_t concurrency = options.concurrency > 0 ? static_cast<size_t>(options.concurrency) : std::max<size_t>(total, 1);
  Shared shared{options, requests, results, Clock::now(), 0.0, *endpoints.begin()};
  std::vector<std::unique_ptr<Loop>> loops;
  for (int t = 0; t < threads; ++t) {
    std::vector<size_t> mine;
    for (size_t i = static_cast<size_t>(t); i < total; i += static_cast<size_t>(threads)) mine.push_back(i);
    // The in-flight limit is dealt like the requests: thread t gets every threads-th slot.
    const size_t limit = concurrency / static_cast<size_t>(threads) +
                         (static_cast<size_t>(t) < concurrency % static_cast<size_t>(threads) ? 1 : 0);
    loops.push_back(std::make_unique<Loop>(shared, std::move(mine), static_cast<int>(std::max<size_t>(limit, 1))));
  }
  shared.start = Clock::now();
  shared.start_clock = seconds_since_epoch(shared.start);
  std::vector<std::thread> workers;
  for (auto& loop : loops) workers.emplace_back([&loop] { loop->run(); });
  for (auto& w : workers) w.join();
  return results;
}

}  // namespace tachyon::loadgen
