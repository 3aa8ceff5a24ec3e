// Tokenizer of the Jinja template language as jinja2's lexer splits it, with the environment
// transformers renders chat templates in: trim_blocks and lstrip_blocks on, default delimiters,
// no line statements, newlines normalized to "\n" and one trailing newline dropped.
//
// Whitespace control is resolved here, so the parser sees final text: "{%-"/"{{-"/"{#-" strip
// the whitespace before the tag, "-%}"/"-}}"/"-#}" the whitespace after it; trim_blocks drops the
// first newline after a block or comment tag; lstrip_blocks drops spaces and tabs between the start
// of a line and a block or comment tag; "+" on either side turns the last two off for that tag.
// Comments disappear and {% raw %} bodies become text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tachyon::jinja {

enum class TokenKind {
  kText,           // template data between tags
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,   // text holds the decoded value
  kInteger,  // integer holds the value
  kFloat,    // number holds the value
  kOperator,
  kEnd,  // end of the template
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;
  int64_t integer = 0;
  double number = 0.0;
  int line = 1;
  int column = 1;
};

// The whole template as tokens, ending with one kEnd. Errors carry "line L, column C".
Result<std::vector<Token>> tokenize(std::string_view source);

// Python's str.isspace() for the code point at `pos` of `s`; `*length` receives its byte length.
bool is_python_space_at(std::string_view s, size_t pos, size_t* length);

}  // namespace tachyon::jinja
