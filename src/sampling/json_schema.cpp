// The JSON Schema compiler: one recursive pass over the schema that returns a GrammarExpr per subschema and adds
// named rules for what is shared or repeated (common JSON pieces, $ref targets, object property chains, array
// items), so that the grammar grows linearly with the schema. See json_schema.h for the supported subset.
#include "sampling/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "sampling/number_range_grammar.h"
#include "sampling/regex_grammar.h"

namespace tachyon {

namespace {

using ojson = nlohmann::ordered_json;

// Keywords that only annotate: never change which documents are valid.
const std::set<std::string, std::less<>> kAnnotations = {"title",
                                                         "description",
                                                         "examples",
                                                         "default",
                                                         "$schema",
                                                         "$id",
                                                         "id",
                                                         "$comment",
                                                         "deprecated",
                                                         "readOnly",
                                                         "writeOnly",
                                                         "contentEncoding",
                                                         "contentMediaType",
                                                         "$anchor",
                                                         "$dynamicAnchor",
                                                         "$vocabulary",
                                                         "$defs",
                                                         "definitions"};

// Validation keywords this compiler does not implement: a schema using one is refused.
const std::set<std::string, std::less<>> kUnsupported = {"not",
                                                         "if",
                                                         "then",
                                                         "else",
                                                         "patternProperties",
                                                         "propertyNames",
                                                         "minProperties",
                                                         "maxProperties",
                                                         "dependentRequired",
                                                         "dependentSchemas",
                                                         "dependencies",
                                                         "unevaluatedProperties",
                                                         "unevaluatedItems",
                                                         "contains",
                                                         "minContains",
                                                         "maxContains",
                                                         "multipleOf",
                                                         "additionalItems",
                                                         "$dynamicRef",
                                                         "$recursiveRef",
                                                         "contentSchema"};

// Validation keywords this compiler implements (for the "siblings of $ref / anyOf" checks).
const std::set<std::string, std::less<>> kSupported = {"type",
                                                       "enum",
                                                       "const",
                                                       "anyOf",
                                                       "oneOf",
                                                       "allOf",
                                                       "$ref",
                                                       "properties",
                                                       "required",
                                                       "additionalProperties",
                                                       "items",
                                                       "prefixItems",
                                                       "minItems",
                                                       "maxItems",
                                                       "uniqueItems",
                                                       "minLength",
                                                       "maxLength",
                                                       "pattern",
                                                       "format",
                                                       "minimum",
                                                       "maximum",
                                                       "exclusiveMinimum",
                                                       "exclusiveMaximum"};

// Regexes (full match, over the decoded string) for the formats we enforce.
const std::map<std::string, std::string, std::less<>>& format_patterns() {
  static const std::map<std::string, std::string, std::less<>> patterns = [] {
    // Days per month (February up to 29 in every year: leap years are not checked).
    const std::string date = R"([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01]))"
                             R"(|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|[12][0-9])))";
    const std::string time =
        R"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))";
    const std::string octet = R"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))";
    const std::string label = R"([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)";
    return std::map<std::string, std::string, std::less<>>{
        {"date", date},
        {"time", time},
        {"date-time", date + "T" + time},
        {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
        {"email", R"([a-zA-Z0-9_%+-]{1,64}(\.[a-zA-Z0-9_%+-]{1,64}){0,8}@)" + label + R"((\.)" + label + "){1,8}"},
        {"ipv4", "(" + octet + R"(\.){3})" + octet},
    };
  }();
  return patterns;
}

GrammarExpr lit(std::string_view text) { return GrammarExpr::literal(text); }
GrammarExpr cp(uint32_t c) { return GrammarExpr::code_point(c); }
GrammarExpr seq(std::vector<GrammarExpr> parts) { return GrammarExpr::sequence(std::move(parts)); }
GrammarExpr alt(std::vector<GrammarExpr> choices) { return GrammarExpr::alternation(std::move(choices)); }

CharClass hex_digits() {
  CharClass c = CharClass::range('0', '9');
  c.add('a', 'f');
  c.add('A', 'F');
  return c;
}

// The four hex digits of a \\u escape, surrogates (D800-DFFF) left out: a surrogate pair would be one character
// written as two escapes, which would break length bounds, and a lone one is not text.
GrammarExpr unicode_hex() {
  const GrammarExpr hex = GrammarExpr::chars(hex_digits());
  CharClass d = CharClass::single('d');
  d.add('D', 'D');
  return GrammarExpr::alternation(
      {GrammarExpr::sequence({GrammarExpr::chars(hex_digits().minus(d)), hex, hex, hex}),
       GrammarExpr::sequence({GrammarExpr::chars(d), GrammarExpr::chars(CharClass::range('0', '7')), hex, hex})});
}

// Characters a JSON string must escape.
CharClass json_specials() {
  CharClass c = CharClass::range(0, 0x1F);
  c.add('"', '"');
  c.add('\\', '\\');
  return c;
}

// How the code points of `c` are written inside a JSON string: plain, short escapes, or \u00XX.
GrammarExpr json_escaped(const CharClass& c) {
  std::vector<GrammarExpr> choices;
  const CharClass plain = c.minus(json_specials());
  if (!plain.empty()) choices.push_back(GrammarExpr::chars(plain));
  const std::pair<uint32_t, char> short_forms[] = {{'"', '"'},  {'\\', '\\'}, {'\n', 'n'}, {'\r', 'r'},
                                                   {'\t', 't'}, {'\b', 'b'},  {'\f', 'f'}};
  CharClass letters;
  CharClass has_short;
  for (auto [code, letter] : short_forms) {
    has_short.add(code, code);
    if (c.contains(code)) letters.add(static_cast<uint32_t>(letter), static_cast<uint32_t>(letter));
  }
  if (!letters.empty()) choices.push_back(seq({cp('\\'), GrammarExpr::chars(letters)}));
  for (uint32_t high = 0; high < 2; ++high) {
    CharClass lows;
    for (uint32_t low = 0; low < 16; ++low) {
      const uint32_t code = high * 16 + low;
      if (!c.contains(code) || has_short.contains(code)) continue;
      lows.add(low < 10 ? '0' + low : 'a' + low - 10, low < 10 ? '0' + low : 'a' + low - 10);
      if (low >= 10) lows.add('A' + low - 10, 'A' + low - 10);
    }
    if (!lows.empty()) choices.push_back(seq({lit("\\u00"), cp('0' + high), GrammarExpr::chars(lows)}));
  }
  if (choices.empty()) return GrammarExpr::chars(CharClass());
  return alt(std::move(choices));
}

// `expr` over decoded characters -> the same strings as written inside a JSON string literal.
GrammarExpr json_string_content(const GrammarExpr& expr) {
  if (expr.kind == GrammarExpr::Kind::kChars) return json_escaped(expr.char_class);
  GrammarExpr out = expr;
  for (GrammarExpr& child : out.children) child = json_string_content(child);
  return out;
}

std::string join_path(const std::string& path, std::string_view segment) {
  std::string escaped;
  for (char c : segment) {
    if (c == '~')
      escaped += "~0";
    else if (c == '/')
      escaped += "~1";
    else
      escaped.push_back(c);
  }
  return path + "/" + escaped;
}

// A rule-name base from a $ref ("#/$defs/Street Address" -> "Street-Address").
std::string name_from_ref(std::string_view ref) {
  const size_t slash = ref.rfind('/');
  std::string_view last = slash == std::string_view::npos ? ref : ref.substr(slash + 1);
  std::string name;
  for (char c : last) name.push_back(is_gbnf_rule_name(std::string_view(&c, 1)) ? c : '-');
  if (name.empty() || name == "#") name = "ref";
  return name;
}

bool value_has_type(const ojson& v, std::string_view type) {
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  }
  return false;
}

class SchemaCompiler {
 public:
  // `root_name`: the rule the caller gives the schema's value; reserved here (with the fixed names) so that
  // $ref-derived names never take it.
  SchemaCompiler(const ojson& root, const JsonSchemaOptions& options, GrammarBuilder& builder,
                 const std::string& root_name)
      : root_(root), options_(options), builder_(builder) {
    (void)builder_.unique_name(root_name);
    for (const char* name : {"ws", "json-char", "json-string", "json-number", "json-integer", "json-value",
                             "json-object", "json-member", "json-array"}) {
      common_names_[name] = builder_.unique_name(name);
    }
  }

