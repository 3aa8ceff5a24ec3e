// Recursive-descent parser over the lexer's tokens, following jinja2's grammar function by
// function (parse_condexpr -> parse_or -> ... -> parse_unary -> parse_primary, then postfix
// subscripts/calls and filter/test chains) so that precedence and its oddities match.
#include <algorithm>
#include <initializer_list>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_lexer.h"

namespace tachyon::jinja {
namespace {

// Deeper nesting than this is refused, so that neither parsing nor rendering nor freeing a template
// can recurse deeply. Each bracket, block, unary operator, and each link of an operator, filter or
// subscript chain (`a + b + c` nests as ((a + b) + c)) counts one level.
constexpr int kMaxParseDepth = 300;

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::kText: return "template data";
    case TokenKind::kVariableBegin: return "begin of print statement";
    case TokenKind::kVariableEnd: return "end of print statement";
    case TokenKind::kBlockBegin: return "begin of statement block";
    case TokenKind::kBlockEnd: return "end of statement block";
    case TokenKind::kName: return t.text;
    case TokenKind::kString: return "string";
    case TokenKind::kInteger: return "integer";
    case TokenKind::kFloat: return "float";
    case TokenKind::kOperator: return t.text;
    case TokenKind::kEnd: return "end of template";
  }
  return "token";
}

template <typename Node>
ExprPtr make_expr(SourcePos pos, Node node) {
  auto e = std::make_unique<Expr>();
  e->pos = pos;
  e->node = std::move(node);
  return e;
}

template <typename Node>
StmtPtr make_stmt(SourcePos pos, Node node) {
  auto s = std::make_unique<Stmt>();
  s->pos = pos;
  s->node = std::move(node);
  return s;
}

// Whether `body` refers to `name` anywhere (for a macro's varargs/kwargs/caller).
bool mentions(const Expr* e, std::string_view name);

bool mentions(const Arguments& a, std::string_view name) {
  for (const auto& p : a.positional) {
    if (mentions(p.get(), name)) return true;
  }
  for (const auto& [k, v] : a.keyword) {
    if (mentions(v.get(), name)) return true;
  }
  return mentions(a.star_args.get(), name) || mentions(a.star_kwargs.get(), name);
}

bool mentions(const Expr* e, std::string_view name) {
  if (e == nullptr) return false;
  return std::visit(
      [&](const auto& n) -> bool {
        using T = std::decay_t<decltype(n)>;
        if constexpr (std::is_same_v<T, node::Name>) {
          return n.name == name;
        } else if constexpr (std::is_same_v<T, node::Sequence>) {
          return std::any_of(n.items.begin(), n.items.end(), [&](const ExprPtr& i) { return mentions(i.get(), name); });
        } else if constexpr (std::is_same_v<T, node::DictLiteral>) {
          return std::any_of(n.items.begin(), n.items.end(), [&](const auto& kv) {
            return mentions(kv.first.get(), name) || mentions(kv.second.get(), name);
          });
        } else if constexpr (std::is_same_v<T, node::Attribute>) {
          return mentions(n.object.get(), name);
        } else if constexpr (std::is_same_v<T, node::Item>) {
          return mentions(n.object.get(), name) || mentions(n.key.get(), name);
        } else if constexpr (std::is_same_v<T, node::Slice>) {
          return mentions(n.object.get(), name) || mentions(n.start.get(), name) || mentions(n.stop.get(), name) ||
                 mentions(n.step.get(), name);
        } else if constexpr (std::is_same_v<T, node::Call>) {
          return mentions(n.callee.get(), name) || mentions(n.args, name);
        } else if constexpr (std::is_same_v<T, node::Filter> || std::is_same_v<T, node::Test>) {
          return mentions(n.value.get(), name) || mentions(n.args, name);
        } else if constexpr (std::is_same_v<T, node::Unary>) {
          return mentions(n.operand.get(), name);
        } else if constexpr (std::is_same_v<T, node::Binary>) {
          return mentions(n.left.get(), name) || mentions(n.right.get(), name);
        } else if constexpr (std::is_same_v<T, node::Compare>) {
          return mentions(n.left.get(), name) ||
                 std::any_of(n.rest.begin(), n.rest.end(), [&](const auto& r) { return mentions(r.second.get(), name); });
        } else if constexpr (std::is_same_v<T, node::Conditional>) {
          return mentions(n.condition.get(), name) || mentions(n.if_true.get(), name) || mentions(n.if_false.get(), name);
        } else {
          return false;
        }
      },
      e->node);
}

bool mentions(const Body& body, std::string_view name);

