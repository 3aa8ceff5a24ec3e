// The values a chat template computes with, and the Python semantics they follow: jinja2 runs on
// Python objects, so printing a list, comparing a dict, dividing two ints or dumping JSON must give
// what Python gives (str(), ==, <, truthiness, json.dumps) for renderings to match transformers.
//
// A Value is one of: undefined (jinja2's Undefined: prints empty, is falsy, iterates as empty, and
// fails when used in arithmetic or subscripted; it carries the message to fail with), none, bool,
// int (int64; overflow is an error where Python would grow), float, string (UTF-8 bytes; lengths,
// indices and slices count code points as Python's str does), list, tuple, dict (insertion order,
// as Python's dict), namespace (jinja2's mutable attribute bag), callable, or a native object
// (the loop variable, cyclers). Lists, tuples and dicts are immutable once built and shared by
// pointer, so copying a Value is cheap; only namespaces are mutated, through a shared pointer.
//
// Nesting is bounded so that no recursive walk (printing, comparing, JSON, destruction) can run
// out of stack on a hostile template: containers record their depth when built and the renderer
// refuses values deeper than kMaxNestingDepth, and a namespace may not hold another namespace
// (directly or inside a container), which also rules out reference cycles.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tachyon::jinja {

class Value;
class Renderer;

inline constexpr int kMaxNestingDepth = 256;
// No string the interpreter prints (str(), repr(), JSON) grows past this; it stops there, and the
// size checks of the renderer (whose output limit is at most this) report the error.
inline constexpr size_t kMaxStringBytes = size_t{64} << 20;
using List = std::vector<Value>;

// Insertion-ordered mapping with Python's key equality. Chat-template dicts are small (a message,
// a tool schema), so lookups scan.
class Dict {
 public:
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts, or replaces the value of an equal key in place (keeping its position).
  void set(Value key, Value value);
  // Defined below Value: clang with libstdc++ needs the pair complete to instantiate these.
  size_t size() const;
  bool empty() const;
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }

 private:
  std::vector<std::pair<Value, Value>> items_;
};

// Arguments of a call, evaluated.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using NativeFunction = std::function<Result<Value>(Renderer&, CallArgs&)>;

struct Callable {
  std::string name;  // for messages: "macro 'm'", "range"
  NativeFunction function;
};

// Built-in objects with attributes and methods (the `loop` variable, cycler()).
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;
  // nullopt: no such attribute (the caller makes an Undefined).
  virtual std::optional<Value> attribute(std::string_view name) const = 0;
  // nullopt: no such method.
  virtual std::optional<Result<Value>> call_method(std::string_view name, CallArgs& args) = 0;
  // Of the values the object keeps (see Value::nesting_depth()).
  virtual int nesting_depth() const { return 1; }
  virtual bool holds_namespace() const { return false; }
};

enum class ValueKind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,
  kCallable,
  kObject,
};

class Value {
 public:
  Value() = default;  // undefined
  Value(bool b) : kind_(ValueKind::kBool), data_(b) {}                                  // NOLINT
  Value(int64_t i) : kind_(ValueKind::kInt), data_(i) {}                                // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}                                      // NOLINT
  Value(double f) : kind_(ValueKind::kFloat), data_(f) {}                               // NOLINT
  Value(std::string s) : kind_(ValueKind::kString), data_(std::move(s)) {}             // NOLINT
  Value(std::string_view s) : Value(std::string(s)) {}                                  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                                       // NOLINT

  // `message` is what using the value reports ("'x' is undefined").
  static Value undefined(std::string message = {});
  static Value none();
  static Value list(List items);
  static Value tuple(List items);
  static Value dict(Dict items);
  static Value make_namespace(Dict attributes);
  static Value callable(std::string name, NativeFunction function);
  static Value object(std::shared_ptr<Object> object);
  // A string jinja2 treats as already HTML-escaped (markupsafe.Markup): from |safe and |escape.
  static Value markup(std::string s);

