// A load generator for an OpenAI-compatible server: many streaming /v1/completions requests at once
// from a few threads, each thread one Asio event loop over its share of keep-alive connections, so
// that the client's own cost per streamed token is a few microseconds (what `tachyon bench --url`
// drives; a scripted client parsing every event in one interpreter bounds the rate it can see).
//
// Each request sends its prompt as token ids with "stream": true, "logprobs": 0 (every event then
// lists the tokens it carries, so each token gets an arrival time) and "ignore_eos": true (it
// generates exactly max_tokens), plus stream_options.include_usage for the server's own counts.
// Arrival times are the monotonic clock when a read completes, before its bytes are parsed. Against
// `tachyon serve --stream-timestamps` (same host), every token's delivery latency — from the engine
// loop handing it to the server until the client has read it — is measured directly.
//
// Responses are parsed by hand (HTTP/1.1 status line, Content-Length or chunked body, SSE events);
// a non-200 answer, an error event, a stream that ends without [DONE], a refused connection or a
// request over its timeout fails that request alone (its `error` says why), and the run goes on.
// Asio stays in stream_load.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "net/http_url.h"

namespace tachyon::loadgen {

struct StreamLoadRequest {
  double arrival = 0.0;  // seconds after the start of the run
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  uint64_t seed = 0;
};

struct StreamLoadOptions {
  net::HttpUrl url;
  std::string model;               // the "model" field of every request
  int concurrency = 0;             // requests in flight at most over all threads; 0 = all
  int threads = 1;                 // event loops; requests are dealt to them round-robin
  double request_timeout_s = 600;  // a request still unfinished this long after it was sent fails
  // Sampling of every request (request i samples with its own seed).
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
};

struct StreamLoadResult {
  bool ok = false;
  std::string error;                // why it failed, when !ok
  double sent = 0.0;                // seconds after the start, when the request was written
  double first_token = 0.0;         // arrival of the first token
  double finished = 0.0;            // arrival of [DONE]
  std::vector<double> token_times;  // arrival of each token (one entry per token an event carried)
  std::vector<double> delivery;     // per token, arrival minus the server's hand-over stamp, when sent
  int64_t prompt_tokens = 0;        // from the final usage chunk (0 when the server sent none)
  int64_t completion_tokens = 0;
};

// The body of one streaming request (exposed for tests).
std::string stream_load_body(const StreamLoadOptions& options, const StreamLoadRequest& request);

// Incremental parser of one HTTP/1.1 response carrying an SSE stream (exposed for tests): feed it
// bytes as they arrive with the time they arrived; it fills `result`.
// Times are seconds after the run's start; `start_clock` is that start on the steady clock
// (seconds since its epoch), against which the server's hand-over stamps are read.
class SseResponseParser {
 public:
  SseResponseParser(StreamLoadResult& result, double start_clock) : result_(result), start_clock_(start_clock) {}
  // False once the response is complete or broken; done() tells which.
  bool feed(std::string_view bytes, double arrival);
  // The connection closed: completes a body that runs until the close, fails any other.
  void end_of_stream(double arrival);
  bool done() const { return phase_ == Phase::kDone; }
  bool failed() const { return phase_ == Phase::kFailed; }
  // The server will close the connection after this response (Connection: close or HTTP/1.0).
  bool closes() const { return closes_; }

 private:
  enum class Phase { kHead, kChunkSize, kChunkData, kChunkEnd, kTrailer, kLength, kUntilClose, kDone, kFailed };
  bool fail(std::string why);
  bool head(std::string_view text);
  void body(std::string_view data, double arrival);
  void event(std::string_view data, double arrival);
  void finish(double arrival);

  StreamLoadResult& result_;
  double start_clock_ = 0.0;
  Phase phase_ = Phase::kHead;
  std::string in_;      // bytes not consumed yet
  std::string events_;  // body bytes not yet split into events
  std::string error_body_;
  int status_ = 0;
  bool closes_ = false;
  bool saw_done_ = false;
  uint64_t left_ = 0;  // of the current chunk or of a Content-Length body
};

// Runs the requests (sorted by arrival) and returns one result per request, in their order; a
// request that failed says why in its result. Only invalid options fail the call.
Result<std::vector<StreamLoadResult>> run_stream_load(const StreamLoadOptions& options,
                                                      const std::vector<StreamLoadRequest>& requests);

}  // namespace tachyon::loadgen