  Result<GrammarExpr> compile(const ojson& schema, const std::string& path, int depth) {
    if (depth > options_.max_depth) {
      return error(path, "nested deeper than {} levels (max_depth)", options_.max_depth);
    }
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return common("json-value");
      return error(path, "the schema 'false' accepts no value");
    }
    if (!schema.is_object()) return error(path, "a schema must be an object or a boolean, got {}", schema.type_name());
    for (const auto& [key, value] : schema.items()) {
      if (kUnsupported.count(key)) return error(path, "keyword '{}' is not supported", key);
      if (key == "uniqueItems" && value != ojson(false)) return error(path, "keyword 'uniqueItems' is not supported");
    }
    if (schema.contains("$ref")) {
      TACHYON_RETURN_IF_ERROR(only_annotations_besides(schema, path, "$ref", {"$ref"}));
      if (!schema["$ref"].is_string()) return error(path, "'$ref' must be a string");
      return compile_ref(schema["$ref"].get<std::string>(), path, depth);
    }
    for (const char* combinator : {"anyOf", "oneOf"}) {
      if (!schema.contains(combinator)) continue;
      TACHYON_RETURN_IF_ERROR(only_annotations_besides(schema, path, combinator, {combinator}));
      const ojson& list = schema[combinator];
      if (!list.is_array() || list.empty()) return error(path, "'{}' must be a non-empty array", combinator);
      std::vector<GrammarExpr> choices;
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string sub_path = join_path(join_path(path, combinator), std::to_string(i));
        TACHYON_ASSIGN_OR_RETURN(GrammarExpr choice, compile(list[i], sub_path, depth + 1));
        choices.push_back(std::move(choice));
      }
      return alt(std::move(choices));
    }
    if (schema.contains("allOf")) {
      TACHYON_RETURN_IF_ERROR(only_annotations_besides(schema, path, "allOf", {"allOf"}));
      const ojson& list = schema["allOf"];
      if (!list.is_array() || list.size() != 1) {
        return error(path, "'allOf' is supported only with exactly one schema");
      }
      return compile(list[0], join_path(path, "allOf/0"), depth + 1);
    }
    if (schema.contains("const") || schema.contains("enum")) return compile_enum(schema, path);

