// jinja2's built-in filters and tests (plus transformers' |tojson), each following jinja2's own
// definition: which inputs it accepts, what it returns, and which quirks it keeps (|int parses
// "4.7" as 4, |round rounds half to even, |attr never looks at dict keys, ...).
#include <algorithm>
#include <cmath>
#include <map>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_string.h"
#include "tokenizer/unicode.h"

namespace tachyon::jinja {
namespace {

Status type_error(std::string message) { return Status(ErrorCode::kInvalidArgument, std::move(message)); }

Status undefined_error(const Value& v) {
  return Status(ErrorCode::kInvalidArgument, v.undefined_message().empty() ? "value is undefined" : v.undefined_message());
}

// jinja2's soft_str: what printing the value gives (undefined -> "").
std::string text_of(const Value& v) { return to_str(v); }

Result<int64_t> int_arg(const Value& v, std::string_view what) {
  if (v.is_integral()) return v.as_int();
  if (v.is_undefined()) return undefined_error(v);
  return type_error(fmt::format("{} must be an integer, not '{}'", what, type_name(v)));
}

// Python's len().
Result<int64_t> length_of(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined: return int64_t{0};
    case ValueKind::kString: return static_cast<int64_t>(pystr::length(v.as_string()));
    case ValueKind::kList:
    case ValueKind::kTuple:
      return static_cast<int64_t>(v.as_list().size());
    case ValueKind::kDict: return static_cast<int64_t>(v.as_dict().size());
    default: return type_error(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

// jinja2's attribute getter for filters' `attribute=` arguments: "a.b.0" looks up item by item.
Result<Value> get_path(const Value& item, const Value& path) {
  if (path.is_integral()) return get_item(item, path);
  if (!path.is_string()) return type_error("attribute must be a string or an integer");
  Value v = item;
  const std::string& p = path.as_string();
  size_t start = 0;
  while (true) {
    const size_t dot = p.find('.', start);
    const std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (numeric && part.size() < 18) {
      TACHYON_ASSIGN_OR_RETURN(v, get_item(v, Value(static_cast<int64_t>(std::stoll(part)))));
    } else {
      TACHYON_ASSIGN_OR_RETURN(v, get_item(v, Value(part)));
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Sort key for case-insensitive comparisons: strings lower-cased.
Value fold_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(pystr::lower(v.as_string()));
  return v;
}

// Stable sort of `items` by `keys`, failing on unorderable pairs as Python's sorted() does.
Status sort_by_keys(List& items, std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Status failure = Status::Ok();
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (!failure.ok()) return false;
    Result<int> c = compare(keys[reverse ? b : a], keys[reverse ? a : b]);
    if (!c.ok()) {
      failure = type_error(fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(keys[a]),
                                       type_name(keys[b])));
      return false;
    }
    return *c < 0;
  });
  TACHYON_RETURN_IF_ERROR(failure);
  List sorted;
  sorted.reserve(items.size());
  for (const size_t i : order) sorted.push_back(items[i]);
  items = std::move(sorted);
  return Status::Ok();
}

// ------------------------------------------------------------------------------------------------
// Filters

Result<Value> f_abs(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("abs", args, {}));
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) return type_error("integer overflow in abs()");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.is_undefined()) return undefined_error(v);
  return type_error(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
}

Result<Value> f_attr(Renderer&, const Value& v, CallArgs& args) {
  Value name;
  TACHYON_RETURN_IF_ERROR(bind_args("attr", args, {{"name", &name}}));
  if (!name.is_string()) return type_error("attr: the attribute name must be a string");
  // getattr() only: dict keys are not attributes.
  if (v.is_dict()) {
    if (std::optional<Value> method = bound_method(v, name.as_string())) return *method;
    return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_description(v), name.as_string()));
  }
  return get_attribute(v, name.as_string());  // fails on undefined, as getattr(Undefined) does
}

Result<Value> f_batch(Renderer& r, const Value& v, CallArgs& args) {
  Value count, fill = Value::none();
  TACHYON_RETURN_IF_ERROR(bind_args("batch", args, {{"linecount", &count}, {"fill_with", &fill}}));
  TACHYON_ASSIGN_OR_RETURN(const int64_t n, int_arg(count, "batch size"));
  if (n <= 0) return type_error("batch size must be positive");
  if (!fill.is_none()) {
    TACHYON_RETURN_IF_ERROR(r.check_size(static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)) * (16 + fill.footprint())));
  }
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  List out;
  List current;
  for (const Value& item : *items) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == n) out.push_back(Value::list(std::exchange(current, {})));
  }
  if (!current.empty()) {
    if (!fill.is_none()) {
      while (static_cast<int64_t>(current.size()) < n) current.push_back(fill);
    }
    out.push_back(Value::list(std::move(current)));
  }
  return Value::list(std::move(out));
}

