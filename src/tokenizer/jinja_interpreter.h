// Renders a parsed template: executes statements, evaluates expressions with Python's semantics,
// and keeps jinja2's scoping (a for-loop iteration and a macro call get their own scope; if-blocks
// do not; namespaces carry values out of loops).
//
// Every rendering is bounded: a step budget (statements, loop iterations, macro calls, and work
// proportional to the size of the strings and lists that builtins process), a macro recursion
// limit, and a cap on the size of the output and of any string or list built along the way. A
// template that exceeds one gets an error Status, never a hang, a crash or unbounded memory.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace tachyon::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;  // the output, and any value built; at most kMaxStringBytes
  uint64_t max_steps = 20'000'000;
  int max_call_depth = 100;  // nested macro calls
};

struct RenderOptions {
  RenderLimits limits;
  // What strftime_now() formats; unset: the local time when it is called.
  std::optional<std::tm> now;
};

class Renderer {
 public:
  Renderer(const Template& tpl, const RenderOptions& options);
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  // Renders the template with `context`'s string keys as variables.
  Result<std::string> render(const Dict& context);

  // --- For the builtins ---------------------------------------------------------------------
  Result<Value> call(const Value& callee, CallArgs& args);
  Result<Value> apply_filter(std::string_view name, const Value& value, CallArgs& args);
  Result<bool> apply_test(std::string_view name, const Value& value, CallArgs& args);
  // Spends `work` units (about 64 bytes or list items each, at least one step).
  Status charge(size_t work);
  // Fails when a string or list of `size` bytes/items would exceed the size cap.
  Status check_size(size_t size) const;
  // Fails for values nested too deeply or holding more than the size cap (see Value::footprint).
  Status check_value(const Value& value) const;
  std::tm now() const;
  const RenderOptions& options() const { return options_; }

  // Runs a macro (or a call block's caller) with `args`; `parent_frame` is the scope its free
  // names resolve in.
  Result<Value> call_macro(const stmt::Macro& macro, CallArgs& args, size_t parent_frame);

 private:
  struct Frame {
    std::vector<std::pair<std::string, Value>> variables;
    size_t parent = 0;  // lookup continues here; the root frame points to itself
  };
  enum class Flow { kNormal, kBreak, kContinue };

  // Scopes
  void push_frame(size_t parent);
  void pop_frame() { frames_.pop_back(); }
  size_t top_frame() const { return frames_.size() - 1; }
  Value lookup(const std::string& name) const;
  void set_variable(const std::string& name, Value value);
  Status assign(const AssignTarget& target, const Value& value);

  // Statements
  Status exec(const Body& body);
  Status exec(const Stmt& statement);
  Status exec_for(const stmt::For& node);
  Status exec_call_block(const stmt::CallBlock& node);
  Result<std::string> capture(const Body& body);
  Status emit(std::string_view text);

  // Expressions
  Result<Value> eval(const Expr& e);
  Result<Value> eval_node(const Expr& e);
  Result<CallArgs> eval_args(const Arguments& args);
  Result<Value> eval_call(const node::Call& call, const Value* caller);
  Result<Value> eval_filter(const node::Filter& filter, const Value& value);
  Result<Value> eval_binary(const node::Binary& node);
  Result<Value> eval_compare(const node::Compare& node);
  Result<Value> eval_slice(const node::Slice& node);
  Result<Value> arithmetic(BinaryOp op, const Value& a, const Value& b);
  Result<bool> contains(const Value& container, const Value& item);

  Status located(Status status, SourcePos pos);

  const Template& template_;
  const RenderOptions& options_;
  std::vector<Frame> frames_;
  std::string* out_ = nullptr;
  Flow flow_ = Flow::kNormal;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  bool error_located_ = false;
};

// Python's iteration of a value as a list (list/tuple items, dict keys, string characters;
// undefined is empty); an error for values Python cannot iterate.
Result<std::shared_ptr<const List>> iterate(const Value& value);

// Attribute (x.name) and subscript (x[key]) access as jinja2's sandbox does them: a missing
// attribute or key gives an undefined value; using an undefined object is an error.
Result<Value> get_attribute(const Value& object, std::string_view name);
Result<Value> get_item(const Value& object, const Value& key);

}  // namespace tachyon::jinja
