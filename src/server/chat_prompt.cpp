#include "server/chat_prompt.h"

#include "core/mapped_file.h"

namespace tachyon::server {

Result<ChatPrompt> build_chat_prompt(const ChatTemplate& chat_template, const ChatTemplateExtras& extras,
                                     const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                     bool add_generation_prompt, const nlohmann::ordered_json& variables,
                                     bool add_special_tokens) {
  const ChatTemplateExtras* use = &extras;
  ChatTemplateExtras merged;
  if (variables.is_object() && !variables.empty()) {
    merged = extras;
    for (auto it = variables.begin(); it != variables.end(); ++it) merged.variables[it.key()] = it.value();
    use = &merged;
  }
  ChatPrompt prompt;
  TACHYON_ASSIGN_OR_RETURN(prompt.text, apply_chat_template(chat_template, messages, add_generation_prompt, *use));
  prompt.bos_in_text = tokenizer.bos_id() >= 0 && use->bos_token && !use->bos_token->empty() &&
                       prompt.text.compare(0, use->bos_token->size(), *use->bos_token) == 0;
  EncodeOptions eo;
  eo.parse_special = true;
  if (prompt.bos_in_text || !add_special_tokens) eo.add_bos = false;
  prompt.ids = tokenizer.encode(prompt.text, eo);
  return prompt;
}

Result<ChatTemplate> load_server_chat_template(const Tokenizer& tokenizer, const std::string& template_file) {
  if (template_file.empty()) return load_chat_template(tokenizer);
  TACHYON_ASSIGN_OR_RETURN(std::string source, read_text_file(template_file));
  Result<ChatTemplate> parsed = ChatTemplate::parse(source);
  if (!parsed.ok()) return parsed.status().with_context(template_file);
  return parsed;
}

}  // namespace tachyon::server