Result<Value> f_capitalize(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("capitalize", args, {}));
  return Value(pystr::capitalize(text_of(v)));
}

Result<Value> f_center(Renderer&, const Value& v, CallArgs& args) {
  Value width = Value(int64_t{80});
  TACHYON_RETURN_IF_ERROR(bind_args("center", args, {{"width", &width}}));
  TACHYON_ASSIGN_OR_RETURN(const int64_t w, int_arg(width, "width"));
  return Value(pystr::center(text_of(v), std::min<int64_t>(w, 1 << 20), " "));
}

Result<Value> f_length(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("length", args, {}));
  TACHYON_ASSIGN_OR_RETURN(const int64_t n, length_of(v));
  return Value(n);
}

Result<Value> f_default(Renderer&, const Value& v, CallArgs& args) {
  Value fallback = Value(""), boolean = Value(false);
  TACHYON_RETURN_IF_ERROR(bind_args("default", args, {{"default_value", &fallback}, {"boolean", &boolean}}));
  if (v.is_undefined() || (truthy(boolean) && !truthy(v))) return fallback;
  return v;
}

Result<Value> f_dictsort(Renderer&, const Value& v, CallArgs& args) {
  Value case_sensitive = Value(false), by = Value("key"), reverse = Value(false);
  TACHYON_RETURN_IF_ERROR(
      bind_args("dictsort", args, {{"case_sensitive", &case_sensitive}, {"by", &by}, {"reverse", &reverse}}));
  if (!v.is_dict()) return type_error("dictsort: value must be a dict");
  int position = 0;
  if (by.is_string() && by.as_string() == "value") {
    position = 1;
  } else if (!by.is_string() || by.as_string() != "key") {
    return type_error("You can only sort by either 'key' or 'value'");
  }
  List items;
  std::vector<Value> keys;
  for (const auto& [k, item] : v.as_dict().items()) {
    items.push_back(Value::tuple({k, item}));
    keys.push_back(fold_case(position == 0 ? k : item, truthy(case_sensitive)));
  }
  TACHYON_RETURN_IF_ERROR(sort_by_keys(items, keys, truthy(reverse)));
  return Value::list(std::move(items));
}

Result<Value> f_escape(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("escape", args, {}));
  if (v.is_markup()) return v;
  return Value::markup(pystr::html_escape(text_of(v)));
}

Result<Value> f_forceescape(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("forceescape", args, {}));
  return Value::markup(pystr::html_escape(text_of(v)));
}

Result<Value> f_first(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("first", args, {}));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  if (items->empty()) return Value::undefined("No first item, sequence was empty.");
  return items->front();
}

Result<Value> f_last(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("last", args, {}));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  if (items->empty()) return Value::undefined("No last item, sequence was empty.");
  return items->back();
}

// Python's float(str): surrounding whitespace allowed, underscores between digits, inf/nan.
std::optional<double> parse_float(const std::string& text) {
  std::string s = pystr::strip(text, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        return std::nullopt;
      }
      continue;
    }
    clean.push_back(s[i]);
  }
  if (clean.empty()) return std::nullopt;
  const std::string lower = pystr::lower(clean);
  const std::string unsigned_part = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (unsigned_part == "inf" || unsigned_part == "infinity" || unsigned_part == "nan") {
    const double x = unsigned_part == "nan" ? std::nan("") : INFINITY;
    return lower[0] == '-' ? -x : x;
  }
  for (const char c : clean) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-') {
      return std::nullopt;
    }
  }
  char* end = nullptr;
  const double x = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return x;
}

// Python's int(str, base).
std::optional<int64_t> parse_int(const std::string& text, int64_t base) {
  std::string s = pystr::strip(text, std::nullopt, true, true);
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (i + 1 < s.size() && s[i] == '0') {
      const char p = static_cast<char>(s[i + 1] | 0x20);
      const int64_t prefixed = p == 'x' ? 16 : (p == 'o' ? 8 : (p == 'b' ? 2 : 0));
      if (prefixed != 0 && (base == 0 || base == prefixed)) {
        base = prefixed;
        i += 2;
        if (i < s.size() && s[i] == '_') ++i;
      }
    }
    if (base == 0) base = 10;
  }
  if (base < 2 || base > 36 || i >= s.size()) return std::nullopt;
  uint64_t value = 0;
  bool any = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_' && any && i + 1 < s.size() && s[i + 1] != '_') continue;
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    const char l = static_cast<char>(c | 0x20);
    if (l >= 'a' && l <= 'z') d = l - 'a' + 10;
    if (d < 0 || d >= base) return std::nullopt;
    if (value > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) {
      return std::nullopt;
    }
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    any = true;
  }
  if (!any) return std::nullopt;
  return negative ? -static_cast<int64_t>(value) : static_cast<int64_t>(value);
}

