#include "tokenizer/jinja_interpreter.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_string.h"

namespace tachyon::jinja {
namespace {

Status type_error(std::string message) { return Status(ErrorCode::kInvalidArgument, std::move(message)); }

Status undefined_error(const Value& v) {
  return Status(ErrorCode::kInvalidArgument, v.undefined_message().empty() ? "value is undefined" : v.undefined_message());
}

// Work units of a value for the step budget: its length for strings and lists.
size_t work_of(const Value& v) {
  if (v.is_string()) return v.as_string().size();
  if (v.is_sequence()) return v.as_list().size();
  if (v.is_dict()) return v.as_dict().size();
  return 0;
}

// The `loop` variable of a for-loop.
class LoopContext final : public Object {
 public:
  LoopContext(std::shared_ptr<const List> items, int depth0) : items_(std::move(items)), depth0_(depth0) {}

  void set_index(size_t index0) { index0_ = index0; }

  std::string type_name() const override { return "LoopContext"; }

  std::optional<Value> attribute(std::string_view name) const override {
    const auto n = static_cast<int64_t>(items_->size());
    const auto i = static_cast<int64_t>(index0_);
    if (name == "index") return Value(i + 1);
    if (name == "index0") return Value(i);
    if (name == "revindex") return Value(n - i);
    if (name == "revindex0") return Value(n - i - 1);
    if (name == "first") return Value(i == 0);
    if (name == "last") return Value(i == n - 1);
    if (name == "length") return Value(n);
    if (name == "depth") return Value(static_cast<int64_t>(depth0_) + 1);
    if (name == "depth0") return Value(static_cast<int64_t>(depth0_));
    if (name == "previtem") return i > 0 ? (*items_)[index0_ - 1] : Value::undefined("there is no previous item");
    if (name == "nextitem") return i + 1 < n ? (*items_)[index0_ + 1] : Value::undefined("there is no next item");
    return std::nullopt;
  }

  std::optional<Result<Value>> call_method(std::string_view name, CallArgs& args) override {
    if (name == "cycle") {
      if (args.positional.empty()) return Result<Value>(type_error("no items for cycling given"));
      return Result<Value>(args.positional[index0_ % args.positional.size()]);
    }
    if (name == "changed") {
      Value current = Value::list(args.positional);
      const bool changed = !has_last_ || !equals(current, last_);
      last_ = std::move(current);
      has_last_ = true;
      return Result<Value>(Value(changed));
    }
    return std::nullopt;
  }

  int nesting_depth() const override { return 1 + items_depth(); }
  bool holds_namespace() const override {
    return std::any_of(items_->begin(), items_->end(), [](const Value& v) { return v.holds_namespace(); });
  }

 private:
  int items_depth() const {
    int depth = 0;
    for (const Value& v : *items_) depth = std::max(depth, v.nesting_depth());
    return depth;
  }

  std::shared_ptr<const List> items_;
  size_t index0_ = 0;
  int depth0_ = 0;
  Value last_;
  bool has_last_ = false;
};

bool checked_add(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }
bool checked_sub(int64_t a, int64_t b, int64_t* out) { return !__builtin_sub_overflow(a, b, out); }
bool checked_mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

Status overflow_error(std::string_view op) {
  return make_error(ErrorCode::kOutOfRange, "integer overflow in '{}' (values beyond 64 bits are not supported)", op);
}

const char* op_symbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "+";
    case BinaryOp::kSubtract: return "-";
    case BinaryOp::kMultiply: return "*";
    case BinaryOp::kDivide: return "/";
    case BinaryOp::kFloorDivide: return "//";
    case BinaryOp::kModulo: return "%";
    case BinaryOp::kPower: return "**";
    case BinaryOp::kConcat: return "~";
    case BinaryOp::kAnd: return "and";
    case BinaryOp::kOr: return "or";
  }
  return "?";
}

const char* op_symbol(CompareOp op) {
  switch (op) {
    case CompareOp::kLess: return "<";
    case CompareOp::kLessEqual: return "<=";
    case CompareOp::kGreater: return ">";
    case CompareOp::kGreaterEqual: return ">=";
    default: return "==";
  }
}

// Python's floor division and modulo of floats.
double float_mod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0.0 && ((r < 0) != (b < 0))) r += b;
  if (r == 0.0) r = std::copysign(0.0, b);
  return r;
}

double float_floor_div(double a, double b) {
  const double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div != 0.0) {
    const double floored = std::floor(div);
    if (div - floored > 0.5) return floored + 1.0;
    return floored;
  }
  return std::copysign(0.0, a / b);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Iteration and access

