// The known-field policy of /v1/completions and /v1/chat/completions: every top-level field of a
// request body is one the endpoint understands, or the request gets a 400 invalid_request_error
// whose message and param name the field. Nothing is silently ignored.
//
// "Understands" means one of: honoured (parsed in openai_api.cpp, server/structured_output.cpp and
// server/tool_calls.cpp into the engine's parameters and the response); a no-op by OpenAI's own
// semantics (user, metadata, store, service_tier "auto" / "default", modalities ["text"]), checked
// for its type and value here; or a field with a value we do not do, refused here in
// refuse_structured_output() (the one place to lift when it is implemented). Owns only which
// fields exist and the no-op values; never reads a field's meaning.
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

// What is still refused of structured output (guided_whitespace_pattern): the 400 when `body` sets
// it. Called by check_request_fields(); lifting the refusal of a field means deleting its line here.
std::optional<ApiError> refuse_structured_output(Endpoint endpoint, const nlohmann::ordered_json& body);

}  // namespace tachyon::server