Result<Value> f_float(Renderer&, const Value& v, CallArgs& args) {
  Value fallback = Value(0.0);
  TACHYON_RETURN_IF_ERROR(bind_args("float", args, {{"default", &fallback}}));
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    if (std::optional<double> x = parse_float(v.as_string())) return Value(*x);
    return fallback;
  }
  if (v.is_undefined()) return undefined_error(v);
  return fallback;
}

Result<Value> f_int(Renderer&, const Value& v, CallArgs& args) {
  Value fallback = Value(int64_t{0}), base = Value(int64_t{10});
  TACHYON_RETURN_IF_ERROR(bind_args("int", args, {{"default", &fallback}, {"base", &base}}));
  if (v.is_integral()) return Value(v.as_int());
  if (v.is_float()) {
    const double x = v.as_float();
    if (std::isnan(x) || std::isinf(x) || std::fabs(x) >= 9.2e18) return type_error("cannot convert float to integer");
    return Value(static_cast<int64_t>(x));
  }
  if (v.is_string()) {
    TACHYON_ASSIGN_OR_RETURN(const int64_t b, int_arg(base, "base"));
    if (std::optional<int64_t> x = parse_int(v.as_string(), b)) return Value(*x);
    if (std::optional<double> x = parse_float(v.as_string())) {
      if (std::isnan(*x) || std::isinf(*x) || std::fabs(*x) >= 9.2e18) return type_error("cannot convert float to integer");
      return Value(static_cast<int64_t>(*x));
    }
    return fallback;
  }
  if (v.is_undefined()) return undefined_error(v);
  return fallback;
}

Result<Value> f_items(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("items", args, {}));
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) return type_error("Can only get item pairs from a mapping.");
  List items;
  items.reserve(v.as_dict().size());
  for (const auto& [k, item] : v.as_dict().items()) items.push_back(Value::tuple({k, item}));
  return Value::list(std::move(items));
}

Result<Value> f_join(Renderer& r, const Value& v, CallArgs& args) {
  Value separator = Value(""), attribute;
  TACHYON_RETURN_IF_ERROR(bind_args("join", args, {{"d", &separator}, {"attribute", &attribute}}));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  const std::string sep = text_of(separator);
  std::string out;
  bool first = true;
  for (const Value& item : *items) {
    if (!first) out += sep;
    first = false;
    if (attribute.is_undefined()) {
      out += text_of(item);
    } else {
      TACHYON_ASSIGN_OR_RETURN(Value field, get_path(item, attribute));
      out += text_of(field);
    }
    TACHYON_RETURN_IF_ERROR(r.check_size(out.size()));
  }
  return Value(std::move(out));
}

Result<Value> f_list(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("list", args, {}));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  return Value::list(*items);
}

Result<Value> f_lower(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("lower", args, {}));
  return Value(pystr::lower(text_of(v)));
}

Result<Value> f_upper(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("upper", args, {}));
  return Value(pystr::upper(text_of(v)));
}

Result<Value> f_map(Renderer& r, const Value& v, CallArgs& args) {
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  List out;
  out.reserve(items->size());
  if (args.positional.empty()) {
    Value attribute, fallback;
    TACHYON_RETURN_IF_ERROR(bind_args("map", args, {{"attribute", &attribute}, {"default", &fallback}}));
    if (attribute.is_undefined()) return type_error("map: give a filter name or attribute=");
    for (const Value& item : *items) {
      TACHYON_ASSIGN_OR_RETURN(Value field, get_path(item, attribute));
      out.push_back(field.is_undefined() && !fallback.is_undefined() ? fallback : field);
    }
    return Value::list(std::move(out));
  }
  const Value name = args.positional.front();
  if (!name.is_string()) return type_error("map: the filter name must be a string");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : *items) {
    CallArgs call = rest;
    TACHYON_ASSIGN_OR_RETURN(Value mapped, r.apply_filter(name.as_string(), item, call));
    out.push_back(std::move(mapped));
  }
  return Value::list(std::move(out));
}

Result<Value> min_max(std::string_view name, const Value& v, CallArgs& args, bool want_max) {
  Value case_sensitive = Value(false), attribute;
  TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"case_sensitive", &case_sensitive}, {"attribute", &attribute}}));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  if (items->empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const Value* best = nullptr;
  Value best_key;
  for (const Value& item : *items) {
    Value key = item;
    if (!attribute.is_undefined()) {
      TACHYON_ASSIGN_OR_RETURN(key, get_path(item, attribute));
    }
    key = fold_case(key, truthy(case_sensitive));
    if (best != nullptr) {
      TACHYON_ASSIGN_OR_RETURN(const int c, compare(key, best_key));
      if (want_max ? c <= 0 : c >= 0) continue;
    }
    best = &item;
    best_key = std::move(key);
  }
  return *best;
}