  ValueKind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == ValueKind::kUndefined; }
  bool is_none() const { return kind_ == ValueKind::kNone; }
  bool is_bool() const { return kind_ == ValueKind::kBool; }
  bool is_int() const { return kind_ == ValueKind::kInt; }
  bool is_float() const { return kind_ == ValueKind::kFloat; }
  // int, float or bool: Python's numbers.Number (bool is an int there).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  // int or bool.
  bool is_integral() const { return is_int() || is_bool(); }
  bool is_string() const { return kind_ == ValueKind::kString; }
  bool is_list() const { return kind_ == ValueKind::kList; }
  bool is_tuple() const { return kind_ == ValueKind::kTuple; }
  bool is_sequence() const { return is_list() || is_tuple(); }
  bool is_dict() const { return kind_ == ValueKind::kDict; }
  bool is_namespace() const { return kind_ == ValueKind::kNamespace; }
  bool is_callable() const { return kind_ == ValueKind::kCallable; }
  bool is_object() const { return kind_ == ValueKind::kObject; }
  bool is_markup() const { return is_string() && markup_; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return is_bool() ? (as_bool() ? 1 : 0) : std::get<int64_t>(data_); }
  double as_float() const { return is_float() ? std::get<double>(data_) : static_cast<double>(as_int()); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(data_); }
  const std::shared_ptr<const List>& list_ptr() const { return std::get<std::shared_ptr<const List>>(data_); }
  // Dicts and namespaces.
  const Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  Dict& namespace_attributes() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<const Callable>>(data_); }
  Object& as_object() const { return *std::get<std::shared_ptr<Object>>(data_); }
  // What using an undefined value reports; empty for one made by Value() (a parameter not given).
  const std::string& undefined_message() const;

  // Same object (Python's `is`), for shared containers.
  bool same_object(const Value& other) const;

  // 0 for scalars, 1 + the deepest element for containers (namespaces: of their attributes now).
  int nesting_depth() const;
  // A namespace, or a container or object holding one.
  bool holds_namespace() const;
  // Approximate bytes held by value: string bytes plus 16 per container item, counted through
  // nested containers (a list repeating one string n times counts it n times, as copies do).
  size_t footprint() const;

 private:
  ValueKind kind_ = ValueKind::kUndefined;
  bool markup_ = false;
  bool holds_namespace_ = false;  // containers: computed when built
  int depth_ = 0;                 // containers: computed when built
  size_t footprint_ = 0;          // containers: computed when built
  std::variant<std::monostate, bool, int64_t, double, std::string, std::shared_ptr<const List>,
               std::shared_ptr<Dict>, std::shared_ptr<const Callable>, std::shared_ptr<Object>>
      data_;
};

inline size_t Dict::size() const { return items_.size(); }
inline bool Dict::empty() const { return items_.empty(); }

// Python's type names, for messages ("'str' object is not callable").
std::string type_name(const Value& value);
// jinja2's name for the owner of a missing attribute ("dict object", "list object", "None").
std::string object_description(const Value& value);

// Python's bool(value).
bool truthy(const Value& value);
// Python's ==.
bool equals(const Value& a, const Value& b);
// Python's ordering for <, <=, >, >=: -1, 0 or 1, or an error for unorderable types (and for
// undefined, which jinja2 refuses to order).
Result<int> compare(const Value& a, const Value& b);

// Python's str() and repr().
std::string to_str(const Value& value);
std::string to_repr(const Value& value);
// Python's repr() of a float ("1.0", "0.1", "1e+16").
std::string format_float(double value);

// JSON to values (objects keep their key order with ordered_json; nlohmann::json sorts keys).
// Fails on nesting deeper than kMaxNestingDepth.
Result<Value> from_json(const nlohmann::ordered_json& json);
Result<Value> from_json(const nlohmann::json& json);

// Python's json.dumps(value, ensure_ascii=..., indent=..., separators=..., sort_keys=...), which is
// what transformers' |tojson filter calls.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: one line; "" or "  ": newline + indent per level
  std::optional<std::pair<std::string, std::string>> separators;  // item, key
  bool sort_keys = false;
};
Result<std::string> to_json(const Value& value, const JsonDumpOptions& options);

}  // namespace tachyon::jinja
