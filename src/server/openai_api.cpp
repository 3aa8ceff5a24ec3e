#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "engine/stop_strings.h"
#include "io/json_file.h"
#include "server/chat_prompt.h"
#include "server/request_fields.h"
#include "server/request_json.h"
#include "server/structured_output.h"
#include "tokenizer/unicode.h"

namespace tachyon::server {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int kMaxN = 128;
// Deeper JSON than kMaxJsonDepth is refused before parsing: copies, the chat template's
// conversion and dumps of a JSON value recurse, and a body of nested brackets must not exhaust
// the stack.

// The deepest nesting of arrays and objects in `text`, brackets inside strings excluded; stops
// counting past `limit`.
int json_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// The first word of a SamplingParams::validate message is the field's name.
std::string param_of(const std::string& message) { return message.substr(0, message.find(' ')); }
// A 400 from a message that starts with the path of what it is about ("tools[1].function.name ..."),
// its param the top-level field ("tools"), named in front as the other messages name theirs.
ApiError invalid_at(const Status& status) {
  const std::string& message = status.message();
  const std::string field = message.substr(0, message.find_first_of(" .["));
  return invalid(fmt::format("'{}': {}", field, message), field);
}

std::optional<ApiError> read_stop(const ojson& body, std::vector<std::string>& out) {
  const ojson* v = field(body, "stop");
  if (v == nullptr) return std::nullopt;
  const auto add = [&](const ojson& s) -> std::optional<ApiError> {
    if (!s.is_string()) return invalid(fmt::format("'stop' must be a string or a list of strings, got {}", json_excerpt(s)), "stop");
    std::string text = s.get<std::string>();
    if (!text.empty()) out.push_back(std::move(text));
    return std::nullopt;
  };
  if (v->is_array()) {
    for (const ojson& s : *v) TACHYON_API_TRY(add(s));
  } else {
    TACHYON_API_TRY(add(*v));
  }
  // The engine checks these too, but only once the request is queued: for a stream, a 200 and its
  // headers would already be out.
  if (Status valid = validate_stop_strings(out); !valid.ok()) return invalid(valid.message(), "stop");
  return std::nullopt;
}

std::optional<ApiError> read_logit_bias(const ojson& body, int vocab_size, SamplingParams& sampling) {
  const ojson* v = field(body, "logit_bias");
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return invalid("'logit_bias' must be an object of token id -> bias", "logit_bias");
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string& key = it.key();
    char* end = nullptr;
    const long id = std::strtol(key.c_str(), &end, 10);
    if (key.empty() || end != key.c_str() + key.size() || id < 0 || id >= vocab_size) {
      return invalid(fmt::format("logit_bias key '{}' is not a token id in [0, {})", key, vocab_size), "logit_bias");
    }
    if (!it.value().is_number()) {
      return invalid(fmt::format("logit_bias for token {} must be a number", key), "logit_bias");
    }
    sampling.logit_bias.emplace_back(static_cast<int32_t>(id), it.value().get<float>());
  }
  return std::nullopt;
}

