// Tool calling: request fields, template cues, message preparation, the output parser and the forcing grammar.
// See tool_calls.h for the formats and the rules each part follows.
#include "server/tool_calls.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <utility>

namespace tachyon::server {

namespace {

using ojson = nlohmann::ordered_json;

// The deepest JSON a call's text or a tool_calls arguments string may nest before it is not parsed (parsing
// recurses); the request body itself is held to the same bound by the server.
constexpr int kMaxCallJsonDepth = 64;
constexpr size_t kMaxToolNameLength = 64;

template <typename... Args>
Status invalid(fmt::format_string<Args...> format, Args&&... args) {
  return Status(ErrorCode::kInvalidArgument, fmt::format(format, std::forward<Args>(args)...));
}

// A JSON value as an error message quotes it.
std::string quoted(const ojson& value) {
  return excerpt(value.dump(-1, ' ', false, ojson::error_handler_t::replace));
}

const ojson* field(const ojson& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

bool is_tool_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxToolNameLength) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The nesting depth of JSON `text` (brackets inside strings aside), counting stopped past `limit`.
int json_depth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

// `text` parsed as JSON when it is JSON no deeper than kMaxCallJsonDepth; nullopt otherwise.
std::optional<ojson> parse_json(std::string_view text) {
  if (json_depth(text, kMaxCallJsonDepth) > kMaxCallJsonDepth) return std::nullopt;
  ojson value = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

// One function of `tools` (where = "tools[i].function") or of the legacy `functions` (where = "functions[i]").
Result<ToolSpec> read_function(const ojson& f, const std::string& where) {
  if (!f.is_object()) return invalid("{} must be an object, got {}", where, f.type_name());
  ToolSpec spec;
  const ojson* name = field(f, "name");
  if (name == nullptr) return invalid("{}.name is required", where);
  if (!name->is_string()) return invalid("{}.name must be a string, got {}", where, quoted(*name));
  spec.name = name->get<std::string>();
  if (!is_tool_name(spec.name)) {
    return invalid("{}.name '{}' must be 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-'", where,
                   excerpt(spec.name));
  }
  if (const ojson* description = field(f, "description")) {
    if (!description->is_string()) return invalid("{}.description must be a string", where);
    spec.description = description->get<std::string>();
  }
  if (const ojson* parameters = field(f, "parameters")) {
    if (!parameters->is_object()) {
      return invalid("{}.parameters must be a JSON Schema object, got {}", where, quoted(*parameters));
    }
    const ojson* type = field(*parameters, "type");
    if (type != nullptr && *type != ojson("object")) {
      return invalid("{}.parameters must describe an object (\"type\": \"object\"), got \"type\": {}", where,
                     quoted(*type));
    }
    spec.parameters = *parameters;
  }
  if (const ojson* strict = field(f, "strict")) {
    if (!strict->is_boolean()) return invalid("{}.strict must be a boolean", where);
    spec.strict = strict->get<bool>();
  }
  return spec;
}

// A named choice's function name: tool_choice {"type": "function", "function": {"name"}} or function_call {"name"}.
Result<std::string> read_named_choice(const ojson& v, const char* key, bool legacy) {
  const ojson* holder = &v;
  if (!legacy) {
    const ojson* type = field(v, "type");
    if (type == nullptr || *type != ojson("function")) {
      return invalid("{}.type must be 'function', got {}", key, type == nullptr ? "nothing" : quoted(*type));
    }
    holder = field(v, "function");
    if (holder == nullptr || !holder->is_object()) {
      return invalid("{}.function must be an object with the function's name", key);
    }
  }
  const ojson* name = field(*holder, "name");
  const char* name_field = legacy ? "name" : "function.name";
  if (name == nullptr || !name->is_string()) return invalid("{}.{} must be a string", key, name_field);
  return name->get<std::string>();
}

Status read_choice(const ojson& v, const char* key, bool legacy, ToolRequest& out) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "none") {
      out.choice = ToolChoiceMode::kNone;
    } else if (s == "auto") {
      out.choice = ToolChoiceMode::kAuto;
    } else if (s == "required" && !legacy) {
      out.choice = ToolChoiceMode::kRequired;
    } else {
      return invalid("{} must be {}or an object naming a function, got '{}'", key,
                     legacy ? "'none', 'auto' " : "'none', 'auto', 'required' ", excerpt(s));
    }
  } else if (v.is_object()) {
    TACHYON_ASSIGN_OR_RETURN(out.named_tool, read_named_choice(v, key, legacy));
    out.choice = ToolChoiceMode::kNamed;
  } else {
    return invalid("{} must be a string or an object, got {}", key, quoted(v));
  }
  const char* list = legacy ? "functions" : "tools";
  if (out.choice == ToolChoiceMode::kRequired && out.tools.empty()) {
    return invalid("{} 'required' needs a non-empty '{}' list", key, list);
  }
  if (out.choice == ToolChoiceMode::kNamed) {
    const bool known = std::any_of(out.tools.begin(), out.tools.end(),
                                   [&](const ToolSpec& t) { return t.name == out.named_tool; });
    if (!known) return invalid("{} names function '{}', which is not in '{}'", key, excerpt(out.named_tool), list);
  }
  return Status::Ok();
}

}  // namespace