    std::vector<std::string> types;
    if (schema.contains("type")) {
      const ojson& type = schema["type"];
      if (type.is_string()) {
        types.push_back(type.get<std::string>());
      } else if (type.is_array() && !type.empty()) {
        for (const ojson& t : type) {
          if (!t.is_string()) return error(path, "'type' must be a string or an array of strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        return error(path, "'type' must be a string or a non-empty array of strings");
      }
    } else {
      types.push_back(inferred_type(schema));
    }
    std::vector<GrammarExpr> choices;
    for (const std::string& type : types) {
      TACHYON_ASSIGN_OR_RETURN(GrammarExpr choice, compile_typed(schema, type, path, depth));
      choices.push_back(std::move(choice));
    }
    return alt(std::move(choices));
  }

  // A named rule for a common JSON piece, added on first use.
  GrammarExpr common(const std::string& which) {
    const std::string& name = common_names_.at(which);
    if (!added_.count(which)) {
      added_.insert(which);
      Status status = builder_.add_rule(name, common_body(which));
      (void)status;  // names are reserved: a duplicate cannot happen
    }
    return GrammarExpr::rule(name);
  }

  GrammarExpr ws() { return options_.max_whitespace > 0 ? common("ws") : GrammarExpr::empty(); }

 private:
  template <typename... Args>
  Status error(const std::string& path, fmt::format_string<Args...> format, Args&&... args) const {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("json schema at '#{}': {}", path, fmt::format(format, std::forward<Args>(args)...)));
  }

  // Refuses a validation keyword next to `owner` ($ref, anyOf...): combining them would need an intersection.
  Status only_annotations_besides(const ojson& schema, const std::string& path, std::string_view owner,
                                  std::set<std::string> allowed) const {
    for (const auto& [key, value] : schema.items()) {
      if (allowed.count(key) || kAnnotations.count(key)) continue;
      if (kSupported.count(key)) {
        return error(path, "'{}' together with '{}' is not supported (no intersection is built)", key, owner);
      }
    }
    return Status::Ok();
  }

  std::string inferred_type(const ojson& schema) const {
    for (const char* k : {"properties", "required", "additionalProperties"}) {
      if (schema.contains(k)) return "object";
    }
    for (const char* k : {"items", "prefixItems", "minItems", "maxItems"}) {
      if (schema.contains(k)) return "array";
    }
    for (const char* k : {"minLength", "maxLength", "pattern", "format"}) {
      if (schema.contains(k)) return "string";
    }
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (schema.contains(k)) return "number";
    }
    return "any";
  }

  GrammarExpr common_body(const std::string& which) {
    if (which == "ws") {
      CharClass blank = CharClass::single(' ');
      blank.add('\t', '\t');
      blank.add('\n', '\n');
      return GrammarExpr::repeat(GrammarExpr::chars(blank), 0, options_.max_whitespace);
    }
    if (which == "json-char") {
      CharClass short_letters;
      for (char c : std::string_view("\"\\/bfnrt")) short_letters.add(c, c);
      return alt({GrammarExpr::chars(CharClass::any().minus(json_specials())),
                  seq({cp('\\'), alt({GrammarExpr::chars(short_letters), seq({cp('u'), unicode_hex()})})})});
    }
    if (which == "json-string") return seq({cp('"'), GrammarExpr::star(common("json-char")), cp('"')});
    if (which == "json-number") {
      const GrammarExpr digit = GrammarExpr::chars(CharClass::range('0', '9'));
      CharClass e = CharClass::single('e');
      e.add('E', 'E');
      CharClass sign = CharClass::single('-');
      sign.add('+', '+');
      return seq(
          {GrammarExpr::optional(cp('-')),
           alt({cp('0'), seq({GrammarExpr::chars(CharClass::range('1', '9')), GrammarExpr::repeat(digit, 0, 15)})}),
           GrammarExpr::optional(seq({cp('.'), GrammarExpr::repeat(digit, 1, 16)})),
           GrammarExpr::optional(seq({GrammarExpr::chars(e), GrammarExpr::optional(GrammarExpr::chars(sign)),
                                      GrammarExpr::repeat(digit, 1, 2)}))});
    }
    if (which == "json-integer") return *integer_range_expr(std::nullopt, std::nullopt);
    if (which == "json-value") {
      return alt({common("json-object"), common("json-array"), common("json-string"), common("json-number"),
                  lit("true"), lit("false"), lit("null")});
    }
    if (which == "json-member") {
      return seq({common("json-string"), ws(), cp(':'), ws(), common("json-value")});
    }
    if (which == "json-object") {
      return seq({cp('{'), ws(),
                  GrammarExpr::optional(seq({common("json-member"), ws(),
                                             GrammarExpr::star(seq({cp(','), ws(), common("json-member"), ws()}))})),
                  cp('}')});
    }
    // json-array
    return seq({cp('['), ws(),
                GrammarExpr::optional(seq(
                    {common("json-value"), ws(), GrammarExpr::star(seq({cp(','), ws(), common("json-value"), ws()}))})),
                cp(']')});
  }

