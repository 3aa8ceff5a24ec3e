#include "server/completion_job.h"

#include <cmath>
#include <ctime>
#include <random>

#include <fmt/format.h>

#include "tokenizer/unicode.h"

namespace tachyon::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

const char* finish_reason_text(FinishReason reason) {
  // OpenAI knows "stop" and "length"; running into the context is "length" too.
  return reason == FinishReason::kStop ? "stop" : "length";
}

size_t count_code_points(std::string_view valid_utf8) {
  size_t n = 0;
  for (unsigned char c : valid_utf8) n += (c & 0xC0) != 0x80;
  return n;
}

// OpenAI's legacy completions write a token that is not valid UTF-8 by itself as "bytes:\xNN...".
std::string legacy_token_text(const std::string& piece) {
  if (is_valid_utf8(piece)) return piece;
  std::string out = "bytes:";
  for (unsigned char c : piece) out += fmt::format("\\x{:02x}", c);
  return out;
}

ojson byte_list(const std::string& piece) {
  ojson bytes = ojson::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return bytes;
}

std::string sse(const ojson& j) { return "data: " + dump(j) + "\n\n"; }

// Seeds of tool call ids: unpredictable, one per choice.
uint64_t tool_ids() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// `more` after `d`: what a stream's last feed() and its finish() release together.
void append(ToolStreamDelta& d, ToolStreamDelta more) {
  d.content += more.content;
  if (d.calls.empty()) d.first_index = more.first_index;
  for (ToolCall& call : more.calls) d.calls.push_back(std::move(call));
}

}  // namespace

CompletionJob::CompletionJob(const ServingContext& context, ApiRequest request, JobOptions options)
    : context_(context), request_(std::move(request)), part_(options.part) {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  id_ = !options.id.empty() ? options.id : new_response_id(request_.endpoint);
  created_ = options.created > 0 ? options.created : static_cast<int64_t>(std::time(nullptr));
  usage_chunk_header_ = fmt::format(R"({{"id":"{}","object":"{}","created":{},"model":{},)", id_,
                                    chat ? "chat.completion.chunk" : "text_completion", created_,
                                    dump(ojson(context_.model_name)));
  // Under stream_options.include_usage every chunk but the last carries "usage": null (as
  // OpenAI's do); the last has the counts and no choices.
  chunk_header_ = usage_chunk_header_ + (request_.include_usage ? R"("usage":null,)" : "");
  for (size_t p = 0; p < request_.prompts.size(); ++p) {
    const size_t first = streams_.size();
    for (int j = 0; j < request_.n; ++j) {
      GenerationParams params = request_.params;
      if (params.sampling.seed) params.sampling.seed = *params.sampling.seed + static_cast<uint64_t>(j);
      // The prompt's logprobs do not depend on the choice: its first computes them.
      params.prompt_logprobs = j == 0 ? request_.prompt_logprobs : std::nullopt;
      streams_.push_back(std::make_shared<RequestStream>(request_.prompts[p].ids, std::move(params)));
      if (j > 0) streams_.back()->set_leader(streams_[first]);
      Choice c;
      c.prompt = p;
      if (request_.tools) {
        c.tool_id_seed = tool_ids();
        if (request_.stream) {
          c.tool_parser = std::make_shared<ToolCallStreamParser>(request_.tools->format, request_.tools->request.tools,
                                                                 std::mt19937_64(c.tool_id_seed));
        }
      }
      if (!request_.params.detokenize && context_.tokenizer != nullptr) {
        c.own_text = std::make_shared<RequestText>(*context_.tokenizer, request_.params, request_.prompts[p].ids);
      }
      choices_.push_back(std::move(c));
    }
  }
  primed_.assign(choices_.size(), part_ != JobPart::kAfterFirstToken);
}

const std::string& CompletionJob::chunk_header() const { return chunk_header_; }

