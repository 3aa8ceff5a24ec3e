#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "tokenizer/jinja_string.h"
#include "tokenizer/unicode.h"

namespace tachyon::jinja {
namespace {

int container_depth(const List& items) {
  int depth = 0;
  for (const Value& item : items) depth = std::max(depth, item.nesting_depth());
  return depth + 1;
}

int container_depth(const Dict& dict) {
  int depth = 0;
  for (const auto& [key, value] : dict.items()) depth = std::max({depth, key.nesting_depth(), value.nesting_depth()});
  return depth + 1;
}

size_t container_footprint(const List& items) {
  size_t bytes = 0;
  for (const Value& item : items) bytes += 16 + item.footprint();
  return bytes;
}

size_t container_footprint(const Dict& dict) {
  size_t bytes = 0;
  for (const auto& [key, value] : dict.items()) bytes += 16 + key.footprint() + value.footprint();
  return bytes;
}

bool any_namespace(const List& items) {
  return std::any_of(items.begin(), items.end(), [](const Value& v) { return v.holds_namespace(); });
}

bool any_namespace(const Dict& dict) {
  return std::any_of(dict.items().begin(), dict.items().end(),
                     [](const auto& kv) { return kv.first.holds_namespace() || kv.second.holds_namespace(); });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Dict

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items_) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items_) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : items_) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

// ---------------------------------------------------------------------------------------------
// Value

Value Value::undefined(std::string message) {
  Value v;
  v.data_ = std::move(message);
  return v;
}

const std::string& Value::undefined_message() const {
  static const std::string kNone;
  const std::string* message = std::get_if<std::string>(&data_);
  return message != nullptr ? *message : kNone;
}

Value Value::none() {
  Value v;
  v.kind_ = ValueKind::kNone;
  return v;
}

Value Value::list(List items) {
  Value v;
  v.kind_ = ValueKind::kList;
  v.depth_ = container_depth(items);
  v.footprint_ = container_footprint(items);
  v.holds_namespace_ = any_namespace(items);
  v.data_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.kind_ = ValueKind::kTuple;
  return v;
}

Value Value::dict(Dict items) {
  Value v;
  v.kind_ = ValueKind::kDict;
  v.depth_ = container_depth(items);
  v.footprint_ = container_footprint(items);
  v.holds_namespace_ = any_namespace(items);
  v.data_ = std::make_shared<Dict>(std::move(items));
  return v;
}

Value Value::make_namespace(Dict attributes) {
  Value v;
  v.kind_ = ValueKind::kNamespace;
  v.data_ = std::make_shared<Dict>(std::move(attributes));
  return v;
}

Value Value::callable(std::string name, NativeFunction function) {
  Value v;
  v.kind_ = ValueKind::kCallable;
  v.data_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(function)});
  return v;
}

Value Value::object(std::shared_ptr<Object> object) {
  Value v;
  v.kind_ = ValueKind::kObject;
  v.depth_ = object->nesting_depth();
  v.holds_namespace_ = object->holds_namespace();
  v.data_ = std::move(object);
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

bool Value::same_object(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case ValueKind::kList:
    case ValueKind::kTuple:
      return list_ptr() == other.list_ptr();
    case ValueKind::kDict:
    case ValueKind::kNamespace:
      return &as_dict() == &other.as_dict();
    case ValueKind::kCallable:
      return &as_callable() == &other.as_callable();
    case ValueKind::kObject:
      return &as_object() == &other.as_object();
    default:
      return false;
  }
}

int Value::nesting_depth() const {
  if (kind_ == ValueKind::kNamespace) return container_depth(as_dict());
  return depth_;
}

bool Value::holds_namespace() const { return kind_ == ValueKind::kNamespace || holds_namespace_; }

size_t Value::footprint() const {
  switch (kind_) {
    case ValueKind::kString: return as_string().size();
    case ValueKind::kNamespace: return container_footprint(as_dict());
    default: return footprint_;
  }
}

// ---------------------------------------------------------------------------------------------
// Python semantics