Result<ToolRequest> parse_tool_request(const ojson& body) {
  ToolRequest out;
  const ojson* tools = field(body, "tools");
  const ojson* functions = field(body, "functions");
  const ojson* tool_choice = field(body, "tool_choice");
  const ojson* function_call = field(body, "function_call");
  // An empty list and "none" ask for nothing: clients send them beside the other family's fields.
  const auto asks = [](const ojson* v) {
    return v != nullptr && !(v->is_array() && v->empty()) && !(v->is_string() && *v == "none");
  };
  if (asks(tools) && asks(functions)) return invalid("functions cannot be given together with 'tools'");
  if (asks(tool_choice) && asks(functions)) {
    return invalid("tool_choice applies to 'tools'; with the legacy 'functions' use 'function_call'");
  }
  if (asks(function_call) && asks(tool_choice)) {
    return invalid("function_call cannot be given together with 'tool_choice'");
  }
  if (asks(function_call) && asks(tools)) {
    return invalid("function_call applies to the legacy 'functions'; with 'tools' use 'tool_choice'");
  }
  out.legacy_functions = asks(functions) || (asks(function_call) && !asks(tool_choice));
  const ojson* list = out.legacy_functions ? functions : tools;
  const char* list_name = out.legacy_functions ? "functions" : "tools";
  if (list != nullptr) {
    if (!list->is_array()) return invalid("{} must be a list, got {}", list_name, list->type_name());
    for (size_t i = 0; i < list->size(); ++i) {
      const ojson& item = (*list)[i];
      std::string where = fmt::format("{}[{}]", list_name, i);
      if (!out.legacy_functions) {
        if (!item.is_object()) return invalid("{} must be an object, got {}", where, item.type_name());
        const ojson* type = field(item, "type");
        if (type == nullptr || *type != ojson("function")) {
          return invalid("{}.type must be 'function', got {}", where, type == nullptr ? "nothing" : quoted(*type));
        }
        const ojson* function = field(item, "function");
        where += ".function";
        if (function == nullptr) return invalid("{} is required", where);
        TACHYON_ASSIGN_OR_RETURN(ToolSpec spec, read_function(*function, where));
        out.tools.push_back(std::move(spec));
      } else {
        TACHYON_ASSIGN_OR_RETURN(ToolSpec spec, read_function(item, where));
        out.tools.push_back(std::move(spec));
      }
      for (size_t j = 0; j + 1 < out.tools.size(); ++j) {
        if (out.tools[j].name == out.tools.back().name) {
          return invalid("{}.name '{}' is the name of {}[{}] too; names must be unique", where, out.tools.back().name,
                         list_name, j);
        }
      }
    }
  }
  out.choice = out.tools.empty() ? ToolChoiceMode::kNone : ToolChoiceMode::kAuto;
  if (const ojson* choice = out.legacy_functions ? function_call : tool_choice) {
    TACHYON_RETURN_IF_ERROR(read_choice(*choice, out.legacy_functions ? "function_call" : "tool_choice",
                                        out.legacy_functions, out));
  }
  if (const ojson* parallel = field(body, "parallel_tool_calls")) {
    if (!parallel->is_boolean()) return invalid("parallel_tool_calls must be a boolean, got {}", quoted(*parallel));
    out.parallel_tool_calls = parallel->get<bool>();
  }
  return out;
}