Result<std::shared_ptr<const List>> iterate(const Value& value) {
  switch (value.kind()) {
    case ValueKind::kUndefined: return std::make_shared<const List>();
    case ValueKind::kList:
    case ValueKind::kTuple:
      return value.list_ptr();
    case ValueKind::kDict: {
      List keys;
      keys.reserve(value.as_dict().size());
      for (const auto& [k, v] : value.as_dict().items()) keys.push_back(k);
      return std::make_shared<const List>(std::move(keys));
    }
    case ValueKind::kString: {
      const std::string& s = value.as_string();
      const std::vector<size_t> offsets = pystr::char_offsets(s);
      List chars;
      chars.reserve(offsets.size());
      for (size_t i = 0; i + 1 < offsets.size(); ++i) chars.emplace_back(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
      return std::make_shared<const List>(std::move(chars));
    }
    default:
      return type_error(fmt::format("'{}' object is not iterable", type_name(value)));
  }
}

Result<Value> get_attribute(const Value& object, std::string_view name) {
  if (object.is_undefined()) return undefined_error(object);
  auto missing = [&] {
    return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_description(object), name));
  };
  if (!name.empty() && name.front() == '_') return missing();  // the sandbox hides private attributes
  switch (object.kind()) {
    case ValueKind::kDict:
      if (std::optional<Value> method = bound_method(object, name)) return *method;
      if (const Value* v = object.as_dict().find(name)) return *v;
      return missing();
    case ValueKind::kNamespace:
      if (const Value* v = object.as_dict().find(name)) return *v;
      return missing();
    case ValueKind::kObject:
      if (std::optional<Value> v = object.as_object().attribute(name)) return *v;
      return missing();
    default:
      if (std::optional<Value> method = bound_method(object, name)) return *method;
      return missing();
  }
}

Result<Value> get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) return undefined_error(object);
  switch (object.kind()) {
    case ValueKind::kDict:
      if (const Value* v = object.as_dict().find(key)) return *v;
      break;
    case ValueKind::kList:
    case ValueKind::kTuple:
      if (key.is_integral()) {
        const List& items = object.as_list();
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
        return Value::undefined(fmt::format("'{}' has no element {}", object_description(object), key.as_int()));
      }
      break;
    case ValueKind::kString:
      if (key.is_integral()) {
        if (std::optional<std::string> ch = pystr::index(object.as_string(), key.as_int())) return Value(std::move(*ch));
        return Value::undefined(fmt::format("'{}' has no element {}", object_description(object), key.as_int()));
      }
      break;
    default:
      break;
  }
  // jinja2 falls back to the attribute of that name.
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined(fmt::format("'{}' has no element {}", object_description(object), to_repr(key)));
}

// ---------------------------------------------------------------------------------------------
// Renderer

Renderer::Renderer(const Template& tpl, const RenderOptions& options) : template_(tpl), options_(options) {}

Result<std::string> Renderer::render(const Dict& context) {
  frames_.clear();
  Frame globals;
  for (const auto& [key, value] : context.items()) {
    if (key.is_string()) globals.variables.emplace_back(key.as_string(), value);
  }
  globals.parent = 0;
  frames_.push_back(std::move(globals));
  push_frame(0);  // the template's own scope
  std::string output;
  out_ = &output;
  steps_ = 0;
  call_depth_ = 0;
  error_located_ = false;
  flow_ = Flow::kNormal;
  TACHYON_RETURN_IF_ERROR(exec(template_.body));
  return output;
}

Status Renderer::charge(size_t work) {
  steps_ += 1 + work / 64;
  if (steps_ > options_.limits.max_steps) {
    return make_error(ErrorCode::kOutOfRange, "rendering took more than {} steps (a loop or recursion too long)",
                      options_.limits.max_steps);
  }
  return Status::Ok();
}

Status Renderer::check_size(size_t size) const {
  const size_t limit = std::min(options_.limits.max_output_bytes, kMaxStringBytes);
  if (size > limit) return make_error(ErrorCode::kOutOfRange, "a value or the output would exceed {} bytes", limit);
  return Status::Ok();
}

Status Renderer::check_value(const Value& value) const {
  if (value.nesting_depth() > kMaxNestingDepth) {
    return make_error(ErrorCode::kOutOfRange, "value nested deeper than {} levels", kMaxNestingDepth);
  }
  if (value.is_string() || value.is_sequence() || value.is_dict()) return check_size(value.footprint());
  return Status::Ok();
}

std::tm Renderer::now() const {
  if (options_.now) return *options_.now;
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  localtime_r(&t, &local);
  return local;
}

Status Renderer::located(Status status, SourcePos pos) {
  if (status.ok() || error_located_) return status;
  error_located_ = true;
  return Status(status.code(), fmt::format("line {}, column {}: {}", pos.line, pos.column, status.message()));
}

// --- Scopes ---------------------------------------------------------------------------------

void Renderer::push_frame(size_t parent) {
  Frame frame;
  frame.parent = std::min(parent, frames_.size() - 1);
  frames_.push_back(std::move(frame));
}

