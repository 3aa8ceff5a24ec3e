// GBNF text -> Grammar: llama.cpp's grammar syntax, for requests that bring their own grammar.
//
//   root   ::= object                     # a rule; '#' starts a comment
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= [a-z_]+ ":" ws [0-9]{1,3}
//   ws     ::= [ \t\n]{0,4}
//
// Literals "..." and classes [a-z], [^"\\] take the escapes \n \r \t \\ \" \' \[ \] \- \^ \/ \xHH \uHHHH
// \UHHHHHHHH; `.` is any code point; ( ) groups; | alternates; * + ? {m} {m,} {m,n} repeat. Newlines are
// whitespace: a rule runs until the next `name ::=`. Text is UTF-8 and is matched as code points.
// Must never: accept a grammar the matcher cannot run (GrammarBuilder's checks apply), or abort — every
// error is kInvalidArgument with line:column.
#pragma once

#include <string_view>

#include "core/status.h"
#include "sampling/grammar.h"

namespace tachyon {

// The deepest nesting of parentheses accepted (a guard for the recursive-descent parser).
inline constexpr int kMaxGbnfNesting = 128;

// Adds the rules of `text` to `builder` (so grammars can be combined with generated rules).
Status parse_gbnf_rules(std::string_view text, GrammarBuilder& builder);

// Parses `text` and builds it with `root` as the start rule.
Result<Grammar> parse_gbnf(std::string_view text, std::string_view root = "root", GrammarLimits limits = {});

}  // namespace tachyon