// A list of token ids, each in the vocabulary.
std::optional<ApiError> read_ids(const ojson& list, int vocab_size, std::vector<int32_t>& out) {
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const ojson& t = list[i];
    if (!t.is_number_integer()) {
      return invalid(fmt::format("prompt token {} must be an integer, got {}", i, json_excerpt(t)), "prompt");
    }
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= vocab_size) {
      return invalid(fmt::format("prompt token {} at index {} is outside the vocabulary [0, {})", id, i, vocab_size),
                     "prompt");
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

std::optional<ApiError> read_prompts(const ojson& body, const ServingContext& ctx, bool add_special_tokens,
                                     std::vector<PromptInput>& out) {
  const ojson* v = field(body, "prompt");
  if (v == nullptr) return invalid("'prompt' is required", "prompt");
  EncodeOptions eo;
  eo.parse_special = true;  // as Hugging Face tokenizers do: special tokens written in the text are recognized
  if (!add_special_tokens) eo.add_bos = false;  // else the tokenizer's default
  const auto text_prompt = [&](const std::string& text) {
    PromptInput p;
    p.text = text;
    p.ids = ctx.tokenizer->encode(text, eo);
    out.push_back(std::move(p));
  };
  const auto id_prompt = [&](const ojson& list) -> std::optional<ApiError> {
    PromptInput p;
    TACHYON_API_TRY(read_ids(list, ctx.vocab_size, p.ids));
    p.text = ctx.tokenizer->decode(p.ids, false);
    out.push_back(std::move(p));
    return std::nullopt;
  };
  if (v->is_string()) {
    text_prompt(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array() || v->empty()) {
    return invalid("'prompt' must be a string, a list of token ids, or a non-empty list of strings or of token id "
                   "lists", "prompt");
  }
  const ojson& first = (*v)[0];
  if (first.is_number()) return id_prompt(*v);
  for (const ojson& item : *v) {
    if (item.is_string()) {
      text_prompt(item.get<std::string>());
    } else if (item.is_array() && !item.empty()) {
      TACHYON_API_TRY(id_prompt(item));
    } else {
      return invalid(fmt::format("a batch prompt must be a string or a non-empty list of token ids, got {}",
                                 item.type_name()), "prompt");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> read_messages(const ojson& body, ojson& messages) {
  const ojson* v = field(body, "messages");
  if (v == nullptr) return invalid("'messages' is required", "messages");
  if (!v->is_array() || v->empty()) return invalid("'messages' must be a non-empty list of messages", "messages");
  messages = ojson::array();
  for (size_t i = 0; i < v->size(); ++i) {
    const ojson& m = (*v)[i];
    if (!m.is_object()) {
      return invalid(fmt::format("messages[{}] must be an object, got {}", i, m.type_name()), "messages");
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return invalid(fmt::format("messages[{}].role must be a string", i), "messages");
    }
    ojson copy = m;
    auto content = m.find("content");
    if (content != m.end()) {
      std::string text;
      TACHYON_API_TRY(flatten_content(*content, i, text));
      if (!content->is_null()) copy["content"] = std::move(text);
    }
    messages.push_back(std::move(copy));
  }
  return std::nullopt;
}

}  // namespace

int json_nesting_depth(std::string_view text, int limit) { return json_depth(text, limit); }

ojson error_json(const ApiError& e) {
  ojson inner = ojson::object();
  inner["message"] = e.message;
  inner["type"] = e.type;
  inner["param"] = e.param.empty() ? ojson(nullptr) : ojson(e.param);
  inner["code"] = e.code.empty() ? ojson(nullptr) : ojson(e.code);
  ojson out = ojson::object();
  out["error"] = std::move(inner);
  return out;
}

std::string error_body(const ApiError& e) {
  return error_json(e).dump(-1, ' ', false, ojson::error_handler_t::replace);
}

ojson response_json(bool chat, const std::string& id, int64_t created, const std::string& model, ojson choices,
                    ojson usage) {
  ojson out = ojson::object();
  out["id"] = id;
  out["object"] = chat ? "chat.completion" : "text_completion";
  out["created"] = created;
  out["model"] = model;
  out["choices"] = std::move(choices);
  out["usage"] = std::move(usage);
  return out;
}

std::string new_response_id(Endpoint endpoint) {
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32));
  std::string out = endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-";
  const size_t n = out.size() + 32;
  while (out.size() < n) {
    uint64_t bits = rng();
    for (int i = 0; i < 16 && out.size() < n; ++i, bits >>= 4) out += "0123456789abcdef"[bits & 15];
  }
  return out;
}

ojson choice_json(bool chat, size_t index, const std::string& text, ojson logprobs, ojson finish_reason) {
  ojson choice = ojson::object();
  choice["index"] = index;
  if (chat) {
    ojson message = ojson::object();
    message["role"] = "assistant";
    message["content"] = text;
    choice["message"] = std::move(message);
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = std::move(finish_reason);
  return choice;
}

std::optional<ApiError> flatten_content(const ojson& content, size_t index, std::string& out) {
  out.clear();
  if (content.is_null()) return std::nullopt;
  if (content.is_string()) {
    out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) {
    return invalid(fmt::format("messages[{}].content must be a string or a list of parts", index), "messages");
  }
  bool first = true;
  for (const ojson& part : content) {
    const ojson* type = part.is_object() ? field(part, "type") : nullptr;
    const ojson* text = part.is_object() ? field(part, "text") : nullptr;
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text" || text == nullptr ||
        !text->is_string()) {
      return invalid(fmt::format("messages[{}].content: only parts of type \"text\" with a string \"text\" are "
                                 "supported", index), "messages");
    }
    if (!first) out += "\n";
    out += text->get<std::string>();
    first = false;
  }
  return std::nullopt;
}

namespace {

// The sampling and streaming fields both endpoints take, and 'n'.
std::optional<ApiError> read_sampling(const ojson& body, const ServingContext& ctx, ApiRequest& out) {
  GenerationParams& p = out.params;
  SamplingParams& s = p.sampling;
  TACHYON_API_TRY(read_float(body, "temperature", s.temperature));
  TACHYON_API_TRY(read_float(body, "top_p", s.top_p));
  TACHYON_API_TRY(read_float(body, "min_p", s.min_p));
  TACHYON_API_TRY(read_float(body, "presence_penalty", s.presence_penalty));
  TACHYON_API_TRY(read_float(body, "frequency_penalty", s.frequency_penalty));
  TACHYON_API_TRY(read_float(body, "repetition_penalty", s.repetition_penalty));
  int64_t top_k = 0;
  TACHYON_API_TRY(read_int(body, "top_k", top_k));
  if (top_k < -1 || top_k > std::numeric_limits<int32_t>::max()) {
    return invalid(fmt::format("'top_k' must be -1 or 0 (off) or a positive count, got {}", top_k), "top_k");
  }
  s.top_k = static_cast<int>(top_k);
  if (field(body, "seed") != nullptr) {
    int64_t value = 0;
    TACHYON_API_TRY(read_int(body, "seed", value));
    s.seed = static_cast<uint64_t>(value);
  }
  TACHYON_API_TRY(read_logit_bias(body, ctx.vocab_size, s));
  TACHYON_API_TRY(read_stop(body, p.stop));
  TACHYON_API_TRY(read_bool(body, "ignore_eos", p.ignore_eos));
  if (field(body, "sparse_budget") != nullptr) {  // an extension: block-sparse decode attention
    int64_t budget = 0;
    TACHYON_API_TRY(read_int(body, "sparse_budget", budget));
    if (budget < 0 || budget > std::numeric_limits<int32_t>::max()) {
      return invalid(fmt::format("'sparse_budget' must be 0 (dense) or a positive number of tokens, got {}", budget),
                     "sparse_budget");
    }
    if (budget > 0 && !ctx.sparse_attention) {
      return invalid("'sparse_budget': this server runs dense attention only (start it with --sparse-budget)",
                     "sparse_budget");
    }
    p.sparse_budget = static_cast<int>(budget);
  }
  if (const ojson* d = field(body, "draft")) {  // an extension: the named draft model to speculate with
    if (!d->is_string()) return invalid(fmt::format("'draft' must be a string, got {}", d->type_name()), "draft");
    p.draft = d->get<std::string>();
    if (std::find(ctx.drafts.begin(), ctx.drafts.end(), p.draft) == ctx.drafts.end()) {
      std::string names;
      for (const std::string& n : ctx.drafts) names += (names.empty() ? "'" : ", '") + n + "'";
      return invalid(names.empty() ? fmt::format("'draft' = '{}': this server runs no named draft model", p.draft)
                                   : fmt::format("'draft' = '{}' is not loaded; the named drafts are {}", p.draft, names),
                     "draft");
    }
  }
  TACHYON_API_TRY(read_bool(body, "stream", out.stream));
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object()) return invalid("'stream_options' must be an object", "stream_options");
    TACHYON_API_TRY(read_bool(*so, "include_usage", out.include_usage));
  }
  if (!out.stream) out.include_usage = false;

  int64_t n = 1;
  TACHYON_API_TRY(read_int(body, "n", n));
  if (n < 1 || n > kMaxN) return invalid(fmt::format("'n' must be in [1, {}], got {}", kMaxN, n), "n");
  out.n = static_cast<int>(n);
  return std::nullopt;
}

// stop_token_ids: token ids of the vocabulary.
std::optional<ApiError> read_stop_token_ids(const ojson& body, int vocab_size, std::vector<int32_t>& out) {
  const ojson* v = field(body, "stop_token_ids");
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) return invalid("'stop_token_ids' must be a list of token ids", "stop_token_ids");
  if (v->size() > kMaxStopTokenIds) {
    return invalid(fmt::format("'stop_token_ids' has {} ids; at most {}", v->size(), kMaxStopTokenIds),
                   "stop_token_ids");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const ojson& t = (*v)[i];
    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() >= static_cast<uint64_t>(vocab_size)) ||
        t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab_size) {
      return invalid(fmt::format("'stop_token_ids': entry {} = {} is not a token id in [0, {})", i, json_excerpt(t),
                                 vocab_size),
                     "stop_token_ids");
    }
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