Value Renderer::lookup(const std::string& name) const {
  size_t i = top_frame();
  while (true) {
    const Frame& frame = frames_[i];
    for (auto it = frame.variables.rbegin(); it != frame.variables.rend(); ++it) {
      if (it->first == name) return it->second;
    }
    if (i == 0) break;
    i = std::min(frame.parent, i - 1);
  }
  if (std::optional<Value> global = find_global(name)) return *global;
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

void Renderer::set_variable(const std::string& name, Value value) {
  auto& variables = frames_.back().variables;
  for (auto& [key, v] : variables) {
    if (key == name) {
      v = std::move(value);
      return;
    }
  }
  variables.emplace_back(name, std::move(value));
}

Status Renderer::assign(const AssignTarget& target, const Value& value) {
  switch (target.kind) {
    case AssignTarget::Kind::kName:
      set_variable(target.name, value);
      return Status::Ok();
    case AssignTarget::Kind::kNamespaceAttribute: {
      const Value ns = lookup(target.name);
      if (!ns.is_namespace()) return type_error("cannot assign attribute on non-namespace object");
      if (!target.attribute.empty() && target.attribute.front() == '_') {
        return type_error(fmt::format("namespace attributes cannot start with an underscore ('{}')", target.attribute));
      }
      if (value.holds_namespace()) {
        return Status(ErrorCode::kUnsupported, "a namespace cannot hold another namespace");
      }
      TACHYON_RETURN_IF_ERROR(check_value(value));
      ns.namespace_attributes().set(Value(target.attribute), value);
      return Status::Ok();
    }
    case AssignTarget::Kind::kTuple: {
      TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(value));
      if (items->size() != target.items.size()) {
        if (items->size() > target.items.size()) {
          return type_error(fmt::format("too many values to unpack (expected {})", target.items.size()));
        }
        return type_error(fmt::format("not enough values to unpack (expected {}, got {})", target.items.size(),
                                      items->size()));
      }
      for (size_t i = 0; i < items->size(); ++i) TACHYON_RETURN_IF_ERROR(assign(target.items[i], (*items)[i]));
      return Status::Ok();
    }
  }
  return Status::Ok();
}

// --- Statements -------------------------------------------------------------------------------

Status Renderer::emit(std::string_view text) {
  TACHYON_RETURN_IF_ERROR(check_size(out_->size() + text.size()));
  out_->append(text);
  return Status::Ok();
}

Status Renderer::exec(const Body& body) {
  for (const StmtPtr& s : body) {
    TACHYON_RETURN_IF_ERROR(exec(*s));
    if (flow_ != Flow::kNormal) break;
  }
  return Status::Ok();
}

Result<std::string> Renderer::capture(const Body& body) {
  std::string buffer;
  std::string* saved = std::exchange(out_, &buffer);
  const Status status = exec(body);
  out_ = saved;
  TACHYON_RETURN_IF_ERROR(status);
  return buffer;
}

Status Renderer::exec(const Stmt& statement) {
  TACHYON_RETURN_IF_ERROR(charge(0));
  const Status status = std::visit(
      [&](const auto& n) -> Status {
        using T = std::decay_t<decltype(n)>;
        if constexpr (std::is_same_v<T, stmt::Text>) {
          return emit(n.text);
        } else if constexpr (std::is_same_v<T, stmt::Print>) {
          TACHYON_ASSIGN_OR_RETURN(Value v, eval(*n.value));
          if (v.is_string()) return emit(v.as_string());
          return emit(to_str(v));
        } else if constexpr (std::is_same_v<T, stmt::If>) {
          for (const auto& [condition, body] : n.branches) {
            TACHYON_ASSIGN_OR_RETURN(Value c, eval(*condition));
            if (truthy(c)) return exec(body);
          }
          return exec(n.otherwise);
        } else if constexpr (std::is_same_v<T, stmt::For>) {
          return exec_for(n);
        } else if constexpr (std::is_same_v<T, stmt::Set>) {
          TACHYON_ASSIGN_OR_RETURN(Value v, eval(*n.value));
          return assign(n.target, v);
        } else if constexpr (std::is_same_v<T, stmt::SetBlock>) {
          TACHYON_ASSIGN_OR_RETURN(std::string text, capture(n.body));
          Value v(std::move(text));
          for (const ExprPtr& f : n.filters) {
            TACHYON_ASSIGN_OR_RETURN(v, eval_filter(std::get<node::Filter>(f->node), v));
          }
          return assign(n.target, v);
        } else if constexpr (std::is_same_v<T, std::shared_ptr<stmt::Macro>>) {
          const stmt::Macro* macro = n.get();
          const size_t parent = top_frame();
          set_variable(macro->name, Value::callable("macro '" + macro->name + "'", [macro, parent](Renderer& r, CallArgs& a) {
                         return r.call_macro(*macro, a, parent);
                       }));
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, stmt::CallBlock>) {
          return exec_call_block(n);
        } else if constexpr (std::is_same_v<T, stmt::FilterBlock>) {
          TACHYON_ASSIGN_OR_RETURN(std::string text, capture(n.body));
          Value v(std::move(text));
          for (const ExprPtr& f : n.filters) {
            TACHYON_ASSIGN_OR_RETURN(v, eval_filter(std::get<node::Filter>(f->node), v));
          }
          return emit(to_str(v));
        } else if constexpr (std::is_same_v<T, stmt::With>) {
          std::vector<Value> values;
          for (const auto& [target, value] : n.assignments) {
            TACHYON_ASSIGN_OR_RETURN(Value v, eval(*value));
            values.push_back(std::move(v));
          }
          push_frame(top_frame());
          Status s = Status::Ok();
          for (size_t i = 0; i < values.size() && s.ok(); ++i) s = assign(n.assignments[i].first, values[i]);
          if (s.ok()) s = exec(n.body);
          pop_frame();
          return s;
        } else if constexpr (std::is_same_v<T, stmt::Break>) {
          flow_ = Flow::kBreak;
          return Status::Ok();
        } else {
          static_assert(std::is_same_v<T, stmt::Continue>);
          flow_ = Flow::kContinue;
          return Status::Ok();
        }
      },
      statement.node);
  return located(status, statement.pos);
}