Result<Value> f_max(Renderer&, const Value& v, CallArgs& args) { return min_max("max", v, args, true); }
Result<Value> f_min(Renderer&, const Value& v, CallArgs& args) { return min_max("min", v, args, false); }

// select/reject/selectattr/rejectattr share this: keep items whose test result equals `keep`.
Result<Value> select_items(Renderer& r, const Value& v, CallArgs& args, bool keep, bool by_attribute) {
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (args.positional.empty()) return type_error("selectattr/rejectattr need an attribute name");
    attribute = args.positional[next++];
  }
  std::optional<std::string> test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return type_error("the test name must be a string");
    test = args.positional[next++].as_string();
  }
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end());
  test_args.keyword = args.keyword;
  List out;
  for (const Value& item : *items) {
    Value subject = item;
    if (by_attribute) {
      TACHYON_ASSIGN_OR_RETURN(subject, get_path(item, attribute));
    }
    bool result;
    if (test) {
      CallArgs call = test_args;
      TACHYON_ASSIGN_OR_RETURN(result, r.apply_test(*test, subject, call));
    } else {
      result = truthy(subject);
    }
    if (result == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Result<Value> f_select(Renderer& r, const Value& v, CallArgs& a) { return select_items(r, v, a, true, false); }
Result<Value> f_reject(Renderer& r, const Value& v, CallArgs& a) { return select_items(r, v, a, false, false); }
Result<Value> f_selectattr(Renderer& r, const Value& v, CallArgs& a) { return select_items(r, v, a, true, true); }
Result<Value> f_rejectattr(Renderer& r, const Value& v, CallArgs& a) { return select_items(r, v, a, false, true); }

Result<Value> f_replace(Renderer& r, const Value& v, CallArgs& args) {
  Value old_part, new_part, count;
  TACHYON_RETURN_IF_ERROR(bind_args("replace", args, {{"old", &old_part}, {"new", &new_part}, {"count", &count}}));
  int64_t n = -1;
  if (!count.is_undefined() && !count.is_none()) {
    TACHYON_ASSIGN_OR_RETURN(n, int_arg(count, "count"));
  }
  const std::string s = text_of(v);
  const std::string o = text_of(old_part);
  const std::string w = text_of(new_part);
  if (o.empty()) TACHYON_RETURN_IF_ERROR(r.check_size(s.size() + (s.size() + 1) * w.size()));
  std::string out = pystr::replace(s, o, w, n);
  TACHYON_RETURN_IF_ERROR(r.check_size(out.size()));
  return Value(std::move(out));
}

Result<Value> f_reverse(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("reverse", args, {}));
  if (v.is_string()) return Value(pystr::slice(v.as_string(), std::nullopt, std::nullopt, -1));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  List out(items->rbegin(), items->rend());
  return Value::list(std::move(out));
}

// Python's round(x, ndigits) for floats: correctly rounded, ties to even.
double round_half_even(double x, int64_t digits) {
  if (std::isnan(x) || std::isinf(x)) return x;
  if (digits < 0) {
    const double scale = std::pow(10.0, static_cast<double>(-digits));
    return std::nearbyint(x / scale) * scale;
  }
  const std::string text = fmt::format("{:.{}f}", x, std::min<int64_t>(digits, 340));
  return std::strtod(text.c_str(), nullptr);
}

Result<Value> f_round(Renderer&, const Value& v, CallArgs& args) {
  Value precision = Value(int64_t{0}), method = Value("common");
  TACHYON_RETURN_IF_ERROR(bind_args("round", args, {{"precision", &precision}, {"method", &method}}));
  TACHYON_ASSIGN_OR_RETURN(const int64_t digits, int_arg(precision, "precision"));
  const std::string how = text_of(method);
  if (how != "common" && how != "ceil" && how != "floor") {
    return type_error("method must be common, ceil or floor");
  }
  if (v.is_undefined()) return undefined_error(v);
  if (!v.is_number()) return type_error(fmt::format("type {} doesn't define __round__ method", type_name(v)));
  if (how == "common") {
    if (v.is_integral()) return Value(v.as_int());  // round(int, n) stays an int
    return Value(round_half_even(v.as_float(), digits));
  }
  const double scale = std::pow(10.0, static_cast<double>(digits));
  const double scaled = v.as_float() * scale;
  return Value((how == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

Result<Value> f_safe(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("safe", args, {}));
  return Value::markup(text_of(v));
}

Result<Value> f_sort(Renderer&, const Value& v, CallArgs& args) {
  Value reverse = Value(false), case_sensitive = Value(false), attribute;
  TACHYON_RETURN_IF_ERROR(bind_args(
      "sort", args, {{"reverse", &reverse}, {"case_sensitive", &case_sensitive}, {"attribute", &attribute}}));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> source, iterate(v));
  List items = *source;
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    Value key = item;
    if (!attribute.is_undefined()) {
      TACHYON_ASSIGN_OR_RETURN(key, get_path(item, attribute));
    }
    keys.push_back(fold_case(key, truthy(case_sensitive)));
  }
  TACHYON_RETURN_IF_ERROR(sort_by_keys(items, keys, truthy(reverse)));
  return Value::list(std::move(items));
}

Result<Value> f_string(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("string", args, {}));
  if (v.is_string()) return v;
  return Value(text_of(v));
}

