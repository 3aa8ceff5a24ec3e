// Python methods of strings, dicts and lists as chat templates call them, the global functions
// (jinja2's range/dict/namespace/joiner/cycler and transformers' raise_exception/strftime_now),
// and argument binding for all builtins. jinja2 renders transformers' templates in an immutable
// sandbox, so methods that would mutate a list or dict are refused with its message.
#include <algorithm>
#include <ctime>
#include <map>
#include <set>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_string.h"

namespace tachyon::jinja {
namespace {

// jinja2's sandbox limit on range().
constexpr int64_t kMaxRange = 100000;

Status type_error(std::string message) { return Status(ErrorCode::kInvalidArgument, std::move(message)); }

Result<int64_t> int_arg(const Value& v, std::string_view what) {
  if (v.is_integral()) return v.as_int();
  if (v.is_undefined()) {
    return Status(ErrorCode::kInvalidArgument, v.undefined_message().empty() ? "value is undefined" : v.undefined_message());
  }
  return type_error(fmt::format("{}: '{}' object cannot be interpreted as an integer", what, type_name(v)));
}

Result<std::string> str_arg(const Value& v, std::string_view what) {
  if (v.is_string()) return v.as_string();
  return type_error(fmt::format("{} must be str, not {}", what, type_name(v)));
}

template <typename Names>
bool is_one_of(std::string_view name, const Names& names) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}
bool is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

constexpr std::string_view kStringMethods[] = {
    "capitalize", "casefold", "center",  "count",   "endswith",   "find",         "format",       "index",
    "isalnum",    "isalpha",  "isdigit", "islower", "isspace",    "isupper",      "join",         "ljust",
    "lower",      "lstrip",   "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex",
    "rjust",      "rpartition", "rsplit", "rstrip", "split",      "splitlines",   "startswith",   "strip",
    "swapcase",   "title",    "upper",   "zfill"};
constexpr std::string_view kDictMethods[] = {"copy", "get", "items", "keys", "values"};
constexpr std::string_view kDictMutators[] = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr std::string_view kListMethods[] = {"copy", "count", "index"};
constexpr std::string_view kListMutators[] = {"append", "clear", "extend", "insert",
                                                                   "pop",    "remove", "reverse", "sort"};

Status unsafe(const Value& object, std::string_view name) {
  return make_error(ErrorCode::kInvalidArgument, "access to attribute '{}' of '{}' object is unsafe.", name,
                    type_name(object));
}

Value list_of_strings(std::vector<std::string> parts) {
  List items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.emplace_back(std::move(p));
  return Value::list(std::move(items));
}

// "{} {0} {name}" formatting without format specs (str.format).
Result<std::string> brace_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      return type_error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) return type_error("Single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 's';
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
      field = field.substr(0, bang);
    }
    if (field.find(':') != std::string::npos || field.find('.') != std::string::npos ||
        field.find('[') != std::string::npos) {
      return Status(ErrorCode::kUnsupported, "str.format: format specs and field lookups are not supported");
    }
    Value arg;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t index = field.empty() ? auto_index++ : std::stoul(field);
      if (index >= args.positional.size()) return type_error("Replacement index out of range for positional args tuple");
      arg = args.positional[index];
    } else {
      const auto it = std::find_if(args.keyword.begin(), args.keyword.end(), [&](const auto& kv) { return kv.first == field; });
      if (it == args.keyword.end()) return type_error(fmt::format("KeyError: '{}'", field));
      arg = it->second;
    }
    out += conversion == 'r' ? to_repr(arg) : to_str(arg);
  }
  return out;
}

