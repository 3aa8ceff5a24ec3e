#include "server/request_fields.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "io/json_file.h"
#include "server/request_json.h"

namespace tachyon::server {
namespace {

using ojson = nlohmann::ordered_json;

// Both endpoints: OpenAI's common fields, vLLM's sampling extras the engine honours, Tachyon's
// extensions (draft, sparse_budget), and the structured-output fields (refused below, known so
// that their refusal says what it is).
constexpr auto kCommonFields = std::to_array<std::string_view>({
    "model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty",
    "logit_bias", "logprobs", "stream", "stream_options", "user",
    // vLLM
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
    "include_stop_str_in_output", "prompt_logprobs", "skip_special_tokens", "add_special_tokens",
    "return_tokens_as_token_ids",
    // Tachyon
    "draft", "sparse_budget",
    // structured output (server/structured_output.h; guided_whitespace_pattern refused)
    "response_format", "guided_json", "guided_regex", "guided_grammar", "guided_choice", "guided_decoding_backend",
    "guided_whitespace_pattern", "structured_outputs",
});
constexpr auto kCompletionFields = std::to_array<std::string_view>({"prompt", "echo", "best_of", "suffix"});
constexpr auto kChatFields = std::to_array<std::string_view>({
    "messages", "max_completion_tokens", "top_logprobs", "add_generation_prompt", "chat_template_kwargs",
    // no-ops by OpenAI's semantics
    "metadata", "store", "service_tier", "modalities",
    // tool calling (server/tool_calls.h)
    "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
});

template <size_t A, size_t B>
std::array<std::string_view, A + B> join(const std::array<std::string_view, A>& a,
                                         const std::array<std::string_view, B>& b) {
  std::array<std::string_view, A + B> out{};
  std::copy(a.begin(), a.end(), out.begin());
  std::copy(b.begin(), b.end(), out.begin() + A);
  return out;
}

const auto kCompletionsKnown = join(kCommonFields, kCompletionFields);
const auto kChatKnown = join(kCommonFields, kChatFields);

const char* route_of(Endpoint endpoint) {
  return endpoint == Endpoint::kChatCompletions ? "/v1/chat/completions" : "/v1/completions";
}

// The no-op fields: their type, and for some the only values that change nothing.
std::optional<ApiError> check_no_ops(const ojson& body) {
  std::string text;
  TACHYON_API_TRY(read_string(body, "user", text));
  if (const ojson* metadata = field(body, "metadata")) {
    if (!metadata->is_object()) return invalid("'metadata' must be an object of strings", "metadata");
    for (auto it = metadata->begin(); it != metadata->end(); ++it) {
      if (!it.value().is_string()) {
        return invalid(fmt::format("'metadata' values must be strings; '{}' is not", excerpt(it.key())), "metadata");
      }
    }
  }
  bool flag = false;
  TACHYON_API_TRY(read_bool(body, "store", flag));
  TACHYON_API_TRY(read_bool(body, "parallel_tool_calls", flag));
  if (const ojson* tier = field(body, "service_tier")) {
    if (!tier->is_string() || (tier->get<std::string>() != "auto" && tier->get<std::string>() != "default")) {
      return invalid(fmt::format("'service_tier' = {} is not supported (only \"auto\" or \"default\")",
                                 json_excerpt(*tier)),
                     "service_tier");
    }
  }
  if (const ojson* modalities = field(body, "modalities")) {
    if (*modalities != ojson::array({"text"})) {
      return invalid(fmt::format("'modalities' = {} is not supported (only [\"text\"])", json_excerpt(*modalities)),
                     "modalities");
    }
  }
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object()) return invalid("'stream_options' must be an object", "stream_options");
    for (auto it = so->begin(); it != so->end(); ++it) {
      // include_obfuscation pads chunks against side channels: a no-op for a server that sends none.
      if (it.key() != "include_usage" && it.key() != "include_obfuscation") {
        return invalid(fmt::format("'stream_options.{}' is not supported (only include_usage, include_obfuscation)",
                                   excerpt(it.key())),
                       "stream_options");
      }
      if (!it.value().is_boolean() && !it.value().is_null()) {
        return invalid(fmt::format("'stream_options.{}' must be a boolean", excerpt(it.key())), "stream_options");
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::span<const std::string_view> known_fields(Endpoint endpoint) {
  if (endpoint == Endpoint::kChatCompletions) return kChatKnown;
  return kCompletionsKnown;
}

std::optional<ApiError> refuse_structured_output(Endpoint endpoint, const ojson& body) {
  (void)endpoint;  // both endpoints refuse the same
  // Blanks between JSON tokens are bounded by the grammar itself (server/structured_output.h).
  if (field(body, "guided_whitespace_pattern") != nullptr) {
    return invalid("'guided_whitespace_pattern' is not supported", "guided_whitespace_pattern");
  }
  return std::nullopt;
}

std::optional<ApiError> check_request_fields(Endpoint endpoint, const ojson& body) {
  const std::span<const std::string_view> known = known_fields(endpoint);
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(known.begin(), known.end(), std::string_view(it.key())) == known.end()) {
      const std::string name = excerpt(it.key());
      return invalid(fmt::format("'{}' is not supported: {} does not know this field (unknown fields are refused, "
                                 "not ignored)",
                                 name, route_of(endpoint)),
                     name);
    }
  }
  TACHYON_API_TRY(check_no_ops(body));
  return refuse_structured_output(endpoint, body);
}

}  // namespace tachyon::server
