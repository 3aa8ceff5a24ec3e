// jinja2's built-in filters, tests and globals, the globals transformers adds (raise_exception,
// strftime_now, its namespace and dict), and the Python methods chat templates call on strings,
// dicts and lists ("x".startswith(...), d.items(), l.index(...)). Filters and tests that jinja2
// has but chat templates do not use (urlize, wordwrap, ...) are known by name, so a template that
// mentions them still parses, and fail only when called.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace tachyon::jinja {

// nullptr when jinja2 has no filter / test of that name.
FilterFunction find_filter(std::string_view name);
TestFunction find_test(std::string_view name);

// A global function (range, namespace, dict, raise_exception, strftime_now, joiner, cycler, ...);
// nullopt for other names.
std::optional<Value> find_global(std::string_view name);

// Calls Python method `name` of `object`; nullopt when `object` has no such method.
std::optional<Result<Value>> call_method(Renderer& renderer, const Value& object, std::string_view name,
                                         CallArgs& args);
// The method as a bound callable (for `f = s.upper` and the like); nullopt when there is none.
// Methods jinja2's immutable sandbox forbids (list.append, dict.update, ...) come back as an
// undefined value that fails with the sandbox's message when called.
std::optional<Value> bound_method(const Value& object, std::string_view name);

// Binds call arguments to named parameters, positionally then by keyword, as Python does. Each
// slot starts with its default; a slot left undefined was not given. Unknown keywords and extra
// positional arguments are errors naming `function`.
struct Param {
  std::string_view name;
  Value* slot;
};
Status bind_args(std::string_view function, CallArgs& args, std::initializer_list<Param> params);

}  // namespace tachyon::jinja