ojson tools_template_json(std::span<const ToolSpec> tools) {
  ojson out = ojson::array();
  for (const ToolSpec& tool : tools) {
    ojson function = ojson::object();
    function["name"] = tool.name;
    if (!tool.description.empty()) function["description"] = tool.description;
    if (!tool.parameters.is_null()) function["parameters"] = tool.parameters;
    ojson item = ojson::object();
    item["type"] = "function";
    item["function"] = std::move(function);
    out.push_back(std::move(item));
  }
  return out;
}

// ---- Formats and templates ---------------------------------------------------------------------------------------

namespace {

struct FormatSyntax {
  std::string_view start_marker;  // starts a call anywhere in the output
  char bare_opener;               // starts a call without the marker at the output's start ('\0': never)
  char json_opener;               // the call JSON's first character: '{' (one call) or '[' (a list of calls)
  std::string_view end_marker;    // dropped after a call ("": none)
};

FormatSyntax syntax_of(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return {"<tool_call>", '\0', '{', "</tool_call>"};
    case ToolCallFormat::kLlamaJson:
      return {"<|python_tag|>", '{', '{', ";"};
    case ToolCallFormat::kMistral:
      return {"[TOOL_CALLS]", '[', '[', ""};
  }
  return {"<tool_call>", '\0', '{', "</tool_call>"};
}

bool is_identifier_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

}  // namespace

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlamaJson:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "hermes";
}

ToolCallFormat detect_tool_call_format(std::string_view source) {
  const auto mentions = [&](std::string_view cue) { return source.find(cue) != std::string_view::npos; };
  if (mentions("[TOOL_CALLS]")) return ToolCallFormat::kMistral;
  if (mentions("<tool_call>")) return ToolCallFormat::kHermes;
  if (mentions("<|python_tag|>") || mentions("\"parameters\"") || mentions("Given the following functions")) {
    return ToolCallFormat::kLlamaJson;
  }
  return ToolCallFormat::kHermes;
}

bool template_renders_tools(std::string_view source) {
  size_t pos = 0;
  while (pos + 1 < source.size()) {
    if (source[pos] != '{' || (source[pos + 1] != '{' && source[pos + 1] != '%' && source[pos + 1] != '#')) {
      ++pos;
      continue;
    }
    if (source[pos + 1] == '#') {  // a comment: nothing in it is read
      const size_t end = source.find("#}", pos + 2);
      if (end == std::string_view::npos) return false;
      pos = end + 2;
      continue;
    }
    const std::string_view close = source[pos + 1] == '{' ? "}}" : "%}";
    pos += 2;
    char previous = ' ';
    while (pos < source.size() && source.substr(pos, 2) != close) {
      const char c = source[pos];
      if (c == '\'' || c == '"') {  // a string literal, escapes included
        for (++pos; pos < source.size() && source[pos] != c; ++pos) {
          if (source[pos] == '\\') ++pos;
        }
        ++pos;
        previous = c;
        continue;
      }
      if (is_identifier_char(c)) {  // a whole name (or number): the scan never stops inside one
        size_t end = pos;
        while (end < source.size() && is_identifier_char(source[end])) ++end;
        // `tools`, not an attribute (`message.tools`) or part of another name (`custom_tools`).
        if (source.substr(pos, end - pos) == "tools" && previous != '.') return true;
        previous = source[end - 1];
        pos = end;
        continue;
      }
      if (!is_ws(c)) previous = c;
      ++pos;
    }
    pos += 2;
  }
  return false;
}

