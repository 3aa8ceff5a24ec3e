#include "server/structured_output.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "io/json_file.h"
#include "server/request_json.h"

namespace tachyon::server {
namespace {

using ojson = nlohmann::ordered_json;

// A schema given as an object (or a boolean) or as its JSON text; its text, keys in the order given.
// `what` names the value in messages; `param` is the top-level field that holds it.
std::optional<ApiError> schema_text(const ojson& v, const std::string& what, const char* param, std::string& out) {
  if (v.is_object() || v.is_boolean()) {
    out = v.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return std::nullopt;
  }
  if (v.is_string()) {
    out = v.get<std::string>();
    return std::nullopt;
  }
  return invalid(fmt::format("{} must be a JSON Schema (an object or its JSON text), got {}", what, v.type_name()),
                 param);
}

std::optional<ApiError> string_list(const ojson& v, const std::string& what, const char* param,
                                    std::vector<std::string>& out) {
  if (!v.is_array() || v.empty()) return invalid(fmt::format("{} must be a non-empty list of strings", what), param);
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get_ref<const std::string&>().empty()) {
      return invalid(fmt::format("{}[{}] must be a non-empty string, got {}", what, i, json_excerpt(v[i])), param);
    }
    out.push_back(v[i].get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> read_response_format(const ojson& format, std::optional<OutputConstraint>& out) {
  if (!format.is_object()) return invalid("'response_format' must be an object", "response_format");
  const ojson* type = field(format, "type");
  if (type == nullptr || !type->is_string()) {
    return invalid("'response_format': type must be \"text\", \"json_object\" or \"json_schema\"", "response_format");
  }
  for (const auto& [key, value] : format.items()) {
    if (key != "type" && key != "json_schema") {
      return invalid(fmt::format("'response_format': {} is not supported", key), "response_format");
    }
  }
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    out = OutputConstraint{OutputConstraint::Kind::kJsonObject, "", {}};
    return std::nullopt;
  }
  if (t != "json_schema") {
    return invalid(fmt::format("'response_format': type '{}' is not one of \"text\", \"json_object\", \"json_schema\"",
                               json_excerpt(*type)), "response_format");
  }
  const ojson* spec = field(format, "json_schema");
  if (spec == nullptr || !spec->is_object()) {
    return invalid("'response_format': json_schema must be an object with a 'name' and a 'schema'", "response_format");
  }
  OutputConstraint c{OutputConstraint::Kind::kJsonSchema, "{}", {}};
  c.strict = false;
  for (const auto& [key, value] : spec->items()) {
    if (key == "name" || key == "description") {
      if (!value.is_string()) return invalid(fmt::format("'response_format': json_schema.{} must be a string", key),
                                             "response_format");
    } else if (key == "schema") {
      TACHYON_API_TRY(schema_text(value, "'response_format': json_schema.schema", "response_format", c.text));
    } else if (key == "strict") {
      if (!value.is_boolean() && !value.is_null()) {
        return invalid("'response_format': json_schema.strict must be a boolean", "response_format");
      }
      c.strict = value.is_boolean() && value.get<bool>();
    } else {
      return invalid(fmt::format("'response_format': json_schema.{} is not supported", key), "response_format");
    }
  }
  if (field(*spec, "name") == nullptr) {
    return invalid("'response_format': json_schema.name is required", "response_format");
  }
  out = std::move(c);
  return std::nullopt;
}

// vLLM's structured_outputs object: exactly one of its constraint keys.
std::optional<ApiError> read_structured_outputs(const ojson& v, std::optional<OutputConstraint>& out) {
  if (!v.is_object()) return invalid("'structured_outputs' must be an object", "structured_outputs");
  for (const auto& [key, value] : v.items()) {
    if (value.is_null() || (key == "json_object" && value.is_boolean() && !value.get<bool>())) continue;
    if (out) return invalid("'structured_outputs' sets more than one constraint", "structured_outputs");
    const std::string what = "'structured_outputs'." + key;
    if (key == "json") {
      OutputConstraint c{OutputConstraint::Kind::kJsonSchema, "", {}};
      c.strict = false;
      TACHYON_API_TRY(schema_text(value, what, "structured_outputs", c.text));
      out = std::move(c);
    } else if (key == "regex" || key == "grammar") {
      if (!value.is_string()) return invalid(fmt::format("{} must be a string", what), "structured_outputs");
      out = OutputConstraint{key == "regex" ? OutputConstraint::Kind::kRegex : OutputConstraint::Kind::kGbnf,
                             value.get<std::string>(), {}};
    } else if (key == "choice") {
      OutputConstraint c{OutputConstraint::Kind::kChoice, "", {}};
      TACHYON_API_TRY(string_list(value, what, "structured_outputs", c.choices));
      out = std::move(c);
    } else if (key == "json_object") {
      if (!value.is_boolean()) return invalid(fmt::format("{} must be a boolean", what), "structured_outputs");
      out = OutputConstraint{OutputConstraint::Kind::kJsonObject, "", {}};
    } else {
      return invalid(fmt::format("{} is not supported", what), "structured_outputs");
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> read_output_constraint(const ojson& body, std::optional<OutputConstraint>& constraint,
                                               const char*& field_name) {
  constraint.reset();
  field_name = nullptr;
  const auto take = [&](std::optional<OutputConstraint> c, const char* key) -> std::optional<ApiError> {
    if (!c) return std::nullopt;
    if (constraint) {
      return invalid(fmt::format("'{}' and '{}' both constrain the output; give one", field_name, key), key);
    }
    constraint = std::move(c);
    field_name = key;
    return std::nullopt;
  };
  if (const ojson* v = field(body, "response_format")) {
    std::optional<OutputConstraint> c;
    TACHYON_API_TRY(read_response_format(*v, c));
    TACHYON_API_TRY(take(std::move(c), "response_format"));
  }
  if (const ojson* v = field(body, "guided_json")) {
    OutputConstraint c{OutputConstraint::Kind::kJsonSchema, "", {}};
    c.strict = false;
    TACHYON_API_TRY(schema_text(*v, "'guided_json'", "guided_json", c.text));
    TACHYON_API_TRY(take(std::move(c), "guided_json"));
  }
  for (const auto& [key, kind] : {std::pair{"guided_regex", OutputConstraint::Kind::kRegex},
                                  std::pair{"guided_grammar", OutputConstraint::Kind::kGbnf}}) {
    if (const ojson* v = field(body, key)) {
      if (!v->is_string()) return invalid(fmt::format("'{}' must be a string", key), key);
      TACHYON_API_TRY(take(OutputConstraint{kind, v->get<std::string>(), {}}, key));
    }
  }
  if (const ojson* v = field(body, "guided_choice")) {
    OutputConstraint c{OutputConstraint::Kind::kChoice, "", {}};
    TACHYON_API_TRY(string_list(*v, "'guided_choice'", "guided_choice", c.choices));
    TACHYON_API_TRY(take(std::move(c), "guided_choice"));
  }
  if (const ojson* v = field(body, "structured_outputs")) {
    std::optional<OutputConstraint> c;
    TACHYON_API_TRY(read_structured_outputs(*v, c));
    TACHYON_API_TRY(take(std::move(c), "structured_outputs"));
  }
  if (const ojson* v = field(body, "guided_decoding_backend"); v != nullptr && !v->is_string()) {
    return invalid("'guided_decoding_backend' must be a string", "guided_decoding_backend");
  }
  return std::nullopt;
}

std::optional<ApiError> read_structured_output(const ojson& body, GrammarCache* cache, GenerationParams& p) {
  std::optional<OutputConstraint> constraint;
  const char* key = nullptr;
  TACHYON_API_TRY(read_output_constraint(body, constraint, key));
  if (!constraint) return std::nullopt;
  if (cache == nullptr) return invalid(fmt::format("'{}': this server does not do structured output", key), key);
  Result<std::shared_ptr<const Grammar>> grammar = cache->get(*constraint);
  if (!grammar.ok()) return invalid(fmt::format("'{}': {}", key, grammar.status().message()), key);
  p.grammar = std::move(grammar).value();
  return std::nullopt;
}

}  // namespace tachyon::server
