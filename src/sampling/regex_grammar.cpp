// The regex compiler: a recursive-descent parser of the ECMAScript subset in regex_grammar.h that builds
// GrammarExpr directly, plus the nullable / non-empty rewrites that keep repetitions from being left-recursive.
#include "sampling/regex_grammar.h"

#include <utility>
#include <vector>

namespace tachyon {

namespace {

CharClass digit_class() { return CharClass::range('0', '9'); }
CharClass word_class() {
  CharClass c = CharClass::range('a', 'z');
  c.add('A', 'Z');
  c.add('0', '9');
  c.add('_', '_');
  return c;
}
// ECMAScript's WhiteSpace and LineTerminator.
CharClass space_class() {
  CharClass c;
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu,
                      0x3000u, 0xFEFFu}) {
    c.add(cp, cp);
  }
  c.add(0x2000, 0x200A);
  return c;
}
CharClass dot_class() {
  CharClass line_terminators;
  for (uint32_t cp : {0x0Au, 0x0Du, 0x2028u, 0x2029u}) line_terminators.add(cp, cp);
  return line_terminators.complement();
}
// Matches nothing: an empty class, which GrammarBuilder drops with the alternative holding it.
GrammarExpr never() { return GrammarExpr::chars(CharClass()); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view pattern) : pattern_(pattern) {}

  // The top level: alternatives with their anchors.
  Status parse(RegexMatchMode mode, GrammarExpr& out) {
    std::vector<GrammarExpr> choices;
    while (true) {
      bool anchored_start = false;
      bool anchored_end = false;
      if (peek() == '^') {
        anchored_start = true;
        ++pos_;
      }
      GrammarExpr body;
      TACHYON_RETURN_IF_ERROR(parse_concat(0, body, &anchored_end));
      if (mode == RegexMatchMode::kSearch) {
        const GrammarExpr anything = GrammarExpr::star(GrammarExpr::chars(CharClass::any()));
        std::vector<GrammarExpr> parts;
        if (!anchored_start) parts.push_back(anything);
        parts.push_back(std::move(body));
        if (!anchored_end) parts.push_back(anything);
        body = GrammarExpr::sequence(std::move(parts));
      }
      choices.push_back(std::move(body));
      if (at_end()) break;
      if (peek() == '|') {
        ++pos_;
        continue;
      }
      if (peek() == ')') return error_at(pos_, "unbalanced ')'");
      return error_at(pos_, "unexpected '{}'", peek());
    }
    out = GrammarExpr::alternation(std::move(choices));
    return Status::Ok();
  }

 private:
  bool at_end() const { return pos_ >= pattern_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < pattern_.size() ? pattern_[pos_ + ahead] : '\0'; }

  template <typename... Args>
  Status error_at(size_t offset, fmt::format_string<Args...> format, Args&&... args) const {
    return Status(ErrorCode::kInvalidArgument, fmt::format("regex '{}': at offset {}: {}", excerpt(pattern_, 80),
                                                           offset, fmt::format(format, std::forward<Args>(args)...)));
  }

  Status parse_alternation(int depth, GrammarExpr& out) {
    std::vector<GrammarExpr> choices;
    while (true) {
      GrammarExpr seq;
      TACHYON_RETURN_IF_ERROR(parse_concat(depth, seq, nullptr));
      choices.push_back(std::move(seq));
      if (peek() != '|') break;
      ++pos_;
    }
    out = GrammarExpr::alternation(std::move(choices));
    return Status::Ok();
  }

  // A run of quantified atoms up to '|', ')' or the end. At the top level (anchored_end != nullptr) a final
  // '$' is accepted and reported.
  Status parse_concat(int depth, GrammarExpr& out, bool* anchored_end) {
    std::vector<GrammarExpr> parts;
    while (!at_end() && peek() != '|' && peek() != ')') {
      const size_t start = pos_;
      if (peek() == '$') {
        ++pos_;
        if (anchored_end != nullptr && (at_end() || peek() == '|')) {
          *anchored_end = true;
          break;
        }
        return error_at(start, "anchor '$' is supported only at the end of the pattern");
      }
      if (peek() == '^') return error_at(start, "anchor '^' is supported only at the start of the pattern");
      GrammarExpr atom;
      TACHYON_RETURN_IF_ERROR(parse_atom(depth, atom));
      TACHYON_RETURN_IF_ERROR(parse_quantifiers(atom));
      parts.push_back(std::move(atom));
    }
    out = parts.empty() ? GrammarExpr::empty() : GrammarExpr::sequence(std::move(parts));
    return Status::Ok();
  }

  Status parse_quantifiers(GrammarExpr& atom) {
    if (at_end()) return Status::Ok();
    int32_t min_count = 0;
    int32_t max_count = 0;
    const char c = peek();
    if (c == '*') {
      min_count = 0, max_count = GrammarExpr::kUnbounded, ++pos_;
    } else if (c == '+') {
      min_count = 1, max_count = GrammarExpr::kUnbounded, ++pos_;
    } else if (c == '?') {
      min_count = 0, max_count = 1, ++pos_;
    } else if (c == '{') {
      TACHYON_RETURN_IF_ERROR(parse_braces(min_count, max_count));
    } else {
      return Status::Ok();
    }
    if (peek() == '?') ++pos_;  // lazy: the same language
    if (peek() == '+') return error_at(pos_, "possessive quantifiers are not supported");
    if (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{') {
      return error_at(pos_, "nothing to repeat (a quantifier follows a quantifier)");
    }
    atom = make_repeat(std::move(atom), min_count, max_count);
    return Status::Ok();
  }

  static GrammarExpr make_repeat(GrammarExpr body, int32_t min_count, int32_t max_count) {
    if (expr_is_nullable(body)) {
      // x{m,n} with x matching "" is (x minus ""){0,n}: the empty copies fill up the minimum.
      return GrammarExpr::repeat(expr_without_empty(body), 0, max_count);
    }
    return GrammarExpr::repeat(std::move(body), min_count, max_count);
  }

  Status parse_braces(int32_t& min_count, int32_t& max_count) {
    const size_t open = pos_;
    ++pos_;
    auto number = [&](int32_t& value) {
      const size_t start = pos_;
      int64_t v = 0;
      while (!at_end() && peek() >= '0' && peek() <= '9') {
        v = v * 10 + (peek() - '0');
        if (v > 1'000'000) v = 1'000'001;
        ++pos_;
      }
      value = static_cast<int32_t>(v);
      return pos_ > start;
    };
    const Status not_a_repeat = error_at(open,
                                         "'{{' must start a repetition {{m}}, {{m,}} or {{m,n}} (write \\{{ "
                                         "for the character)");
    if (!number(min_count)) return not_a_repeat;
    max_count = min_count;
    if (peek() == ',') {
      ++pos_;
      if (peek() == '}') {
        max_count = GrammarExpr::kUnbounded;
      } else if (!number(max_count)) {
        return not_a_repeat;
      }
    }
    if (peek() != '}') return not_a_repeat;
    ++pos_;
    if (max_count != GrammarExpr::kUnbounded && max_count < min_count) {
      return error_at(open, "repetition {{{},{}}}: the maximum is below the minimum", min_count, max_count);
    }
    return Status::Ok();
  }

  Status parse_atom(int depth, GrammarExpr& out) {
    const size_t start = pos_;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') return error_at(start, "nothing to repeat before '{}'", c);
    if (c == '{') return error_at(start, "nothing to repeat before '{{' (write \\{{ for the character)");
    if (c == '}' || c == ']') return error_at(start, "unescaped '{}' (write \\{})", c, c);
    if (c == '.') {
      ++pos_;
      out = GrammarExpr::chars(dot_class());
      return Status::Ok();
    }
    if (c == '[') return parse_class(out);
    if (c == '(') return parse_group(depth, out);
    if (c == '\\') {
      CharClass set;
      TACHYON_RETURN_IF_ERROR(parse_escape(false, set));
      out = GrammarExpr::chars(std::move(set));
      return Status::Ok();
    }
    std::optional<uint32_t> cp = decode_utf8(pattern_, pos_);
    if (!cp) return error_at(pos_, "invalid UTF-8");
    out = GrammarExpr::code_point(*cp);
    return Status::Ok();
  }

  Status parse_group(int depth, GrammarExpr& out) {
    const size_t open = pos_;
    if (depth + 1 > kMaxRegexNesting) return error_at(open, "groups nested deeper than {}", kMaxRegexNesting);
    ++pos_;
    if (peek() == '?') {
      const char kind = peek(1);
      if (kind == ':') {
        pos_ += 2;
      } else if (kind == '=' || kind == '!') {
        return error_at(open, "lookahead (?{} ...) is not supported", kind);
      } else if (kind == '<' && (peek(2) == '=' || peek(2) == '!')) {
        return error_at(open, "lookbehind (?<{} ...) is not supported", peek(2));
      } else if (kind == '<') {
        pos_ += 2;  // a named group: the name changes nothing
        while (!at_end() && peek() != '>') ++pos_;
        if (at_end()) return error_at(open, "unterminated group name");
        ++pos_;
      } else {
        return error_at(open, "group modifier '(?{}' (inline flags and the like) is not supported", kind);
      }
    }
    TACHYON_RETURN_IF_ERROR(parse_alternation(depth + 1, out));
    if (peek() != ')') return error_at(open, "unclosed '('");
    ++pos_;
    return Status::Ok();
  }

  // After '\\'. In a class, \b is backspace; outside, \b \B are word boundaries (refused).
  Status parse_escape(bool in_class, CharClass& out) {
    const size_t start = pos_;
    ++pos_;
    if (at_end()) return error_at(start, "pattern ends with '\\'");
    const char e = peek();
    ++pos_;
    switch (e) {
      case 'd': out = digit_class(); return Status::Ok();
      case 'D': out = digit_class().complement(); return Status::Ok();
      case 'w': out = word_class(); return Status::Ok();
      case 'W': out = word_class().complement(); return Status::Ok();
      case 's': out = space_class(); return Status::Ok();
      case 'S': out = space_class().complement(); return Status::Ok();
      case 't': out = CharClass::single('\t'); return Status::Ok();
      case 'n': out = CharClass::single('\n'); return Status::Ok();
      case 'r': out = CharClass::single('\r'); return Status::Ok();
      case 'v': out = CharClass::single('\v'); return Status::Ok();
      case 'f': out = CharClass::single('\f'); return Status::Ok();
      case 'b':
        if (in_class) {
          out = CharClass::single('\b');
          return Status::Ok();
        }
        return error_at(start, "word boundaries (\\b) are not supported");
      case 'B': return error_at(start, "word boundaries (\\B) are not supported");
      case '0':
        if (peek() >= '0' && peek() <= '9') return error_at(start, "octal escapes are not supported");
        out = CharClass::single(0);
        return Status::Ok();
      case 'x':
      case 'u': {
        const int digits = e == 'x' ? 2 : 4;
        if (e == 'u' && peek() == '{') return error_at(start, "\\u{{...}} escapes are not supported");
        uint32_t value = 0;
        for (int i = 0; i < digits; ++i) {
          const int h = hex_value(peek());
          if (h < 0) return error_at(start, "\\{} needs {} hex digits", e, digits);
          value = value * 16 + static_cast<uint32_t>(h);
          ++pos_;
        }
        out = CharClass::single(value);
        return Status::Ok();
      }
      case 'c': {
        const char letter = peek();
        if (!((letter >= 'a' && letter <= 'z') || (letter >= 'A' && letter <= 'Z'))) {
          return error_at(start, "\\c must be followed by a letter");
        }
        ++pos_;
        out = CharClass::single(static_cast<uint32_t>(letter) % 32);
        return Status::Ok();
      }
      case 'k': return error_at(start, "backreferences (\\k<name>) are not supported");
      case 'p':
      case 'P': return error_at(start, "Unicode property classes (\\{}{{...}}) are not supported", e);
      default: break;
    }
    if (e >= '1' && e <= '9') return error_at(start, "backreferences (\\{}) are not supported", e);
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
      return error_at(start, "unknown escape '\\{}'", e);
    }
    // Escaped punctuation (or any other character) stands for itself.
    --pos_;
    std::optional<uint32_t> cp = decode_utf8(pattern_, pos_);
    if (!cp) return error_at(pos_, "invalid UTF-8");
    out = CharClass::single(*cp);
    return Status::Ok();
  }

  Status parse_class(GrammarExpr& out) {
    const size_t open = pos_;
    ++pos_;
    const bool negated = peek() == '^';
    if (negated) ++pos_;
    CharClass set;
    while (true) {
      if (at_end()) return error_at(open, "unterminated character class");
      if (peek() == ']') break;
      const size_t item = pos_;
      CharClass first;
      bool first_is_set = false;
      TACHYON_RETURN_IF_ERROR(parse_class_atom(first, first_is_set));
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < pattern_.size()) {
        ++pos_;
        CharClass last;
        bool last_is_set = false;
        TACHYON_RETURN_IF_ERROR(parse_class_atom(last, last_is_set));
        if (first_is_set || last_is_set) {
          return error_at(item, "a range in a character class cannot start or end at a class escape");
        }
        const uint32_t lo = *first.single_member();
        const uint32_t hi = *last.single_member();
        if (hi < lo) return error_at(item, "range out of order in character class");
        set.add(lo, hi);
      } else {
        set.add(first);
      }
    }
    ++pos_;
    out = GrammarExpr::chars(negated ? set.complement() : set);
    return Status::Ok();
  }

  Status parse_class_atom(CharClass& out, bool& is_set) {
    is_set = false;
    if (peek() == '\\') {
      const char e = peek(1);
      is_set = e == 'd' || e == 'D' || e == 'w' || e == 'W' || e == 's' || e == 'S';
      return parse_escape(true, out);
    }
    std::optional<uint32_t> cp = decode_utf8(pattern_, pos_);
    if (!cp) return error_at(pos_, "invalid UTF-8");
    out = CharClass::single(*cp);
    return Status::Ok();
  }

  std::string_view pattern_;
  size_t pos_ = 0;
};

}  // namespace