Result<Value> f_striptags(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("striptags", args, {}));
  return Value(pystr::strip_tags(text_of(v)));
}

Result<Value> f_sum(Renderer&, const Value& v, CallArgs& args) {
  Value attribute, start = Value(int64_t{0});
  TACHYON_RETURN_IF_ERROR(bind_args("sum", args, {{"attribute", &attribute}, {"start", &start}}));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  Value total = start;
  for (const Value& item : *items) {
    Value x = item;
    if (!attribute.is_undefined()) {
      TACHYON_ASSIGN_OR_RETURN(x, get_path(item, attribute));
    }
    if (!total.is_number() || !x.is_number()) {
      return type_error(fmt::format("unsupported operand type(s) for +: '{}' and '{}'", type_name(total), type_name(x)));
    }
    if (total.is_float() || x.is_float()) {
      total = Value(total.as_float() + x.as_float());
    } else {
      int64_t s = 0;
      if (__builtin_add_overflow(total.as_int(), x.as_int(), &s)) return type_error("integer overflow in sum");
      total = Value(s);
    }
  }
  return total;
}

Result<Value> f_title(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("title", args, {}));
  return Value(pystr::jinja_title(text_of(v)));
}

Result<Value> f_tojson(Renderer& r, const Value& v, CallArgs& args) {
  Value ensure_ascii = Value(false), indent = Value::none(), separators = Value::none(), sort_keys = Value(false);
  TACHYON_RETURN_IF_ERROR(bind_args("tojson", args,
                                    {{"ensure_ascii", &ensure_ascii},
                                     {"indent", &indent},
                                     {"separators", &separators},
                                     {"sort_keys", &sort_keys}}));
  JsonDumpOptions options;
  options.ensure_ascii = truthy(ensure_ascii);
  options.sort_keys = truthy(sort_keys);
  if (indent.is_integral()) {
    options.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(indent.as_int(), 0, 1024)), ' ');
  } else if (indent.is_string()) {
    options.indent = indent.as_string();
  } else if (!indent.is_none() && !indent.is_undefined()) {
    return type_error("tojson: indent must be an integer or a string");
  }
  if (separators.is_sequence() && separators.as_list().size() == 2 && separators.as_list()[0].is_string() &&
      separators.as_list()[1].is_string()) {
    options.separators = std::make_pair(separators.as_list()[0].as_string(), separators.as_list()[1].as_string());
  } else if (!separators.is_none() && !separators.is_undefined()) {
    return type_error("tojson: separators must be a pair of strings");
  }
  TACHYON_ASSIGN_OR_RETURN(std::string json, to_json(v, options));
  TACHYON_RETURN_IF_ERROR(r.charge(json.size()));
  return Value(std::move(json));
}

Result<Value> f_trim(Renderer&, const Value& v, CallArgs& args) {
  Value chars = Value::none();
  TACHYON_RETURN_IF_ERROR(bind_args("trim", args, {{"chars", &chars}}));
  std::optional<std::string> set;
  if (chars.is_string()) set = chars.as_string();
  return Value(pystr::strip(text_of(v), set ? std::optional<std::string_view>(*set) : std::nullopt, true, true));
}

Result<Value> f_truncate(Renderer&, const Value& v, CallArgs& args) {
  Value length = Value(int64_t{255}), killwords = Value(false), end = Value("..."), leeway = Value::none();
  TACHYON_RETURN_IF_ERROR(bind_args(
      "truncate", args, {{"length", &length}, {"killwords", &killwords}, {"end", &end}, {"leeway", &leeway}}));
  TACHYON_ASSIGN_OR_RETURN(const int64_t n, int_arg(length, "length"));
  int64_t slack = 5;
  if (leeway.is_integral()) slack = leeway.as_int();
  const std::string s = text_of(v);
  const std::string tail = text_of(end);
  const auto tail_length = static_cast<int64_t>(pystr::length(tail));
  if (n < tail_length) return type_error("expected length >= len(end)");
  if (static_cast<int64_t>(pystr::length(s)) <= n + slack) return Value(s);
  std::string head = pystr::slice(s, int64_t{0}, n - tail_length, 1);
  if (!truthy(killwords)) head = pystr::rsplit(head, std::string_view(" "), 1).front();
  return Value(head + tail);
}

