// A chat conversation to prompt token ids, the way the model's own tooling does it: the messages
// rendered with the chat template (add_generation_prompt), then tokenized with special tokens
// parsed. Used by the server's /v1/chat/completions and by `tachyon chat`.
//
// BOS: transformers tokenizes a rendered chat with add_special_tokens=False, because templates
// that need a BOS write it themselves ({{ bos_token }}). We add none when the rendered text already
// starts with the BOS token's text, which is that case, so there is never a double BOS. A template
// that writes no BOS (e.g. the ChatML fallback on a base model) keeps the tokenizer's default, as a
// completion prompt would.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tachyon::server {

struct ChatPrompt {
  std::string text;            // the rendered template
  std::vector<int32_t> ids;    // the prompt the engine runs
  bool bos_in_text = false;    // the template wrote the BOS token itself
};

// `messages`: a JSON array of {"role", "content", ...} objects, content already a string.
// `variables`: extra template variables (enable_thinking, ...), may be null.
// `add_special_tokens` false: no BOS beyond what the template writes (vLLM's add_special_tokens
// false); true: the BOS rule above.
Result<ChatPrompt> build_chat_prompt(const ChatTemplate& chat_template, const ChatTemplateExtras& extras,
                                     const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                     bool add_generation_prompt = true,
                                     const nlohmann::ordered_json& variables = nullptr,
                                     bool add_special_tokens = true);

// The template given by --chat-template FILE (when not empty), else the tokenizer's, else ChatML.
Result<ChatTemplate> load_server_chat_template(const Tokenizer& tokenizer, const std::string& template_file);

}  // namespace tachyon::server