std::string tools_system_prompt(std::span<const ToolSpec> tools, ToolCallFormat format) {
  std::string list;
  for (const ojson& tool : tools_template_json(tools)) {
    list += tool.dump(-1, ' ', false, ojson::error_handler_t::replace);
    list += '\n';
  }
  switch (format) {
    case ToolCallFormat::kLlamaJson:
      return "You have access to the following functions. To call a function, respond with only a JSON object in "
             "the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. "
             "To call several, separate the objects with \"; \". Do not use variables.\n\n" +
             list + "\nIf no function call is needed, answer the user directly.";
    case ToolCallFormat::kMistral:
      return "You have access to the following functions:\n" + list +
             "\nTo call functions, respond with [TOOL_CALLS] followed by a JSON list of calls: [TOOL_CALLS] "
             "[{\"name\": function name, \"arguments\": dictionary of argument name and its value}]\n"
             "If no function call is needed, answer the user directly.";
    case ToolCallFormat::kHermes:
      break;
  }
  return "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
         "function signatures within <tools></tools> XML tags:\n<tools>\n" +
         list +
         "</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call>\n\nIf no function call is needed, answer the user directly.";
}

Result<ojson> add_tools_system_prompt(const ojson& messages, std::span<const ToolSpec> tools, ToolCallFormat format) {
  if (!messages.is_array()) return invalid("messages must be a list");
  const std::string prompt = tools_system_prompt(tools, format);
  ojson out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    ojson& m = out[i];
    if (!m.is_object() || m.value("role", ojson()) != ojson("system")) continue;
    const ojson* content = field(m, "content");
    if (content != nullptr && !content->is_string()) {
      return invalid("messages[{}].content must be a string here, got {}", i, content->type_name());
    }
    const std::string text = content == nullptr ? "" : content->get<std::string>();
    m["content"] = text.empty() ? prompt : prompt + "\n\n" + text;
    return out;
  }
  ojson system = ojson::object();
  system["role"] = "system";
  system["content"] = prompt;
  out.insert(out.begin(), std::move(system));
  return out;
}

// ---- Messages ----------------------------------------------------------------------------------------------------

namespace {

// One assistant tool call checked, its arguments string turned into the object it holds.
Status prepare_tool_call(ojson& call, const std::string& where) {
  if (!call.is_object()) return invalid("{} must be an object, got {}", where, call.type_name());
  if (const ojson* type = field(call, "type"); type != nullptr && *type != ojson("function")) {
    return invalid("{}.type must be 'function', got {}", where, quoted(*type));
  }
  if (const ojson* id = field(call, "id"); id != nullptr && !id->is_string()) {
    return invalid("{}.id must be a string, got {}", where, quoted(*id));
  }
  auto function = call.find("function");
  if (function == call.end() || !function->is_object()) return invalid("{}.function must be an object", where);
  const ojson* name = field(*function, "name");
  if (name == nullptr || !name->is_string()) return invalid("{}.function.name must be a string", where);
  auto arguments = function->find("arguments");
  if (arguments == function->end() || !(arguments->is_string() || arguments->is_object())) {
    return invalid("{}.function.arguments must be a string of JSON (or an object)", where);
  }
  if (arguments->is_string()) {
    std::optional<ojson> parsed = parse_json(arguments->get_ref<const std::string&>());
    if (parsed && parsed->is_object()) *arguments = std::move(*parsed);
  }
  return Status::Ok();
}

}  // namespace