Result<Value> f_unique(Renderer&, const Value& v, CallArgs& args) {
  Value case_sensitive = Value(false), attribute;
  TACHYON_RETURN_IF_ERROR(bind_args("unique", args, {{"case_sensitive", &case_sensitive}, {"attribute", &attribute}}));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
  List out;
  std::vector<Value> seen;
  for (const Value& item : *items) {
    Value key = item;
    if (!attribute.is_undefined()) {
      TACHYON_ASSIGN_OR_RETURN(key, get_path(item, attribute));
    }
    key = fold_case(key, truthy(case_sensitive));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
    seen.push_back(std::move(key));
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Result<Value> f_wordcount(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("wordcount", args, {}));
  return Value(pystr::word_count(text_of(v)));
}

Result<Value> f_indent(Renderer& r, const Value& v, CallArgs& args) {
  Value width = Value(int64_t{4}), first = Value(false), blank = Value(false);
  TACHYON_RETURN_IF_ERROR(bind_args("indent", args, {{"width", &width}, {"first", &first}, {"blank", &blank}}));
  std::string indentation;
  if (width.is_string()) {
    indentation = width.as_string();
  } else {
    TACHYON_ASSIGN_OR_RETURN(const int64_t w, int_arg(width, "width"));
    indentation.assign(static_cast<size_t>(std::clamp<int64_t>(w, 0, 1024)), ' ');
  }
  const std::string s = text_of(v) + "\n";  // jinja2's quirk, so that splitlines sees the end
  const std::vector<std::string> lines = pystr::splitlines(s);
  TACHYON_RETURN_IF_ERROR(r.check_size(s.size() + (lines.size() + 1) * indentation.size()));
  std::string out;
  if (truthy(blank)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n" + indentation;
      out += lines[i];
    }
  } else {
    out = lines.empty() ? std::string() : lines.front();
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += indentation;
      out += lines[i];
    }
  }
  if (truthy(first)) out = indentation + out;
  return Value(std::move(out));
}

// Python's printf-style "%" formatting (the |format filter and "fmt" % args).
Result<std::string> percent_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t next = 0;
  const bool mapping = !args.keyword.empty();
  auto next_arg = [&](std::string_view key) -> Result<Value> {
    if (!key.empty()) {
      for (const auto& [k, v] : args.keyword) {
        if (k == key) return v;
      }
      return type_error(fmt::format("format: no value for key '{}'", key));
    }
    if (mapping) return type_error("format requires a mapping");
    if (next >= args.positional.size()) return type_error("not enough arguments for format string");
    return args.positional[next++];
  };
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) return type_error("incomplete format");
    std::string key;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) return type_error("incomplete format key");
      key = format.substr(i + 1, close - i - 1);
      i = close + 1;
    }
    std::string spec = "%";
    while (i < format.size() && std::string_view("-+ #0").find(format[i]) != std::string_view::npos) spec += format[i++];
    while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) spec += format[i++];
    if (i < format.size() && format[i] == '.') {
      spec += format[i++];
      while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) spec += format[i++];
    }
    if (i >= format.size()) return type_error("incomplete format");
    const char type = format[i];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    TACHYON_ASSIGN_OR_RETURN(Value arg, next_arg(key));
    char buffer[512];
    if (type == 's' || type == 'r' || type == 'a') {
      const std::string text = type == 's' ? to_str(arg) : to_repr(arg);
      // Width and precision count characters; apply them on code points.
      std::string flags = spec.substr(1);
      int64_t width = 0;
      std::optional<int64_t> precision;
      const bool left = flags.find('-') != std::string::npos;
      const size_t dot = flags.find('.');
      const std::string width_part = flags.substr(0, dot);
      for (const char c : width_part) {
        if (std::isdigit(static_cast<unsigned char>(c))) width = std::min<int64_t>(width * 10 + (c - '0'), 1 << 20);
      }
      if (dot != std::string::npos) precision = std::atoll(flags.c_str() + dot + 1);
      std::string body = precision ? pystr::slice(text, int64_t{0}, *precision, 1) : text;
      out += left ? pystr::ljust(body, width, " ") : pystr::rjust(body, width, " ");
      continue;
    }
    if (std::string_view("diouxXeEfFgGc").find(type) == std::string_view::npos) {
      return type_error(fmt::format("unsupported format character '{}'", type));
    }
    if (!arg.is_number()) {
      return type_error(fmt::format("%{} format: a real number is required, not {}", type, type_name(arg)));
    }
    if (spec.size() > 40) return type_error("format specification too long");
    if (std::string_view("diouxXc").find(type) != std::string_view::npos) {
      const auto x = static_cast<long long>(arg.is_float() ? std::trunc(arg.as_float()) : static_cast<double>(arg.as_int()));
      const char t = type == 'i' || type == 'u' ? 'd' : type;
      if (t == 'c') {
        std::string ch;
        append_utf8(ch, static_cast<char32_t>(std::clamp<long long>(x, 0, 0x10FFFF)));
        out += ch;
        continue;
      }
      std::snprintf(buffer, sizeof(buffer), (spec + "ll" + t).c_str(), arg.is_float() ? x : static_cast<long long>(arg.as_int()));
    } else {
      std::snprintf(buffer, sizeof(buffer), (spec + type).c_str(), arg.as_float());
    }
    out += buffer;
  }
  if (!mapping && next < args.positional.size()) {
    return type_error("not all arguments converted during string formatting");
  }
  return out;
}