bool mentions(const Stmt& s, std::string_view name) {
  return std::visit(
      [&](const auto& n) -> bool {
        using T = std::decay_t<decltype(n)>;
        if constexpr (std::is_same_v<T, stmt::Print>) {
          return mentions(n.value.get(), name);
        } else if constexpr (std::is_same_v<T, stmt::If>) {
          for (const auto& [cond, body] : n.branches) {
            if (mentions(cond.get(), name) || mentions(body, name)) return true;
          }
          return mentions(n.otherwise, name);
        } else if constexpr (std::is_same_v<T, stmt::For>) {
          return mentions(n.iterable.get(), name) || mentions(n.condition.get(), name) || mentions(n.body, name) ||
                 mentions(n.otherwise, name);
        } else if constexpr (std::is_same_v<T, stmt::Set>) {
          return mentions(n.value.get(), name);
        } else if constexpr (std::is_same_v<T, stmt::SetBlock> || std::is_same_v<T, stmt::FilterBlock>) {
          return mentions(n.body, name) ||
                 std::any_of(n.filters.begin(), n.filters.end(), [&](const ExprPtr& f) { return mentions(f.get(), name); });
        } else if constexpr (std::is_same_v<T, stmt::CallBlock>) {
          return mentions(n.call.get(), name) || mentions(n.caller->body, name);
        } else if constexpr (std::is_same_v<T, stmt::With>) {
          for (const auto& [target, value] : n.assignments) {
            if (mentions(value.get(), name)) return true;
          }
          return mentions(n.body, name);
        } else {
          return false;  // text, break, continue; nested macros have their own scope
        }
      },
      s.node);
}

