// The parsed form of a chat template: expressions and statements as jinja2's parser builds them
// (same precedence, same quirks: `~` binds tighter than `+`, `**` is left-associative, a filter
// applies to the operand on its left only). Filters and tests are resolved to their functions at
// parse time, so an unknown name is a parse error as it is in jinja2. Owned by jinja::Template,
// immutable after parsing; renderings only read it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/status.h"
#include "tokenizer/jinja_value.h"

namespace tachyon::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct SourcePos {
  int line = 0;
  int column = 0;
};

// A filter is called with the value on its left; a test answers a question about it.
using FilterFunction = Result<Value> (*)(Renderer&, const Value&, CallArgs&);
using TestFunction = Result<bool> (*)(Renderer&, const Value&, CallArgs&);

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr star_args;    // *args
  ExprPtr star_kwargs;  // **kwargs
};

enum class UnaryOp { kNegate, kPlus, kNot };
enum class BinaryOp { kAdd, kSubtract, kMultiply, kDivide, kFloorDivide, kModulo, kPower, kConcat, kAnd, kOr };
enum class CompareOp { kEqual, kNotEqual, kLess, kLessEqual, kGreater, kGreaterEqual, kIn, kNotIn };

namespace node {
struct Literal {
  Value value;
};
struct Name {
  std::string name;
};
struct Sequence {  // [a, b] or (a, b)
  std::vector<ExprPtr> items;
  bool tuple = false;
};
struct DictLiteral {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};
struct Attribute {  // object.name
  ExprPtr object;
  std::string name;
};
struct Item {  // object[key]
  ExprPtr object;
  ExprPtr key;
};
struct Slice {  // object[start:stop:step], each part optional
  ExprPtr object;
  ExprPtr start;
  ExprPtr stop;
  ExprPtr step;
};
struct Call {
  ExprPtr callee;
  Arguments args;
};
struct Filter {  // value | name(args); value is null in {% filter %} and {% set x | f %}
  ExprPtr value;
  std::string name;
  FilterFunction function = nullptr;
  Arguments args;
};
struct Test {  // value is [not] name(args)
  ExprPtr value;
  std::string name;
  TestFunction function = nullptr;
  Arguments args;
  bool negated = false;
};
struct Unary {
  UnaryOp op;
  ExprPtr operand;
};
struct Binary {
  BinaryOp op;
  ExprPtr left;
  ExprPtr right;
};
struct Compare {  // left op1 a op2 b ... (chained as in Python)
  ExprPtr left;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};
struct Conditional {  // if_true if condition else if_false (if_false may be null: undefined)
  ExprPtr condition;
  ExprPtr if_true;
  ExprPtr if_false;
};
}  // namespace node

struct Expr {
  SourcePos pos;
  std::variant<node::Literal, node::Name, node::Sequence, node::DictLiteral, node::Attribute, node::Item, node::Slice,
               node::Call, node::Filter, node::Test, node::Unary, node::Binary, node::Compare, node::Conditional>
      node;
};

// Left-hand side of set/for/with: a name, a namespace attribute (ns.x), or a tuple of targets.
struct AssignTarget {
  enum class Kind { kName, kNamespaceAttribute, kTuple };
  Kind kind = Kind::kName;
  std::string name;
  std::string attribute;
  std::vector<AssignTarget> items;
};

namespace stmt {
struct Text {
  std::string text;
};
struct Print {
  ExprPtr value;
};
struct If {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body otherwise;
};
struct For {
  AssignTarget target;
  ExprPtr iterable;
  ExprPtr condition;  // {% for x in xs if cond %}, may be null
  Body body;
  Body otherwise;  // {% else %}: runs when no item was iterated
};
struct Set {
  AssignTarget target;
  ExprPtr value;
};
struct SetBlock {  // {% set x | filters %}body{% endset %}
  AssignTarget target;
  std::vector<ExprPtr> filters;  // node::Filter with a null value, applied in order
  Body body;
};
struct Macro {  // also the caller of a {% call %} block
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per param; null: none
  Body body;
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
};
struct CallBlock {  // {% call(params) macro(args) %}body{% endcall %}
  ExprPtr call;                   // a node::Call
  std::shared_ptr<Macro> caller;  // the body, as the macro `caller`
};
struct FilterBlock {
  std::vector<ExprPtr> filters;
  Body body;
};
struct With {
  std::vector<std::pair<AssignTarget, ExprPtr>> assignments;
  Body body;
};
struct Break {};
struct Continue {};
}  // namespace stmt

struct Stmt {
  SourcePos pos;
  std::variant<stmt::Text, stmt::Print, stmt::If, stmt::For, stmt::Set, stmt::SetBlock, std::shared_ptr<stmt::Macro>,
               stmt::CallBlock, stmt::FilterBlock, stmt::With, stmt::Break, stmt::Continue>
      node;
};

struct Template {
  Body body;
};

// Parses a whole template (see jinja_lexer.h for the whitespace rules). Syntax errors, unknown
// filters and tests come back as kInvalidArgument with "line L, column C".
Result<std::shared_ptr<const Template>> parse_template(std::string_view source);

}  // namespace tachyon::jinja