Result<Value> f_format(Renderer& r, const Value& v, CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    return type_error("can't handle positional and keyword arguments at the same time");
  }
  TACHYON_ASSIGN_OR_RETURN(std::string out, percent_format(text_of(v), args));
  TACHYON_RETURN_IF_ERROR(r.check_size(out.size()));
  return Value(std::move(out));
}

Result<Value> f_unsupported(Renderer&, const Value&, CallArgs&) {
  return Status(ErrorCode::kUnsupported, "this jinja2 filter is not supported in chat templates");
}

// ------------------------------------------------------------------------------------------------
// Tests

#define SIMPLE_TEST(fn, name, expr)                                  \
  Result<bool> fn(Renderer&, const Value& v, CallArgs& args) {       \
    TACHYON_RETURN_IF_ERROR(bind_args(name, args, {}));              \
    return (expr);                                                   \
  }

SIMPLE_TEST(t_defined, "defined", !v.is_undefined())
SIMPLE_TEST(t_undefined, "undefined", v.is_undefined())
SIMPLE_TEST(t_none, "none", v.is_none())
SIMPLE_TEST(t_boolean, "boolean", v.is_bool())
SIMPLE_TEST(t_true, "true", v.is_bool() && v.as_bool())
SIMPLE_TEST(t_false, "false", v.is_bool() && !v.as_bool())
SIMPLE_TEST(t_integer, "integer", v.is_int())
SIMPLE_TEST(t_float, "float", v.is_float())
SIMPLE_TEST(t_number, "number", v.is_number())
SIMPLE_TEST(t_string, "string", v.is_string())
SIMPLE_TEST(t_mapping, "mapping", v.is_dict())
SIMPLE_TEST(t_iterable, "iterable",
            v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() ||
                (v.is_object() && v.as_object().type_name() == "LoopContext"))
SIMPLE_TEST(t_sequence, "sequence", v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict())
SIMPLE_TEST(t_callable, "callable",
            v.is_callable() || v.is_undefined() || (v.is_object() && v.as_object().type_name() == "LoopContext"))
SIMPLE_TEST(t_escaped, "escaped", v.is_markup())
SIMPLE_TEST(t_lower, "lower", pystr::is_lower(text_of(v)))
SIMPLE_TEST(t_upper, "upper", pystr::is_upper(text_of(v)))
#undef SIMPLE_TEST

Result<Value> modulo(const Value& v, int64_t divisor) {
  if (v.is_undefined()) return undefined_error(v);
  if (v.is_float()) {
    const double m = std::fmod(v.as_float(), static_cast<double>(divisor));
    return Value(m < 0 ? m + static_cast<double>(divisor) : m);
  }
  if (!v.is_integral()) return type_error(fmt::format("unsupported operand type(s) for %: '{}' and 'int'", type_name(v)));
  if (divisor == 0) return type_error("integer modulo by zero");
  int64_t m = v.as_int() % divisor;
  if (m != 0 && ((m < 0) != (divisor < 0))) m += divisor;
  return Value(m);
}

Result<bool> t_odd(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("odd", args, {}));
  TACHYON_ASSIGN_OR_RETURN(Value m, modulo(v, 2));
  return m.as_float() == 1.0;
}

Result<bool> t_even(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("even", args, {}));
  TACHYON_ASSIGN_OR_RETURN(Value m, modulo(v, 2));
  return m.as_float() == 0.0;
}

// Tests such as `is le`, `is in` and `is divisibleby` need their argument; jinja2 raises Python's
// TypeError when it is missing (`x is le`), where bind_args alone would leave it undefined.
Status require_argument(std::string_view test, const CallArgs& args, std::string_view name) {
  if (!args.positional.empty() || !args.keyword.empty()) return Status::Ok();
  return type_error(fmt::format("{}() missing 1 required positional argument: '{}'", test, name));
}

Result<bool> t_divisibleby(Renderer&, const Value& v, CallArgs& args) {
  Value num;
  TACHYON_RETURN_IF_ERROR(bind_args("divisibleby", args, {{"num", &num}}));
  TACHYON_RETURN_IF_ERROR(require_argument("divisibleby", args, "num"));
  TACHYON_ASSIGN_OR_RETURN(const int64_t n, int_arg(num, "divisor"));
  TACHYON_ASSIGN_OR_RETURN(Value m, modulo(v, n));
  return m.as_float() == 0.0;
}

