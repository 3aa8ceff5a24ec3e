#include "server/response_assembler.h"

#include <fmt/format.h>

namespace tachyon::server {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int64_t kMaxChoices = 1 << 16;

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

Status bad(std::string_view what) { return make_error(ErrorCode::kCorruptFile, "a worker's chunk: {}", what); }

// Appends `from`'s arrays to `into`'s, key by key (completions logprobs: tokens, token_logprobs,
// top_logprobs, text_offset; chat: content).
Status append_arrays(ojson& into, const ojson& from) {
  if (!from.is_object()) return bad("logprobs is not an object");
  if (into.is_null()) {
    into = ojson::object();
    for (auto it = from.begin(); it != from.end(); ++it) {
      into[it.key()] = it.value().is_array() ? ojson::array() : it.value();
    }
  }
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (!it.value().is_array()) {
      if (into.contains(it.key()) && into[it.key()].is_array()) return bad("logprobs arrays disagree");
      continue;
    }
    ojson& target = into[it.key()];
    if (!target.is_array()) return bad("logprobs arrays disagree");
    for (const ojson& v : it.value()) target.push_back(v);
  }
  return Status::Ok();
}

}  // namespace

int ResponseAssembler::status_of_error(const ojson& error) {
  const ojson* inner = error.is_object() && error.contains("error") ? &error["error"] : nullptr;
  const auto str = [&](const char* key) -> std::string {
    if (inner == nullptr || !inner->is_object()) return "";
    auto it = inner->find(key);
    return it != inner->end() && it->is_string() ? it->get<std::string>() : "";
  };
  const std::string type = str("type"), code = str("code");
  if (type == "invalid_request_error") return 400;
  if (type == "timeout_error") return 504;
  if (code == "kv_transfer_failed") return 502;
  return 500;
}

Status ResponseAssembler::add(std::string_view chunk) {
  const ojson j = ojson::parse(chunk, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (j.contains("error")) {
    if (!error_) error_ = j;
    return Status::Ok();
  }
  if (id_.empty() && j.contains("id") && j["id"].is_string()) id_ = j["id"].get<std::string>();
  if (model_.empty() && j.contains("model") && j["model"].is_string()) model_ = j["model"].get<std::string>();
  if (created_ == 0 && j.contains("created") && j["created"].is_number_integer()) created_ = j["created"].get<int64_t>();
  if (j.contains("usage") && j["usage"].is_object()) usage_ = j["usage"];
  const auto choices = j.find("choices");
  if (choices == j.end()) return Status::Ok();
  if (!choices->is_array()) return bad("choices is not an array");
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  for (const ojson& c : *choices) {
    if (!c.is_object() || !c.contains("index") || !c["index"].is_number_integer()) return bad("a choice without index");
    const int64_t index = c["index"].get<int64_t>();
    if (index < 0 || index >= kMaxChoices) return bad(fmt::format("choice index {}", index));
    Choice& choice = choices_[index];
    if (chat) {
      if (c.contains("delta")) {
        const ojson& delta = c["delta"];
        if (!delta.is_object()) return bad("delta is not an object");
        if (delta.contains("content") && !delta["content"].is_null()) {
          if (!delta["content"].is_string()) return bad("delta.content is not a string");
          choice.text += delta["content"].get<std::string>();
        }
      }
    } else if (c.contains("text") && !c["text"].is_null()) {
      if (!c["text"].is_string()) return bad("text is not a string");
      choice.text += c["text"].get<std::string>();
    }
    if (c.contains("logprobs") && !c["logprobs"].is_null()) TACHYON_RETURN_IF_ERROR(append_arrays(choice.logprobs, c["logprobs"]));
    if (c.contains("finish_reason") && !c["finish_reason"].is_null()) choice.finish_reason = c["finish_reason"];
  }
  return Status::Ok();
}

int ResponseAssembler::error_status() const { return error_ ? status_of_error(*error_) : 200; }

std::string ResponseAssembler::error_body() const { return error_ ? dump(*error_) : std::string(); }

std::string ResponseAssembler::body() const {
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  ojson choices = ojson::array();
  for (const auto& [index, c] : choices_) {
    choices.push_back(choice_json(chat, static_cast<size_t>(index), c.text, c.logprobs, c.finish_reason));
  }
  return dump(response_json(chat, id_, created_, model_, std::move(choices), usage_));
}

}  // namespace tachyon::server