// vLLM's extra fields beyond sampling: stop_token_ids, include_stop_str_in_output,
// skip_special_tokens, return_tokens_as_token_ids, prompt_logprobs (min_tokens waits for
// max_tokens, add_special_tokens goes with the prompt).
std::optional<ApiError> read_vllm_fields(const ojson& body, const ServingContext& ctx, ApiRequest& out) {
  GenerationParams& p = out.params;
  TACHYON_API_TRY(read_stop_token_ids(body, ctx.vocab_size, p.stop_token_ids));
  TACHYON_API_TRY(read_bool(body, "include_stop_str_in_output", p.include_stop_str_in_output));
  TACHYON_API_TRY(read_bool(body, "skip_special_tokens", p.skip_special_tokens));
  TACHYON_API_TRY(read_bool(body, "return_tokens_as_token_ids", out.tokens_as_ids));
  if (field(body, "prompt_logprobs") != nullptr) {
    int64_t n = 0;
    TACHYON_API_TRY(read_int(body, "prompt_logprobs", n));
    if (n < 0 || n > SamplingParams::kMaxLogprobs) {
      return invalid(fmt::format("'prompt_logprobs' must be in [0, {}], got {}", SamplingParams::kMaxLogprobs, n),
                     "prompt_logprobs");
    }
    if (out.stream) {
      return invalid("'prompt_logprobs' are not available when 'stream' is true (as in vLLM)", "prompt_logprobs");
    }
    out.prompt_logprobs = static_cast<int>(n);
  }
  return std::nullopt;
}

