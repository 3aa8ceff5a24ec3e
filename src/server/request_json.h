// Typed reads of one field of a request's JSON body, for the OpenAI API and the server's other
// JSON routes: each mistake is an ApiError (400, invalid_request_error) whose message and param
// name the field. Owns no policy about which fields exist (server/request_fields.h does) and never
// throws or aborts on any input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"

namespace tachyon::server {

// A request body (any bytes) as a JSON object: valid UTF-8, nested at most kMaxJsonDepth deep
// (checked before parsing, since parsing recurses), valid JSON, an object.
std::optional<ApiError> parse_request_body(std::string_view text, nlohmann::ordered_json& out);

// 'model', when given, must name the served model (404 model_not_found otherwise).
std::optional<ApiError> check_model(const nlohmann::ordered_json& body, const std::string& served_model);

// A 400 invalid_request_error.
ApiError invalid(std::string message, std::string param = "", std::string code = "");

// The field when present and not null; null otherwise (a null field counts as absent).
const nlohmann::ordered_json* field(const nlohmann::ordered_json& body, const char* key);

// Each leaves `out` alone when the field is absent or null.
std::optional<ApiError> read_float(const nlohmann::ordered_json& body, const char* key, float& out);
// An integer; 16.0 counts as 16 (an integer to a JavaScript client).
std::optional<ApiError> read_int(const nlohmann::ordered_json& body, const char* key, int64_t& out);
std::optional<ApiError> read_bool(const nlohmann::ordered_json& body, const char* key, bool& out);
std::optional<ApiError> read_string(const nlohmann::ordered_json& body, const char* key, std::string& out);

// Returns the ApiError of `expr`, if any, from the calling function.
#define TACHYON_API_TRY(expr)                        \
  do {                                               \
    if (auto api_error_ = (expr)) return api_error_; \
  } while (0)

}  // namespace tachyon::server