bool expr_is_nullable(const GrammarExpr& expr) {
  switch (expr.kind) {
    case GrammarExpr::Kind::kChars: return false;
    case GrammarExpr::Kind::kRuleRef: return false;  // not used on expressions with references
    case GrammarExpr::Kind::kSequence:
      for (const GrammarExpr& c : expr.children) {
        if (!expr_is_nullable(c)) return false;
      }
      return true;
    case GrammarExpr::Kind::kAlternation:
      for (const GrammarExpr& c : expr.children) {
        if (expr_is_nullable(c)) return true;
      }
      return false;
    case GrammarExpr::Kind::kRepeat: return expr.min_count == 0 || expr_is_nullable(expr.children[0]);
  }
  return false;
}

GrammarExpr expr_without_empty(const GrammarExpr& expr) {
  switch (expr.kind) {
    case GrammarExpr::Kind::kChars:
    case GrammarExpr::Kind::kRuleRef: return expr;
    case GrammarExpr::Kind::kSequence: {
      if (expr.children.empty()) return never();
      const GrammarExpr& head = expr.children[0];
      std::vector<GrammarExpr> rest(expr.children.begin() + 1, expr.children.end());
      if (!expr_is_nullable(head)) return expr;
      // (head minus "") rest  |  "" (rest minus "")
      std::vector<GrammarExpr> first{expr_without_empty(head)};
      first.insert(first.end(), rest.begin(), rest.end());
      GrammarExpr tail = rest.empty() ? GrammarExpr::empty() : GrammarExpr::sequence(std::move(rest));
      return GrammarExpr::alternation({GrammarExpr::sequence(std::move(first)), expr_without_empty(tail)});
    }
    case GrammarExpr::Kind::kAlternation: {
      std::vector<GrammarExpr> choices;
      for (const GrammarExpr& c : expr.children) choices.push_back(expr_without_empty(c));
      if (choices.empty()) return never();
      return GrammarExpr::alternation(std::move(choices));
    }
    case GrammarExpr::Kind::kRepeat: {
      if (expr.max_count == 0) return never();
      const GrammarExpr& body = expr.children[0];
      if (expr_is_nullable(body)) return GrammarExpr::repeat(expr_without_empty(body), 1, expr.max_count);
      return GrammarExpr::repeat(body, std::max(expr.min_count, 1), expr.max_count);
    }
  }
  return expr;
}

Result<GrammarExpr> regex_to_expr(std::string_view pattern, RegexMatchMode mode) {
  RegexParser parser(pattern);
  GrammarExpr out;
  TACHYON_RETURN_IF_ERROR(parser.parse(mode, out));
  return out;
}

Result<Grammar> regex_to_grammar(std::string_view pattern, GrammarLimits limits) {
  TACHYON_ASSIGN_OR_RETURN(GrammarExpr expr, regex_to_expr(pattern, RegexMatchMode::kFullMatch));
  GrammarBuilder builder(limits);
  TACHYON_RETURN_IF_ERROR(builder.add_rule("root", std::move(expr)));
  return builder.build("root");
}

}  // namespace tachyon