Result<ojson> messages_for_template(const ojson& messages) {
  if (!messages.is_array()) return invalid("messages must be a list");
  ojson out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    ojson& m = out[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return invalid("{} must be an object, got {}", where, m.type_name());
    const ojson* role_value = field(m, "role");
    if (role_value == nullptr || !role_value->is_string()) return invalid("{}.role must be a string", where);
    const std::string role = role_value->get<std::string>();
    if (role == "assistant") {
      if (field(m, "tool_calls") == nullptr) {
        if (const ojson* legacy = field(m, "function_call")) {
          ojson call = ojson::object();
          call["type"] = "function";
          call["function"] = *legacy;
          m["tool_calls"] = ojson::array({std::move(call)});
          m.erase("function_call");
        }
      }
      if (const ojson* calls = field(m, "tool_calls")) {
        if (!calls->is_array()) return invalid("{}.tool_calls must be a list, got {}", where, calls->type_name());
        ojson& list = m["tool_calls"];
        for (size_t j = 0; j < list.size(); ++j) {
          TACHYON_RETURN_IF_ERROR(prepare_tool_call(list[j], fmt::format("{}.tool_calls[{}]", where, j)));
        }
      }
    } else if (role == "tool") {
      const ojson* id = field(m, "tool_call_id");
      if (id == nullptr || !id->is_string()) {
        return invalid("{}.tool_call_id must be a string (the id of the call this message answers)", where);
      }
    } else if (role == "function") {
      const ojson* name = field(m, "name");
      if (name == nullptr || !name->is_string()) return invalid("{}.name must be a string", where);
      m["role"] = "tool";
    }
  }
  return out;
}

bool template_renders_tool_calls(std::string_view template_source) {
  return template_source.find("tool_calls") != std::string_view::npos;
}

ojson calls_as_text(const ojson& messages, ToolCallFormat format) {
  ojson out = messages;
  if (!out.is_array()) return out;
  const auto compact = [](const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); };
  for (ojson& m : out) {
    if (!m.is_object()) continue;
    const ojson* content = field(m, "content");
    std::string text = content != nullptr && content->is_string() ? content->get<std::string>() : std::string();
    const ojson* calls = field(m, "tool_calls");
    if (calls != nullptr && calls->is_array() && !calls->empty()) {
      std::vector<std::string> written;
      for (const ojson& call : *calls) {
        const ojson* function = call.is_object() ? field(call, "function") : nullptr;
        if (function == nullptr || !function->is_object()) continue;
        ojson one = ojson::object();
        one["name"] = function->value("name", ojson(""));
        one[format == ToolCallFormat::kLlamaJson ? "parameters" : "arguments"] =
            function->value("arguments", ojson::object());
        written.push_back(compact(one));
      }
      std::string block;
      for (size_t i = 0; i < written.size(); ++i) {
        switch (format) {
          case ToolCallFormat::kHermes:
            block += (i > 0 ? "\n" : "") + ("<tool_call>\n" + written[i] + "\n</tool_call>");
            break;
          case ToolCallFormat::kLlamaJson:
            block += (i > 0 ? "; " : "") + written[i];
            break;
          case ToolCallFormat::kMistral:
            block += (i > 0 ? ", " : "[TOOL_CALLS] [") + written[i];
            break;
        }
      }
      if (format == ToolCallFormat::kMistral && !written.empty()) block += "]";
      text = text.empty() ? block : text + "\n" + block;
      m.erase("tool_calls");
    }
    m["content"] = std::move(text);
  }
  return out;
}

Result<ToolChatInput> prepare_tool_chat(const ojson& messages, const ToolRequest& request,
                                        std::string_view template_source) {
  ToolChatInput out;
  out.format = detect_tool_call_format(template_source);
  TACHYON_ASSIGN_OR_RETURN(out.messages, messages_for_template(messages));
  out.tools = nullptr;
  if (!request.active()) return out;
  if (template_renders_tools(template_source)) {
    out.tools = tools_template_json(request.tools);
  } else {
    TACHYON_ASSIGN_OR_RETURN(out.messages, add_tools_system_prompt(out.messages, request.tools, out.format));
  }
  return out;
}

// ---- Output parsing ----------------------------------------------------------------------------------------------

std::string new_tool_call_id(std::mt19937_64& rng, ToolCallFormat format) {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const bool mistral = format == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id.push_back(kAlphabet[rng() % kAlphabet.size()]);
  return id;
}

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format, std::span<const ToolSpec> tools,
                                           std::mt19937_64 id_rng)
    : format_(format), id_rng_(std::move(id_rng)) {
  for (const ToolSpec& tool : tools) tool_names_.push_back(tool.name);
}

ToolStreamDelta ToolCallStreamParser::feed(std::string_view text) {
  ToolStreamDelta out;
  out.first_index = num_calls_;
  buffer_.append(text);
  step(false, out);
  return out;
}