std::optional<Result<Value>> string_method(Renderer& r, const std::string& s, std::string_view name, CallArgs& args) {
  auto optional_chars = [](const Value& v) -> Result<std::optional<std::string>> {
    if (v.is_undefined() || v.is_none()) return std::optional<std::string>();
    if (!v.is_string()) return type_error("strip arg must be None or str");
    return std::optional<std::string>(v.as_string());
  };
  auto run = [&]() -> Result<Value> {
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      Value chars;
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"chars", &chars}}));
      TACHYON_ASSIGN_OR_RETURN(std::optional<std::string> set, optional_chars(chars));
      return Value(pystr::strip(s, set ? std::optional<std::string_view>(*set) : std::nullopt, name != "rstrip",
                                name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      Value sep, maxsplit = Value(int64_t{-1});
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"sep", &sep}, {"maxsplit", &maxsplit}}));
      TACHYON_ASSIGN_OR_RETURN(const int64_t limit, int_arg(maxsplit, "maxsplit"));
      std::optional<std::string> separator;
      if (sep.is_string()) {
        if (sep.as_string().empty()) return type_error("empty separator");
        separator = sep.as_string();
      } else if (!sep.is_none() && !sep.is_undefined()) {
        return type_error(fmt::format("must be str or None, not {}", type_name(sep)));
      }
      const std::optional<std::string_view> view = separator ? std::optional<std::string_view>(*separator) : std::nullopt;
      return list_of_strings(name == "split" ? pystr::split(s, view, limit) : pystr::rsplit(s, view, limit));
    }
    if (name == "splitlines") {
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {}));
      return list_of_strings(pystr::splitlines(s));
    }
    if (name == "startswith" || name == "endswith") {
      Value affix;
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"prefix", &affix}}));
      std::vector<std::string> candidates;
      if (affix.is_string()) {
        candidates.push_back(affix.as_string());
      } else if (affix.is_tuple()) {
        for (const Value& v : affix.as_list()) {
          TACHYON_ASSIGN_OR_RETURN(std::string c, str_arg(v, name));
          candidates.push_back(std::move(c));
        }
      } else {
        return type_error(fmt::format("{} first arg must be str or a tuple of str, not {}", name, type_name(affix)));
      }
      for (const std::string& c : candidates) {
        const bool match = name == "startswith" ? s.compare(0, c.size(), c) == 0
                                                : (s.size() >= c.size() && s.compare(s.size() - c.size(), c.size(), c) == 0);
        if (match) return Value(true);
      }
      return Value(false);
    }
    if (name == "upper" || name == "lower" || name == "casefold") {
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {}));
      return Value(name == "upper" ? pystr::upper(s) : pystr::lower(s));
    }
    if (name == "title" || name == "capitalize" || name == "swapcase") {
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {}));
      if (name == "title") return Value(pystr::title(s));
      if (name == "capitalize") return Value(pystr::capitalize(s));
      return Value(pystr::swapcase(s));
    }
    if (name == "replace") {
      Value old_part, new_part, count = Value(int64_t{-1});
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"old", &old_part}, {"new", &new_part}, {"count", &count}}));
      TACHYON_ASSIGN_OR_RETURN(std::string o, str_arg(old_part, "replace() argument 1"));
      TACHYON_ASSIGN_OR_RETURN(std::string n, str_arg(new_part, "replace() argument 2"));
      TACHYON_ASSIGN_OR_RETURN(const int64_t limit, int_arg(count, "count"));
      if (o.empty()) TACHYON_RETURN_IF_ERROR(r.check_size(s.size() + (s.size() + 1) * n.size()));
      std::string out = pystr::replace(s, o, n, limit);
      TACHYON_RETURN_IF_ERROR(r.check_size(out.size()));
      return Value(std::move(out));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
      Value part;
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"sub", &part}}));
      TACHYON_ASSIGN_OR_RETURN(std::string p, str_arg(part, name));
      if (name == "count") return Value(pystr::count(s, p));
      const int64_t at = (name == "find" || name == "index") ? pystr::find(s, p) : pystr::rfind(s, p);
      if (at < 0 && (name == "index" || name == "rindex")) return type_error("substring not found");
      return Value(at);
    }
    if (name == "join") {
      Value iterable;
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"iterable", &iterable}}));
      TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(iterable));
      std::string out;
      for (size_t i = 0; i < items->size(); ++i) {
        const Value& item = (*items)[i];
        if (!item.is_string()) {
          return type_error(fmt::format("sequence item {}: expected str instance, {} found", i, type_name(item)));
        }
        if (i > 0) out += s;
        out += item.as_string();
        TACHYON_RETURN_IF_ERROR(r.check_size(out.size()));
      }
      return Value(std::move(out));
    }
    if (name == "format") {
      TACHYON_ASSIGN_OR_RETURN(std::string out, brace_format(s, args));
      TACHYON_RETURN_IF_ERROR(r.check_size(out.size()));
      return Value(std::move(out));
    }
    if (is_one_of(name, {"isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper"})) {
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {}));
      if (name == "isdigit") return Value(pystr::is_digit(s));
      if (name == "isalpha") return Value(pystr::is_alpha(s));
      if (name == "isalnum") return Value(pystr::is_alnum(s));
      if (name == "isspace") return Value(pystr::is_all_space(s));
      if (name == "islower") return Value(pystr::is_lower(s));
      return Value(pystr::is_upper(s));
    }
    if (name == "center" || name == "ljust" || name == "rjust") {
      Value width, fill = Value(" ");
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"width", &width}, {"fillchar", &fill}}));
      TACHYON_ASSIGN_OR_RETURN(int64_t w, int_arg(width, name));
      TACHYON_ASSIGN_OR_RETURN(std::string f, str_arg(fill, "fillchar"));
      if (pystr::length(f) != 1) return type_error("The fill character must be exactly one character long");
      TACHYON_RETURN_IF_ERROR(r.check_size(static_cast<size_t>(std::max<int64_t>(w, 0)) * f.size()));
      if (name == "center") return Value(pystr::center(s, w, f));
      return Value(name == "ljust" ? pystr::ljust(s, w, f) : pystr::rjust(s, w, f));
    }
    if (name == "zfill") {
      Value width;
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"width", &width}}));
      TACHYON_ASSIGN_OR_RETURN(int64_t w, int_arg(width, name));
      TACHYON_RETURN_IF_ERROR(r.check_size(static_cast<size_t>(std::max<int64_t>(w, 0))));
      return Value(pystr::zfill(s, w));
    }
    if (name == "partition" || name == "rpartition") {
      Value sep;
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"sep", &sep}}));
      TACHYON_ASSIGN_OR_RETURN(std::string p, str_arg(sep, name));
      if (p.empty()) return type_error("empty separator");
      const size_t at = name == "partition" ? s.find(p) : s.rfind(p);
      if (at == std::string::npos) {
        return name == "partition" ? Value::tuple({Value(s), Value(""), Value("")})
                                   : Value::tuple({Value(""), Value(""), Value(s)});
      }
      return Value::tuple({Value(s.substr(0, at)), Value(p), Value(s.substr(at + p.size()))});
    }
    if (name == "removeprefix" || name == "removesuffix") {
      Value affix;
      TACHYON_RETURN_IF_ERROR(bind_args(name, args, {{"affix", &affix}}));
      TACHYON_ASSIGN_OR_RETURN(std::string a, str_arg(affix, name));
      if (name == "removeprefix") return Value(s.compare(0, a.size(), a) == 0 ? s.substr(a.size()) : s);
      const bool ends = s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0;
      return Value(ends ? s.substr(0, s.size() - a.size()) : s);
    }
    return type_error(fmt::format("str has no method '{}'", name));
  };
  if (!is_one_of(name, kStringMethods)) return std::nullopt;
  return run();
}

