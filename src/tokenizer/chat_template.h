// Chat templates: the Jinja template a chat model ships (tokenizer_config.json "chat_template",
// GGUF "tokenizer.chat_template") rendered exactly as Hugging Face transformers renders it in
// apply_chat_template(tokenize=False): jinja2 semantics (trim_blocks, lstrip_blocks, loop
// controls, an immutable sandbox), transformers' globals (raise_exception, strftime_now,
// namespace, dict) and its |tojson (json.dumps with ensure_ascii=False, key order kept).
//
// The interpreter lives in jinja_*.{h,cpp}; this file is the interface the engine and the server
// use. Parsing and rendering never abort on a template or on messages: syntax errors (with line
// and column), unknown filters, raise_exception() and exceeded limits all come back as Status.
// A parsed ChatTemplate is immutable and cheap to copy; render() may run on many threads at once.
//
// Undefined values behave as jinja2's default Undefined: empty when printed, false, `is defined`
// false, empty when iterated; but reading an attribute or item of an undefined value is an error,
// as it is in jinja2 (`message.foo` is undefined when the message has no "foo"; `message.foo.bar`
// then fails).
//
// Not supported (an error if a template uses them): template inheritance and includes (block,
// extends, include, import), recursive for-loops, the groupby/slice/wordwrap/urlize/... filters,
// format specs in str.format(), integers beyond 64 bits. Case mapping is Unicode's simple mapping.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tachyon {

class Tokenizer;
namespace jinja {
struct Template;
class Dict;
}  // namespace jinja
struct ChatTemplateExtras;

// Bounds on one rendering, so that a hostile template cannot hang or exhaust memory.
struct ChatTemplateLimits {
  size_t max_output_bytes = size_t{16} << 20;  // the output and any value built on the way (64 MiB at most)
  uint64_t max_steps = 20'000'000;             // statements, loop iterations, calls, work on big values
  int max_call_depth = 100;                    // nested macro calls
};

struct ChatTemplateRenderOptions {
  ChatTemplateLimits limits;
  // The time strftime_now() formats (local time fields; weekday and day of year are derived).
  // Unset: the local time at the call. Tests set it to get fixed renderings.
  std::optional<std::tm> now;
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> parse(std::string_view source);
  // ChatML (<|im_start|>role\ncontent<|im_end|>\n ...), for models that ship no template.
  static ChatTemplate chatml();

  // Renders with the keys of `context` (a JSON object) as template variables. ordered_json keeps
  // object keys in their order, as Python dicts do (|tojson and dict iteration show it);
  // nlohmann::json sorts them.
  Result<std::string> render(const nlohmann::ordered_json& context, const ChatTemplateRenderOptions& options = {}) const;
  Result<std::string> render(const nlohmann::json& context, const ChatTemplateRenderOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  friend Result<std::string> apply_chat_template(const ChatTemplate&, const nlohmann::ordered_json&, bool,
                                                 const ChatTemplateExtras&);
  Result<std::string> render_variables(const jinja::Dict& variables, const ChatTemplateRenderOptions& options) const;
  ChatTemplate(std::string source, std::shared_ptr<const jinja::Template> tpl)
      : source_(std::move(source)), template_(std::move(tpl)) {}

  std::string source_;
  std::shared_ptr<const jinja::Template> template_;
};

// What apply_chat_template passes besides the messages.
struct ChatTemplateExtras {
  // The tokenizer's special tokens; unset ones are undefined in the template (as transformers
  // leaves out tokens a model does not declare, e.g. Qwen's BOS).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // Tool schemas (a JSON array of {"type": "function", "function": {...}}); null: no tools, which
  // templates see as `tools` = none.
  nlohmann::ordered_json tools;
  nlohmann::ordered_json documents;  // for RAG templates; null: none
  // Extra template variables (enable_thinking, date_string, builtin_tools, ...); they override
  // bos_token/eos_token of the same name.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  ChatTemplateRenderOptions render;
};

// transformers' apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False,
// **variables): `messages` is a JSON array of message objects; keys whose value is null are
// dropped first (so "content": null reads as undefined) and reasoning given as
// "reasoning_content", "thinking" or "reasoning" is visible under the first two names.
Result<std::string> apply_chat_template(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                                        bool add_generation_prompt, const ChatTemplateExtras& extras = {});

// The tokenizer's BOS and (declared) EOS token text, for ChatTemplateExtras.
ChatTemplateExtras chat_template_extras(const Tokenizer& tokenizer);

// The tokenizer's own template, or the built-in ChatML template (with a log line saying so) when
// it has none.
Result<ChatTemplate> load_chat_template(const Tokenizer& tokenizer);

// The source of ChatTemplate::chatml().
std::string_view chatml_template_source();

}  // namespace tachyon
