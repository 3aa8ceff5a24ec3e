// The OpenAI API's request side: a JSON body of POST /v1/completions or /v1/chat/completions,
// checked field by field and turned into prompts (token ids) and GenerationParams; and its error
// objects. Nothing here touches the engine or the network.
//
// Every user mistake comes back as an ApiError (HTTP status, OpenAI-style type/param/code), never
// as an exception or an abort. Values are checked against the served model: vocabulary, context
// length (prompt < max_model_len, 1 <= max_tokens <= max_model_len), sampling ranges.
//
// Fields (server/request_fields.h refuses every other one with a 400 naming it, and the
// structured-output ones; nothing is silently ignored):
//   both        model, max_tokens, temperature, top_p, top_k, min_p, n, stop, seed,
//               presence_penalty, frequency_penalty, repetition_penalty, logit_bias, stream,
//               stream_options (include_usage; include_obfuscation a no-op), user (a no-op),
//               vLLM's ignore_eos, min_tokens, stop_token_ids, include_stop_str_in_output,
//               prompt_logprobs (not with stream), skip_special_tokens, add_special_tokens,
//               return_tokens_as_token_ids,
//               Tachyon's draft, sparse_budget; structured output (server/structured_output.h):
//               response_format, guided_json, guided_regex, guided_grammar, guided_choice,
//               structured_outputs, guided_decoding_backend (a no-op)
//   completions prompt (string | [ids] | [strings] | [[ids]]), echo, logprobs (int), best_of (= n),
//               suffix (empty)
//   chat        messages, max_completion_tokens, logprobs (bool), top_logprobs,
//               add_generation_prompt, chat_template_kwargs; tools, tool_choice, functions,
//               function_call, parallel_tool_calls (server/tool_calls.h); no-ops: metadata, store,
//               service_tier (auto | default), modalities (["text"])
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "sampling/output_constraint.h"
#include "server/tool_calls.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tachyon::server {

enum class Endpoint { kCompletions, kChatCompletions };

// {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};
nlohmann::ordered_json error_json(const ApiError& error);
std::string error_body(const ApiError& error);

// A plain (not streamed) response, {"id", "object", "created", "model", "choices", "usage"}, and
// one of its choices, {"index", "message" (chat) or "text", "logprobs", "finish_reason"}: the
// server's own and the one the router assembles from a worker's stream.
nlohmann::ordered_json response_json(bool chat, const std::string& id, int64_t created, const std::string& model,
                                     nlohmann::ordered_json choices, nlohmann::ordered_json usage);
nlohmann::ordered_json choice_json(bool chat, size_t index, const std::string& text, nlohmann::ordered_json logprobs,
                                   nlohmann::ordered_json finish_reason);
// A fresh response id as OpenAI writes them: "cmpl-" or "chatcmpl-" and 32 random hex digits.
std::string new_response_id(Endpoint endpoint);

// What request parsing needs to know about the served model. Read-only; shared by all threads.
struct ServingContext {
  std::string model_name;                 // the only name `model` may hold
  const Tokenizer* tokenizer = nullptr;   // never null in the server
  const ChatTemplate* chat_template = nullptr;
  ChatTemplateExtras template_extras;
  int max_model_len = 0;
  int vocab_size = 0;
  int max_choices = 1024;                 // prompts x n of one request
  // Streamed chunks carry "tachyon_handed_over": the CLOCK_MONOTONIC second the engine loop
  // handed their tokens over (a client on the same host measures what delivery adds).
  bool stream_timestamps = false;
  // Named draft models a request may pick with "draft" (--draft-model NAME=PATH); empty: none.
  std::vector<std::string> drafts;
  // The engine keeps key bounds (--sparse-budget): requests may set "sparse_budget".
  bool sparse_attention = false;
  // Compiled structured-output grammars, shared by the connection threads (thread-safe); null: no
  // structured output (requests that ask for it get a 400).
  GrammarCache* grammars = nullptr;
};

struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;  // as given, or decoded from the ids; for echo
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::vector<PromptInput> prompts;  // completions may batch; chat has one
  GenerationParams params;           // for choice j of each prompt the seed is seed + j
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  bool logprobs = false;
  int top_logprobs = 0;
  bool tokens_as_ids = false;  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"
  // vLLM's prompt_logprobs (N top tokens per prompt token); computed by each prompt's first choice
  // only (GenerationParams::prompt_logprobs) and shown in every choice of that prompt.
  std::optional<int> prompt_logprobs;
  // Chat with tools (server/tool_calls.h) and tool_choice other than "none": the prompt shows them
  // and each choice's output is parsed into message.tool_calls; a forced choice ("required", a
  // named function) decodes under tool_call_grammar() (params.grammar).
  struct Tools {
    ToolRequest request;
    ToolCallFormat format = ToolCallFormat::kHermes;
  };
  std::optional<Tools> tools;
};

// The deepest nesting of arrays and objects in JSON `text` (brackets inside strings excluded);
// stops counting past `limit`. Callers refuse deep bodies before parsing them, since parsing and
// dumping recurse.
int json_nesting_depth(std::string_view text, int limit);
inline constexpr int kMaxJsonDepth = 64;

// Parses `body` (any bytes) into `out`; the error to answer with otherwise.
std::optional<ApiError> parse_api_request(Endpoint endpoint, std::string_view body, const ServingContext& context,
                                          ApiRequest& out);

// The chat's `messages` through the chat template, with `body`'s add_generation_prompt and
// chat_template_kwargs: one prompt (for /v1/chat/completions and /tokenize).
// add_special_tokens: see build_chat_prompt (server/chat_prompt.h).
// `tools`: set when the request's tools are active (and then shown to the template), else reset.
std::optional<ApiError> read_chat_prompt(const nlohmann::ordered_json& body, const ServingContext& context,
                                         bool add_special_tokens, PromptInput& out,
                                         std::optional<ApiRequest::Tools>* tools = nullptr);

// The message content as one string: a string as is; a list of {"type": "text", "text"} parts
// joined by newlines; null as empty. Other part types are an error.
std::optional<ApiError> flatten_content(const nlohmann::ordered_json& content, size_t index, std::string& out);

}  // namespace tachyon::server