std::string type_name(const Value& value) {
  switch (value.kind()) {
    case ValueKind::kUndefined: return "Undefined";
    case ValueKind::kNone: return "NoneType";
    case ValueKind::kBool: return "bool";
    case ValueKind::kInt: return "int";
    case ValueKind::kFloat: return "float";
    case ValueKind::kString: return value.is_markup() ? "Markup" : "str";
    case ValueKind::kList: return "list";
    case ValueKind::kTuple: return "tuple";
    case ValueKind::kDict: return "dict";
    case ValueKind::kNamespace: return "Namespace";
    case ValueKind::kCallable: return "function";
    case ValueKind::kObject: return value.as_object().type_name();
  }
  return "object";
}

std::string object_description(const Value& value) {
  if (value.is_none()) return "None";
  return type_name(value) + " object";
}

bool truthy(const Value& value) {
  switch (value.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return false;
    case ValueKind::kBool: return value.as_bool();
    case ValueKind::kInt: return value.as_int() != 0;
    case ValueKind::kFloat: return value.as_float() != 0.0;
    case ValueKind::kString: return !value.as_string().empty();
    case ValueKind::kList:
    case ValueKind::kTuple:
      return !value.as_list().empty();
    case ValueKind::kDict: return !value.as_dict().empty();
    default: return true;
  }
}

namespace {

bool equals_at(const Value& a, const Value& b, int depth) {
  if (depth > 2 * kMaxNestingDepth) return a.same_object(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return true;
    case ValueKind::kString:
      return a.as_string() == b.as_string();
    case ValueKind::kList:
    case ValueKind::kTuple: {
      if (a.same_object(b)) return true;
      const List& x = a.as_list();
      const List& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals_at(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case ValueKind::kDict: {
      if (a.same_object(b)) return true;
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.items()) {
        const Value* other = y.find(key);
        if (other == nullptr || !equals_at(value, *other, depth + 1)) return false;
      }
      return true;
    }
    default:
      return a.same_object(b);
  }
}

Result<int> compare_at(const Value& a, const Value& b, int depth) {
  if (a.is_undefined() || b.is_undefined()) {
    const std::string& message = (a.is_undefined() ? a : b).undefined_message();
    return Status(ErrorCode::kInvalidArgument, message.empty() ? "value is undefined" : message);
  }
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_float();
      const double y = b.as_float();
      return x < y ? -1 : (y < x ? 1 : 0);
    }
    return a.as_int() < b.as_int() ? -1 : (b.as_int() < a.as_int() ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.kind() == b.kind() && a.is_sequence() && depth < 2 * kMaxNestingDepth) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare_at(x[i], y[i], depth + 1);
    }
    return x.size() < y.size() ? -1 : (y.size() < x.size() ? 1 : 0);
  }
  return make_error(ErrorCode::kInvalidArgument, "ordering is not supported between instances of '{}' and '{}'",
                    type_name(a), type_name(b));
}

void append_repr(std::string& out, const Value& value, int depth);

void append_sequence(std::string& out, const Value& value, int depth) {
  const bool tuple = value.is_tuple();
  const List& items = value.as_list();
  out.push_back(tuple ? '(' : '[');
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    append_repr(out, items[i], depth + 1);
  }
  if (tuple && items.size() == 1) out.push_back(',');
  out.push_back(tuple ? ')' : ']');
}

void append_dict(std::string& out, const Dict& dict, int depth) {
  out.push_back('{');
  bool first = true;
  for (const auto& [key, value] : dict.items()) {
    if (!first) out += ", ";
    first = false;
    append_repr(out, key, depth + 1);
    out += ": ";
    append_repr(out, value, depth + 1);
  }
  out.push_back('}');
}

