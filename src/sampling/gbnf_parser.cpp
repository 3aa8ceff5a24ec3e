// The GBNF parser: recursive descent over the UTF-8 text with line:column tracking. It builds GrammarExpr
// trees and leaves lowering and the semantic checks (undefined rules, left recursion) to GrammarBuilder.
#include "sampling/gbnf_parser.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace tachyon {

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, GrammarBuilder& builder) : text_(text), builder_(builder) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < text_.size(); ++i) {
      if (text_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Status parse() {
    skip_space();
    while (!at_end()) {
      TACHYON_RETURN_IF_ERROR(parse_rule());
      skip_space();
    }
    return Status::Ok();
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }

  // Line starts are found once, so that positions of many rule references stay cheap.
  SourcePos position_of(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());  // >= 1: line_starts_[0] == 0
    return SourcePos{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  template <typename... Args>
  Status error_at(size_t offset, fmt::format_string<Args...> format, Args&&... args) const {
    const SourcePos p = position_of(offset);
    return Status(ErrorCode::kInvalidArgument, fmt::format("grammar syntax error at {}:{}: {}", p.line, p.column,
                                                           fmt::format(format, std::forward<Args>(args)...)));
  }

  // What the text holds at `offset`, quoted for an error message.
  std::string shown_at(size_t offset) const {
    if (offset >= text_.size()) return "end of text";
    size_t end = offset;
    if (!decode_utf8(text_, end)) return fmt::format("byte 0x{:02X}", static_cast<unsigned char>(text_[offset]));
    const std::string_view c = text_.substr(offset, end - offset);
    if (c == "\n") return "end of line";
    return fmt::format("'{}'", c);
  }

  // The first offset at or after `p` that is not whitespace or inside a comment.
  size_t after_space(size_t p) const {
    while (p < text_.size()) {
      const char c = text_[p];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++p;
      } else if (c == '#') {
        while (p < text_.size() && text_[p] != '\n') ++p;
      } else {
        break;
      }
    }
    return p;
  }
  void skip_space() { pos_ = after_space(pos_); }

  std::string_view parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    return text_.substr(start, pos_ - start);
  }

  // Whether `name ::=` starts at the current position (the start of the next rule).
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    return text_.substr(after_space(p), 3) == "::=";
  }

  Status parse_rule() {
    const size_t start = pos_;
    const std::string_view name = parse_name();
    if (name.empty()) return error_at(pos_, "expected a rule name, got {}", shown_at(pos_));
    skip_space();
    if (text_.substr(pos_, 3) != "::=") {
      return error_at(pos_, "expected '::=' after rule name '{}', got {}", name, shown_at(pos_));
    }
    pos_ += 3;
    skip_space();
    GrammarExpr body;
    TACHYON_RETURN_IF_ERROR(parse_alternatives(0, body));
    if (!at_end() && !at_rule_start()) {
      if (peek() == ')') return error_at(pos_, "unbalanced ')'");
      return error_at(pos_, "unexpected {}", shown_at(pos_));
    }
    return builder_.add_rule(std::string(name), std::move(body), position_of(start));
  }

  // Stops before ')' (nested) or at the next rule / the end of text (top level).
  Status parse_alternatives(int depth, GrammarExpr& out) {
    std::vector<GrammarExpr> choices;
    while (true) {
      GrammarExpr seq;
      TACHYON_RETURN_IF_ERROR(parse_sequence(depth, seq));
      choices.push_back(std::move(seq));
      if (peek() != '|') break;
      ++pos_;
      skip_space();
    }
    out = GrammarExpr::alternation(std::move(choices));
    return Status::Ok();
  }

  Status parse_sequence(int depth, GrammarExpr& out) {
    std::vector<GrammarExpr> parts;
    while (!at_end()) {
      const char c = peek();
      if (c == '|' || c == ')') break;
      if (depth == 0 && at_rule_start()) break;
      if (c == '*' || c == '+' || c == '?' || c == '{') {
        return error_at(pos_, "quantifier '{}' has nothing before it to repeat", c);
      }
      GrammarExpr item;
      TACHYON_RETURN_IF_ERROR(parse_primary(depth, item));
      skip_space();
      // Postfix quantifiers; stacking them (x*?) is allowed and means what it says.
      while (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) {
        TACHYON_RETURN_IF_ERROR(parse_quantifier(item));
        skip_space();
      }
      parts.push_back(std::move(item));
    }
    out = parts.empty() ? GrammarExpr::empty() : GrammarExpr::sequence(std::move(parts));
    return Status::Ok();
  }

  Status parse_primary(int depth, GrammarExpr& out) {
    const char c = peek();
    if (c == '"') return parse_literal(out);
    if (c == '[') return parse_class(out);
    if (c == '.') {
      ++pos_;
      out = GrammarExpr::chars(CharClass::any());
      return Status::Ok();
    }
    if (c == '(') {
      if (depth + 1 > kMaxGbnfNesting) return error_at(pos_, "groups nested deeper than {}", kMaxGbnfNesting);
      const size_t open = pos_;
      ++pos_;
      skip_space();
      TACHYON_RETURN_IF_ERROR(parse_alternatives(depth + 1, out));
      if (peek() != ')') return error_at(open, "unclosed '(' (expected ')' before {})", shown_at(pos_));
      ++pos_;
      return Status::Ok();
    }
    if (is_name_char(c)) {
      const SourcePos where = position_of(pos_);
      out = GrammarExpr::rule(std::string(parse_name()), where);
      return Status::Ok();
    }
    if (c == ':' && text_.substr(pos_, 3) == "::=") {
      return error_at(pos_, "'::=' without a rule name before it");
    }
    return error_at(pos_, "unexpected {}", shown_at(pos_));
  }

  Status parse_quantifier(GrammarExpr& item) {
    const char c = peek();
    if (c != '{') {
      ++pos_;
      if (c == '*') item = GrammarExpr::star(std::move(item));
      if (c == '+') item = GrammarExpr::plus(std::move(item));
      if (c == '?') item = GrammarExpr::optional(std::move(item));
      return Status::Ok();
    }
    const size_t open = pos_;
    ++pos_;
    skip_space();
    int32_t min_count = 0;
    TACHYON_RETURN_IF_ERROR(parse_count(min_count));
    skip_space();
    int32_t max_count = min_count;
    if (peek() == ',') {
      ++pos_;
      skip_space();
      if (peek() == '}') {
        max_count = GrammarExpr::kUnbounded;
      } else {
        TACHYON_RETURN_IF_ERROR(parse_count(max_count));
        skip_space();
      }
    }
    if (peek() != '}') return error_at(pos_, "expected '}}' to close the repetition, got {}", shown_at(pos_));
    ++pos_;
    if (max_count != GrammarExpr::kUnbounded && max_count < min_count) {
      return error_at(open, "repetition {{{},{}}}: the maximum is below the minimum", min_count, max_count);
    }
    item = GrammarExpr::repeat(std::move(item), min_count, max_count);
    return Status::Ok();
  }

  Status parse_count(int32_t& out) {
    const size_t start = pos_;
    int64_t value = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      value = value * 10 + (peek() - '0');
      if (value > 1'000'000'000) return error_at(start, "repetition count is too large");
      ++pos_;
    }
    if (pos_ == start) return error_at(pos_, "expected a number in the repetition, got {}", shown_at(pos_));
    out = static_cast<int32_t>(value);
    return Status::Ok();
  }

  // One code point of a literal or class, escapes included; `quote` is the closing character.
  Status parse_char(uint32_t& cp, bool in_class) {
    const size_t start = pos_;
    if (peek() != '\\') {
      std::optional<uint32_t> decoded = decode_utf8(text_, pos_);
      if (!decoded) return error_at(pos_, "invalid UTF-8 (byte 0x{:02X})", static_cast<unsigned char>(peek()));
      cp = *decoded;
      return Status::Ok();
    }
    ++pos_;
    if (at_end()) return error_at(start, "escape '\\' at the end of the text");
    const char e = peek();
    ++pos_;
    switch (e) {
      case 'n': cp = '\n'; return Status::Ok();
      case 'r': cp = '\r'; return Status::Ok();
      case 't': cp = '\t'; return Status::Ok();
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
      case '-':
      case '^':
      case '/': cp = static_cast<unsigned char>(e); return Status::Ok();
      case 'x': return parse_hex(start, 2, in_class, cp);
      case 'u': return parse_hex(start, 4, in_class, cp);
      case 'U': return parse_hex(start, 8, in_class, cp);
      default: break;
    }
    return error_at(start, "unknown escape '\\' followed by {}", shown_at(start + 1));
  }

  Status parse_hex(size_t start, int digits, bool in_class, uint32_t& cp) {
    uint64_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const int h = hex_value(peek());
      if (h < 0) return error_at(start, "escape needs {} hex digits, got {}", digits, shown_at(pos_));
      value = value * 16 + static_cast<uint64_t>(h);
      ++pos_;
    }
    if (value > kMaxCodePoint) return error_at(start, "code point 0x{:X} is beyond U+10FFFF", value);
    if (!in_class && value >= 0xD800 && value <= 0xDFFF) {
      return error_at(start, "U+{:04X} is a surrogate, which UTF-8 text cannot hold", value);
    }
    cp = static_cast<uint32_t>(value);
    return Status::Ok();
  }

  Status parse_literal(GrammarExpr& out) {
    const size_t open = pos_;
    ++pos_;
    std::vector<GrammarExpr> parts;
    while (true) {
      if (at_end() || peek() == '\n') return error_at(open, "unterminated string literal");
      if (peek() == '"') break;
      uint32_t cp = 0;
      TACHYON_RETURN_IF_ERROR(parse_char(cp, false));
      parts.push_back(GrammarExpr::code_point(cp));
    }
    ++pos_;
    out = parts.empty() ? GrammarExpr::empty() : GrammarExpr::sequence(std::move(parts));
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
      uint32_t first = 0;
      const size_t item = pos_;
      TACHYON_RETURN_IF_ERROR(parse_char(first, true));
      uint32_t last = first;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
        ++pos_;
        TACHYON_RETURN_IF_ERROR(parse_char(last, true));
        if (last < first) {
          return error_at(item, "range U+{:04X}-U+{:04X} in a character class is reversed", first, last);
        }
      }
      set.add(first, last);
    }
    ++pos_;
    out = GrammarExpr::chars(negated ? set.complement() : set);
    return Status::Ok();
  }

  std::string_view text_;
  GrammarBuilder& builder_;
  std::vector<size_t> line_starts_;  // byte offsets where each line begins
  size_t pos_ = 0;
};

}  // namespace

Status parse_gbnf_rules(std::string_view text, GrammarBuilder& builder) {
  GbnfParser parser(text, builder);
  return parser.parse();
}

Result<Grammar> parse_gbnf(std::string_view text, std::string_view root, GrammarLimits limits) {
  GrammarBuilder builder(limits);
  TACHYON_RETURN_IF_ERROR(parse_gbnf_rules(text, builder));
  return builder.build(root);
}

}  // namespace tachyon