ojson CompletionJob::logprobs_json(Choice& choice, const std::vector<TokenLogprob>& logprobs) const {
  const Tokenizer& tok = *context_.tokenizer;
  // How a token is named: its text, or (return_tokens_as_token_ids) "token_id:N".
  const auto named = [&](int32_t id, std::string text) {
    return request_.tokens_as_ids ? fmt::format("token_id:{}", id) : std::move(text);
  };
  if (request_.endpoint == Endpoint::kCompletions) {
    ojson tokens = ojson::array(), token_logprobs = ojson::array(), top = ojson::array(), offsets = ojson::array();
    for (const TokenLogprob& lp : logprobs) {
      const std::string piece = tok.token_to_piece(lp.token);
      tokens.push_back(named(lp.token, legacy_token_text(piece)));
      token_logprobs.push_back(lp.logprob);
      ojson alternatives = ojson::object();
      for (const auto& [id, value] : lp.top) alternatives[named(id, legacy_token_text(tok.token_to_piece(id)))] = value;
      top.push_back(std::move(alternatives));
      offsets.push_back(choice.text_offset);
      if (!tok.is_special(lp.token)) choice.text_offset += count_code_points(sanitize_utf8(piece));
    }
    ojson out = ojson::object();
    out["tokens"] = std::move(tokens);
    out["token_logprobs"] = std::move(token_logprobs);
    out["top_logprobs"] = std::move(top);
    out["text_offset"] = std::move(offsets);
    return out;
  }
  ojson content = ojson::array();
  for (const TokenLogprob& lp : logprobs) {
    const std::string piece = tok.token_to_piece(lp.token);
    ojson entry = ojson::object();
    entry["token"] = named(lp.token, sanitize_utf8(piece));
    entry["logprob"] = lp.logprob;
    entry["bytes"] = byte_list(piece);
    ojson top = ojson::array();
    for (const auto& [id, value] : lp.top) {
      const std::string alt = tok.token_to_piece(id);
      ojson a = ojson::object();
      a["token"] = named(id, sanitize_utf8(alt));
      a["logprob"] = value;
      a["bytes"] = byte_list(alt);
      top.push_back(std::move(a));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  ojson out = ojson::object();
  out["content"] = std::move(content);
  out["refusal"] = nullptr;
  return out;
}

ojson CompletionJob::prompt_logprobs_json(size_t p) const {
  const Tokenizer& tok = *context_.tokenizer;
  const Choice& first = choices_[p * static_cast<size_t>(request_.n)];
  const auto entry = [&](int32_t id, float logprob, int64_t rank) {
    ojson e = ojson::object();
    // JSON has no -inf: OpenAI writes -9999.0 for a token the model gives no probability.
    e["logprob"] = std::isfinite(logprob) ? logprob : -9999.0f;
    e["rank"] = rank;
    e["decoded_token"] = sanitize_utf8(tok.token_to_piece(id));
    return e;
  };
  ojson out = ojson::array();
  out.push_back(nullptr);  // the first prompt token has nothing before it
  for (const PromptLogprob& lp : first.prompt_logprobs) {
    ojson tokens = ojson::object();
    tokens[std::to_string(lp.token)] = entry(lp.token, lp.logprob, lp.rank);
    for (size_t r = 0; r < lp.top.size(); ++r) {
      const std::string key = std::to_string(lp.top[r].first);
      if (!tokens.contains(key)) tokens[key] = entry(lp.top[r].first, lp.top[r].second, static_cast<int64_t>(r) + 1);
    }
    out.push_back(std::move(tokens));
  }
  return out;
}

ojson CompletionJob::usage_json() const {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const PromptInput& p : request_.prompts) prompt_tokens += static_cast<int64_t>(p.ids.size());
  for (const Choice& c : choices_) completion_tokens += c.num_generated;
  ojson usage = ojson::object();
  usage["prompt_tokens"] = prompt_tokens;
  usage["completion_tokens"] = completion_tokens;
  usage["total_tokens"] = prompt_tokens + completion_tokens;
  return usage;
}

void CompletionJob::fail(ApiError error, std::string& events) {
  if (error_) return;
  error_ = std::move(error);
  if (request_.stream) {
    events += sse(error_json(*error_));
    events += "data: [DONE]\n\n";
  }
  done_ = true;
}

void CompletionJob::on_output(size_t index, RequestOutput& o, std::string& events) {
  Choice& c = choices_[index];
  if (c.finished || done_) return;
  if (!primed_[index]) {
    // The tokens the prefill worker reported come first in the completion's text offsets.
    primed_[index] = true;
    const Tokenizer& tok = *context_.tokenizer;
    for (int32_t t : streams_[index]->imported_tokens()) {
      if (!tok.is_special(t)) c.text_offset += count_code_points(sanitize_utf8(tok.token_to_piece(t)));
      if (c.own_text) (void)c.own_text->push(t);  // their text went out from the prefill worker
    }
  }
  if (o.finished && o.finish_reason == FinishReason::kTransfer) {
    // The prefill worker's handoff: its first token went out before; this is the transfer's outcome.
    if (!o.error.ok()) {
      ApiError e;
      e.status = 502;
      e.type = "server_error";
      e.code = "kv_transfer_failed";
      e.message = "handing the request to the decode worker failed: " + o.error.message();
      fail(std::move(e), events);
      return;
    }
    events += fmt::format("event: {}\ndata: {{\"handoff\":\"ok\"}}\n\n", "tachyon");
    done_ = true;
    return;
  }
  if (o.finished && (o.finish_reason == FinishReason::kAbort || o.finish_reason == FinishReason::kError)) {
    ApiError e;
    if (o.finish_reason == FinishReason::kAbort && streams_[index]->timed_out()) {
      e.status = 504;
      e.type = "timeout_error";
      e.code = "request_timeout";
      e.message = "the request ran past the server's request timeout and was aborted";
    } else if (o.finish_reason == FinishReason::kAbort) {
      e.status = 503;
      e.type = "server_error";
      e.message = "the request was aborted";
    } else {
      const ErrorCode code = o.error.code();
      const bool user = code == ErrorCode::kInvalidArgument || code == ErrorCode::kOutOfRange;
      e.status = user ? 400 : 500;
      e.type = user ? "invalid_request_error" : "server_error";
      e.message = o.error.message();
    }
    fail(std::move(e), events);
    return;
  }
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  if (c.own_text) c.own_text->append(o);
  c.num_generated = o.num_generated_tokens;
  if (request_.stream) {
    const bool with_logprobs = request_.logprobs && !o.logprobs.empty();
    const bool has_content = !o.text.empty() || with_logprobs;
    const std::string lp = with_logprobs ? dump(logprobs_json(c, o.logprobs)) : "null";
    const std::string stamp = context_.stream_timestamps
                                  ? fmt::format(R"("tachyon_handed_over":{:.6f},)", o.handed_over_at)
                                  : std::string();
    if (chat) {
      stream_chat(index, c, o, with_logprobs ? lp : std::string(), stamp, events);
    } else if (has_content || o.finished) {
      const std::string reason = o.finished ? fmt::format("\"{}\"", finish_reason_text(o.finish_reason)) : "null";
      events += "data: " + chunk_header() + stamp +
                fmt::format(R"("choices":[{{"index":{},"text":{},"logprobs":{},"finish_reason":{}}}]}})", index,
                            dump(ojson(o.text)), lp, reason) +
                "\n\n";
    }
  } else {
    c.text += o.text;
    if (request_.logprobs) {
      for (TokenLogprob& lp : o.logprobs) c.logprobs.push_back(std::move(lp));
    }
    if (!o.prompt_logprobs.empty()) c.prompt_logprobs = std::move(o.prompt_logprobs);
  }
  if (o.finished) {
    c.finished = true;
    c.reason = o.finish_reason;
    ++num_finished_;
  }
}

const char* CompletionJob::finish_reason_of(FinishReason reason, size_t num_calls) const {
  // Calls cut short by max_tokens or the context are "length", as any output cut short.
  if (num_calls == 0 || reason != FinishReason::kStop) return finish_reason_text(reason);
  return request_.tools->request.legacy_functions ? "function_call" : "tool_calls";
}

void CompletionJob::stream_chat(size_t index, Choice& c, const RequestOutput& o, const std::string& logprobs,
                                const std::string& stamp, std::string& events) {
  const auto chunk = [&](const ojson& delta, const std::string& lp, const std::string& reason) {
    events += "data: " + chunk_header() + stamp +
              fmt::format(R"("choices":[{{"index":{},"delta":{},"logprobs":{},"finish_reason":{}}}]}})", index,
                          dump(delta), lp.empty() ? "null" : lp, reason) +
              "\n\n";
  };
  ToolStreamDelta d;
  if (c.tool_parser) {
    d = c.tool_parser->feed(o.text);  // text that may start a call is held back until it is decided
    if (o.finished) append(d, c.tool_parser->finish());
  } else {
    d.content = o.text;
  }
  if (!d.content.empty() || !logprobs.empty()) chunk(ojson{{"content", d.content}}, logprobs, "null");
  if (!d.calls.empty()) {
    if (request_.tools->request.legacy_functions) {
      if (d.first_index == 0) chunk(ojson{{"function_call", function_call_json(d.calls[0])}}, "", "null");
    } else {
      chunk(ojson{{"tool_calls", tool_calls_delta_json(d)}}, "", "null");
    }
  }
  if (o.finished) {
    const size_t calls = c.tool_parser ? c.tool_parser->num_calls() : 0;
    chunk(ojson::object(), "", fmt::format("\"{}\"", finish_reason_of(o.finish_reason, calls)));
  }
}

std::string CompletionJob::poll() {
  std::string events;
  if (done_) return events;
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  if (request_.stream && !started_ && part_ != JobPart::kAfterFirstToken) {
    // Every choice opens with the assistant role (chat) or the echoed prompt (completions).
    for (size_t i = 0; i < choices_.size(); ++i) {
      if (chat) {
        events += "data: " + chunk_header() +
                  fmt::format(R"("choices":[{{"index":{},"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}})",
                              i) +
                  "\n\n";
      } else if (request_.echo) {
        events += "data: " + chunk_header() +
                  fmt::format(R"("choices":[{{"index":{},"text":{},"logprobs":null,"finish_reason":null}}]}})", i,
                              dump(ojson(request_.prompts[choices_[i].prompt].text))) +
                  "\n\n";
      }
    }
  }
  started_ = true;
  for (size_t i = 0; i < streams_.size() && !done_; ++i) {
    std::vector<RequestOutput> outputs = streams_[i]->take();
    for (RequestOutput& o : outputs) {
      on_output(i, o, events);
      if (done_) break;
    }
  }
  if (!done_ && num_finished_ == choices_.size()) {
    if (request_.stream) {
      if (request_.include_usage) {
        events += "data: " + usage_chunk_header_ + R"("choices":[],"usage":)" + dump(usage_json()) + "}\n\n";
      }
      events += "data: [DONE]\n\n";
    }
    done_ = true;
  }
  return events;
}