Result<bool> t_sameas(Renderer&, const Value& v, CallArgs& args) {
  Value other;
  TACHYON_RETURN_IF_ERROR(bind_args("sameas", args, {{"other", &other}}));
  TACHYON_RETURN_IF_ERROR(require_argument("sameas", args, "other"));
  if (v.kind() != other.kind()) return false;
  if (v.is_none() || v.is_bool() || v.is_int() || v.is_string() || v.is_undefined()) return equals(v, other);
  return v.same_object(other);
}

Result<bool> t_in(Renderer&, const Value& v, CallArgs& args) {
  Value seq;
  TACHYON_RETURN_IF_ERROR(bind_args("in", args, {{"seq", &seq}}));
  TACHYON_RETURN_IF_ERROR(require_argument("in", args, "seq"));
  if (seq.is_string()) {
    if (!v.is_string()) return type_error("'in <string>' requires string as left operand");
    return seq.as_string().find(v.as_string()) != std::string::npos;
  }
  if (seq.is_dict()) return seq.as_dict().find(v) != nullptr;
  if (seq.is_undefined()) return false;
  if (!seq.is_sequence()) return type_error(fmt::format("argument of type '{}' is not iterable", type_name(seq)));
  return std::any_of(seq.as_list().begin(), seq.as_list().end(), [&](const Value& x) { return equals(x, v); });
}

template <int kOp>  // 0 ==, 1 !=, 2 <, 3 <=, 4 >, 5 >=
Result<bool> t_compare(Renderer&, const Value& v, CallArgs& args) {
  Value other;
  TACHYON_RETURN_IF_ERROR(bind_args("comparison", args, {{"other", &other}}));
  TACHYON_RETURN_IF_ERROR(require_argument("comparison", args, "other"));
  if (kOp == 0) return equals(v, other);
  if (kOp == 1) return !equals(v, other);
  Result<int> c = compare(v, other);
  if (!c.ok()) {
    if (v.is_undefined() || other.is_undefined()) return c.status();
    return type_error(fmt::format("ordering not supported between instances of '{}' and '{}'", type_name(v),
                                  type_name(other)));
  }
  if (kOp == 2) return *c < 0;
  if (kOp == 3) return *c <= 0;
  if (kOp == 4) return *c > 0;
  return *c >= 0;
}

Result<bool> t_filter(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("filter", args, {}));
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}

Result<bool> t_test(Renderer&, const Value& v, CallArgs& args) {
  TACHYON_RETURN_IF_ERROR(bind_args("test", args, {}));
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

const std::map<std::string, FilterFunction, std::less<>>& filters() {
  static const std::map<std::string, FilterFunction, std::less<>> table = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"filesizeformat", f_unsupported},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_forceescape},
      {"format", f_format},
      {"groupby", f_unsupported},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"pprint", f_unsupported},
      {"random", f_unsupported},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"slice", f_unsupported},
      {"sort", f_sort},
      {"string", f_string},
      {"striptags", f_striptags},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"urlencode", f_unsupported},
      {"urlize", f_unsupported},
      {"wordcount", f_wordcount},
      {"wordwrap", f_unsupported},
      {"xmlattr", f_unsupported},
  };
  return table;
}

const std::map<std::string, TestFunction, std::less<>>& tests() {
  static const std::map<std::string, TestFunction, std::less<>> table = {
      {"!=", t_compare<1>},
      {"<", t_compare<2>},
      {"<=", t_compare<3>},
      {"==", t_compare<0>},
      {">", t_compare<4>},
      {">=", t_compare<5>},
      {"boolean", t_boolean},
      {"callable", t_callable},
      {"defined", t_defined},
      {"divisibleby", t_divisibleby},
      {"eq", t_compare<0>},
      {"equalto", t_compare<0>},
      {"escaped", t_escaped},
      {"even", t_even},
      {"false", t_false},
      {"filter", t_filter},
      {"float", t_float},
      {"ge", t_compare<5>},
      {"greaterthan", t_compare<4>},
      {"gt", t_compare<4>},
      {"in", t_in},
      {"integer", t_integer},
      {"iterable", t_iterable},
      {"le", t_compare<3>},
      {"lessthan", t_compare<2>},
      {"lower", t_lower},
      {"lt", t_compare<2>},
      {"mapping", t_mapping},
      {"ne", t_compare<1>},
      {"none", t_none},
      {"number", t_number},
      {"odd", t_odd},
      {"sameas", t_sameas},
      {"sequence", t_sequence},
      {"string", t_string},
      {"test", t_test},
      {"true", t_true},
      {"undefined", t_undefined},
      {"upper", t_upper},
  };
  return table;
}

}  // namespace

FilterFunction find_filter(std::string_view name) {
  const auto& table = filters();
  const auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}

TestFunction find_test(std::string_view name) {
  const auto& table = tests();
  const auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace tachyon::jinja