Status Renderer::exec_for(const stmt::For& node) {
  TACHYON_ASSIGN_OR_RETURN(Value iterable, eval(*node.iterable));
  TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(iterable));
  TACHYON_RETURN_IF_ERROR(charge(items->size()));
  if (node.condition) {
    // The filter sees the loop target but no `loop` variable.
    List kept;
    for (const Value& item : *items) {
      push_frame(top_frame());
      Status s = assign(node.target, item);
      Result<Value> keep = s.ok() ? eval(*node.condition) : Result<Value>(s);
      pop_frame();
      if (!keep.ok()) return keep.status();
      if (truthy(*keep)) kept.push_back(item);
    }
    items = std::make_shared<const List>(std::move(kept));
  }
  if (items->empty()) {
    push_frame(top_frame());
    const Status s = exec(node.otherwise);
    pop_frame();
    return s;
  }
  int depth0 = 0;
  if (const Value outer = lookup("loop"); outer.is_object() && outer.as_object().type_name() == "LoopContext") {
    depth0 = static_cast<int>(outer.as_object().attribute("depth0")->as_int()) + 1;
  }
  auto loop = std::make_shared<LoopContext>(items, depth0);
  const Value loop_value = Value::object(loop);
  for (size_t i = 0; i < items->size(); ++i) {
    TACHYON_RETURN_IF_ERROR(charge(0));
    loop->set_index(i);
    push_frame(top_frame());
    set_variable("loop", loop_value);
    Status s = assign(node.target, (*items)[i]);
    if (s.ok()) s = exec(node.body);
    pop_frame();
    TACHYON_RETURN_IF_ERROR(s);
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  return Status::Ok();
}

Status Renderer::exec_call_block(const stmt::CallBlock& node) {
  const stmt::Macro* caller_macro = node.caller.get();
  const size_t parent = top_frame();
  const Value caller = Value::callable("caller", [caller_macro, parent](Renderer& r, CallArgs& a) {
    return r.call_macro(*caller_macro, a, parent);
  });
  TACHYON_ASSIGN_OR_RETURN(Value v, eval_call(std::get<node::Call>(node.call->node), &caller));
  return emit(to_str(v));
}