std::optional<Result<Value>> dict_method(const Value& object, std::string_view name, CallArgs& args) {
  if (is_one_of(name, kDictMutators)) return Result<Value>(unsafe(object, name));
  if (!is_one_of(name, kDictMethods)) return std::nullopt;
  const Dict& dict = object.as_dict();
  if (name == "get") {
    Value key, fallback = Value::none();
    if (Status s = bind_args(name, args, {{"key", &key}, {"default", &fallback}}); !s.ok()) return Result<Value>(s);
    const Value* v = dict.find(key);
    return Result<Value>(v != nullptr ? *v : fallback);
  }
  if (Status s = bind_args(name, args, {}); !s.ok()) return Result<Value>(s);
  if (name == "copy") return Result<Value>(object);
  List out;
  out.reserve(dict.size());
  for (const auto& [k, v] : dict.items()) {
    if (name == "keys") {
      out.push_back(k);
    } else if (name == "values") {
      out.push_back(v);
    } else {
      out.push_back(Value::tuple({k, v}));
    }
  }
  return Result<Value>(Value::list(std::move(out)));
}

std::optional<Result<Value>> list_method(const Value& object, std::string_view name, CallArgs& args) {
  if (object.is_list() && is_one_of(name, kListMutators)) return Result<Value>(unsafe(object, name));
  if (!is_one_of(name, kListMethods) || (name == "copy" && object.is_tuple())) return std::nullopt;
  const List& items = object.as_list();
  if (name == "copy") {
    if (Status s = bind_args(name, args, {}); !s.ok()) return Result<Value>(s);
    return Result<Value>(object);
  }
  Value x;
  if (Status s = bind_args(name, args, {{"value", &x}}); !s.ok()) return Result<Value>(s);
  if (name == "count") {
    return Result<Value>(Value(static_cast<int64_t>(
        std::count_if(items.begin(), items.end(), [&](const Value& v) { return equals(v, x); }))));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (equals(items[i], x)) return Result<Value>(Value(static_cast<int64_t>(i)));
  }
  return Result<Value>(type_error(fmt::format("{} is not in list", to_repr(x))));
}