  Result<GrammarExpr> compile_ref(const std::string& ref, const std::string& path, int depth) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return GrammarExpr::rule(it->second);
    if (ref.empty() || ref[0] != '#') {
      return error(path, "$ref '{}' is not supported (only references inside the schema, starting with '#')", ref);
    }
    const ojson* target = nullptr;
    try {
      const ojson::json_pointer pointer(ref.substr(1));
      if (root_.contains(pointer)) target = &root_.at(pointer);
    } catch (const nlohmann::json::exception& e) {
      return error(path, "$ref '{}' is not a valid JSON pointer ({})", ref, e.what());
    }
    if (target == nullptr) return error(path, "$ref '{}' does not resolve to anything in the schema", ref);
    const std::string name = builder_.unique_name(name_from_ref(ref));
    ref_rules_[ref] = name;
    TACHYON_ASSIGN_OR_RETURN(GrammarExpr body, compile(*target, ref.substr(1), depth + 1));
    TACHYON_RETURN_IF_ERROR(builder_.add_rule(name, std::move(body)));
    return GrammarExpr::rule(name);
  }

  Result<GrammarExpr> compile_enum(const ojson& schema, const std::string& path) {
    const char* keyword = schema.contains("const") ? "const" : "enum";
    TACHYON_RETURN_IF_ERROR(only_annotations_besides(schema, path, keyword, {"const", "enum", "type"}));
    std::vector<ojson> values;
    if (schema.contains("const")) {
      values.push_back(schema["const"]);
    } else {
      const ojson& list = schema["enum"];
      if (!list.is_array() || list.empty()) return error(path, "'enum' must be a non-empty array");
      values.assign(list.begin(), list.end());
    }
    if (schema.contains("const") && schema.contains("enum")) {
      const ojson& list = schema["enum"];
      if (!list.is_array() || std::find(list.begin(), list.end(), values[0]) == list.end()) {
        return error(path, "'const' is not one of 'enum'");
      }
    }
    // Keep the values that `type` allows (both keywords apply).
    std::vector<GrammarExpr> choices;
    for (const ojson& v : values) {
      bool typed_ok = true;
      if (schema.contains("type")) {
        const ojson& type = schema["type"];
        typed_ok = false;
        if (type.is_string()) typed_ok = value_has_type(v, type.get<std::string>());
        if (type.is_array()) {
          for (const ojson& t : type) typed_ok = typed_ok || (t.is_string() && value_has_type(v, t.get<std::string>()));
        }
      }
      if (typed_ok) choices.push_back(lit(v.dump()));
    }
    if (choices.empty()) return error(path, "no value of '{}' has the schema's 'type'", keyword);
    return alt(std::move(choices));
  }

  Result<GrammarExpr> compile_typed(const ojson& schema, const std::string& type, const std::string& path, int depth) {
    if (type == "string") return compile_string(schema, path);
    if (type == "number") return compile_number(schema, path, false);
    if (type == "integer") return compile_number(schema, path, true);
    if (type == "boolean") return alt({lit("true"), lit("false")});
    if (type == "null") return lit("null");
    if (type == "object") return compile_object(schema, path, depth);
    if (type == "array") return compile_array(schema, path, depth);
    if (type == "any") return common("json-value");
    return error(path, "unknown type '{}'", type);
  }

  // A non-negative integer keyword (minLength, maxItems...), or nullopt when absent.
  Status count_keyword(const ojson& schema, const std::string& path, const char* key, std::optional<int64_t>& out) {
    out.reset();
    if (!schema.contains(key)) return Status::Ok();
    const ojson& v = schema[key];
    if (!value_has_type(v, "integer") || v.get<double>() < 0) {
      return error(path, "'{}' must be a non-negative integer", key);
    }
    if (v.get<double>() > options_.limits.max_repeat) {
      return error(path, "'{}' = {} is over the supported limit of {}", key, v.dump(), options_.limits.max_repeat);
    }
    out = v.get<int64_t>();
    return Status::Ok();
  }

  Result<GrammarExpr> compile_string(const ojson& schema, const std::string& path) {
    std::optional<int64_t> min_length;
    std::optional<int64_t> max_length;
    TACHYON_RETURN_IF_ERROR(count_keyword(schema, path, "minLength", min_length));
    TACHYON_RETURN_IF_ERROR(count_keyword(schema, path, "maxLength", max_length));
    if (min_length && max_length && *min_length > *max_length) {
      return error(path, "minLength {} is above maxLength {}", *min_length, *max_length);
    }
    const bool has_length = min_length || max_length;
    if (schema.contains("pattern") || schema.contains("format")) {
      const bool is_pattern = schema.contains("pattern");
      if (is_pattern && schema.contains("format"))
        return error(path, "'pattern' together with 'format' is not supported");
      if (has_length) {
        return error(path, "'{}' together with minLength/maxLength is not supported",
                     is_pattern ? "pattern" : "format");
      }
      std::string regex;
      RegexMatchMode mode = RegexMatchMode::kFullMatch;
      if (is_pattern) {
        if (!schema["pattern"].is_string()) return error(path, "'pattern' must be a string");
        regex = schema["pattern"].get<std::string>();
        mode = RegexMatchMode::kSearch;
      } else {
        if (!schema["format"].is_string()) return error(path, "'format' must be a string");
        const std::string format = schema["format"].get<std::string>();
        auto it = format_patterns().find(format);
        if (it == format_patterns().end()) {
          return error(path, "format '{}' is not supported (supported: date, time, date-time, uuid, email, ipv4)",
                       format);
        }
        regex = it->second;
      }
      Result<GrammarExpr> content = regex_to_expr(regex, mode);
      if (!content.ok()) return content.status().with_context(fmt::format("json schema at '#{}'", path));
      return seq({cp('"'), json_string_content(*content), cp('"')});
    }
    if (!has_length) return common("json-string");
    const int32_t max_count = max_length ? static_cast<int32_t>(*max_length) : GrammarExpr::kUnbounded;
    return seq({cp('"'),
                GrammarExpr::repeat(common("json-char"), static_cast<int32_t>(min_length.value_or(0)), max_count),
                cp('"')});
  }

  // The tighter of an inclusive and an exclusive bound keyword; draft 4's boolean exclusive* flags too.
  Status read_bound(const ojson& schema, const std::string& path, bool lower, std::optional<double>& value,
                    bool& exclusive) {
    const char* inclusive_key = lower ? "minimum" : "maximum";
    const char* exclusive_key = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    value.reset();
    exclusive = false;
    if (schema.contains(inclusive_key)) {
      if (!schema[inclusive_key].is_number()) return error(path, "'{}' must be a number", inclusive_key);
      value = schema[inclusive_key].get<double>();
    }
    if (schema.contains(exclusive_key)) {
      const ojson& e = schema[exclusive_key];
      if (e.is_boolean()) {
        exclusive = e.get<bool>() && value.has_value();
      } else if (e.is_number()) {
        const double v = e.get<double>();
        if (!value || (lower ? v >= *value : v <= *value)) {
          value = v;
          exclusive = true;
        }
      } else {
        return error(path, "'{}' must be a number (or a boolean in draft 4)", exclusive_key);
      }
    }
    if (value && !(std::fabs(*value) < 9.2e18)) {
      return error(path, "'{}' / '{}' bound {} is out of range", inclusive_key, exclusive_key, *value);
    }
    return Status::Ok();
  }

  Result<GrammarExpr> compile_number(const ojson& schema, const std::string& path, bool integer) {
    std::optional<double> lo, hi;
    bool lo_exclusive = false, hi_exclusive = false;
    TACHYON_RETURN_IF_ERROR(read_bound(schema, path, true, lo, lo_exclusive));
    TACHYON_RETURN_IF_ERROR(read_bound(schema, path, false, hi, hi_exclusive));
    if (!lo && !hi) return common(integer ? "json-integer" : "json-number");
    if (integer) {
      std::optional<int64_t> min, max;
      if (lo) min = static_cast<int64_t>(lo_exclusive ? std::floor(*lo) + 1 : std::ceil(*lo));
      if (hi) max = static_cast<int64_t>(hi_exclusive ? std::ceil(*hi) - 1 : std::floor(*hi));
      Result<GrammarExpr> range = integer_range_expr(min, max);
      if (!range.ok()) return range.status().with_context(fmt::format("json schema at '#{}'", path));
      return range;
    }
    std::optional<NumberBound> min, max;
    for (auto [bound, exclusive, out, name] :
         {std::tuple{lo, lo_exclusive, &min, "lower"}, std::tuple{hi, hi_exclusive, &max, "upper"}}) {
      if (!bound) continue;
      if (std::floor(*bound) != *bound) {
        return error(path, "a fractional {} bound ({}) on a number is not supported (whole-number bounds are)", name,
                     *bound);
      }
      *out = NumberBound{static_cast<int64_t>(*bound), exclusive};
    }
    Result<GrammarExpr> range = decimal_range_expr(min, max);
    if (!range.ok()) return range.status().with_context(fmt::format("json schema at '#{}'", path));
    return range;
  }

  // A rule holding `expr` (so that repeated uses share it instead of copying the tree).
  Result<GrammarExpr> as_rule(std::string_view base, GrammarExpr expr) {
    if (expr.kind == GrammarExpr::Kind::kRuleRef) return expr;
    const std::string name = builder_.unique_name(base);
    TACHYON_RETURN_IF_ERROR(builder_.add_rule(name, std::move(expr)));
    return GrammarExpr::rule(name);
  }

  // A JSON string key that is none of `declared` (compared after decoding): a trie over the declared keys whose
  // path is followed with plain characters only; leaving it (or ending where no key ends) frees the rest.
  Result<GrammarExpr> other_key(const std::vector<std::string>& declared) {
    if (declared.empty()) return common("json-string");
    struct Node {
      std::map<uint32_t, int> children;
      bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& key : declared) {
      int node = 0;
      size_t pos = 0;
      while (pos < key.size()) {
        std::optional<uint32_t> c = decode_utf8(key, pos);
        if (!c) break;  // nlohmann validated the text: cannot happen
        auto it = trie[node].children.find(*c);
        if (it == trie[node].children.end()) {
          trie.push_back(Node{});
          it = trie[node].children.emplace(*c, static_cast<int>(trie.size() - 1)).first;
        }
        node = it->second;
      }
      trie[node].terminal = true;
    }
    const std::string base = builder_.unique_name("other-key");
    const GrammarExpr tail = seq({GrammarExpr::star(common("json-char")), cp('"')});
    const CharClass plain = CharClass::any().minus(json_specials());
    for (size_t n = 0; n < trie.size(); ++n) {
      std::vector<GrammarExpr> choices;
      if (!trie[n].terminal) choices.push_back(cp('"'));  // this prefix is no declared key: it may end here
      CharClass leave = plain;
      for (const auto& [c, child] : trie[n].children) {
        leave = leave.minus(CharClass::single(c));
        if (plain.contains(c)) choices.push_back(seq({cp(c), GrammarExpr::rule(fmt::format("{}-n{}", base, child))}));
        // A child that only an escape can write is not followed: its escapes are left out below.
      }
      choices.push_back(seq({alt({GrammarExpr::chars(leave), escapes_off_path(trie[n].children)}), tail}));
      TACHYON_RETURN_IF_ERROR(builder_.add_rule(fmt::format("{}-n{}", base, n), alt(std::move(choices))));
    }
    return seq({cp('"'), GrammarExpr::rule(fmt::format("{}-n0", base))});
  }

  // Escapes (in json-char's forms) that leave the key trie at a node: they may write any character but the
  // node's children. \\uXXXX is offered only at leaves (no children), where every character leaves.
  GrammarExpr escapes_off_path(const std::map<uint32_t, int>& children) {
    CharClass letters;
    const std::pair<uint32_t, char> short_forms[] = {{'"', '"'},  {'\\', '\\'}, {'/', '/'},  {'\n', 'n'},
                                                     {'\r', 'r'}, {'\t', 't'},  {'\b', 'b'}, {'\f', 'f'}};
    for (auto [code, letter] : short_forms) {
      if (!children.count(code)) letters.add(static_cast<uint32_t>(letter), static_cast<uint32_t>(letter));
    }
    std::vector<GrammarExpr> choices{seq({cp('\\'), GrammarExpr::chars(letters)})};
    if (children.empty()) choices.push_back(seq({lit("\\u"), unicode_hex()}));
    return alt(std::move(choices));
  }

  Result<GrammarExpr> compile_object(const ojson& schema, const std::string& path, int depth) {
    struct Property {
      std::string key;
      GrammarExpr value;
      bool required = false;
    };
    std::vector<Property> properties;
    std::set<std::string> required;
    if (schema.contains("required")) {
      const ojson& list = schema["required"];
      if (!list.is_array()) return error(path, "'required' must be an array of strings");
      for (const ojson& r : list) {
        if (!r.is_string()) return error(path, "'required' must be an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    // additionalProperties: nullopt = none allowed, else the schema of extra values.
    std::optional<ojson> extra;
    if (schema.contains("additionalProperties")) {
      const ojson& a = schema["additionalProperties"];
      if (a.is_boolean()) {
        if (a.get<bool>()) extra = ojson(true);
      } else if (a.is_object()) {
        extra = a;
      } else {
        return error(path, "'additionalProperties' must be a boolean or a schema");
      }
    } else if (!options_.strict) {
      extra = ojson(true);
    }
    const std::string base = builder_.unique_name(path.empty() ? "root-object" : name_from_ref(path));
    std::set<std::string> declared;
    if (schema.contains("properties")) {
      const ojson& props = schema["properties"];
      if (!props.is_object()) return error(path, "'properties' must be an object");
      for (const auto& [key, sub] : props.items()) {
        const std::string sub_path = join_path(join_path(path, "properties"), key);
        TACHYON_ASSIGN_OR_RETURN(GrammarExpr value, compile(sub, sub_path, depth + 1));
        TACHYON_ASSIGN_OR_RETURN(value, as_rule(base + "-value", std::move(value)));
        properties.push_back({key, std::move(value), required.count(key) != 0});
        declared.insert(key);
      }
    }
    for (const std::string& name : required) {
      if (declared.count(name)) continue;
      if (!extra) {
        return error(path, "required property '{}' is not in 'properties' and additional properties are not allowed",
                     name);
      }
      TACHYON_ASSIGN_OR_RETURN(GrammarExpr value, compile(*extra, join_path(path, "additionalProperties"), depth + 1));
      TACHYON_ASSIGN_OR_RETURN(value, as_rule(base + "-value", std::move(value)));
      properties.push_back({name, std::move(value), true});
      declared.insert(name);
    }

    // Extra pairs after the declared ones: first = none emitted yet, after = some emitted (needs a comma).
    GrammarExpr extras_first = GrammarExpr::empty();
    GrammarExpr extras_after = GrammarExpr::empty();
    if (extra) {
      TACHYON_ASSIGN_OR_RETURN(GrammarExpr value, compile(*extra, join_path(path, "additionalProperties"), depth + 1));
      TACHYON_ASSIGN_OR_RETURN(GrammarExpr key, other_key({declared.begin(), declared.end()}));
      TACHYON_ASSIGN_OR_RETURN(GrammarExpr pair,
                               as_rule(base + "-extra", seq({std::move(key), ws(), cp(':'), ws(), std::move(value)})));
      TACHYON_ASSIGN_OR_RETURN(extras_after,
                               as_rule(base + "-extras", GrammarExpr::star(seq({cp(','), ws(), pair, ws()}))));
      extras_first = GrammarExpr::optional(seq({pair, ws(), extras_after}));
    }
    // Declared properties in order; each optional one may be skipped.
    GrammarExpr next_first = std::move(extras_first);
    GrammarExpr next_after = std::move(extras_after);
    for (size_t i = properties.size(); i-- > 0;) {
      Property& p = properties[i];
      const GrammarExpr pair = seq({lit(ojson(p.key).dump()), ws(), cp(':'), ws(), p.value});
      std::vector<GrammarExpr> after_choices{seq({cp(','), ws(), pair, ws(), next_after})};
      std::vector<GrammarExpr> first_choices{seq({pair, ws(), next_after})};
      if (!p.required) {
        after_choices.push_back(next_after);
        first_choices.push_back(next_first);
      }
      TACHYON_ASSIGN_OR_RETURN(GrammarExpr after, as_rule(base + "-after", alt(std::move(after_choices))));
      TACHYON_ASSIGN_OR_RETURN(GrammarExpr first, as_rule(base + "-first", alt(std::move(first_choices))));
      next_after = std::move(after);
      next_first = std::move(first);
    }
    return seq({cp('{'), ws(), std::move(next_first), cp('}')});
  }

  Result<GrammarExpr> compile_array(const ojson& schema, const std::string& path, int depth) {
    std::optional<int64_t> min_items;
    std::optional<int64_t> max_items;
    TACHYON_RETURN_IF_ERROR(count_keyword(schema, path, "minItems", min_items));
    TACHYON_RETURN_IF_ERROR(count_keyword(schema, path, "maxItems", max_items));
    const int64_t min_count = min_items.value_or(0);
    if (max_items && *max_items < min_count)
      return error(path, "minItems {} is above maxItems {}", min_count, *max_items);
    const std::string base = builder_.unique_name(path.empty() ? "root-array" : name_from_ref(path));

    std::vector<GrammarExpr> prefix;
    if (schema.contains("prefixItems")) {
      const ojson& list = schema["prefixItems"];
      if (!list.is_array()) return error(path, "'prefixItems' must be an array of schemas");
      for (size_t i = 0; i < list.size(); ++i) {
        TACHYON_ASSIGN_OR_RETURN(
            GrammarExpr item,
            compile(list[i], join_path(join_path(path, "prefixItems"), std::to_string(i)), depth + 1));
        prefix.push_back(std::move(item));
      }
    }
    std::optional<GrammarExpr> item;  // nullopt: no items after the prefix
    if (schema.contains("items")) {
      const ojson& items = schema["items"];
      if (items.is_array())
        return error(path, "'items' as an array (draft 4 tuples) is not supported; use prefixItems");
      if (!(items.is_boolean() && !items.get<bool>())) {
        TACHYON_ASSIGN_OR_RETURN(GrammarExpr e, compile(items, join_path(path, "items"), depth + 1));
        TACHYON_ASSIGN_OR_RETURN(e, as_rule(base + "-item", std::move(e)));
        item = std::move(e);
      }
    } else {
      item = common("json-value");
    }
    const auto num_prefix = static_cast<int64_t>(prefix.size());
    if (max_items && *max_items < num_prefix) {
      return error(path, "maxItems {} below the {} prefixItems is not supported (all prefix items are emitted)",
                   *max_items, num_prefix);
    }
    const int64_t rest_min = std::max<int64_t>(0, min_count - num_prefix);
    const int64_t rest_max = max_items ? *max_items - num_prefix : -1;
    if (!item && rest_min > 0)
      return error(path, "minItems {} needs items beyond prefixItems, which 'items' forbids", min_count);

    std::vector<GrammarExpr> parts{cp('['), ws()};
    if (num_prefix > 0) {
      for (int64_t i = 0; i < num_prefix; ++i) {
        if (i > 0) parts.push_back(cp(','));
        if (i > 0) parts.push_back(ws());
        parts.push_back(std::move(prefix[i]));
        parts.push_back(ws());
      }
      if (item && rest_max != 0) {
        parts.push_back(GrammarExpr::repeat(seq({cp(','), ws(), *item, ws()}), static_cast<int32_t>(rest_min),
                                            static_cast<int32_t>(rest_max)));
      }
    } else if (item && rest_max != 0) {
      const GrammarExpr more = GrammarExpr::repeat(
          seq({cp(','), ws(), *item, ws()}), static_cast<int32_t>(std::max<int64_t>(0, rest_min - 1)),
          rest_max < 0 ? GrammarExpr::kUnbounded : static_cast<int32_t>(rest_max - 1));
      GrammarExpr body = seq({*item, ws(), more});
      parts.push_back(rest_min == 0 ? GrammarExpr::optional(std::move(body)) : std::move(body));
    }
    parts.push_back(cp(']'));
    return seq(std::move(parts));
  }

  const ojson& root_;
  const JsonSchemaOptions& options_;
  GrammarBuilder& builder_;
  std::map<std::string, std::string> common_names_;
  std::set<std::string> added_;
  std::map<std::string, std::string> ref_rules_;
};

Status check_options(const JsonSchemaOptions& options) {
  if (options.max_whitespace < 0 || options.max_whitespace > 1000 || options.max_depth < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "json schema options: max_whitespace {} (0..1000), max_depth {} (>= 1)", options.max_whitespace,
                      options.max_depth);
  }
  return Status::Ok();
}

}  // namespace

