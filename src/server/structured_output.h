// The structured-output fields of /v1/completions and /v1/chat/completions, read into the grammar
// the request's output must follow (GenerationParams::grammar):
//   response_format     {"type": "text"} (no constraint), {"type": "json_object"} (any JSON
//                       object), {"type": "json_schema", "json_schema": {"name", "schema",
//                       "strict", "description"}} (JSON valid under the schema; strict: properties
//                       the schema does not declare are refused unless additionalProperties says
//                       otherwise; without it they are allowed where the schema does not forbid them)
//   guided_json         vLLM: a schema (object or JSON text), not strict; guided_regex (the whole
//                       output matches); guided_grammar (GBNF, root rule "root"); guided_choice (a
//                       list of strings: exactly one of them)
//   structured_outputs  vLLM's newer form: {"json" | "regex" | "grammar" | "choice" | "json_object"}
//   guided_decoding_backend  accepted and ignored: there is one grammar engine
// At most one constraint per request (a 400 names the two fields). A schema, regex or grammar the
// compiler refuses is a 400 whose param is the field and whose message says what and where.
// Compiled grammars come from the server's GrammarCache: requests with the same constraint share one.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "sampling/output_constraint.h"
#include "server/openai_api.h"

namespace tachyon::server {

// Sets p.grammar from `body` (left null when the body asks for no constraint). `cache` null: the
// server does not do structured output, and a field that asks for it is refused.
std::optional<ApiError> read_structured_output(const nlohmann::ordered_json& body, GrammarCache* cache,
                                               GenerationParams& p);

// The constraint `body` asks for, not compiled, and the field that asked; nullopt constraint for
// none. Shared with the tool-call layer, which builds its own.
std::optional<ApiError> read_output_constraint(const nlohmann::ordered_json& body,
                                               std::optional<OutputConstraint>& constraint, const char*& field_name);

}  // namespace tachyon::server