bool has_method(const Value& object, std::string_view name) {
  switch (object.kind()) {
    case ValueKind::kString: return is_one_of(name, kStringMethods);
    case ValueKind::kDict: return is_one_of(name, kDictMethods) || is_one_of(name, kDictMutators);
    case ValueKind::kList: return is_one_of(name, kListMethods) || is_one_of(name, kListMutators);
    case ValueKind::kTuple: return name == "count" || name == "index";
    default: return false;
  }
}

// ------------------------------------------------------------------------------------------------
// Globals

Result<Value> g_range(Renderer& r, CallArgs& args) {
  if (!args.keyword.empty()) return type_error("range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3) {
    return type_error(fmt::format("range expected at most 3 arguments, got {}", args.positional.size()));
  }
  std::vector<int64_t> v;
  for (const Value& a : args.positional) {
    TACHYON_ASSIGN_OR_RETURN(int64_t x, int_arg(a, "range"));
    v.push_back(x);
  }
  const int64_t start = v.size() == 1 ? 0 : v[0];
  const int64_t stop = v.size() == 1 ? v[0] : v[1];
  const int64_t step = v.size() == 3 ? v[2] : 1;
  if (step == 0) return type_error("range() arg 3 must not be zero");
  const double count = std::max(0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step)));
  if (count > static_cast<double>(kMaxRange)) {
    return make_error(ErrorCode::kOutOfRange,
                      "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
  }
  TACHYON_RETURN_IF_ERROR(r.charge(static_cast<size_t>(count)));
  List items;
  items.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) items.emplace_back(start + i * step);
  return Value::list(std::move(items));
}