ToolStreamDelta ToolCallStreamParser::finish() {
  ToolStreamDelta out;
  out.first_index = num_calls_;
  step(true, out);
  if (mode_ == Mode::kCall) abandon_call(out);  // an unfinished call
  step(true, out);
  if (mode_ == Mode::kText) emit_content("", out);  // trailing whitespace of the content
  return out;
}

void ToolCallStreamParser::step(bool at_end, ToolStreamDelta& out) {
  for (;;) {
    bool progressed = false;
    switch (mode_) {
      case Mode::kText:
        progressed = step_text(at_end, out);
        break;
      case Mode::kCall:
        progressed = step_call(out);
        break;
      case Mode::kAfterCall:
        progressed = step_after_call(at_end);
        break;
    }
    if (!progressed) break;
  }
  buffer_.erase(0, read_);
  read_ = 0;
}

void ToolCallStreamParser::emit_content(std::string_view text, ToolStreamDelta& out) {
  out.content += pending_ws_;
  pending_ws_.clear();
  out.content.append(text);
}

bool ToolCallStreamParser::step_text(bool at_end, ToolStreamDelta& out) {
  const std::string_view in = unread();
  if (in.empty()) return false;
  const FormatSyntax syntax = syntax_of(format_);
  if (is_ws(in[0])) {
    size_t n = 0;
    while (n < in.size() && is_ws(in[n])) ++n;
    pending_ws_.append(in.substr(0, n));
    consume(n);
    return true;
  }
  const std::string_view marker = syntax.start_marker;
  if (in.starts_with(marker)) {
    mode_ = Mode::kCall;
    call_text_ = std::string(marker);
    consume(marker.size());
    return true;
  }
  if (!at_end && in.size() < marker.size() && marker.starts_with(in)) return false;  // maybe a marker
  if (at_call_start_ && syntax.bare_opener != '\0' && in[0] == syntax.bare_opener) {
    mode_ = Mode::kCall;
    call_text_.clear();
    return true;
  }
  size_t n = 1;
  while (n < in.size() && !is_ws(in[n]) && in[n] != marker[0]) ++n;
  emit_content(in.substr(0, n), out);
  consume(n);
  at_call_start_ = false;
  return true;
}

bool ToolCallStreamParser::step_call(ToolStreamDelta& out) {
  std::string_view in = unread();
  if (in.empty()) return false;
  size_t i = 0;
  if (call_json_.empty()) {
    while (i < in.size() && is_ws(in[i])) ++i;
    call_text_.append(in.substr(0, i));
    consume(i);
    in = unread();
    if (in.empty()) return false;
    if (in[0] != syntax_of(format_).json_opener) {  // not a call after all; the character is looked at again
      abandon_call(out);
      return true;
    }
    i = 0;
  }
  for (; i < in.size(); ++i) {
    const char c = in[i];
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      if (++json_depth_ > kMaxCallJsonDepth) {
        call_text_.append(in.substr(0, i + 1));
        consume(i + 1);
        abandon_call(out);
        return true;
      }
    } else if (c == '}' || c == ']') {
      if (--json_depth_ == 0) {
        call_text_.append(in.substr(0, i + 1));
        call_json_.append(in.substr(0, i + 1));
        consume(i + 1);
        complete_call(out);
        return true;
      }
    }
  }
  call_text_.append(in);
  call_json_.append(in);
  consume(in.size());
  return false;  // an unfinished call waits for more text; finish() abandons it
}

bool ToolCallStreamParser::step_after_call(bool at_end) {
  const std::string_view in = unread();
  if (in.empty()) return false;
  if (is_ws(in[0])) {
    size_t n = 0;
    while (n < in.size() && is_ws(in[n])) ++n;
    consume(n);
    return true;
  }
  const std::string_view end_marker = syntax_of(format_).end_marker;
  if (!end_marker.empty()) {
    if (in.starts_with(end_marker)) {
      consume(end_marker.size());
      return true;
    }
    if (!at_end && in.size() < end_marker.size() && end_marker.starts_with(in)) return false;
  }
  mode_ = Mode::kText;
  return true;
}

