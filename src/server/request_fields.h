// The known-field policy of /v1/completions and /v1/chat/completions: every top-level field of a
// request body is one the endpoint understands, or the request gets a 400 invalid_request_error
// whose message and param name the field. Nothing is silently ignored.
//
// "Understands" means one of: honoured (parsed in openai_api.cpp into the engine's parameters);
// a no-op by OpenAI's own semantics (user, metadata, store, service_tier "auto" / "default",
// parallel_tool_calls, modalities ["text"], response_format {"type": "text"}, tool_choice "none"
// with no tools, an empty tools or functions list, function_call "none"), checked for its type and
// value here; or a structured-output / tool-calling field with a value that would change the
// output, refused here in refuse_structured_output() (the one place to lift when they are
// implemented). Owns only which fields exist and the no-op values; never reads a field's meaning.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"

namespace tachyon::server {

// The top-level fields `endpoint` understands (honoured, no-ops and refused structured-output
// fields alike), for tests and docs.
std::span<const std::string_view> known_fields(Endpoint endpoint);

// nullopt when every top-level field of `body` (an object) is known to `endpoint` and every no-op
// field holds a no-op value; else the 400 naming the first offending field.
std::optional<ApiError> check_request_fields(Endpoint endpoint, const nlohmann::ordered_json& body);

// Structured output and tool calls (response_format json_object / json_schema, guided_json,
// guided_regex, guided_grammar, guided_choice, guided_decoding_backend, guided_whitespace_pattern,
// structured_outputs, non-empty tools, tool_choice other than "none", functions, function_call):
// the 400 for the first one `body` sets to something that is not a no-op. Called by
// check_request_fields(); lifting the refusal of a field means deleting its line here.
std::optional<ApiError> refuse_structured_output(Endpoint endpoint, const nlohmann::ordered_json& body);

}  // namespace tachyon::server