// dict(...) and namespace(...): a mapping or (key, value) pairs, then keywords.
Result<Dict> dict_from_args(std::string_view function, CallArgs& args) {
  if (args.positional.size() > 1) {
    return type_error(fmt::format("{} expected at most 1 argument, got {}", function, args.positional.size()));
  }
  Dict out;
  if (!args.positional.empty()) {
    const Value& source = args.positional.front();
    if (source.is_dict() || source.is_namespace()) {
      for (const auto& [k, v] : source.as_dict().items()) out.set(k, v);
    } else {
      TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> pairs, iterate(source));
      for (const Value& pair : *pairs) {
        if (!pair.is_sequence() || pair.as_list().size() != 2) {
          return type_error("dictionary update sequence element has wrong length; 2 is required");
        }
        out.set(pair.as_list()[0], pair.as_list()[1]);
      }
    }
  }
  for (const auto& [k, v] : args.keyword) out.set(Value(k), v);
  return out;
}

Result<Value> g_dict(Renderer&, CallArgs& args) {
  TACHYON_ASSIGN_OR_RETURN(Dict d, dict_from_args("dict", args));
  return Value::dict(std::move(d));
}

Result<Value> g_namespace(Renderer&, CallArgs& args) {
  TACHYON_ASSIGN_OR_RETURN(Dict d, dict_from_args("namespace", args));
  for (const auto& [k, v] : d.items()) {
    if (k.is_string() && !k.as_string().empty() && k.as_string().front() == '_') {
      return type_error(fmt::format("namespace attributes cannot start with an underscore ('{}')", k.as_string()));
    }
    if (v.holds_namespace()) return Status(ErrorCode::kUnsupported, "a namespace cannot hold another namespace");
  }
  return Value::make_namespace(std::move(d));
}

Result<Value> g_raise_exception(Renderer&, CallArgs& args) {
  Value message;
  TACHYON_RETURN_IF_ERROR(bind_args("raise_exception", args, {{"message", &message}}));
  return Status(ErrorCode::kInvalidArgument, "the template raised an error: " + to_str(message));
}

Result<Value> g_strftime_now(Renderer& r, CallArgs& args) {
  Value format;
  TACHYON_RETURN_IF_ERROR(bind_args("strftime_now", args, {{"format", &format}}));
  TACHYON_ASSIGN_OR_RETURN(std::string f, str_arg(format, "strftime_now() argument"));
  if (f.size() > 4096) return type_error("strftime_now: format string too long");
  // A naive datetime: %z and %Z are empty; no sub-second part.
  std::string prepared;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '%' && i + 1 < f.size()) {
      const char c = f[i + 1];
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      if (c == 'f') {
        prepared += "000000";
        ++i;
        continue;
      }
      prepared += f.substr(i, 2);
      ++i;
      continue;
    }
    prepared.push_back(f[i]);
  }
  std::tm t = r.now();
  std::tm normalized = t;
  timegm(&normalized);  // fills weekday and day of year
  if (prepared.empty()) return Value("");
  std::string out(prepared.size() * 64 + 256, '\0');
  const size_t n = std::strftime(out.data(), out.size(), prepared.c_str(), &normalized);
  out.resize(n);
  return Value(std::move(out));
}

// jinja2's joiner: "" on the first call, the separator afterwards.
Result<Value> g_joiner(Renderer&, CallArgs& args) {
  Value separator = Value(", ");
  TACHYON_RETURN_IF_ERROR(bind_args("joiner", args, {{"sep", &separator}}));
  auto used = std::make_shared<bool>(false);
  const std::string sep = to_str(separator);
  return Value::callable("joiner", [used, sep](Renderer&, CallArgs&) -> Result<Value> {
    if (!*used) {
      *used = true;
      return Value("");
    }
    return Value(sep);
  });
}

