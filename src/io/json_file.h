// Reading JSON files and strings into nlohmann::json with errors as Status: a parse error
// names the file and the line, column and byte where parsing stopped. nlohmann's exceptions
// never escape this file's functions.
//
// Hostile input: nesting is limited to kMaxJsonDepth before nlohmann sees the text, so every
// recursive walk over a parsed value (dump, the tokenizer's Sequence parsers, the chat
// template's values) stays far from the end of the stack; and error messages quote a value
// through json_excerpt, which never dumps an array or object.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tachyon {

// The deepest nesting of arrays and objects accepted. Real configs, tokenizers and requests
// nest fewer than 20 levels.
inline constexpr int kMaxJsonDepth = 256;

// kCorruptFile if `text` nests arrays/objects deeper than kMaxJsonDepth (naming the limit and
// where it was passed); Ok otherwise, also for text that is not valid JSON (the parser reports
// that). Linear, no allocation.
Status check_json_depth(std::string_view text, const std::string& origin);

// Parses `text`; `origin` names where it came from in messages (a path, or "path: header").
Result<nlohmann::json> parse_json(std::string_view text, const std::string& origin);
// Reads and parses a whole file. NotFound if the file is absent.
Result<nlohmann::json> read_json_file(const std::string& path);

// A value as an error message shows it: numbers, booleans and null as JSON, a string quoted and
// cut to kMaxEchoBytes, an array or object by kind and size ("an array of 3 elements") — never
// dumped, since it may be megabytes or deeply nested. Works for json and ordered_json.
template <typename Json>
std::string json_excerpt(const Json& value) {
  if (value.is_array()) return fmt::format("an array of {} elements", value.size());
  if (value.is_object()) return fmt::format("an object of {} members", value.size());
  if (value.is_string()) return "\"" + excerpt(value.template get_ref<const std::string&>()) + "\"";
  if (value.is_binary()) return "binary data";
  return value.dump();  // a number, boolean or null: short
}

}  // namespace tachyon