int CompletionJob::status() const { return error_ ? error_->status : 200; }

std::string CompletionJob::body() const {
  if (error_) return error_body(*error_);
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  ojson choices = ojson::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice c = choices_[i];  // logprobs_json advances text_offset
    ToolCallParse calls;
    if (request_.tools) {
      std::mt19937_64 ids(c.tool_id_seed);
      calls = parse_tool_calls(c.text, request_.tools->format, request_.tools->request.tools, ids);
    } else {
      calls.content = request_.echo ? request_.prompts[c.prompt].text + c.text : c.text;
    }
    choices.push_back(choice_json(chat, i, calls.content,
                                  request_.logprobs ? logprobs_json(c, c.logprobs) : ojson(nullptr),
                                  finish_reason_of(c.reason, calls.calls.size())));
    if (!calls.calls.empty()) {
      ojson& message = choices.back()["message"];
      if (calls.content.empty()) message["content"] = nullptr;
      if (request_.tools->request.legacy_functions) {
        message["function_call"] = function_call_json(calls.calls[0]);
      } else {
        message["tool_calls"] = tool_calls_json(calls.calls);
      }
    }
    if (request_.prompt_logprobs && !chat) choices.back()["prompt_logprobs"] = prompt_logprobs_json(c.prompt);
  }
  ojson response = response_json(chat, id_, created_, context_.model_name, std::move(choices), usage_json());
  if (request_.prompt_logprobs && chat) response["prompt_logprobs"] = prompt_logprobs_json(0);
  return dump(response);
}

}  // namespace tachyon::server