void append_str(std::string& out, const Value& value, int depth) {
  if (depth > 2 * kMaxNestingDepth) {
    out += "...";
    return;
  }
  if (out.size() > kMaxStringBytes) return;  // the caller's size check reports it
  switch (value.kind()) {
    case ValueKind::kUndefined: return;
    case ValueKind::kNone: out += "None"; return;
    case ValueKind::kBool: out += value.as_bool() ? "True" : "False"; return;
    case ValueKind::kInt: out += std::to_string(value.as_int()); return;
    case ValueKind::kFloat: out += format_float(value.as_float()); return;
    case ValueKind::kString: out += value.as_string(); return;
    case ValueKind::kList:
    case ValueKind::kTuple:
      append_sequence(out, value, depth);
      return;
    case ValueKind::kDict: append_dict(out, value.as_dict(), depth); return;
    case ValueKind::kNamespace:
      out += "<Namespace ";
      append_dict(out, value.as_dict(), depth);
      out += ">";
      return;
    case ValueKind::kCallable: out += fmt::format("<function {}>", value.as_callable().name); return;
    case ValueKind::kObject: out += fmt::format("<{}>", value.as_object().type_name()); return;
  }
}

void append_repr(std::string& out, const Value& value, int depth) {
  if (out.size() > kMaxStringBytes) return;  // the caller's size check reports it
  if (value.is_string()) {
    if (value.is_markup()) out += "Markup(";
    out += pystr::repr(value.as_string());
    if (value.is_markup()) out += ")";
  } else if (value.is_undefined()) {
    out += "Undefined";
  } else {
    append_str(out, value, depth);
  }
}

// ---------------------------------------------------------------------------------------------
// JSON

template <typename Json>
Result<Value> from_json_at(const Json& json, int depth) {
  if (depth > kMaxNestingDepth) {
    return make_error(ErrorCode::kInvalidArgument, "JSON nested deeper than {} levels", kMaxNestingDepth);
  }
  switch (json.type()) {
    case nlohmann::detail::value_t::null: return Value::none();
    case nlohmann::detail::value_t::boolean: return Value(json.template get<bool>());
    case nlohmann::detail::value_t::number_integer: return Value(json.template get<int64_t>());
    case nlohmann::detail::value_t::number_unsigned: {
      const auto u = json.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::detail::value_t::number_float: return Value(json.template get<double>());
    case nlohmann::detail::value_t::string: return Value(json.template get_ref<const std::string&>());
    case nlohmann::detail::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) {
        TACHYON_ASSIGN_OR_RETURN(Value v, from_json_at(item, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::list(std::move(items));
    }
    case nlohmann::detail::value_t::object: {
      Dict dict;
      for (auto it = json.begin(); it != json.end(); ++it) {
        TACHYON_ASSIGN_OR_RETURN(Value v, from_json_at(it.value(), depth + 1));
        dict.set(Value(it.key()), std::move(v));
      }
      return Value::dict(std::move(dict));
    }
    default:
      return make_error(ErrorCode::kInvalidArgument, "unsupported JSON value (binary or discarded)");
  }
}

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (size_t pos = 0; pos < s.size();) {
    const auto byte = static_cast<unsigned char>(s[pos]);
    if (byte < 0x80) {
      switch (byte) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (byte < 0x20) {
            out += fmt::format("\\u{:04x}", byte);
          } else {
            out.push_back(static_cast<char>(byte));
          }
      }
      ++pos;
      continue;
    }
    const pystr::Char ch = pystr::char_at(s, pos);
    if (!ensure_ascii) {
      out.append(s.substr(pos, ch.length));
    } else if (ch.code_point > 0xFFFF) {
      const char32_t v = ch.code_point - 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(ch.code_point));
    }
    pos += ch.length;
  }
  out.push_back('"');
}

std::string json_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return format_float(value);
}

