// The internal HTTP protocol between `tachyon router` and disaggregated workers (`tachyon serve
// --role prefill|decode`), version 1, and the small parsers both sides share. Nothing here does
// I/O; every parser takes untrusted bytes and returns a Status, never throws or aborts.
//
// Endpoints (on the workers' HTTP port, beside the OpenAI ones):
//   GET  /internal/v1/load
//        Every role. 200 {"version":1, "role":"prefill|decode|both", "kv_blocks_total", "kv_blocks_free",
//        "num_running", "num_waiting", "pending_adoptions", "transfers_in_flight", "kv_port"}
//        (kv_port 0 when the worker takes no transfers). The router polls it.
//   POST /internal/v1/decode/completions, /internal/v1/decode/chat/completions   (decode role)
//        Body: the client's OpenAI request (the router sets "stream": true and include_usage).
//        Headers: X-Tachyon-Transfer-Id (decimal u64, not 0), X-Tachyon-Min-Prompt-Tokens (decimal,
//        optional, default 0), X-Tachyon-Response-Id and X-Tachyon-Created (the id and creation time
//        every chunk carries, so that both workers' chunks read as one response).
//        The worker parses and checks the request like /v1/*: a bad one gets its 4xx here, before any
//        prefill ran. Then a server-sent-event stream whose first event is a control event
//          event: tachyon
//          data: {"mode":"disagg","kv_port":P,"prompt_tokens":N}
//        meaning the transfer id is registered: the worker waits (bounded) for that transfer on its
//        KV port P, adopts it and streams OpenAI chunks for the tokens after the first one, then the
//        usage chunk and "data: [DONE]". Or {"mode":"colocated",...}: the request is short (fewer
//        prompt tokens than the minimum) or has several choices, and this worker runs it whole,
//        streaming every chunk itself. Closing the connection cancels the request (and the
//        registration) at once.
//   POST /internal/v1/prefill/completions, /internal/v1/prefill/chat/completions  (prefill role)
//        Body and id headers as above, plus X-Tachyon-Kv-Address: the decode worker's "host:port".
//        The worker runs the prompt (one choice only) and streams the opening chunks and the first
//        token's chunk. If that token ends the request (a stop, max_tokens = 1) the stream goes on
//        as a whole response (finish chunk, usage, [DONE]) and nothing is transferred. Otherwise the
//        KV is shipped to the decode worker under the transfer id and, once the decode worker
//        acked the adoption, the stream ends with the control event
//          event: tachyon
//          data: {"handoff":"ok"}
//        A failed transfer ends it with an {"error": ...} chunk and [DONE] instead.
//
// Errors in the workers' streams are OpenAI error chunks ({"error": {...}}) followed by [DONE].
// Timeouts: every wait on either side is bounded (the router's per-read worker timeout, the decode
// worker's wait for a registered transfer, the KV transport's timeouts).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "disagg/kv_sender.h"
#include "net/http_url.h"

namespace tachyon::server {

inline constexpr int kInternalProtocolVersion = 1;
inline constexpr std::string_view kInternalPrefix = "/internal/v1/";
inline constexpr const char* kHeaderTransferId = "X-Tachyon-Transfer-Id";
inline constexpr const char* kHeaderMinPromptTokens = "X-Tachyon-Min-Prompt-Tokens";
inline constexpr const char* kHeaderResponseId = "X-Tachyon-Response-Id";
inline constexpr const char* kHeaderCreated = "X-Tachyon-Created";
inline constexpr const char* kHeaderKvAddress = "X-Tachyon-Kv-Address";
inline constexpr std::string_view kControlEvent = "tachyon";

enum class WorkerRole { kBoth, kPrefill, kDecode };
const char* role_name(WorkerRole role);
Result<WorkerRole> parse_role(std::string_view text);

// "18446744073709551615": a decimal u64, not 0, no sign, no spaces.
Result<uint64_t> parse_transfer_id(std::string_view text);
// A decimal count in [0, max].
Result<int64_t> parse_count(std::string_view text, int64_t max);
// net::parse_host_port's address as a KV destination.
Result<disagg::KvDestination> parse_host_port(std::string_view text);
// A response id as the OpenAI API writes them: 1..64 of [A-Za-z0-9_-].
Status check_response_id(std::string_view text);

// GET /internal/v1/load.
struct WorkerLoadReport {
  WorkerRole role = WorkerRole::kBoth;
  int kv_blocks_total = 0;
  int kv_blocks_free = 0;
  int num_running = 0;
  int num_waiting = 0;
  int pending_adoptions = 0;    // decode: transfers received, waiting for room in the engine
  int transfers_in_flight = 0;  // prefill: exports being shipped
  int kv_port = 0;
};
std::string load_json(const WorkerLoadReport& load);
Result<WorkerLoadReport> parse_load_json(std::string_view body);

// Server-sent events, incrementally: feed() bytes as they arrive, next() each complete event.
// Lines end with "\n" (a "\r" before it is dropped); "event:" and "data:" fields (one data line
// per event, as our workers write them); comments and other fields are ignored. An event (or a
// line) longer than the limit is an error, raised before it grows further.
struct SseEvent {
  std::string event;  // empty: the default "message"
  std::string data;
};
class SseParser {
 public:
  explicit SseParser(size_t max_event_bytes = size_t{4} << 20) : max_event_bytes_(max_event_bytes) {}
  Status feed(std::string_view bytes);
  std::optional<SseEvent> next();

 private:
  size_t max_event_bytes_;
  std::string buffer_;   // bytes not yet split into lines
  SseEvent current_;
  bool has_field_ = false;
  std::vector<SseEvent> ready_;
  size_t ready_at_ = 0;
};

}  // namespace tachyon::server
