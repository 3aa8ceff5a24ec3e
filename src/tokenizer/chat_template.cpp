#include "tokenizer/chat_template.h"

#include "core/log.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/tokenizer.h"

namespace tachyon {
namespace {

constexpr std::string_view kChatMlTemplate =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// The names transformers accepts a message's reasoning under; the first is what templates read.
constexpr std::string_view kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

jinja::RenderOptions to_jinja(const ChatTemplateRenderOptions& options) {
  jinja::RenderOptions out;
  out.limits.max_output_bytes = options.limits.max_output_bytes;
  out.limits.max_steps = options.limits.max_steps;
  out.limits.max_call_depth = options.limits.max_call_depth;
  out.now = options.now;
  return out;
}

template <typename Json>
Result<jinja::Value> context_from_json(const Json& context) {
  if (!context.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "chat template context must be a JSON object, got {}",
                      context.type_name());
  }
  return jinja::from_json(context);
}

// A message as transformers hands it to the template: null-valued keys dropped, and reasoning
// visible as "thinking" (first) and "reasoning_content".
Result<jinja::Value> normalize_message(const nlohmann::ordered_json& message, size_t index) {
  if (!message.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "chat message {} must be a JSON object, got {}", index,
                      message.type_name());
  }
  jinja::Dict fields;
  for (auto it = message.begin(); it != message.end(); ++it) {
    if (it.value().is_null()) continue;
    TACHYON_ASSIGN_OR_RETURN(jinja::Value v, jinja::from_json(it.value()));
    fields.set(jinja::Value(it.key()), std::move(v));
  }
  const jinja::Value* reasoning = nullptr;
  for (const std::string_view name : kReasoningFields) {
    if ((reasoning = fields.find(name)) != nullptr) break;
  }
  if (reasoning == nullptr) return jinja::Value::dict(std::move(fields));
  // {"thinking": reasoning, **message, "reasoning_content": reasoning}
  const jinja::Value reasoning_value = *reasoning;
  jinja::Dict aliased;
  aliased.set(jinja::Value("thinking"), reasoning_value);
  for (const auto& [key, value] : fields.items()) aliased.set(key, value);
  aliased.set(jinja::Value("reasoning_content"), reasoning_value);
  return jinja::Value::dict(std::move(aliased));
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  Result<std::shared_ptr<const jinja::Template>> tpl = jinja::parse_template(source);
  if (!tpl.ok()) return tpl.status().with_context("chat template");
  return ChatTemplate(std::string(source), std::move(*tpl));
}

ChatTemplate ChatTemplate::chatml() {
  Result<ChatTemplate> tpl = parse(kChatMlTemplate);
  TACHYON_CHECK(tpl.ok(), "the built-in ChatML template does not parse: {}", tpl.status().to_string());
  return std::move(tpl).value();
}

Result<std::string> ChatTemplate::render_variables(const jinja::Dict& variables,
                                                   const ChatTemplateRenderOptions& options) const {
  const jinja::RenderOptions jinja_options = to_jinja(options);
  jinja::Renderer renderer(*template_, jinja_options);
  Result<std::string> out = renderer.render(variables);
  if (!out.ok()) return out.status().with_context("chat template");
  return out;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context,
                                         const ChatTemplateRenderOptions& options) const {
  TACHYON_ASSIGN_OR_RETURN(jinja::Value variables, context_from_json(context));
  return render_variables(variables.as_dict(), options);
}

Result<std::string> ChatTemplate::render(const nlohmann::json& context, const ChatTemplateRenderOptions& options) const {
  TACHYON_ASSIGN_OR_RETURN(jinja::Value variables, context_from_json(context));
  return render_variables(variables.as_dict(), options);
}

Result<std::string> apply_chat_template(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                                        bool add_generation_prompt, const ChatTemplateExtras& extras) {
  if (!messages.is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "chat messages must be a JSON array, got {}", messages.type_name());
  }
  if (messages.empty()) {
    return Status(ErrorCode::kInvalidArgument, "cannot apply a chat template to an empty conversation");
  }
  if (!extras.variables.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "chat template variables must be a JSON object, got {}",
                      extras.variables.type_name());
  }
  jinja::List normalized;
  normalized.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    TACHYON_ASSIGN_OR_RETURN(jinja::Value m, normalize_message(messages[i], i));
    normalized.push_back(std::move(m));
  }

  jinja::Dict variables;
  if (extras.bos_token) variables.set(jinja::Value("bos_token"), jinja::Value(*extras.bos_token));
  if (extras.eos_token) variables.set(jinja::Value("eos_token"), jinja::Value(*extras.eos_token));
  for (auto it = extras.variables.begin(); it != extras.variables.end(); ++it) {
    TACHYON_ASSIGN_OR_RETURN(jinja::Value v, jinja::from_json(it.value()));
    variables.set(jinja::Value(it.key()), std::move(v));
  }
  variables.set(jinja::Value("messages"), jinja::Value::list(std::move(normalized)));
  TACHYON_ASSIGN_OR_RETURN(jinja::Value tools, jinja::from_json(extras.tools));
  variables.set(jinja::Value("tools"), std::move(tools));
  TACHYON_ASSIGN_OR_RETURN(jinja::Value documents, jinja::from_json(extras.documents));
  variables.set(jinja::Value("documents"), std::move(documents));
  variables.set(jinja::Value("add_generation_prompt"), jinja::Value(add_generation_prompt));
  return chat_template.render_variables(variables, extras.render);
}

ChatTemplateExtras chat_template_extras(const Tokenizer& tokenizer) {
  ChatTemplateExtras extras;
  if (tokenizer.bos_id() >= 0) extras.bos_token = tokenizer.token_to_piece(tokenizer.bos_id());
  if (!tokenizer.eos_ids().empty()) extras.eos_token = tokenizer.token_to_piece(tokenizer.eos_ids().front());
  return extras;
}

Result<ChatTemplate> load_chat_template(const Tokenizer& tokenizer) {
  if (tokenizer.chat_template().empty()) {
    TACHYON_LOG_INFO("the tokenizer has no chat template; using the built-in ChatML template");
    return ChatTemplate::chatml();
  }
  return ChatTemplate::parse(tokenizer.chat_template());
}

std::string_view chatml_template_source() { return kChatMlTemplate; }

}  // namespace tachyon
