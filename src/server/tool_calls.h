// Tool calling for /v1/chat/completions: the request's tools, the prompt they go into, the output they come back
// from, and the grammar that forces a call. Nothing here touches the engine or the network.
//
// Request. `tools` ([{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}]) and
// `tool_choice` ("none" | "auto" | "required" | {"type": "function", "function": {"name"}}), or the legacy
// `functions` ([{"name", "description"?, "parameters"?}]) and `function_call` ("none" | "auto" | {"name"}), which
// map onto the same ToolRequest; `parallel_tool_calls` (bool). tool_choice defaults to "auto" with tools and "none"
// without. Names match [a-zA-Z0-9_-]{1,64} and are unique; parameters is a JSON Schema object whose "type", when
// given, is "object" (absent: any JSON object). Every mistake is a kInvalidArgument Status whose message starts
// with the field it names ("tools[1].function.name ..."), for the caller's 400 (its param is the first word).
// "none" leaves the tools out of the prompt and the output is plain content.
//
// Formats. The chat template's source says how its model writes calls (detect_tool_call_format):
//   kHermes    <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, one block per call
//              (Hermes, Qwen2.5, Qwen3: the template mentions <tool_call>). Also the fallback for templates
//              with no tool section: their system prompt is then told this format (add_tools_system_prompt).
//   kLlamaJson {"name": "f", "parameters": {...}} at the start of the output (or after a call) or after
//              <|python_tag|>, several separated by ';' (Llama 3.1-3.3: the template mentions <|python_tag|>,
//              "parameters" or "Given the following functions"). "arguments" is accepted for "parameters".
//   kMistral   [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...] (the template mentions [TOOL_CALLS]); the
//              array alone at the start of the output counts too, since [TOOL_CALLS] is a special token that a
//              grammar cannot produce and detokenization may drop.
// A call's JSON is an object with "name" (a requested tool) and "arguments" / "parameters" (an object; absent
// means {}). Anything else where a call could start (an unknown name, malformed or unfinished JSON) stays content,
// as vLLM does. Whitespace (and kHermes' </tool_call>, which may be missing, and kLlamaJson's ';') around a
// recognized call is dropped from the content; an output with no calls is its content byte for byte.
//
// Parsing. ToolCallStreamParser sees the output as text deltas split anywhere (inside markers too) and returns
// content deltas and whole calls in OpenAI's streaming shape: text that could still start a call is held back until
// it is decided, and a call is sent in one delta (index, id, type, name, all its arguments) once its JSON is
// complete; finish() hands back what is held. parse_tool_calls() is the same parser over the whole text, so joining
// the deltas of any split gives exactly its result. Call ids come from the caller's random generator
// (new_tool_call_id).
//
// Grammar. tool_call_grammar() is the language of "required" (one or more calls; one when parallel_tool_calls is
// false) or of a named function (exactly one call of it), in the format's own syntax (calls joined by "\n",
// "; " or ", "), each call's arguments compiled from its tool's parameters by the JSON Schema compiler
// (sampling/json_schema.h; parameters without "type" are taken as objects). kMistral's grammar is the JSON array
// alone (see above). Its errors are the request's (a 400 naming the tool's parameters).
//
// Must never: abort on a request's tools, messages or a model's output; turn text into a call that names a tool
// the request did not give.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "sampling/grammar.h"
#include "sampling/json_schema.h"

namespace tachyon::server {

struct ToolSpec {
  std::string name;                   // [a-zA-Z0-9_-]{1,64}
  std::string description;            // empty: none given
  nlohmann::ordered_json parameters;  // a JSON Schema object; null: not given (any JSON object)
  bool strict = false;                // as given (the grammar takes its own JsonSchemaOptions)
};

enum class ToolChoiceMode {
  kNone,      // no calls: tools left out of the prompt, output is content
  kAuto,      // the model decides; calls are parsed out of the output
  kRequired,  // one or more calls, forced by tool_call_grammar()
  kNamed,     // exactly one call of ToolRequest::named_tool, forced likewise
};

struct ToolRequest {
  std::vector<ToolSpec> tools;  // from `tools` or from the legacy `functions`
  ToolChoiceMode choice = ToolChoiceMode::kNone;
  std::string named_tool;  // kNamed: a name in `tools`
  bool parallel_tool_calls = true;
  bool legacy_functions = false;  // from `functions`: answer with message.function_call (the first call)