bool mentions(const Body& body, std::string_view name) {
  return std::any_of(body.begin(), body.end(), [&](const StmtPtr& s) { return mentions(*s, name); });
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Result<std::shared_ptr<const Template>> run() {
    auto tpl = std::make_shared<Template>();
    std::string end_name;
    TACHYON_RETURN_IF_ERROR(parse_body(tpl->body, {}, &end_name));
    return std::shared_ptr<const Template>(std::move(tpl));
  }

 private:
  // ------------------------------------------------------------------------------------------
  // Token stream

  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  SourcePos position() const { return {current().line, current().column}; }

  bool is_op(std::string_view op) const { return current().kind == TokenKind::kOperator && current().text == op; }
  bool is_name(std::string_view name) const { return current().kind == TokenKind::kName && current().text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }

  Status error(const std::string& message) const { return error_at(position(), message); }
  static Status error_at(SourcePos pos, const std::string& message) {
    return make_error(ErrorCode::kInvalidArgument, "syntax error at line {}, column {}: {}", pos.line, pos.column, message);
  }

  Status expect_op(std::string_view op) {
    if (skip_op(op)) return Status::Ok();
    return error(fmt::format("expected '{}', got '{}'", op, describe(current())));
  }
  Status expect_name(std::string_view name) {
    if (skip_name(name)) return Status::Ok();
    return error(fmt::format("expected '{}', got '{}'", name, describe(current())));
  }
  Result<std::string> expect_identifier() {
    if (current().kind != TokenKind::kName) return error(fmt::format("expected a name, got '{}'", describe(current())));
    std::string name = current().text;
    advance();
    return name;
  }
  Status expect_block_end() {
    if (current().kind == TokenKind::kBlockEnd) {
      advance();
      return Status::Ok();
    }
    return error(fmt::format("expected end of statement block, got '{}'", describe(current())));
  }

  // Guards recursion: every nested expression or block goes through one of these.
  class DepthGuard {
   public:
    explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
    ~DepthGuard() { --depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
    bool too_deep() const { return depth_ > kMaxParseDepth; }

   private:
    int& depth_;
  };

  // Counts the links of a left-nested chain as nesting levels, for as long as the chain is parsed.
  class ChainGuard {
   public:
    explicit ChainGuard(int& depth) : depth_(depth) {}
    ~ChainGuard() { depth_ -= links_; }
    ChainGuard(const ChainGuard&) = delete;
    ChainGuard& operator=(const ChainGuard&) = delete;
    bool add_link() {
      ++links_;
      return ++depth_ <= kMaxParseDepth;
    }

   private:
    int& depth_;
    int links_ = 0;
  };

  // ------------------------------------------------------------------------------------------
  // Statements

  // Parses until a block tag named one of `end_names` (left unconsumed: `*end_name` is set and
  // the stream stands on that name) or the end of the template (only when `end_names` is empty).
  Status parse_body(Body& body, std::initializer_list<std::string_view> end_names, std::string* end_name) {
    DepthGuard guard(depth_);
    if (guard.too_deep()) return error("template blocks nested too deeply");
    while (true) {
      const Token& t = current();
      switch (t.kind) {
        case TokenKind::kText:
          body.push_back(make_stmt(position(), stmt::Text{t.text}));
          advance();
          break;
        case TokenKind::kVariableBegin: {
          advance();
          const SourcePos pos = position();
          TACHYON_ASSIGN_OR_RETURN(ExprPtr value, parse_tuple(false, true, {}, false));
          if (current().kind != TokenKind::kVariableEnd) {
            return error(fmt::format("expected end of print statement, got '{}'", describe(current())));
          }
          advance();
          body.push_back(make_stmt(pos, stmt::Print{std::move(value)}));
          break;
        }
        case TokenKind::kBlockBegin: {
          advance();
          if (current().kind == TokenKind::kName &&
              std::find(end_names.begin(), end_names.end(), current().text) != end_names.end()) {
            *end_name = current().text;
            return Status::Ok();
          }
          TACHYON_RETURN_IF_ERROR(parse_statement(body, end_names));
          break;
        }
        case TokenKind::kEnd:
          if (end_names.size() == 0) return Status::Ok();
          return error("unexpected end of template; expected " + list_names(end_names));
        default:
          return error(fmt::format("unexpected '{}'", describe(t)));
      }
    }
  }

  static std::string list_names(std::initializer_list<std::string_view> names) {
    std::string out;
    for (const std::string_view n : names) {
      if (!out.empty()) out += " or ";
      out += fmt::format("'{}'", n);
    }
    return out;
  }

  // One statement after "{%", through its closing "%}" (and its end tag's, for blocks).
  Status parse_statement(Body& body, std::initializer_list<std::string_view> end_names) {
    const SourcePos pos = position();
    if (current().kind != TokenKind::kName) return error(fmt::format("tag name expected, got '{}'", describe(current())));
    const std::string tag = current().text;
    advance();
    if (tag == "for") return parse_for(body, pos);
    if (tag == "if") return parse_if(body, pos);
    if (tag == "set") return parse_set(body, pos);
    if (tag == "macro") return parse_macro(body, pos);
    if (tag == "call") return parse_call_block(body, pos);
    if (tag == "filter") return parse_filter_block(body, pos);
    if (tag == "with") return parse_with(body, pos);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return error_at(pos, fmt::format("'{}' outside loop", tag));
      TACHYON_RETURN_IF_ERROR(expect_block_end());
      if (tag == "break") {
        body.push_back(make_stmt(pos, stmt::Break{}));
      } else {
        body.push_back(make_stmt(pos, stmt::Continue{}));
      }
      return Status::Ok();
    }
    if (tag == "generation") {
      // transformers' assistant-mask tag: its body renders in place.
      TACHYON_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      TACHYON_RETURN_IF_ERROR(parse_body(body, {"endgeneration"}, &end));
      advance();
      return expect_block_end();
    }
    if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" || tag == "from" ||
        tag == "autoescape" || tag == "trans") {
      return error_at(pos, fmt::format("the '{}' tag is not supported in chat templates", tag));
    }
    std::string message = fmt::format("encountered unknown tag '{}'", tag);
    if (end_names.size() > 0) message += "; expected " + list_names(end_names);
    return error_at(pos, message);
  }

  Status parse_for(Body& body, SourcePos pos) {
    stmt::For node;
    TACHYON_ASSIGN_OR_RETURN(node.target, parse_assign_target(true, false, {"in"}));
    TACHYON_RETURN_IF_ERROR(expect_name("in"));
    TACHYON_ASSIGN_OR_RETURN(node.iterable, parse_tuple(false, false, {"recursive"}, false));
    if (skip_name("if")) {
      TACHYON_ASSIGN_OR_RETURN(node.condition, parse_expression(true));
    }
    if (is_name("recursive")) return error("recursive loops are not supported");
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    ++loop_depth_;
    const Status status = parse_body(node.body, {"endfor", "else"}, &end);
    --loop_depth_;
    TACHYON_RETURN_IF_ERROR(status);
    advance();
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    if (end == "else") {
      TACHYON_RETURN_IF_ERROR(parse_body(node.otherwise, {"endfor"}, &end));
      advance();
      TACHYON_RETURN_IF_ERROR(expect_block_end());
    }
    body.push_back(make_stmt(pos, std::move(node)));
    return Status::Ok();
  }

  Status parse_if(Body& body, SourcePos pos) {
    stmt::If node;
    while (true) {
      TACHYON_ASSIGN_OR_RETURN(ExprPtr condition, parse_tuple(false, false, {}, false));
      TACHYON_RETURN_IF_ERROR(expect_block_end());
      Body branch;
      std::string end;
      TACHYON_RETURN_IF_ERROR(parse_body(branch, {"elif", "else", "endif"}, &end));
      node.branches.emplace_back(std::move(condition), std::move(branch));
      advance();
      if (end == "elif") continue;
      TACHYON_RETURN_IF_ERROR(expect_block_end());
      if (end == "else") {
        TACHYON_RETURN_IF_ERROR(parse_body(node.otherwise, {"endif"}, &end));
        advance();
        TACHYON_RETURN_IF_ERROR(expect_block_end());
      }
      break;
    }
    body.push_back(make_stmt(pos, std::move(node)));
    return Status::Ok();
  }

  Status parse_set(Body& body, SourcePos pos) {
    TACHYON_ASSIGN_OR_RETURN(AssignTarget target, parse_assign_target(true, true, {}));
    if (skip_op("=")) {
      TACHYON_ASSIGN_OR_RETURN(ExprPtr value, parse_tuple(false, true, {}, false));
      TACHYON_RETURN_IF_ERROR(expect_block_end());
      body.push_back(make_stmt(pos, stmt::Set{std::move(target), std::move(value)}));
      return Status::Ok();
    }
    stmt::SetBlock node;
    node.target = std::move(target);
    if (is_op("|")) {
      TACHYON_RETURN_IF_ERROR(parse_filter_chain(node.filters, false));
    }
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    TACHYON_RETURN_IF_ERROR(parse_body(node.body, {"endset"}, &end));
    advance();
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    body.push_back(make_stmt(pos, std::move(node)));
    return Status::Ok();
  }

  // (a, b=default, ...) of a macro or a call block's caller.
  Status parse_signature(stmt::Macro& macro) {
    TACHYON_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!macro.params.empty()) TACHYON_RETURN_IF_ERROR(expect_op(","));
      if (is_op(")")) break;
      TACHYON_ASSIGN_OR_RETURN(std::string name, expect_identifier());
      ExprPtr default_value;
      if (skip_op("=")) {
        TACHYON_ASSIGN_OR_RETURN(default_value, parse_expression(true));
      } else if (!macro.defaults.empty() && macro.defaults.back() != nullptr) {
        return error("non-default argument follows default argument");
      }
      macro.params.push_back(std::move(name));
      macro.defaults.push_back(std::move(default_value));
    }
    advance();
    return Status::Ok();
  }

  static void note_special_names(stmt::Macro& macro) {
    macro.uses_varargs = mentions(macro.body, "varargs");
    macro.uses_kwargs = mentions(macro.body, "kwargs");
    macro.uses_caller = mentions(macro.body, "caller");
  }

  Status parse_macro(Body& body, SourcePos pos) {
    auto macro = std::make_shared<stmt::Macro>();
    TACHYON_ASSIGN_OR_RETURN(macro->name, expect_identifier());
    TACHYON_RETURN_IF_ERROR(parse_signature(*macro));
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    const int saved_loops = std::exchange(loop_depth_, 0);
    const Status status = parse_body(macro->body, {"endmacro"}, &end);
    loop_depth_ = saved_loops;
    TACHYON_RETURN_IF_ERROR(status);
    advance();
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    note_special_names(*macro);
    body.push_back(make_stmt(pos, std::move(macro)));
    return Status::Ok();
  }

  Status parse_call_block(Body& body, SourcePos pos) {
    stmt::CallBlock node;
    node.caller = std::make_shared<stmt::Macro>();
    node.caller->name = "caller";
    if (is_op("(")) TACHYON_RETURN_IF_ERROR(parse_signature(*node.caller));
    TACHYON_ASSIGN_OR_RETURN(node.call, parse_expression(true));
    if (!std::holds_alternative<node::Call>(node.call->node)) return error_at(pos, "expected a call after 'call'");
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    const int saved_loops = std::exchange(loop_depth_, 0);
    const Status status = parse_body(node.caller->body, {"endcall"}, &end);
    loop_depth_ = saved_loops;
    TACHYON_RETURN_IF_ERROR(status);
    advance();
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    note_special_names(*node.caller);
    body.push_back(make_stmt(pos, std::move(node)));
    return Status::Ok();
  }

  Status parse_filter_block(Body& body, SourcePos pos) {
    stmt::FilterBlock node;
    TACHYON_RETURN_IF_ERROR(parse_filter_chain(node.filters, true));
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    TACHYON_RETURN_IF_ERROR(parse_body(node.body, {"endfilter"}, &end));
    advance();
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    body.push_back(make_stmt(pos, std::move(node)));
    return Status::Ok();
  }

  Status parse_with(Body& body, SourcePos pos) {
    stmt::With node;
    while (current().kind != TokenKind::kBlockEnd) {
      if (!node.assignments.empty()) TACHYON_RETURN_IF_ERROR(expect_op(","));
      TACHYON_ASSIGN_OR_RETURN(AssignTarget target, parse_assign_target(true, false, {}));
      TACHYON_RETURN_IF_ERROR(expect_op("="));
      TACHYON_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      node.assignments.emplace_back(std::move(target), std::move(value));
    }
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    TACHYON_RETURN_IF_ERROR(parse_body(node.body, {"endwith"}, &end));
    advance();
    TACHYON_RETURN_IF_ERROR(expect_block_end());
    body.push_back(make_stmt(pos, std::move(node)));
    return Status::Ok();
  }

  // ------------------------------------------------------------------------------------------
  // Assignment targets

  Result<AssignTarget> to_target(const Expr& e) {
    if (const auto* name = std::get_if<node::Name>(&e.node)) {
      AssignTarget t;
      t.kind = AssignTarget::Kind::kName;
      t.name = name->name;
      return t;
    }
    if (const auto* seq = std::get_if<node::Sequence>(&e.node); seq != nullptr && seq->tuple) {
      AssignTarget t;
      t.kind = AssignTarget::Kind::kTuple;
      for (const ExprPtr& item : seq->items) {
        TACHYON_ASSIGN_OR_RETURN(AssignTarget sub, to_target(*item));
        t.items.push_back(std::move(sub));
      }
      return t;
    }
    const char* what = std::holds_alternative<node::Literal>(e.node) ? "const" : "expression";
    return error_at(e.pos, fmt::format("can't assign to '{}'", what));
  }

  Result<AssignTarget> parse_assign_target(bool with_tuple, bool with_namespace,
                                           std::initializer_list<std::string_view> extra_end) {
    if (with_namespace && current().kind == TokenKind::kName && peek().kind == TokenKind::kOperator &&
        peek().text == ".") {
      AssignTarget t;
      t.kind = AssignTarget::Kind::kNamespaceAttribute;
      t.name = current().text;
      advance();
      advance();
      TACHYON_ASSIGN_OR_RETURN(t.attribute, expect_identifier());
      return t;
    }
    ExprPtr e;
    if (with_tuple) {
      TACHYON_ASSIGN_OR_RETURN(e, parse_tuple(true, true, extra_end, false));
    } else {
      TACHYON_ASSIGN_OR_RETURN(e, parse_primary());
    }
    return to_target(*e);
  }

  // ------------------------------------------------------------------------------------------
  // Expressions

  bool at_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = current();
    if (t.kind == TokenKind::kVariableEnd || t.kind == TokenKind::kBlockEnd || t.kind == TokenKind::kEnd) return true;
    if (t.kind == TokenKind::kOperator && t.text == ")") return true;
    return t.kind == TokenKind::kName && std::find(extra_end.begin(), extra_end.end(), t.text) != extra_end.end();
  }

  // Comma-separated expressions; more than one (or a trailing comma) makes a tuple.
  Result<ExprPtr> parse_tuple(bool simplified, bool with_condexpr, std::initializer_list<std::string_view> extra_end,
                              bool explicit_parentheses) {
    const SourcePos pos = position();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) TACHYON_RETURN_IF_ERROR(expect_op(","));
      if (at_tuple_end(extra_end)) break;
      ExprPtr item;
      if (simplified) {
        TACHYON_ASSIGN_OR_RETURN(item, parse_primary());
      } else {
        TACHYON_ASSIGN_OR_RETURN(item, parse_expression(with_condexpr));
      }
      items.push_back(std::move(item));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items.front());
      if (!explicit_parentheses) return error(fmt::format("expected an expression, got '{}'", describe(current())));
    }
    return make_expr(pos, node::Sequence{std::move(items), true});
  }

  Result<ExprPtr> parse_expression(bool with_condexpr) {
    DepthGuard guard(depth_);
    if (guard.too_deep()) return error("expression nested too deeply");
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  Result<ExprPtr> parse_condexpr() {
    const SourcePos pos = position();
    TACHYON_ASSIGN_OR_RETURN(ExprPtr value, parse_or());
    ChainGuard chain(depth_);
    while (skip_name("if")) {
      if (!chain.add_link()) return error("expression too long or nested too deeply");
      TACHYON_ASSIGN_OR_RETURN(ExprPtr condition, parse_or());
      ExprPtr otherwise;
      if (skip_name("else")) {
        DepthGuard guard(depth_);
        if (guard.too_deep()) return error("expression nested too deeply");
        TACHYON_ASSIGN_OR_RETURN(otherwise, parse_condexpr());
      }
      value = make_expr(pos, node::Conditional{std::move(condition), std::move(value), std::move(otherwise)});
    }
    return value;
  }

  Result<ExprPtr> parse_or() {
    const SourcePos pos = position();
    TACHYON_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    ChainGuard chain(depth_);
    while (skip_name("or")) {
      if (!chain.add_link()) return error("expression too long or nested too deeply");
      TACHYON_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      left = make_expr(pos, node::Binary{BinaryOp::kOr, std::move(left), std::move(right)});
    }
    return left;
  }

  Result<ExprPtr> parse_and() {
    const SourcePos pos = position();
    TACHYON_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    ChainGuard chain(depth_);
    while (skip_name("and")) {
      if (!chain.add_link()) return error("expression too long or nested too deeply");
      TACHYON_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      left = make_expr(pos, node::Binary{BinaryOp::kAnd, std::move(left), std::move(right)});
    }
    return left;
  }

  Result<ExprPtr> parse_not() {
    const SourcePos pos = position();
    if (skip_name("not")) {
      DepthGuard guard(depth_);
      if (guard.too_deep()) return error("expression nested too deeply");
      TACHYON_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
      return make_expr(pos, node::Unary{UnaryOp::kNot, std::move(operand)});
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    const SourcePos pos = position();
    TACHYON_ASSIGN_OR_RETURN(ExprPtr left, parse_math1());
    std::vector<std::pair<CompareOp, ExprPtr>> rest;
    while (true) {
      CompareOp op;
      if (is_op("==")) {
        op = CompareOp::kEqual;
      } else if (is_op("!=")) {
        op = CompareOp::kNotEqual;
      } else if (is_op("<")) {
        op = CompareOp::kLess;
      } else if (is_op("<=")) {
        op = CompareOp::kLessEqual;
      } else if (is_op(">")) {
        op = CompareOp::kGreater;
      } else if (is_op(">=")) {
        op = CompareOp::kGreaterEqual;
      } else if (is_name("in")) {
        op = CompareOp::kIn;
      } else if (is_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
        op = CompareOp::kNotIn;
        advance();
      } else {
        break;
      }
      advance();
      TACHYON_ASSIGN_OR_RETURN(ExprPtr right, parse_math1());
      rest.emplace_back(op, std::move(right));
    }
    if (rest.empty()) return left;
    return make_expr(pos, node::Compare{std::move(left), std::move(rest)});
  }

  Result<ExprPtr> parse_math1() {
    const SourcePos pos = position();
    TACHYON_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
    ChainGuard chain(depth_);
    while (is_op("+") || is_op("-")) {
      if (!chain.add_link()) return error("expression too long or nested too deeply");
      const BinaryOp op = is_op("+") ? BinaryOp::kAdd : BinaryOp::kSubtract;
      advance();
      TACHYON_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
      left = make_expr(pos, node::Binary{op, std::move(left), std::move(right)});
    }
    return left;
  }

  Result<ExprPtr> parse_concat() {
    const SourcePos pos = position();
    TACHYON_ASSIGN_OR_RETURN(ExprPtr left, parse_math2());
    ChainGuard chain(depth_);
    while (skip_op("~")) {
      if (!chain.add_link()) return error("expression too long or nested too deeply");
      TACHYON_ASSIGN_OR_RETURN(ExprPtr right, parse_math2());
      left = make_expr(pos, node::Binary{BinaryOp::kConcat, std::move(left), std::move(right)});
    }
    return left;
  }

  Result<ExprPtr> parse_math2() {
    const SourcePos pos = position();
    TACHYON_ASSIGN_OR_RETURN(ExprPtr left, parse_pow());
    ChainGuard chain(depth_);
    while (true) {
      BinaryOp op;
      if (is_op("*")) {
        op = BinaryOp::kMultiply;
      } else if (is_op("/")) {
        op = BinaryOp::kDivide;
      } else if (is_op("//")) {
        op = BinaryOp::kFloorDivide;
      } else if (is_op("%")) {
        op = BinaryOp::kModulo;
      } else {
        break;
      }
      advance();
      if (!chain.add_link()) return error("expression too long or nested too deeply");
      TACHYON_ASSIGN_OR_RETURN(ExprPtr right, parse_pow());
      left = make_expr(pos, node::Binary{op, std::move(left), std::move(right)});
    }
    return left;
  }

  Result<ExprPtr> parse_pow() {
    const SourcePos pos = position();
    TACHYON_ASSIGN_OR_RETURN(ExprPtr left, parse_unary(true));
    ChainGuard chain(depth_);
    while (skip_op("**")) {
      if (!chain.add_link()) return error("expression too long or nested too deeply");
      TACHYON_ASSIGN_OR_RETURN(ExprPtr right, parse_unary(true));
      left = make_expr(pos, node::Binary{BinaryOp::kPower, std::move(left), std::move(right)});
    }
    return left;
  }

  Result<ExprPtr> parse_unary(bool with_filter) {
    DepthGuard guard(depth_);
    if (guard.too_deep()) return error("expression nested too deeply");
    const SourcePos pos = position();
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const UnaryOp op = is_op("-") ? UnaryOp::kNegate : UnaryOp::kPlus;
      advance();
      TACHYON_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
      e = make_expr(pos, node::Unary{op, std::move(operand)});
    } else {
      TACHYON_ASSIGN_OR_RETURN(e, parse_primary());
    }
    TACHYON_ASSIGN_OR_RETURN(e, parse_postfix(std::move(e)));
    if (with_filter) {
      TACHYON_ASSIGN_OR_RETURN(e, parse_filter_expr(std::move(e)));
    }
    return e;
  }

  Result<ExprPtr> parse_primary() {
    DepthGuard guard(depth_);
    if (guard.too_deep()) return error("expression nested too deeply");
    const SourcePos pos = position();
    const Token& t = current();
    switch (t.kind) {
      case TokenKind::kName: {
        std::string name = t.text;
        advance();
        if (name == "true" || name == "True") return make_expr(pos, node::Literal{Value(true)});
        if (name == "false" || name == "False") return make_expr(pos, node::Literal{Value(false)});
        if (name == "none" || name == "None") return make_expr(pos, node::Literal{Value::none()});
        return make_expr(pos, node::Name{std::move(name)});
      }
      case TokenKind::kString: {
        std::string value;
        while (current().kind == TokenKind::kString) {  // adjacent literals concatenate
          value += current().text;
          advance();
        }
        return make_expr(pos, node::Literal{Value(std::move(value))});
      }
      case TokenKind::kInteger: {
        const int64_t v = t.integer;
        advance();
        return make_expr(pos, node::Literal{Value(v)});
      }
      case TokenKind::kFloat: {
        const double v = t.number;
        advance();
        return make_expr(pos, node::Literal{Value(v)});
      }
      case TokenKind::kOperator:
        if (t.text == "(") {
          advance();
          TACHYON_ASSIGN_OR_RETURN(ExprPtr e, parse_tuple(false, true, {}, true));
          TACHYON_RETURN_IF_ERROR(expect_op(")"));
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        return error(fmt::format("unexpected '{}'", t.text));
      default:
        return error(fmt::format("expected an expression, got '{}'", describe(t)));
    }
  }

  Result<ExprPtr> parse_list() {
    const SourcePos pos = position();
    advance();
    std::vector<ExprPtr> items;
    while (!is_op("]")) {
      if (!items.empty()) TACHYON_RETURN_IF_ERROR(expect_op(","));
      if (is_op("]")) break;
      TACHYON_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
      items.push_back(std::move(item));
    }
    advance();
    return make_expr(pos, node::Sequence{std::move(items), false});
  }

  Result<ExprPtr> parse_dict() {
    const SourcePos pos = position();
    advance();
    std::vector<std::pair<ExprPtr, ExprPtr>> items;
    while (!is_op("}")) {
      if (!items.empty()) TACHYON_RETURN_IF_ERROR(expect_op(","));
      if (is_op("}")) break;
      TACHYON_ASSIGN_OR_RETURN(ExprPtr key, parse_expression(true));
      TACHYON_RETURN_IF_ERROR(expect_op(":"));
      TACHYON_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      items.emplace_back(std::move(key), std::move(value));
    }
    advance();
    return make_expr(pos, node::DictLiteral{std::move(items)});
  }

  Result<ExprPtr> parse_postfix(ExprPtr e) {
    ChainGuard chain(depth_);
    while (true) {
      if (!chain.add_link()) return error("expression too long or nested too deeply");
      if (is_op(".") || is_op("[")) {
        TACHYON_ASSIGN_OR_RETURN(e, parse_subscript(std::move(e)));
      } else if (is_op("(")) {
        TACHYON_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr e) {
    ChainGuard chain(depth_);
    while (true) {
      if (!chain.add_link()) return error("expression too long or nested too deeply");
      if (is_op("|")) {
        std::vector<ExprPtr> filters;
        TACHYON_RETURN_IF_ERROR(parse_filter_chain(filters, false));
        for (ExprPtr& f : filters) {
          if (!chain.add_link()) return error("expression too long or nested too deeply");
          std::get<node::Filter>(f->node).value = std::move(e);
          e = std::move(f);
        }
      } else if (is_name("is")) {
        TACHYON_ASSIGN_OR_RETURN(e, parse_test(std::move(e)));
      } else if (is_op("(")) {
        TACHYON_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr object) {
    const SourcePos pos = position();
    if (skip_op(".")) {
      const Token& t = current();
      if (t.kind == TokenKind::kName) {
        std::string name = t.text;
        advance();
        return make_expr(pos, node::Attribute{std::move(object), std::move(name)});
      }
      if (t.kind == TokenKind::kInteger) {
        ExprPtr key = make_expr(position(), node::Literal{Value(t.integer)});
        advance();
        return make_expr(pos, node::Item{std::move(object), std::move(key)});
      }
      return error(fmt::format("expected a name or number after '.', got '{}'", describe(t)));
    }
    advance();  // [
    // One key or one slice; jinja2's tuples of keys/slices only make sense for Python objects.
    ExprPtr start, stop, step;
    bool is_slice = false;
    if (!is_op(":")) {
      TACHYON_ASSIGN_OR_RETURN(start, parse_expression(true));
    }
    if (skip_op(":")) {
      is_slice = true;
      if (!is_op("]") && !is_op(":") && !is_op(",")) {
        TACHYON_ASSIGN_OR_RETURN(stop, parse_expression(true));
      }
      if (skip_op(":")) {
        if (!is_op("]") && !is_op(",")) {
          TACHYON_ASSIGN_OR_RETURN(step, parse_expression(true));
        }
      }
    }
    if (is_op(",")) return error("subscripts with several keys are not supported");
    TACHYON_RETURN_IF_ERROR(expect_op("]"));
    if (is_slice) {
      return make_expr(pos, node::Slice{std::move(object), std::move(start), std::move(stop), std::move(step)});
    }
    return make_expr(pos, node::Item{std::move(object), std::move(start)});
  }

  Status parse_arguments(Arguments& args) {
    TACHYON_RETURN_IF_ERROR(expect_op("("));
    bool first = true;
    while (!is_op(")")) {
      if (!first) TACHYON_RETURN_IF_ERROR(expect_op(","));
      first = false;
      if (is_op(")")) break;
      if (skip_op("**")) {
        TACHYON_ASSIGN_OR_RETURN(args.star_kwargs, parse_expression(true));
      } else if (skip_op("*")) {
        TACHYON_ASSIGN_OR_RETURN(args.star_args, parse_expression(true));
      } else if (current().kind == TokenKind::kName && peek().kind == TokenKind::kOperator && peek().text == "=") {
        std::string key = current().text;
        advance();
        advance();
        TACHYON_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        args.keyword.emplace_back(std::move(key), std::move(value));
      } else {
        if (!args.keyword.empty() || args.star_args || args.star_kwargs) {
          return error("positional argument follows keyword argument");
        }
        TACHYON_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        args.positional.push_back(std::move(value));
      }
    }
    advance();
    return Status::Ok();
  }

  Result<ExprPtr> parse_call(ExprPtr callee) {
    const SourcePos pos = callee->pos;  // errors point at the start of the call
    node::Call call;
    call.callee = std::move(callee);
    TACHYON_RETURN_IF_ERROR(parse_arguments(call.args));
    return make_expr(pos, std::move(call));
  }

  Result<std::string> parse_dotted_name() {
    TACHYON_ASSIGN_OR_RETURN(std::string name, expect_identifier());
    while (skip_op(".")) {
      TACHYON_ASSIGN_OR_RETURN(std::string part, expect_identifier());
      name += "." + part;
    }
    return name;
  }

  // "| f(args) | g ..." (or, inline, "f(args) | g ..." after {% filter %}); values left null.
  Status parse_filter_chain(std::vector<ExprPtr>& chain, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) advance();
      start_inline = false;
      const SourcePos pos = position();
      node::Filter filter;
      TACHYON_ASSIGN_OR_RETURN(filter.name, parse_dotted_name());
      filter.function = find_filter(filter.name);
      if (filter.function == nullptr) return error_at(pos, fmt::format("no filter named '{}'", filter.name));
      if (is_op("(")) TACHYON_RETURN_IF_ERROR(parse_arguments(filter.args));
      chain.push_back(make_expr(pos, std::move(filter)));
    }
    return Status::Ok();
  }

  Result<ExprPtr> parse_test(ExprPtr value) {
    const SourcePos pos = position();
    advance();  // is
    node::Test test;
    test.value = std::move(value);
    test.negated = skip_name("not");
    TACHYON_ASSIGN_OR_RETURN(test.name, parse_dotted_name());
    test.function = find_test(test.name);
    if (test.function == nullptr) return error_at(pos, fmt::format("no test named '{}'", test.name));
    const Token& t = current();
    if (is_op("(")) {
      TACHYON_RETURN_IF_ERROR(parse_arguments(test.args));
    } else if ((t.kind == TokenKind::kName || t.kind == TokenKind::kString || t.kind == TokenKind::kInteger ||
                t.kind == TokenKind::kFloat || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) return error("you cannot chain multiple tests with is");
      TACHYON_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
      TACHYON_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
      test.args.positional.push_back(std::move(arg));
    }
    return make_expr(pos, std::move(test));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Template>> parse_template(std::string_view source) {
  TACHYON_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
  return Parser(std::move(tokens)).run();
}

}  // namespace tachyon::jinja