void ToolCallStreamParser::abandon_call(ToolStreamDelta& out) {
  emit_content(call_text_, out);
  mode_ = Mode::kText;
  at_call_start_ = false;
  call_text_.clear();
  call_json_.clear();
  json_depth_ = 0;
  in_string_ = false;
  escaped_ = false;
}

void ToolCallStreamParser::complete_call(ToolStreamDelta& out) {
  // The calls in the JSON: all of them valid, or the whole text stays content.
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  const auto read_call = [&](const ojson& call) {
    if (!call.is_object()) return false;
    auto name = call.find("name");
    if (name == call.end() || !name->is_string()) return false;
    if (std::find(tool_names_.begin(), tool_names_.end(), name->get_ref<const std::string&>()) == tool_names_.end()) {
      return false;
    }
    auto arguments = call.find("arguments");
    if (arguments == call.end()) arguments = call.find("parameters");
    if (arguments != call.end() && !arguments->is_object()) return false;
    calls.emplace_back(name->get<std::string>(), arguments == call.end() ? "{}" : arguments->dump());
    return true;
  };
  bool valid = false;
  if (std::optional<ojson> json = parse_json(call_json_)) {
    if (json->is_array()) {
      valid = !json->empty() && std::all_of(json->begin(), json->end(), read_call);
    } else {
      valid = read_call(*json);
    }
  }
  if (!valid) {
    abandon_call(out);
    return;
  }
  pending_ws_.clear();  // whitespace before a call is not content
  if (out.calls.empty()) out.first_index = num_calls_;
  for (auto& [name, arguments] : calls) {
    out.calls.push_back(ToolCall{new_tool_call_id(id_rng_, format_), std::move(name), std::move(arguments)});
    ++num_calls_;
  }
  mode_ = Mode::kAfterCall;
  at_call_start_ = true;
  call_text_.clear();
  call_json_.clear();
  json_depth_ = 0;
}

ToolCallParse parse_tool_calls(std::string_view text, ToolCallFormat format, std::span<const ToolSpec> tools,
                               std::mt19937_64& id_rng) {
  ToolCallStreamParser parser(format, tools, id_rng);
  ToolStreamDelta fed = parser.feed(text);
  ToolStreamDelta rest = parser.finish();
  id_rng = parser.id_rng();
  ToolCallParse out;
  out.content = std::move(fed.content) + rest.content;
  out.calls = std::move(fed.calls);
  std::move(rest.calls.begin(), rest.calls.end(), std::back_inserter(out.calls));
  return out;
}

ojson tool_calls_json(std::span<const ToolCall> calls) {
  ojson out = ojson::array();
  for (const ToolCall& call : calls) {
    ojson item = ojson::object();
    item["id"] = call.id;
    item["type"] = "function";
    item["function"] = function_call_json(call);
    out.push_back(std::move(item));
  }
  return out;
}

ojson tool_calls_delta_json(const ToolStreamDelta& delta) {
  ojson out = tool_calls_json(delta.calls);
  for (size_t i = 0; i < out.size(); ++i) {
    ojson item = ojson::object();
    item["index"] = delta.first_index + i;
    for (auto& [key, value] : out[i].items()) item[key] = std::move(value);
    out[i] = std::move(item);
  }
  return out;
}

ojson function_call_json(const ToolCall& call) {
  ojson out = ojson::object();
  out["name"] = call.name;
  out["arguments"] = call.arguments;
  return out;
}

// ---- Grammar -----------------------------------------------------------------------------------------------------

