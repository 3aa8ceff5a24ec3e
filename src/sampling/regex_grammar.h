// Regex -> grammar, for `guided_regex` requests and JSON Schema string `pattern`s. The ECMAScript subset whose
// language is regular and needs no backtracking state:
//   literals (UTF-8), `.` (any code point but \n \r U+2028 U+2029), classes [a-z] [^"\\] (with \d \w \s inside),
//   escapes \d \w \s \D \W \S \t \n \r \v \f \0 \xHH \uHHHH \cX and escaped punctuation, groups ( ) (?: )
//   (?<name> ), alternation |, quantifiers * + ? {m} {m,} {m,n} (lazy forms accepted: same language),
//   anchors ^ at the start and $ at the end of a top-level alternative.
// Refused with a Status naming the construct: backreferences, lookahead/lookbehind, word boundaries, inline
// flags, Unicode property classes, possessive quantifiers, anchors anywhere else, an unescaped '{' that starts
// no repetition. \d \w \s are ASCII/ECMAScript sets (no Unicode digits).
// A repetition of something that can match "" is rewritten to repeat its non-empty part (same language), so
// the result is never left-recursive.
// Must never: accept a pattern whose language would differ from ECMAScript's, or abort on a pattern.
#pragma once

#include <string_view>

#include "core/status.h"
#include "sampling/grammar.h"

namespace tachyon {

enum class RegexMatchMode {
  kFullMatch,  // the whole text must match (guided_regex); ^ and $ change nothing
  kSearch,     // the text must contain a match (JSON Schema `pattern`); unanchored ends match anything
};

// The deepest group nesting accepted.
inline constexpr int kMaxRegexNesting = 128;

// The language of `pattern` as an expression over code points (no rule references).
Result<GrammarExpr> regex_to_expr(std::string_view pattern, RegexMatchMode mode);

// A grammar whose root matches the text `pattern` matches (full match).
Result<Grammar> regex_to_grammar(std::string_view pattern, GrammarLimits limits = {});

// Helpers on reference-free expressions, shared with the JSON Schema compiler.
bool expr_is_nullable(const GrammarExpr& expr);           // matches ""
GrammarExpr expr_without_empty(const GrammarExpr& expr);  // the same language minus ""

}  // namespace tachyon
