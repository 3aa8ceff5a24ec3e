#include "server/request_json.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "io/json_file.h"
#include "tokenizer/unicode.h"

namespace tachyon::server {

using ojson = nlohmann::ordered_json;

ApiError invalid(std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

std::optional<ApiError> parse_request_body(std::string_view text, ojson& out) {
  if (!is_valid_utf8(text)) return invalid("the request body is not valid UTF-8");
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return invalid(fmt::format("the request body nests arrays and objects deeper than {} levels", kMaxJsonDepth));
  }
  out = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) return invalid("the request body is not valid JSON");
  if (!out.is_object()) return invalid(fmt::format("the request body must be a JSON object, got {}", out.type_name()));
  return std::nullopt;
}

std::optional<ApiError> check_model(const ojson& body, const std::string& served_model) {
  if (const ojson* model = field(body, "model")) {
    if (!model->is_string()) return invalid("'model' must be a string", "model");
    if (model->get<std::string>() != served_model) {
      ApiError e;
      e.status = 404;
      e.message = fmt::format("The model '{}' does not exist; this server serves '{}'",
                              excerpt(model->get<std::string>()), served_model);
      e.param = "model";
      e.code = "model_not_found";
      return e;
    }
  }
  return std::nullopt;
}

const ojson* field(const ojson& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> read_float(const ojson& body, const char* key, float& out) {
  const ojson* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return invalid(fmt::format("'{}' must be a number, got {}", key, v->type_name()), key);
  const double d = v->get<double>();
  if (!std::isfinite(d) || std::fabs(d) > 1e30) return invalid(fmt::format("'{}' = {} is out of range", key, d), key);
  out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<ApiError> read_int(const ojson& body, const char* key, int64_t& out) {
  const ojson* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return invalid(fmt::format("'{}' is out of range", key), key);
    }
    out = v->get<int64_t>();
    return std::nullopt;
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
      out = static_cast<int64_t>(d);
      return std::nullopt;
    }
  }
  return invalid(fmt::format("'{}' must be an integer, got {}", key, json_excerpt(*v)), key);
}

std::optional<ApiError> read_bool(const ojson& body, const char* key, bool& out) {
  const ojson* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return invalid(fmt::format("'{}' must be a boolean, got {}", key, v->type_name()), key);
  out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_string(const ojson& body, const char* key, std::string& out) {
  const ojson* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return invalid(fmt::format("'{}' must be a string, got {}", key, v->type_name()), key);
  out = v->get<std::string>();
  return std::nullopt;
}

}  // namespace tachyon::server