  // Whether the prompt shows the tools and the output is parsed for calls.
  bool active() const { return choice != ToolChoiceMode::kNone && !tools.empty(); }
  // Whether decoding follows tool_call_grammar().
  bool forced() const { return choice == ToolChoiceMode::kRequired || choice == ToolChoiceMode::kNamed; }
};

// Reads tools / tool_choice / functions / function_call / parallel_tool_calls of a request `body` (an object).
// Null fields count as absent.
Result<ToolRequest> parse_tool_request(const nlohmann::ordered_json& body);

// The tools as chat templates take them (ChatTemplateExtras::tools): [{"type": "function", "function": {"name",
// "description"?, "parameters"?}}], in request order.
nlohmann::ordered_json tools_template_json(std::span<const ToolSpec> tools);

enum class ToolCallFormat { kHermes, kLlamaJson, kMistral };
std::string_view tool_call_format_name(ToolCallFormat format);  // "hermes", "llama3_json", "mistral", for logs

// The format a chat template's source text asks its model to call tools in (the file comment lists the cues).
ToolCallFormat detect_tool_call_format(std::string_view template_source);
// Whether the template reads the `tools` variable in a {{ }} or {% %} block (string literals and comments aside).
bool template_renders_tools(std::string_view template_source);

// The system-message text that lists `tools` and the exact syntax of a call in `format`.
std::string tools_system_prompt(std::span<const ToolSpec> tools, ToolCallFormat format);
// `messages` with tools_system_prompt() put before the first system message's content (a string or null), or as
// a new system message in front when there is none: for templates that do not render `tools`.
Result<nlohmann::ordered_json> add_tools_system_prompt(const nlohmann::ordered_json& messages,
                                                       std::span<const ToolSpec> tools, ToolCallFormat format);

// A copy of `messages` (contents already flattened) for the chat template: assistant tool_calls[].function.arguments
// given as a JSON string (OpenAI's way) become the object it holds (templates |tojson them); a string that is not
// a JSON object stays a string. A legacy assistant function_call becomes a one-call tool_calls, a legacy
// "function" message a "tool" message. "tool" messages are kept as they are. Checks: tool_calls is a list of
// {"id"?: string, "type"?: "function", "function": {"name": string, "arguments": string | object}}; a "tool"
// message has a string tool_call_id. Errors name the message ("messages[2].tool_calls[0].function.name ...").
Result<nlohmann::ordered_json> messages_for_template(const nlohmann::ordered_json& messages);

// Whether the template writes assistant messages' tool calls (mentions "tool_calls").
bool template_renders_tool_calls(std::string_view template_source);
// For a template that does not (calls_as_text): `messages` (as messages_for_template() leaves them)
// with each assistant message's calls written into its content in `format`'s syntax, as the
// system prompt told the model to write them, and every null or missing content made "" (such
// templates concatenate contents).
nlohmann::ordered_json calls_as_text(const nlohmann::ordered_json& messages, ToolCallFormat format);

// What apply_chat_template gets for a tool request: messages_for_template(), with the tools either as the template's
// `tools` (when it renders them) or in the system prompt (when it does not); `format` from the template.
struct ToolChatInput {
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // for ChatTemplateExtras::tools; null: none
  ToolCallFormat format = ToolCallFormat::kHermes;
};
Result<ToolChatInput> prepare_tool_chat(const nlohmann::ordered_json& messages, const ToolRequest& request,
                                        std::string_view template_source);

struct ToolCall {
  std::string id;         // "call_" + 24 alphanumerics (kMistral: 9 alphanumerics)
  std::string name;       // one of the request's tools
  std::string arguments;  // compact JSON text of an object
  bool operator==(const ToolCall&) const = default;
};

// "call_" + 24 characters of [A-Za-z0-9] drawn from `rng`; for kMistral 9 characters alone (its
// template refuses other ids in the calls a client sends back).
std::string new_tool_call_id(std::mt19937_64& rng, ToolCallFormat format = ToolCallFormat::kHermes);

// A finished output split into its text and its calls.
struct ToolCallParse {
  std::string content;  // empty: null in the API when there are calls
  std::vector<ToolCall> calls;
};
// Ids come from `id_rng` in call order (the same draws a ToolCallStreamParser with an equal generator makes).
ToolCallParse parse_tool_calls(std::string_view text, ToolCallFormat format, std::span<const ToolSpec> tools,
                               std::mt19937_64& id_rng);

// What one feed() or finish() releases: content text and the calls completed, numbered from `first_index` on.
struct ToolStreamDelta {
  std::string content;
  std::vector<ToolCall> calls;
  size_t first_index = 0;  // the index of calls[0] among all the output's calls
  bool empty() const { return content.empty() && calls.empty(); }
};

class ToolCallStreamParser {
 public:
  ToolCallStreamParser(ToolCallFormat format, std::span<const ToolSpec> tools, std::mt19937_64 id_rng);

