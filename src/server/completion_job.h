// One HTTP completion request in flight: its engine requests (one per choice: prompts x n, prompt
// first) and the OpenAI response objects built from their outputs, as server-sent events for a
// streaming request or one JSON body otherwise. Knows nothing of sockets: the connection calls
// poll() when its streams notify, and writes what comes back.
//
// Response objects follow OpenAI's: ids "cmpl-..." / "chatcmpl-...", `object`, `created`, `model`,
// choices[i] with index, text | message | delta, logprobs, finish_reason ("stop"; "length" for
// max_tokens and for the context limit), and usage (prompt tokens of each prompt once, completion
// tokens of every choice). A stream sends the role (chat) or the echoed prompt (completions) first,
// one event per engine output while the client keeps up (several outputs in one write when it does
// not), a last event per choice with its finish_reason, the usage event when
// stream_options.include_usage, then "data: [DONE]". Chat with tools (server/tool_calls.h): the
// output's calls go into message.tool_calls (content null when nothing else was said), or, streamed,
// into delta.tool_calls as each call completes, and finish_reason is "tool_calls"; legacy
// `functions` requests get message.function_call and "function_call". vLLM's prompt_logprobs
// (plain responses only): a list with one entry per prompt token, null for the first and else
// {"<token id>": {"logprob", "rank", "decoded_token"}} for the prompt token and the N most likely
// there; in each completion choice, and at the top of a chat response.
//
// A choice that fails (engine error, timeout) ends the whole request with an error: the error
// body for a plain request, an {"error": ...} event then [DONE] for a stream.
//
// Disaggregated workers write one part of a streamed response each (server/disagg_protocol.h):
// the prefill worker the opening chunks and the first token's (then a control event once the KV
// was handed off), the decode worker the rest (no opening chunks; its usage counts the first
// token too, since the adopted request's generated tokens include it). Both use the id and
// creation time the router gave them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "server/openai_api.h"
#include "engine/request_text.h"

namespace tachyon::server {

enum class JobPart {
  kWhole,            // an ordinary request
  kFirstToken,       // prefill worker: opening chunks and the first token; a streaming, one-choice request
  kAfterFirstToken,  // decode worker: the chunks after the first token
};

struct JobOptions {
  JobPart part = JobPart::kWhole;
  std::string id;     // empty: a fresh "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // 0: now
};

class CompletionJob {
 public:
  CompletionJob(const ServingContext& context, ApiRequest request, JobOptions options = {});

  // The engine requests, one per choice; the caller sets their notify and submits them.
  const std::vector<std::shared_ptr<RequestStream>>& streams() const { return streams_; }
  bool streaming() const { return request_.stream; }

  // Takes what the streams delivered. Streaming: the bytes to send now (possibly empty; the last
  // piece ends with "data: [DONE]\n\n"). Not streaming: empty.
  std::string poll();
  // Every choice finished (or the request failed); for a stream, [DONE] was returned.
  bool done() const { return done_; }
  // A choice failed: the caller aborts the others.
  bool failed() const { return error_.has_value(); }
  // Not streaming, once done(): the HTTP status and JSON body.
  int status() const;
  std::string body() const;

 private:
  struct Choice {
    size_t prompt = 0;                  // index into request_.prompts
    std::string text;                   // everything so far (plain requests)
    std::vector<TokenLogprob> logprobs; // everything so far (plain requests)
    std::vector<PromptLogprob> prompt_logprobs;  // a prompt's first choice, when asked
    int num_generated = 0;
    size_t text_offset = 0;             // code points of text returned so far (completions logprobs)
    bool finished = false;
    FinishReason reason = FinishReason::kLength;
    // The text of the choice's tokens, made here (on the connection's thread) by the engine's
    // rules when the engine does not make it (requests without stop strings); null otherwise.
    std::shared_ptr<RequestText> own_text;  // shared: body() works on copies of choices
    // Chat with tools: the calls' ids come from this seed; a stream's parser of its text.
    uint64_t tool_id_seed = 0;
    std::shared_ptr<ToolCallStreamParser> tool_parser;
  };

  void on_output(size_t index, RequestOutput& output, std::string& events);
  // A streamed chat choice's events for one output: its content, tool calls and end.
  void stream_chat(size_t index, Choice& c, const RequestOutput& o, const std::string& logprobs,
                   const std::string& stamp, std::string& events);
  // The finish_reason of a choice that made `num_calls` tool calls.
  const char* finish_reason_of(FinishReason reason, size_t num_calls) const;
  void fail(ApiError error, std::string& events);
  // {"id":...,"object":...,"created":...,"model":..., of every event but the final usage chunk.
  const std::string& chunk_header() const;
  nlohmann::ordered_json logprobs_json(Choice& choice, const std::vector<TokenLogprob>& logprobs) const;
  nlohmann::ordered_json usage_json() const;
  // The prompt_logprobs of prompt `p` (from its first choice).
  nlohmann::ordered_json prompt_logprobs_json(size_t p) const;

  const ServingContext& context_;
  ApiRequest request_;
  JobPart part_ = JobPart::kWhole;
  std::vector<bool> primed_;  // kAfterFirstToken: the choice's text offset counts the imported tokens
  std::string id_;
  int64_t created_ = 0;
  std::string chunk_header_;        // with "usage":null, under include_usage
  std::string usage_chunk_header_;  // without: the final usage chunk's
  std::vector<Choice> choices_;
  std::vector<std::shared_ptr<RequestStream>> streams_;
  size_t num_finished_ = 0;
  bool started_ = false;
  bool done_ = false;
  std::optional<ApiError> error_;
};

}  // namespace tachyon::server