Result<Value> Renderer::call_macro(const stmt::Macro& macro, CallArgs& args, size_t parent_frame) {
  if (call_depth_ >= options_.limits.max_call_depth) {
    return make_error(ErrorCode::kOutOfRange, "macro calls nested deeper than {} (runaway recursion?)",
                      options_.limits.max_call_depth);
  }
  TACHYON_RETURN_IF_ERROR(charge(0));
  const size_t n_params = macro.params.size();
  std::vector<std::optional<Value>> bound(n_params);
  List varargs;
  Dict kwargs;
  std::optional<Value> caller;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < n_params) {
      bound[i] = args.positional[i];
    } else if (macro.uses_varargs) {
      varargs.push_back(args.positional[i]);
    } else {
      return type_error(fmt::format("macro '{}' takes not more than {} argument(s)", macro.name, n_params));
    }
  }
  for (auto& [name, value] : args.keyword) {
    const auto it = std::find(macro.params.begin(), macro.params.end(), name);
    if (it != macro.params.end()) {
      const size_t i = static_cast<size_t>(it - macro.params.begin());
      if (bound[i]) return type_error(fmt::format("macro '{}' got multiple values for argument '{}'", macro.name, name));
      bound[i] = value;
    } else if (name == "caller" && macro.uses_caller) {
      caller = value;
    } else if (macro.uses_kwargs) {
      kwargs.set(Value(name), value);
    } else {
      return type_error(fmt::format("macro '{}' takes no keyword argument '{}'", macro.name, name));
    }
  }

  ++call_depth_;
  push_frame(parent_frame);
  Status status = Status::Ok();
  for (size_t i = 0; i < n_params && status.ok(); ++i) {
    if (bound[i]) {
      set_variable(macro.params[i], *bound[i]);
    } else if (macro.defaults[i]) {
      Result<Value> d = eval(*macro.defaults[i]);
      if (d.ok()) {
        set_variable(macro.params[i], *d);
      } else {
        status = d.status();
      }
    } else {
      set_variable(macro.params[i], Value::undefined(fmt::format("parameter '{}' was not provided", macro.params[i])));
    }
  }
  if (macro.uses_varargs) set_variable("varargs", Value::tuple(std::move(varargs)));
  if (macro.uses_kwargs) set_variable("kwargs", Value::dict(std::move(kwargs)));
  if (macro.uses_caller) set_variable("caller", caller ? *caller : Value::undefined("no caller defined"));
  Result<std::string> text = status.ok() ? capture(macro.body) : Result<std::string>(status);
  pop_frame();
  --call_depth_;
  if (!text.ok()) return text.status();
  return Value(std::move(*text));
}

// --- Expressions ------------------------------------------------------------------------------

Result<Value> Renderer::eval(const Expr& e) {
  Result<Value> v = eval_node(e);
  if (!v.ok()) return located(v.status(), e.pos);
  return v;
}

Result<CallArgs> Renderer::eval_args(const Arguments& args) {
  CallArgs out;
  out.positional.reserve(args.positional.size());
  for (const ExprPtr& p : args.positional) {
    TACHYON_ASSIGN_OR_RETURN(Value v, eval(*p));
    out.positional.push_back(std::move(v));
  }
  for (const auto& [name, expr] : args.keyword) {
    TACHYON_ASSIGN_OR_RETURN(Value v, eval(*expr));
    out.keyword.emplace_back(name, std::move(v));
  }
  if (args.star_args) {
    TACHYON_ASSIGN_OR_RETURN(Value v, eval(*args.star_args));
    TACHYON_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, iterate(v));
    out.positional.insert(out.positional.end(), items->begin(), items->end());
  }
  if (args.star_kwargs) {
    TACHYON_ASSIGN_OR_RETURN(Value v, eval(*args.star_kwargs));
    if (!v.is_dict()) return type_error("argument after ** must be a mapping");
    for (const auto& [k, item] : v.as_dict().items()) {
      if (!k.is_string()) return type_error("keywords must be strings");
      out.keyword.emplace_back(k.as_string(), item);
    }
  }
  return out;
}

Result<Value> Renderer::call(const Value& callee, CallArgs& args) {
  if (callee.is_callable()) {
    Result<Value> v = callee.as_callable().function(*this, args);
    if (v.ok()) TACHYON_RETURN_IF_ERROR(check_value(*v));
    return v;
  }
  if (callee.is_undefined()) return undefined_error(callee);
  return type_error(fmt::format("'{}' object is not callable", type_name(callee)));
}

Result<Value> Renderer::eval_call(const node::Call& call, const Value* caller) {
  TACHYON_ASSIGN_OR_RETURN(CallArgs args, eval_args(call.args));
  if (caller != nullptr) args.keyword.emplace_back("caller", *caller);
  if (const auto* attribute = std::get_if<node::Attribute>(&call.callee->node)) {
    // obj.method(...): dispatch without materializing a bound method.
    TACHYON_ASSIGN_OR_RETURN(Value object, eval(*attribute->object));
    if (object.is_undefined()) return undefined_error(object);
    TACHYON_RETURN_IF_ERROR(charge(work_of(object)));
    if (object.is_object()) {
      if (std::optional<Result<Value>> r = object.as_object().call_method(attribute->name, args)) return std::move(*r);
    } else if (!object.is_namespace()) {
      if (std::optional<Result<Value>> r = call_method(*this, object, attribute->name, args)) {
        if (r->ok()) TACHYON_RETURN_IF_ERROR(check_value(r->value()));
        return std::move(*r);
      }
    }
    TACHYON_ASSIGN_OR_RETURN(Value callee, get_attribute(object, attribute->name));
    return this->call(callee, args);
  }
  TACHYON_ASSIGN_OR_RETURN(Value callee, eval(*call.callee));
  return this->call(callee, args);
}