  // The next piece of output text, split anywhere. Content comes back cut where the input was or at ASCII bytes.
  ToolStreamDelta feed(std::string_view text);
  // The end of the output: releases what is held (as content unless it completed a call).
  ToolStreamDelta finish();

  size_t num_calls() const { return num_calls_; }
  const std::mt19937_64& id_rng() const { return id_rng_; }

 private:
  enum class Mode {
    kText,       // content; holds trailing whitespace and a possible marker start
    kCall,       // inside a call candidate: marker? whitespace* JSON extent
    kAfterCall,  // dropping whitespace and end markers / separators after a call
  };
  void step(bool at_end, ToolStreamDelta& out);
  bool step_text(bool at_end, ToolStreamDelta& out);
  bool step_call(ToolStreamDelta& out);
  bool step_after_call(bool at_end);
  void abandon_call(ToolStreamDelta& out);  // the held candidate becomes content
  void emit_content(std::string_view text, ToolStreamDelta& out);
  void complete_call(ToolStreamDelta& out);
  std::string_view unread() const { return std::string_view(buffer_).substr(read_); }
  void consume(size_t n) { read_ += n; }

  ToolCallFormat format_;
  std::vector<std::string> tool_names_;
  std::mt19937_64 id_rng_;
  std::string buffer_;      // received; bytes from read_ on are not looked at yet
  size_t read_ = 0;
  std::string pending_ws_;  // whitespace after content: dropped if a call follows
  Mode mode_ = Mode::kText;
  bool at_call_start_ = true;  // a bare '{' (kLlamaJson) or '[' (kMistral) starts a call here
  // The call candidate: its text so far (marker included) and the JSON extent's scan state.
  std::string call_text_;
  std::string call_json_;
  int json_depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
  size_t num_calls_ = 0;
};

// The message's "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}].
nlohmann::ordered_json tool_calls_json(std::span<const ToolCall> calls);
// A streamed delta's "tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}].
nlohmann::ordered_json tool_calls_delta_json(const ToolStreamDelta& delta);
// The legacy message's "function_call": {"name", "arguments"}.
nlohmann::ordered_json function_call_json(const ToolCall& call);

// The grammar of a forced request (request.forced()) in `format`; `options` apply to every tool's parameters.
// A parameters schema the compiler refuses is an error naming it ("tools[0].function.parameters cannot be ...").
Result<Grammar> tool_call_grammar(const ToolRequest& request, ToolCallFormat format,
                                  const JsonSchemaOptions& options = {});

}  // namespace tachyon::server