Result<Grammar> tool_call_grammar(const ToolRequest& request, ToolCallFormat format,
                                  const JsonSchemaOptions& options) {
  if (!request.forced()) {
    return invalid("tool_choice is not 'required' or a named function: no tool call grammar applies");
  }
  GrammarBuilder builder(options.limits);
  const std::string ws = builder.unique_name("tool-ws");
  // Spaces between the call's own JSON tokens, as many as the schema compiler allows.
  TACHYON_RETURN_IF_ERROR(builder.add_rule(
      ws, options.max_whitespace > 0 ? GrammarExpr::repeat(GrammarExpr::code_point(' '), 0, options.max_whitespace)
                                     : GrammarExpr::empty()));
  const auto lit = [](std::string_view text) { return GrammarExpr::literal(text); };
  const std::string_view arguments_key = format == ToolCallFormat::kLlamaJson ? "parameters" : "arguments";
  std::vector<GrammarExpr> calls;
  for (size_t i = 0; i < request.tools.size(); ++i) {
    const ToolSpec& tool = request.tools[i];
    if (request.choice == ToolChoiceMode::kNamed && tool.name != request.named_tool) continue;
    ojson schema = tool.parameters;
    if (schema.is_null()) {
      schema = ojson{{"type", "object"}, {"additionalProperties", true}};
    } else if (!schema.contains("type")) {
      // Only objects are arguments; a schema that already constrains the kind of value is left as it is.
      static const char* const kKindKeywords[] = {"$ref", "anyOf", "oneOf", "allOf", "enum", "const"};
      if (std::none_of(std::begin(kKindKeywords), std::end(kKindKeywords),
                       [&](const char* k) { return schema.contains(k); })) {
        schema["type"] = "object";
      }
    }
    const std::string arguments_rule = builder.unique_name("tool-arguments");
    const Status added = add_json_schema_rules(schema, builder, arguments_rule, options);
    if (!added.ok()) {
      const std::string where = request.legacy_functions ? fmt::format("functions[{}]", i)
                                                         : fmt::format("tools[{}].function", i);
      return Status(added.code(), fmt::format("{}.parameters cannot be enforced: {}", where, added.message()));
    }
    const GrammarExpr w = GrammarExpr::rule(ws);
    const std::string call_rule = builder.unique_name("tool-call");
    TACHYON_RETURN_IF_ERROR(builder.add_rule(
        call_rule, GrammarExpr::sequence({lit("{"), w, lit("\"name\""), w, lit(":"), w, lit(ojson(tool.name).dump()),
                                          w, lit(","), w, lit(ojson(arguments_key).dump()), w, lit(":"), w,
                                          GrammarExpr::rule(arguments_rule), w, lit("}")})));
    calls.push_back(GrammarExpr::rule(call_rule));
  }
  if (calls.empty()) return invalid("tool_choice names function '{}', which is not in 'tools'", request.named_tool);
  const std::string any_call = builder.unique_name("tool-any-call");
  TACHYON_RETURN_IF_ERROR(builder.add_rule(any_call, GrammarExpr::alternation(std::move(calls))));
  const bool several = request.choice == ToolChoiceMode::kRequired && request.parallel_tool_calls;
  GrammarExpr one = GrammarExpr::rule(any_call);
  GrammarExpr separator;
  GrammarExpr before = GrammarExpr::empty();
  GrammarExpr after = GrammarExpr::empty();
  switch (format) {
    case ToolCallFormat::kHermes:
      one = GrammarExpr::sequence({lit("<tool_call>\n"), std::move(one), lit("\n</tool_call>")});
      separator = lit("\n");
      break;
    case ToolCallFormat::kLlamaJson:
      separator = lit("; ");
      break;
    case ToolCallFormat::kMistral:
      before = GrammarExpr::sequence({lit("["), GrammarExpr::rule(ws)});
      after = GrammarExpr::sequence({GrammarExpr::rule(ws), lit("]")});
      separator = GrammarExpr::sequence({GrammarExpr::rule(ws), lit(","), GrammarExpr::rule(ws)});
      break;
  }
  std::vector<GrammarExpr> root{before, one};
  if (several) root.push_back(GrammarExpr::star(GrammarExpr::sequence({separator, one})));
  root.push_back(after);
  const std::string root_name = builder.unique_name("root");
  TACHYON_RETURN_IF_ERROR(builder.add_rule(root_name, GrammarExpr::sequence(std::move(root))));
  Result<Grammar> grammar = builder.build(root_name);
  if (!grammar.ok()) return grammar.status().with_context("tool call grammar");
  return grammar;
}

}  // namespace tachyon::server