Result<Value> Renderer::eval_filter(const node::Filter& filter, const Value& value) {
  TACHYON_ASSIGN_OR_RETURN(CallArgs args, eval_args(filter.args));
  TACHYON_RETURN_IF_ERROR(charge(work_of(value)));
  TACHYON_ASSIGN_OR_RETURN(Value result, filter.function(*this, value, args));
  TACHYON_RETURN_IF_ERROR(check_value(result));
  return result;
}

Result<Value> Renderer::apply_filter(std::string_view name, const Value& value, CallArgs& args) {
  const FilterFunction f = find_filter(name);
  if (f == nullptr) return type_error(fmt::format("no filter named '{}'", name));
  TACHYON_RETURN_IF_ERROR(charge(work_of(value)));
  return f(*this, value, args);
}

Result<bool> Renderer::apply_test(std::string_view name, const Value& value, CallArgs& args) {
  const TestFunction t = find_test(name);
  if (t == nullptr) return type_error(fmt::format("no test named '{}'", name));
  TACHYON_RETURN_IF_ERROR(charge(0));
  return t(*this, value, args);
}

Result<Value> Renderer::eval_node(const Expr& e) {
  return std::visit(
      [&](const auto& n) -> Result<Value> {
        using T = std::decay_t<decltype(n)>;
        if constexpr (std::is_same_v<T, node::Literal>) {
          return n.value;
        } else if constexpr (std::is_same_v<T, node::Name>) {
          return lookup(n.name);
        } else if constexpr (std::is_same_v<T, node::Sequence>) {
          List items;
          items.reserve(n.items.size());
          for (const ExprPtr& item : n.items) {
            TACHYON_ASSIGN_OR_RETURN(Value v, eval(*item));
            items.push_back(std::move(v));
          }
          Value v = n.tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
          TACHYON_RETURN_IF_ERROR(check_value(v));
          return v;
        } else if constexpr (std::is_same_v<T, node::DictLiteral>) {
          Dict dict;
          for (const auto& [key, value] : n.items) {
            TACHYON_ASSIGN_OR_RETURN(Value k, eval(*key));
            TACHYON_ASSIGN_OR_RETURN(Value v, eval(*value));
            dict.set(std::move(k), std::move(v));
          }
          Value v = Value::dict(std::move(dict));
          TACHYON_RETURN_IF_ERROR(check_value(v));
          return v;
        } else if constexpr (std::is_same_v<T, node::Attribute>) {
          TACHYON_ASSIGN_OR_RETURN(Value object, eval(*n.object));
          return get_attribute(object, n.name);
        } else if constexpr (std::is_same_v<T, node::Item>) {
          TACHYON_ASSIGN_OR_RETURN(Value object, eval(*n.object));
          TACHYON_ASSIGN_OR_RETURN(Value key, eval(*n.key));
          return get_item(object, key);
        } else if constexpr (std::is_same_v<T, node::Slice>) {
          return eval_slice(n);
        } else if constexpr (std::is_same_v<T, node::Call>) {
          return eval_call(n, nullptr);
        } else if constexpr (std::is_same_v<T, node::Filter>) {
          TACHYON_ASSIGN_OR_RETURN(Value v, eval(*n.value));
          return eval_filter(n, v);
        } else if constexpr (std::is_same_v<T, node::Test>) {
          TACHYON_ASSIGN_OR_RETURN(Value v, eval(*n.value));
          TACHYON_ASSIGN_OR_RETURN(CallArgs args, eval_args(n.args));
          TACHYON_RETURN_IF_ERROR(charge(0));
          TACHYON_ASSIGN_OR_RETURN(bool result, n.function(*this, v, args));
          return Value(result != n.negated);
        } else if constexpr (std::is_same_v<T, node::Unary>) {
          TACHYON_ASSIGN_OR_RETURN(Value v, eval(*n.operand));
          if (n.op == UnaryOp::kNot) return Value(!truthy(v));
          if (v.is_undefined()) return undefined_error(v);
          if (!v.is_number()) {
            return type_error(fmt::format("bad operand type for unary {}: '{}'", n.op == UnaryOp::kNegate ? '-' : '+',
                                          type_name(v)));
          }
          if (n.op == UnaryOp::kPlus) return v.is_float() ? v : Value(v.as_int());
          if (v.is_float()) return Value(-v.as_float());
          if (v.as_int() == INT64_MIN) return overflow_error("-");
          return Value(-v.as_int());
        } else if constexpr (std::is_same_v<T, node::Binary>) {
          return eval_binary(n);
        } else if constexpr (std::is_same_v<T, node::Compare>) {
          return eval_compare(n);
        } else {
          static_assert(std::is_same_v<T, node::Conditional>);
          TACHYON_ASSIGN_OR_RETURN(Value c, eval(*n.condition));
          if (truthy(c)) return eval(*n.if_true);
          if (n.if_false) return eval(*n.if_false);
          return Value::undefined("the inline if-expression evaluated to false and has no else section");
        }
      },
      e.node);
}