Status add_json_schema_rules(const nlohmann::ordered_json& schema, GrammarBuilder& builder,
                             const std::string& rule_name, const JsonSchemaOptions& options) {
  TACHYON_RETURN_IF_ERROR(check_options(options));
  if (!is_gbnf_rule_name(rule_name) || builder.has_rule(rule_name)) {
    return make_error(ErrorCode::kInvalidArgument, "json schema: rule name '{}' is not a free GBNF name", rule_name);
  }
  SchemaCompiler compiler(schema, options, builder, rule_name);
  try {
    TACHYON_ASSIGN_OR_RETURN(GrammarExpr root, compiler.compile(schema, "", 0));
    TACHYON_RETURN_IF_ERROR(builder.add_rule(rule_name, std::move(root)));
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, "json schema: {}", e.what());
  }
  return Status::Ok();
}

Result<Grammar> json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  GrammarBuilder builder(options.limits);
  TACHYON_RETURN_IF_ERROR(add_json_schema_rules(schema, builder, "root", options));
  Result<Grammar> grammar = builder.build("root");
  if (!grammar.ok()) return grammar.status().with_context("json schema");
  return grammar;
}

Result<Grammar> json_schema_to_grammar(const nlohmann::json& schema, const JsonSchemaOptions& options) {
  return json_schema_to_grammar(nlohmann::ordered_json::parse(schema.dump()), options);
}

Result<Grammar> json_schema_to_grammar(std::string_view schema_text, const JsonSchemaOptions& options) {
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::parse_error& e) {
    return make_error(ErrorCode::kInvalidArgument, "json schema is not valid JSON: {}", e.what());
  }
  return json_schema_to_grammar(schema, options);
}

Result<Grammar> json_object_grammar(const JsonSchemaOptions& options) {
  TACHYON_RETURN_IF_ERROR(check_options(options));
  GrammarBuilder builder(options.limits);
  const ojson empty = ojson::object();
  SchemaCompiler compiler(empty, options, builder, "root");
  TACHYON_RETURN_IF_ERROR(builder.add_rule("root", compiler.common("json-object")));
  return builder.build("root");
}

}  // namespace tachyon