// 'logprobs' (a flag with 'top_logprobs' in chat, a count in completions) and the fields only one
// endpoint takes.
std::optional<ApiError> read_endpoint_fields(const ojson& body, bool chat, ApiRequest& out) {
  if (chat) {
    TACHYON_API_TRY(read_bool(body, "logprobs", out.logprobs));
    int64_t top = 0;
    TACHYON_API_TRY(read_int(body, "top_logprobs", top));
    if (top < 0 || top > SamplingParams::kMaxLogprobs) {
      return invalid(fmt::format("'top_logprobs' must be in [0, {}], got {}", SamplingParams::kMaxLogprobs, top),
                     "top_logprobs");
    }
    if (top > 0 && !out.logprobs) return invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    out.top_logprobs = static_cast<int>(top);
  } else {
    if (field(body, "logprobs") != nullptr) {
      int64_t top = 0;
      TACHYON_API_TRY(read_int(body, "logprobs", top));
      if (top < 0 || top > SamplingParams::kMaxLogprobs) {
        return invalid(fmt::format("'logprobs' must be in [0, {}], got {}", SamplingParams::kMaxLogprobs, top),
                       "logprobs");
      }
      out.logprobs = true;
      out.top_logprobs = static_cast<int>(top);
    }
    TACHYON_API_TRY(read_bool(body, "echo", out.echo));
    if (out.echo && out.logprobs) {
      return invalid("'echo' with 'logprobs' is not supported (vLLM's 'prompt_logprobs' gives the prompt's logprobs)",
                     "echo");
    }
    int64_t best_of = out.n;
    TACHYON_API_TRY(read_int(body, "best_of", best_of));
    if (best_of != out.n) return invalid("'best_of' other than 'n' is not supported", "best_of");
    if (const ojson* suffix = field(body, "suffix"); suffix != nullptr && !(suffix->is_string() && suffix->empty())) {
      return invalid("'suffix' is not supported", "suffix");
    }
  }
  return std::nullopt;
}

}  // namespace