class Cycler final : public Object {
 public:
  explicit Cycler(List items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  std::optional<Value> attribute(std::string_view name) const override {
    if (name == "current") return items_[position_];
    return std::nullopt;
  }
  std::optional<Result<Value>> call_method(std::string_view name, CallArgs& args) override {
    if (name == "next" || name == "__next__") {
      Value v = items_[position_];
      position_ = (position_ + 1) % items_.size();
      return Result<Value>(std::move(v));
    }
    if (name == "reset") {
      position_ = 0;
      return Result<Value>(Value::none());
    }
    (void)args;
    return std::nullopt;
  }
  int nesting_depth() const override {
    int depth = 0;
    for (const Value& v : items_) depth = std::max(depth, v.nesting_depth());
    return depth + 1;
  }
  bool holds_namespace() const override {
    return std::any_of(items_.begin(), items_.end(), [](const Value& v) { return v.holds_namespace(); });
  }

 private:
  List items_;
  size_t position_ = 0;
};

Result<Value> g_cycler(Renderer&, CallArgs& args) {
  if (args.positional.empty()) return type_error("at least one item has to be provided");
  return Value::object(std::make_shared<Cycler>(args.positional));
}

Result<Value> g_unsupported(Renderer&, CallArgs&) {
  return Status(ErrorCode::kUnsupported, "this jinja2 global is not supported in chat templates");
}

}  // namespace

Status bind_args(std::string_view function, CallArgs& args, std::initializer_list<Param> params) {
  if (args.positional.size() > params.size()) {
    return type_error(fmt::format("{}() takes at most {} argument(s) ({} given)", function, params.size(),
                                  args.positional.size()));
  }
  std::vector<bool> given(params.size(), false);
  size_t i = 0;
  for (const Param& p : params) {
    if (i < args.positional.size()) {
      *p.slot = args.positional[i];
      given[i] = true;
    }
    ++i;
  }
  for (const auto& [name, value] : args.keyword) {
    size_t j = 0;
    bool found = false;
    for (const Param& p : params) {
      if (p.name == name) {
        if (given[j]) return type_error(fmt::format("{}() got multiple values for argument '{}'", function, name));
        *p.slot = value;
        given[j] = true;
        found = true;
        break;
      }
      ++j;
    }
    if (!found) return type_error(fmt::format("{}() got an unexpected keyword argument '{}'", function, name));
  }
  return Status::Ok();
}

std::optional<Result<Value>> call_method(Renderer& renderer, const Value& object, std::string_view name,
                                         CallArgs& args) {
  switch (object.kind()) {
    case ValueKind::kString: return string_method(renderer, object.as_string(), name, args);
    case ValueKind::kDict: return dict_method(object, name, args);
    case ValueKind::kList:
    case ValueKind::kTuple:
      return list_method(object, name, args);
    default: return std::nullopt;
  }
}

std::optional<Value> bound_method(const Value& object, std::string_view name) {
  if (!has_method(object, name)) return std::nullopt;
  if ((object.is_dict() && is_one_of(name, kDictMutators)) || (object.is_list() && is_one_of(name, kListMutators))) {
    return Value::undefined(unsafe(object, name).message());
  }
  std::string method(name);
  return Value::callable(method, [object, method](Renderer& r, CallArgs& args) -> Result<Value> {
    std::optional<Result<Value>> result = call_method(r, object, method, args);
    if (!result) return type_error(fmt::format("'{}' object has no method '{}'", type_name(object), method));
    return std::move(*result);
  });
}

std::optional<Value> find_global(std::string_view name) {
  static const std::map<std::string, Value, std::less<>> globals = {
      {"range", Value::callable("range", g_range)},
      {"dict", Value::callable("dict", g_dict)},
      {"namespace", Value::callable("namespace", g_namespace)},
      {"raise_exception", Value::callable("raise_exception", g_raise_exception)},
      {"strftime_now", Value::callable("strftime_now", g_strftime_now)},
      {"joiner", Value::callable("joiner", g_joiner)},
      {"cycler", Value::callable("cycler", g_cycler)},
      {"lipsum", Value::callable("lipsum", g_unsupported)},
  };
  const auto it = globals.find(name);
  if (it == globals.end()) return std::nullopt;
  return it->second;
}

}  // namespace tachyon::jinja