Result<Value> Renderer::eval_slice(const node::Slice& n) {
  TACHYON_ASSIGN_OR_RETURN(Value object, eval(*n.object));
  if (object.is_undefined()) return undefined_error(object);
  std::optional<int64_t> bounds[3];
  const ExprPtr* parts[3] = {&n.start, &n.stop, &n.step};
  for (int i = 0; i < 3; ++i) {
    if (!*parts[i]) continue;
    TACHYON_ASSIGN_OR_RETURN(Value v, eval(**parts[i]));
    if (v.is_none()) continue;
    if (!v.is_integral()) return Value::undefined("slice indices must be integers or None");
    bounds[i] = v.as_int();
  }
  const int64_t step = bounds[2].value_or(1);
  if (step == 0) return type_error("slice step cannot be zero");
  if (object.is_string()) {
    TACHYON_RETURN_IF_ERROR(charge(object.as_string().size()));
    return Value(pystr::slice(object.as_string(), bounds[0], bounds[1], step));
  }
  if (!object.is_sequence()) return Value::undefined(fmt::format("'{}' cannot be sliced", object_description(object)));
  const List& items = object.as_list();
  TACHYON_RETURN_IF_ERROR(charge(items.size()));
  const auto size = static_cast<int64_t>(items.size());
  auto clamp = [&](std::optional<int64_t> v, bool is_start) -> int64_t {
    if (!v) return step > 0 ? (is_start ? 0 : size) : (is_start ? size - 1 : -1);
    int64_t x = *v;
    if (x < 0) {
      x += size;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= size) {
      x = step < 0 ? size - 1 : size;
    }
    return x;
  };
  const int64_t begin = clamp(bounds[0], true);
  const int64_t end = clamp(bounds[1], false);
  List out;
  for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) out.push_back(items[static_cast<size_t>(i)]);
  return object.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Result<Value> Renderer::eval_binary(const node::Binary& n) {
  TACHYON_ASSIGN_OR_RETURN(Value left, eval(*n.left));
  if (n.op == BinaryOp::kAnd) return truthy(left) ? eval(*n.right) : left;
  if (n.op == BinaryOp::kOr) return truthy(left) ? left : eval(*n.right);
  TACHYON_ASSIGN_OR_RETURN(Value right, eval(*n.right));
  return arithmetic(n.op, left, right);
}