// The chat's messages through the chat template: one prompt.
std::optional<ApiError> read_chat_prompt(const ojson& body, const ServingContext& ctx, bool add_special_tokens,
                                         PromptInput& out, std::optional<ApiRequest::Tools>* tools) {
  ojson messages;
  TACHYON_API_TRY(read_messages(body, messages));
  bool add_generation_prompt = true;
  TACHYON_API_TRY(read_bool(body, "add_generation_prompt", add_generation_prompt));
  ojson variables = nullptr;
  if (const ojson* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return invalid("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    variables = *kwargs;
  }
  if (tools != nullptr) tools->reset();
  // Tools: into the template's `tools` (or the system prompt, for templates without a tool
  // section); earlier calls and results in the messages in the shape templates expect.
  Result<ToolRequest> tool_request = parse_tool_request(body);
  if (!tool_request.ok()) return invalid_at(tool_request.status());
  const ChatTemplateExtras* extras = &ctx.template_extras;
  ChatTemplateExtras with_tools;
  if (tool_request->active()) {
    Result<ToolChatInput> input = prepare_tool_chat(messages, *tool_request, ctx.chat_template->source());
    if (!input.ok()) return invalid_at(input.status());
    messages = std::move(input->messages);
    with_tools = ctx.template_extras;
    with_tools.tools = std::move(input->tools);
    extras = &with_tools;
    if (tools != nullptr) *tools = ApiRequest::Tools{std::move(*tool_request), input->format};
  } else {
    Result<ojson> prepared = messages_for_template(messages);  // earlier tool calls may still be in the chat
    if (!prepared.ok()) return invalid_at(prepared.status());
    messages = std::move(*prepared);
  }
  if (!template_renders_tool_calls(ctx.chat_template->source())) {
    messages = calls_as_text(messages, detect_tool_call_format(ctx.chat_template->source()));
  }
  Result<ChatPrompt> prompt = build_chat_prompt(*ctx.chat_template, *extras, *ctx.tokenizer, messages,
                                                add_generation_prompt, variables, add_special_tokens);
  if (!prompt.ok()) return invalid(prompt.status().message(), "messages");
  out.text = std::move(prompt->text);
  out.ids = std::move(prompt->ids);
  return std::nullopt;
}

namespace {

// The prompts against the per-request choice limit and the context; the longest prompt's length.
std::optional<ApiError> check_prompts(const ApiRequest& request, bool chat, const ServingContext& ctx, size_t& longest) {
  if (static_cast<int64_t>(request.prompts.size()) * request.n > ctx.max_choices) {
    return invalid(fmt::format("{} prompts x n = {} choices; at most {} per request", request.prompts.size(), request.n,
                               ctx.max_choices), "n");
  }
  longest = 0;
  for (const PromptInput& prompt : request.prompts) {
    if (prompt.ids.empty()) return invalid("the prompt is empty (no tokens)", chat ? "messages" : "prompt");
    longest = std::max(longest, prompt.ids.size());
  }
  if (static_cast<int64_t>(longest) >= ctx.max_model_len) {
    return invalid(fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens, which "
                               "leaves no room for a completion",
                               ctx.max_model_len, longest),
                   chat ? "messages" : "prompt", "context_length_exceeded");
  }
  return std::nullopt;
}

// tool_choice "required" or a named function: the output is calls, by the tools' grammar (shared
// through the server's cache by the requests that give the same tools and choice).
std::optional<ApiError> force_tool_calls(const ApiRequest::Tools& tools, const ServingContext& ctx,
                                         GenerationParams& p) {
  if (p.grammar) {
    return invalid("'tool_choice' forces tool calls, and the output is already constrained (response_format or a "
                   "guided_* field); give one", "tool_choice");
  }
  if (ctx.grammars == nullptr) {
    return invalid("'tool_choice': this server does not do constrained output", "tool_choice");
  }
  const ToolRequest& r = tools.request;
  ojson key = ojson::object();
  key["tools"] = tools_template_json(r.tools);
  key["choice"] = r.choice == ToolChoiceMode::kNamed ? r.named_tool : std::string("required");
  key["parallel"] = r.parallel_tool_calls;
  key["format"] = std::string(tool_call_format_name(tools.format));
  Result<std::shared_ptr<const Grammar>> grammar = ctx.grammars->get(
      "tool_calls|" + key.dump(), [&] { return tool_call_grammar(r, tools.format); });
  if (!grammar.ok()) return invalid_at(grammar.status());
  p.grammar = std::move(grammar).value();
  return std::nullopt;
}

// max_tokens: completions default to 16 (as OpenAI), chat to the rest of the context.
std::optional<ApiError> read_max_tokens(const ojson& body, bool chat, const ServingContext& ctx, size_t longest,
                                        GenerationParams& p) {
  int64_t max_tokens = chat ? ctx.max_model_len - static_cast<int64_t>(longest) : 16;
  const char* max_key = "max_tokens";
  if (chat && field(body, "max_completion_tokens") != nullptr) max_key = "max_completion_tokens";
  TACHYON_API_TRY(read_int(body, max_key, max_tokens));
  if (max_tokens < 1) {
    return invalid(fmt::format("'{}' must be at least 1, got {}", max_key, max_tokens), max_key);
  }
  if (max_tokens > ctx.max_model_len) {
    return invalid(fmt::format("'{}' = {} is larger than the model's context length of {} tokens", max_key, max_tokens,
                               ctx.max_model_len),
                   max_key, "context_length_exceeded");
  }
  p.max_tokens = static_cast<int>(max_tokens);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_api_request(Endpoint endpoint, std::string_view body_text, const ServingContext& ctx,
                                          ApiRequest& out) {
  ojson body;
  TACHYON_API_TRY(parse_request_body(body_text, body));
  const bool chat = endpoint == Endpoint::kChatCompletions;
  out = ApiRequest{};
  out.endpoint = endpoint;
  TACHYON_API_TRY(check_request_fields(endpoint, body));  // nothing unknown, no structured output
  TACHYON_API_TRY(check_model(body, ctx.model_name));
  TACHYON_API_TRY(read_sampling(body, ctx, out));
  TACHYON_API_TRY(read_vllm_fields(body, ctx, out));
  TACHYON_API_TRY(read_endpoint_fields(body, chat, out));
  TACHYON_API_TRY(read_structured_output(body, ctx.grammars, out.params));
  SamplingParams& s = out.params.sampling;
  s.logprobs = out.top_logprobs;
  if (Status valid = s.validate(ctx.vocab_size); !valid.ok()) return invalid(valid.message(), param_of(valid.message()));

  // The prompt(s).
  bool add_special_tokens = true;
  TACHYON_API_TRY(read_bool(body, "add_special_tokens", add_special_tokens));
  if (chat) {
    TACHYON_API_TRY(read_chat_prompt(body, ctx, add_special_tokens, out.prompts.emplace_back(), &out.tools));
    if (out.tools && out.tools->request.forced()) TACHYON_API_TRY(force_tool_calls(*out.tools, ctx, out.params));
  } else {
    TACHYON_API_TRY(read_prompts(body, ctx, add_special_tokens, out.prompts));
  }
  size_t longest = 0;
  TACHYON_API_TRY(check_prompts(out, chat, ctx, longest));
  GenerationParams& p = out.params;
  TACHYON_API_TRY(read_max_tokens(body, chat, ctx, longest, p));
  int64_t min_tokens = 0;
  TACHYON_API_TRY(read_int(body, "min_tokens", min_tokens));
  if (min_tokens < 0 || min_tokens > p.max_tokens) {
    return invalid(fmt::format("'min_tokens' must be in [0, max_tokens = {}], got {}", p.max_tokens, min_tokens),
                   "min_tokens");
  }
  p.min_tokens = static_cast<int>(min_tokens);
  // The engine detokenizes only where stop strings need it (to end the request at the match);
  // otherwise the connection's CompletionJob makes the text, off the engine's thread.
  p.detokenize = !p.stop.empty();
  return std::nullopt;
}

}  // namespace tachyon::server
