// JSON Schema -> Grammar, for response_format {type: json_schema} and {type: json_object}.
//
// Supported (anything else that changes validity is refused with a Status naming the keyword and where it is):
//   type (one or a list), enum, const, anyOf / oneOf (as alternation: oneOf's "exactly one" is not enforced, so
//   give it disjoint branches), allOf of one schema, $ref to "#", "#/$defs/..", "#/definitions/.." or any local
//   JSON pointer (recursion allowed), boolean schema true.
//   object: properties (emitted in schema order; optional ones may be left out), required (names not in
//     properties take additionalProperties' schema, or any value), additionalProperties false / true / schema.
//     When additionalProperties is absent: strict mode (the default, OpenAI's structured outputs) means false;
//     non-strict means any extra key/value pairs. Extra pairs come after the declared ones, with keys that are
//     none of the declared names (spelled with \u escapes only once off every declared name's path). Extra keys
//     may repeat one another: a context-free grammar cannot remember which ones it wrote.
//   array: items, prefixItems (all prefix items are emitted), minItems, maxItems; uniqueItems false.
//   string: minLength, maxLength (code points), pattern (ECMAScript subset of regex_grammar.h, search semantics:
//     unanchored ends allow any text), format date, time, date-time, uuid, email, ipv4 (loosely: date allows
//     Feb 29 in any year). A pattern or format together with a length bound is refused (no intersection is built).
//   number / integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers in draft 6+, booleans in
//     draft 4). Integers: exact for any int64 bound. Numbers: exact for whole-number bounds (then written
//     without exponent); fractional bounds on a number are refused. multipleOf is refused.
// Ignored (annotations): title, description, examples, default, $schema, $id, id, $comment, deprecated,
//   readOnly, writeOnly, contentEncoding, contentMediaType, and keywords JSON Schema does not define.
// Output shape: keys and values in JSON syntax, strings written with the short escapes (\" \\ \n \r \t \b \f)
// or \u00XX for other control characters (no \u escapes of surrogates). Between tokens at most
// max_whitespace characters of [ \t\n] — bounded on purpose: with unbounded whitespace a model can loop on
// blanks forever. Unbounded numbers have at most 16 integer digits, 16 fraction digits and a 2-digit exponent.
// Must never: accept a schema it would enforce differently from a validator (except oneOf's exclusivity and
// the annotation-only keywords above), or abort on a user's schema.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string_view>

#include "core/status.h"
#include "sampling/grammar.h"

namespace tachyon {

struct JsonSchemaOptions {
  bool strict = true;       // additionalProperties absent means false (see the file comment)
  int max_whitespace = 20;  // whitespace characters allowed between two JSON tokens; 0: compact JSON
  int max_depth = 64;       // schema nesting (through properties, items, anyOf...) before an error
  GrammarLimits limits;
};

// Properties are emitted in the schema's order, which an ordered_json keeps (parse requests with it).
Result<Grammar> json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
// nlohmann::json sorts object keys: properties then come in alphabetical order.
Result<Grammar> json_schema_to_grammar(const nlohmann::json& schema, const JsonSchemaOptions& options = {});
// `schema_text` is parsed (keeping key order) first; a parse error is kInvalidArgument with the position.
Result<Grammar> json_schema_to_grammar(std::string_view schema_text, const JsonSchemaOptions& options = {});

// Adds the rules of `schema` to `builder`, its value as the rule `rule_name` (a GBNF name not defined yet), so that
// a caller can wrap JSON values in other text or combine several schemas in one grammar. Helper rules get fresh
// names from builder.unique_name(); each call adds its own copy of the common JSON rules (whitespace, strings...).
// $refs resolve against `schema`. json_schema_to_grammar() is this with rule "root" in a fresh builder.
Status add_json_schema_rules(const nlohmann::ordered_json& schema, GrammarBuilder& builder,
                             const std::string& rule_name, const JsonSchemaOptions& options = {});

// Any JSON object (response_format json_object): the root is an object, values are any JSON.
Result<Grammar> json_object_grammar(const JsonSchemaOptions& options = {});

}  // namespace tachyon
