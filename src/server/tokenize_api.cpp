#include "server/tokenize_api.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "io/json_file.h"
#include "server/request_json.h"
#include "tokenizer/unicode.h"

namespace tachyon::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

JsonReply error_reply(const ApiError& e) { return {e.status, error_body(e)}; }

// Refuses a top-level field not in `known`.
template <size_t N>
std::optional<ApiError> check_fields(const ojson& body, const std::array<std::string_view, N>& known,
                                     const char* route) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(known.begin(), known.end(), std::string_view(it.key())) == known.end()) {
      const std::string name = excerpt(it.key());
      return invalid(fmt::format("'{}' is not supported: {} does not know this field", name, route), name);
    }
  }
  return std::nullopt;
}

std::optional<ApiError> tokenize(const ojson& body, const ServingContext& ctx, ojson& out) {
  const bool chat = body.contains("messages");
  if (chat) {
    constexpr auto kKnown = std::to_array<std::string_view>(
        {"model", "messages", "add_generation_prompt", "add_special_tokens", "chat_template_kwargs",
         "return_token_strs"});
    TACHYON_API_TRY(check_fields(body, kKnown, "/tokenize with messages"));
  } else {
    constexpr auto kKnown =
        std::to_array<std::string_view>({"model", "prompt", "add_special_tokens", "return_token_strs"});
    TACHYON_API_TRY(check_fields(body, kKnown, "/tokenize"));
  }
  TACHYON_API_TRY(check_model(body, ctx.model_name));
  bool add_special_tokens = true, return_token_strs = false;
  TACHYON_API_TRY(read_bool(body, "add_special_tokens", add_special_tokens));
  TACHYON_API_TRY(read_bool(body, "return_token_strs", return_token_strs));
  PromptInput prompt;
  if (chat) {
    TACHYON_API_TRY(read_chat_prompt(body, ctx, add_special_tokens, prompt));
  } else {
    const ojson* text = field(body, "prompt");
    if (text == nullptr || !text->is_string()) {
      return invalid("/tokenize needs 'prompt' (a string) or 'messages' (a list of messages)", "prompt");
    }
    EncodeOptions eo;
    eo.parse_special = true;  // as /v1/completions reads a text prompt
    if (!add_special_tokens) eo.add_bos = false;
    prompt.ids = ctx.tokenizer->encode(text->get<std::string>(), eo);
  }
  out = ojson::object();
  out["count"] = prompt.ids.size();
  out["max_model_len"] = ctx.max_model_len;
  out["tokens"] = prompt.ids;
  if (return_token_strs) {
    ojson strs = ojson::array();
    for (const int32_t id : prompt.ids) strs.push_back(sanitize_utf8(ctx.tokenizer->token_to_piece(id)));
    out["token_strs"] = std::move(strs);
  }
  return std::nullopt;
}

std::optional<ApiError> detokenize(const ojson& body, const ServingContext& ctx, ojson& out) {
  constexpr auto kKnown = std::to_array<std::string_view>({"model", "tokens"});
  TACHYON_API_TRY(check_fields(body, kKnown, "/detokenize"));
  TACHYON_API_TRY(check_model(body, ctx.model_name));
  const ojson* tokens = field(body, "tokens");
  if (tokens == nullptr || !tokens->is_array()) return invalid("'tokens' must be a list of token ids", "tokens");
  std::vector<int32_t> ids;
  ids.reserve(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    const ojson& t = (*tokens)[i];
    const bool in_vocab = t.is_number_integer() && !(t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX) &&
                          t.get<int64_t>() >= 0 && t.get<int64_t>() < ctx.vocab_size;
    if (!in_vocab) {
      return invalid(
          fmt::format("'tokens': entry {} = {} is not a token id in [0, {})", i, json_excerpt(t), ctx.vocab_size),
          "tokens");
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  out = ojson::object();
  out["prompt"] = sanitize_utf8(ctx.tokenizer->decode(ids, /*skip_special=*/false));
  return std::nullopt;
}

template <typename Handler>
JsonReply reply(std::string_view text, const ServingContext& ctx, Handler handler) {
  ojson body, out;
  if (auto error = parse_request_body(text, body)) return error_reply(*error);
  if (auto error = handler(body, ctx, out)) return error_reply(*error);
  return {200, dump(out)};
}

}  // namespace

JsonReply tokenize_reply(std::string_view body, const ServingContext& context) {
  return reply(body, context, tokenize);
}

JsonReply detokenize_reply(std::string_view body, const ServingContext& context) {
  return reply(body, context, detokenize);
}

}  // namespace tachyon::server