Result<Value> Renderer::arithmetic(BinaryOp op, const Value& a, const Value& b) {
  if (op == BinaryOp::kConcat) {
    std::string s = to_str(a);
    s += to_str(b);
    TACHYON_RETURN_IF_ERROR(check_size(s.size()));
    TACHYON_RETURN_IF_ERROR(charge(s.size()));
    return Value(std::move(s));
  }
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  const auto unsupported = [&] {
    return type_error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op_symbol(op), type_name(a),
                                  type_name(b)));
  };
  if (a.is_number() && b.is_number()) {
    const bool ints = a.is_integral() && b.is_integral();
    const int64_t x = ints ? a.as_int() : 0;
    const int64_t y = ints ? b.as_int() : 0;
    const double fx = a.as_float();
    const double fy = b.as_float();
    int64_t r = 0;
    switch (op) {
      case BinaryOp::kAdd:
        if (!ints) return Value(fx + fy);
        if (!checked_add(x, y, &r)) return overflow_error("+");
        return Value(r);
      case BinaryOp::kSubtract:
        if (!ints) return Value(fx - fy);
        if (!checked_sub(x, y, &r)) return overflow_error("-");
        return Value(r);
      case BinaryOp::kMultiply:
        if (!ints) return Value(fx * fy);
        if (!checked_mul(x, y, &r)) return overflow_error("*");
        return Value(r);
      case BinaryOp::kDivide:
        if (fy == 0.0) return type_error("division by zero");
        return Value(fx / fy);
      case BinaryOp::kFloorDivide:
        if (ints) {
          if (y == 0) return type_error("integer division or modulo by zero");
          if (x == INT64_MIN && y == -1) return overflow_error("//");
          int64_t q = x / y;
          if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
          return Value(q);
        }
        if (fy == 0.0) return type_error("float floor division by zero");
        return Value(float_floor_div(fx, fy));
      case BinaryOp::kModulo:
        if (ints) {
          if (y == 0) return type_error("integer modulo by zero");
          if (y == -1) return Value(int64_t{0});
          int64_t m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value(m);
        }
        if (fy == 0.0) return type_error("float modulo by zero");
        return Value(float_mod(fx, fy));
      case BinaryOp::kPower:
        if (ints && y >= 0) {
          int64_t result = 1;
          int64_t base = x;
          int64_t e = y;
          while (e > 0) {
            if (e & 1) {
              if (!checked_mul(result, base, &result)) return overflow_error("**");
            }
            e >>= 1;
            if (e > 0 && !checked_mul(base, base, &base)) return overflow_error("**");
          }
          return Value(result);
        }
        if (fx == 0.0 && fy < 0.0) return type_error("0.0 cannot be raised to a negative power");
        return Value(std::pow(fx, fy));
      default:
        break;
    }
    return unsupported();
  }
  // Sequences and strings.
  if (op == BinaryOp::kAdd) {
    if (a.is_string() && b.is_string()) {
      TACHYON_RETURN_IF_ERROR(check_size(a.as_string().size() + b.as_string().size()));
      TACHYON_RETURN_IF_ERROR(charge(a.as_string().size() + b.as_string().size()));
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      TACHYON_RETURN_IF_ERROR(check_size(a.footprint() + b.footprint()));
      TACHYON_RETURN_IF_ERROR(charge(a.as_list().size() + b.as_list().size()));
      List items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    if (a.is_string()) {
      return type_error(fmt::format("can only concatenate str (not \"{}\") to str", type_name(b)));
    }
    if (a.is_sequence()) {
      return type_error(fmt::format("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b), type_name(a)));
    }
    return unsupported();
  }
  if (op == BinaryOp::kMultiply) {
    const Value* seq = a.is_integral() ? &b : &a;
    const Value* count = a.is_integral() ? &a : &b;
    if (count->is_integral() && (seq->is_string() || seq->is_sequence())) {
      const int64_t times = std::max<int64_t>(0, count->as_int());
      const size_t unit = seq->footprint();
      if (unit > 0 && static_cast<uint64_t>(times) > options_.limits.max_output_bytes / unit) {
        return check_size(options_.limits.max_output_bytes + 1);
      }
      const size_t total = unit * static_cast<size_t>(times);
      TACHYON_RETURN_IF_ERROR(check_size(total));
      TACHYON_RETURN_IF_ERROR(charge(total));
      if (seq->is_string()) {
        std::string s;
        s.reserve(total);
        for (int64_t i = 0; i < times; ++i) s += seq->as_string();
        return Value(std::move(s));
      }
      List items;
      items.reserve(seq->as_list().size() * static_cast<size_t>(times));
      for (int64_t i = 0; i < times; ++i) items.insert(items.end(), seq->as_list().begin(), seq->as_list().end());
      return seq->is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    return unsupported();
  }
  if (op == BinaryOp::kModulo && a.is_string()) {
    // "%s" % value: printf-style formatting, as the |format filter does it.
    CallArgs args;
    if (b.is_tuple()) {
      args.positional = b.as_list();
    } else if (b.is_dict()) {
      for (const auto& [k, v] : b.as_dict().items()) {
        if (k.is_string()) args.keyword.emplace_back(k.as_string(), v);
      }
    } else {
      args.positional.push_back(b);
    }
    return apply_filter("format", a, args);
  }
  return unsupported();
}

Result<bool> Renderer::contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case ValueKind::kUndefined: return false;
    case ValueKind::kString:
      if (!item.is_string()) {
        return type_error(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case ValueKind::kList:
    case ValueKind::kTuple:
      TACHYON_RETURN_IF_ERROR(charge(container.as_list().size()));
      return std::any_of(container.as_list().begin(), container.as_list().end(),
                         [&](const Value& v) { return equals(v, item); });
    case ValueKind::kDict: return container.as_dict().find(item) != nullptr;
    default:
      return type_error(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

Result<Value> Renderer::eval_compare(const node::Compare& n) {
  TACHYON_ASSIGN_OR_RETURN(Value left, eval(*n.left));
  for (const auto& [op, expr] : n.rest) {
    TACHYON_ASSIGN_OR_RETURN(Value right, eval(*expr));
    bool result = false;
    switch (op) {
      case CompareOp::kEqual: result = equals(left, right); break;
      case CompareOp::kNotEqual: result = !equals(left, right); break;
      case CompareOp::kIn: {
        TACHYON_ASSIGN_OR_RETURN(result, contains(right, left));
        break;
      }
      case CompareOp::kNotIn: {
        TACHYON_ASSIGN_OR_RETURN(bool in, contains(right, left));
        result = !in;
        break;
      }
      default: {
        Result<int> c = compare(left, right);
        if (!c.ok()) {
          if (left.is_undefined() || right.is_undefined()) return c.status();
          return type_error(fmt::format("'{}' not supported between instances of '{}' and '{}'", op_symbol(op),
                                        type_name(left), type_name(right)));
        }
        if (op == CompareOp::kLess) result = *c < 0;
        if (op == CompareOp::kLessEqual) result = *c <= 0;
        if (op == CompareOp::kGreater) result = *c > 0;
        if (op == CompareOp::kGreaterEqual) result = *c >= 0;
      }
    }
    if (!result) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

}  // namespace tachyon::jinja