Result<std::string> json_key(const Value& key) {
  switch (key.kind()) {
    case ValueKind::kString: return key.as_string();
    case ValueKind::kBool: return std::string(key.as_bool() ? "true" : "false");
    case ValueKind::kInt: return std::to_string(key.as_int());
    case ValueKind::kFloat: return json_float(key.as_float());
    case ValueKind::kNone: return std::string("null");
    default:
      return make_error(ErrorCode::kInvalidArgument, "keys must be str, int, float, bool or None, not {}",
                        type_name(key));
  }
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpOptions& options) : options_(options) {
    const bool indented = options.indent.has_value();
    item_separator_ = options.separators ? options.separators->first : (indented ? "," : ", ");
    key_separator_ = options.separators ? options.separators->second : ": ";
  }

  Status write(std::string& out, const Value& value, int level) {
    if (level > 2 * kMaxNestingDepth) {
      return make_error(ErrorCode::kInvalidArgument, "tojson: value nested too deeply (or circular)");
    }
    if (out.size() > kMaxStringBytes) {
      return make_error(ErrorCode::kOutOfRange, "tojson: output larger than {} bytes", kMaxStringBytes);
    }
    switch (value.kind()) {
      case ValueKind::kNone: out += "null"; return Status::Ok();
      case ValueKind::kBool: out += value.as_bool() ? "true" : "false"; return Status::Ok();
      case ValueKind::kInt: out += std::to_string(value.as_int()); return Status::Ok();
      case ValueKind::kFloat: out += json_float(value.as_float()); return Status::Ok();
      case ValueKind::kString: append_json_string(out, value.as_string(), options_.ensure_ascii); return Status::Ok();
      case ValueKind::kList:
      case ValueKind::kTuple: {
        const List& items = value.as_list();
        if (items.empty()) {
          out += "[]";
          return Status::Ok();
        }
        out.push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_separator_;
          newline(out, level + 1);
          TACHYON_RETURN_IF_ERROR(write(out, items[i], level + 1));
        }
        newline(out, level);
        out.push_back(']');
        return Status::Ok();
      }
      case ValueKind::kDict: {
        const Dict& dict = value.as_dict();
        if (dict.empty()) {
          out += "{}";
          return Status::Ok();
        }
        std::vector<std::pair<std::string, const Value*>> entries;
        entries.reserve(dict.size());
        for (const auto& [key, item] : dict.items()) {
          TACHYON_ASSIGN_OR_RETURN(std::string k, json_key(key));
          entries.emplace_back(std::move(k), &item);
        }
        if (options_.sort_keys) {
          std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        out.push_back('{');
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i > 0) out += item_separator_;
          newline(out, level + 1);
          append_json_string(out, entries[i].first, options_.ensure_ascii);
          out += key_separator_;
          TACHYON_RETURN_IF_ERROR(write(out, *entries[i].second, level + 1));
        }
        newline(out, level);
        out.push_back('}');
        return Status::Ok();
      }
      default:
        return make_error(ErrorCode::kInvalidArgument, "Object of type {} is not JSON serializable", type_name(value));
    }
  }

 private:
  void newline(std::string& out, int level) const {
    if (!options_.indent) return;
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *options_.indent;
  }

  const JsonDumpOptions& options_;
  std::string item_separator_;
  std::string key_separator_;
};

}  // namespace

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }

Result<int> compare(const Value& a, const Value& b) { return compare_at(a, b, 0); }

std::string to_str(const Value& value) {
  if (value.is_string()) return value.as_string();
  std::string out;
  append_str(out, value, 0);
  return out;
}

std::string to_repr(const Value& value) {
  std::string out;
  append_repr(out, value, 0);
  return out;
}

std::string format_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, laid out as Python's repr(): positional for exponents -4..15,
  // scientific otherwise, always with a '.0' or a fraction in positional form.
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string_view sci(buffer, static_cast<size_t>(result.ptr - buffer));
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (const char c : sci.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exponent);
  const int decimal_point = exponent + 1;  // digits before the point
  if (decimal_point > -4 && decimal_point <= 16) {
    const auto point = static_cast<size_t>(std::max(decimal_point, 0));
    if (decimal_point <= 0) {
      out.append("0.");
      out.append(static_cast<size_t>(-decimal_point), '0');
      out.append(digits);
    } else if (point >= digits.size()) {
      out.append(digits);
      out.append(point - digits.size(), '0');
      out.append(".0");
    } else {
      out.append(digits, 0, point);
      out.push_back('.');
      out.append(digits, point);
    }
    return out;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) {
    out.push_back('.');
    out.append(digits, 1);
  }
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

Result<Value> from_json(const nlohmann::ordered_json& json) { return from_json_at(json, 0); }
Result<Value> from_json(const nlohmann::json& json) { return from_json_at(json, 0); }

Result<std::string> to_json(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  JsonWriter writer(options);
  TACHYON_RETURN_IF_ERROR(writer.write(out, value, 0));
  return out;
}

}  // namespace tachyon::jinja
