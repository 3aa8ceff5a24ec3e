#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cmath>

#include "tokenizer/jinja_string.h"
#include "tokenizer/unicode.h"

namespace tachyon::jinja {
namespace {

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  // keep_trailing_newline=False: one final newline goes.
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize_newlines(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t tag = find_tag_start(pos);
      if (tag == std::string_view::npos) {
        emit_text(pos, src_.substr(pos));
        break;
      }
      const char kind = src_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      const size_t raw_end = kind == '%' ? match_raw_begin(after) : std::string_view::npos;
      // A raw begin is a block tag for lstrip purposes; variables never lstrip.
      emit_text(pos, strip_before_tag(std::string_view(src_).substr(pos, tag - pos), sign, kind != '{', line_starting));

      if (kind == '#') {
        TACHYON_ASSIGN_OR_RETURN(const size_t end, comment_end(tag, after));
        line_starting = src_[end - 1] == '\n';
        pos = end;
      } else if (raw_end != std::string_view::npos) {
        line_starting = src_[raw_end - 1] == '\n';
        TACHYON_ASSIGN_OR_RETURN(pos, raw_body(tag, raw_end, line_starting));
      } else {
        TACHYON_ASSIGN_OR_RETURN(const size_t end, tag_tokens(tag, after, kind == '{'));
        line_starting = src_[end - 1] == '\n';
        pos = end;
      }
    }
    Token end;
    end.kind = TokenKind::kEnd;
    set_position(end, src_.size());
    tokens_.push_back(std::move(end));
    return std::move(tokens_);
  }

 private:
  // ------------------------------------------------------------------------------------------
  // Positions and errors

  void set_position(Token& token, size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());  // 1-based
    token.line = static_cast<int>(line);
    token.column = static_cast<int>(offset - line_starts_[line - 1]) + 1;
  }

  Status error_at(size_t offset, const std::string& message) const {
    Token t;
    set_position(t, offset);
    return make_error(ErrorCode::kInvalidArgument, "syntax error at line {}, column {}: {}", t.line, t.column, message);
  }

  // ------------------------------------------------------------------------------------------
  // Template data

  size_t find_tag_start(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string_view::npos;
  }

  size_t skip_space(size_t pos) const {
    size_t n = 0;
    while (pos < src_.size() && is_python_space_at(src_, pos, &n)) pos += n;
    return pos;
  }

  // "{%-" strips all whitespace before the tag; otherwise lstrip_blocks strips spaces between the
  // start of the line and a block or comment tag (unless "{%+").
  std::string_view strip_before_tag(std::string_view text, char sign, bool block_or_comment, bool line_starting) const {
    if (sign == '-') {
      size_t end = text.size();
      while (end > 0) {
        const size_t start = previous_start(text, end);
        size_t n = 0;
        if (!is_python_space_at(text, start, &n)) break;
        end = start;
      }
      return text.substr(0, end);
    }
    if (sign == '+' || !block_or_comment) return text;
    const size_t newline = text.rfind('\n');
    const size_t line_begin = newline == std::string_view::npos ? 0 : newline + 1;
    if (line_begin == 0 && !line_starting) return text;
    if (line_begin == text.size()) return text;
    for (size_t p = line_begin; p < text.size();) {
      size_t n = 0;
      if (!is_python_space_at(text, p, &n)) return text;
      p += n;
    }
    return text.substr(0, line_begin);
  }

  static size_t previous_start(std::string_view text, size_t end) {
    size_t start = end - 1;
    // Step back over continuation bytes to the start of a (possibly invalid) sequence.
    while (start > 0 && end - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    if (pystr::char_at(text, start).length != end - start) return end - 1;
    return start;
  }

  void emit_text(size_t offset, std::string_view text) {
    if (text.empty()) return;
    Token t;
    t.kind = TokenKind::kText;
    t.text = std::string(text);
    set_position(t, offset);
    tokens_.push_back(std::move(t));
  }

  // ------------------------------------------------------------------------------------------
  // Comments and raw blocks

  // End of the comment that starts at `tag`, after its closing marker and what that consumes.
  Result<size_t> comment_end(size_t tag, size_t content) const {
    const size_t close = src_.find("#}", content);
    if (close == std::string::npos) return error_at(tag, "missing end of comment tag");
    size_t end = close + 2;
    const char before = close > content ? src_[close - 1] : 0;
    if (before == '-') {
      end = skip_space(end);
    } else if (before != '+' && end < src_.size() && src_[end] == '\n') {
      ++end;  // trim_blocks
    }
    return end;
  }

  // If a "{% raw %}" tag starts at `after` (just past "{%" and its sign), where it ends.
  size_t match_raw_begin(size_t after) const {
    size_t p = skip_space(after);
    if (src_.compare(p, 3, "raw") != 0) return std::string_view::npos;
    p = skip_space(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_space(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string_view::npos;
  }

  // Emits the raw body as text and returns where "{% endraw %}" ends.
  Result<size_t> raw_body(size_t tag, size_t body, bool line_starting) {
    for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_space(q);
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q = skip_space(q + 6);
      size_t end;
      if (src_.compare(q, 3, "+%}") == 0) {
        end = q + 3;
      } else if (src_.compare(q, 3, "-%}") == 0) {
        end = skip_space(q + 3);
      } else if (src_.compare(q, 2, "%}") == 0) {
        end = q + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      emit_text(body, strip_before_tag(std::string_view(src_).substr(body, p - body), sign, true, line_starting));
      return end;
    }
    return error_at(tag, "missing end of raw directive");
  }

  // ------------------------------------------------------------------------------------------
  // Expressions inside {{ }} and {% %}

  Result<size_t> tag_tokens(size_t tag, size_t pos, bool variable) {
    push(variable ? TokenKind::kVariableBegin : TokenKind::kBlockBegin, tag, variable ? "{{" : "{%");
    std::vector<char> brackets;  // expected closers
    while (true) {
      if (brackets.empty()) {
        if (variable) {
          if (src_.compare(pos, 3, "-}}") == 0) return end_tag(TokenKind::kVariableEnd, pos, skip_space(pos + 3));
          if (src_.compare(pos, 2, "}}") == 0) return end_tag(TokenKind::kVariableEnd, pos, pos + 2);
        } else {
          if (src_.compare(pos, 3, "+%}") == 0) return end_tag(TokenKind::kBlockEnd, pos, pos + 3);
          if (src_.compare(pos, 3, "-%}") == 0) return end_tag(TokenKind::kBlockEnd, pos, skip_space(pos + 3));
          if (src_.compare(pos, 2, "%}") == 0) {
            const size_t end = pos + 2 < src_.size() && src_[pos + 2] == '\n' ? pos + 3 : pos + 2;  // trim_blocks
            return end_tag(TokenKind::kBlockEnd, pos, end);
          }
        }
      }
      if (pos >= src_.size()) {
        return error_at(tag, variable ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      }
      size_t n = 0;
      if (is_python_space_at(src_, pos, &n)) {
        pos = skip_space(pos);
        continue;
      }
      const char c = src_[pos];
      if (is_digit(c)) {
        TACHYON_ASSIGN_OR_RETURN(pos, number(pos));
      } else if (is_name_start(c)) {
        const size_t start = pos;
        while (pos < src_.size() && is_name_char(src_[pos])) ++pos;
        push(TokenKind::kName, start, src_.substr(start, pos - start));
      } else if (c == '\'' || c == '"') {
        TACHYON_ASSIGN_OR_RETURN(pos, string_literal(pos));
      } else {
        TACHYON_ASSIGN_OR_RETURN(pos, operator_token(pos, brackets));
      }
    }
  }

  size_t end_tag(TokenKind kind, size_t at, size_t end) {
    push(kind, at, kind == TokenKind::kVariableEnd ? "}}" : "%}");
    return end;
  }

  void push(TokenKind kind, size_t offset, std::string text) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    set_position(t, offset);
    tokens_.push_back(std::move(t));
  }

  // (\d+_)*\d+ at `pos`: end, or npos.
  size_t digits(size_t pos) const {
    if (pos >= src_.size() || !is_digit(src_[pos])) return std::string_view::npos;
    while (true) {
      while (pos < src_.size() && is_digit(src_[pos])) ++pos;
      if (pos + 1 < src_.size() && src_[pos] == '_' && is_digit(src_[pos + 1])) {
        ++pos;
        continue;
      }
      return pos;
    }
  }

  static std::string without_underscores(std::string_view s) {
    std::string out;
    for (const char c : s) {
      if (c != '_') out.push_back(c);
    }
    return out;
  }

  Result<size_t> number(size_t start) {
    // Floats first, as jinja2 tries them: digits, then a fraction and/or an exponent; not right
    // after a '.', so that "a.0.1" stays attribute access.
    const size_t whole = digits(start);
    auto exponent_end = [&](size_t p) -> size_t {
      if (p >= src_.size() || (src_[p] != 'e' && src_[p] != 'E')) return std::string_view::npos;
      ++p;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      return digits(p);
    };
    size_t float_end = std::string_view::npos;
    if (start == 0 || src_[start - 1] != '.') {
      const size_t fraction = src_.compare(whole, 1, ".") == 0 ? digits(whole + 1) : std::string_view::npos;
      if (fraction != std::string_view::npos && exponent_end(fraction) != std::string_view::npos) {
        float_end = exponent_end(fraction);
      } else if (exponent_end(whole) != std::string_view::npos) {
        float_end = exponent_end(whole);
      } else {
        float_end = fraction;
      }
    }
    if (float_end != std::string_view::npos) {
      Token t;
      t.kind = TokenKind::kFloat;
      t.text = src_.substr(start, float_end - start);
      t.number = std::strtod(without_underscores(t.text).c_str(), nullptr);
      set_position(t, start);
      tokens_.push_back(std::move(t));
      return float_end;
    }
    // Integers: 0b/0o/0x prefixes, [1-9](_?\d)*, or 0(_?0)*.
    int base = 10;
    size_t p = start;
    auto in_base = [&](char c) {
      const char l = static_cast<char>(c | 0x20);
      if (base == 2) return c == '0' || c == '1';
      if (base == 8) return c >= '0' && c <= '7';
      if (base == 16) return is_digit(c) || (l >= 'a' && l <= 'f');
      return is_digit(c);
    };
    std::string digits_only;
    const char prefix_char = p + 1 < src_.size() ? static_cast<char>(src_[p + 1] | 0x20) : 0;
    if (src_[p] == '0' && (prefix_char == 'b' || prefix_char == 'o' || prefix_char == 'x')) {
      base = prefix_char == 'b' ? 2 : (prefix_char == 'o' ? 8 : 16);
      size_t q = p + 2;
      while (true) {
        size_t r = q;
        if (r < src_.size() && src_[r] == '_') ++r;
        if (r < src_.size() && in_base(src_[r])) {
          digits_only.push_back(src_[r]);
          q = r + 1;
        } else {
          break;
        }
      }
      if (digits_only.empty()) {
        base = 10;  // just "0", then a name
        p = start + 1;
        digits_only = "0";
      } else {
        p = q;
      }
    } else if (src_[p] == '0') {
      // 0(_?0)*
      p = start + 1;
      while (true) {
        size_t r = p;
        if (r < src_.size() && src_[r] == '_') ++r;
        if (r < src_.size() && src_[r] == '0') {
          p = r + 1;
        } else {
          break;
        }
      }
      digits_only = "0";
    } else {
      while (true) {
        size_t r = p;
        if (r > start && r < src_.size() && src_[r] == '_') ++r;
        if (r < src_.size() && is_digit(src_[r])) {
          digits_only.push_back(src_[r]);
          p = r + 1;
        } else {
          break;
        }
      }
    }
    Token t;
    t.kind = TokenKind::kInteger;
    t.text = src_.substr(start, p - start);
    set_position(t, start);
    uint64_t value = 0;
    for (const char c : digits_only) {
      const int d = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
      if (value > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) {
        return error_at(start, "integer literal " + t.text + " does not fit in 64 bits");
      }
      value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    }
    t.integer = static_cast<int64_t>(value);
    tokens_.push_back(std::move(t));
    return p;
  }

  static int hex_value(char c) {
    if (is_digit(c)) return c - '0';
    const char l = static_cast<char>(c | 0x20);
    return l >= 'a' && l <= 'f' ? l - 'a' + 10 : -1;
  }

  // A quoted string with Python's escapes (jinja2 decodes literals with "unicode-escape").
  Result<size_t> string_literal(size_t start) {
    const char quote = src_[start];
    size_t p = start + 1;
    while (p < src_.size() && src_[p] != quote) {
      if (src_[p] == '\\' && p + 1 < src_.size()) ++p;
      ++p;
    }
    if (p >= src_.size()) return error_at(start, fmt::format("unexpected char {}", quote == '\'' ? "\"'\"" : "'\"'"));
    const std::string_view body = std::string_view(src_).substr(start + 1, p - start - 1);
    std::string value;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] != '\\' || i + 1 >= body.size()) {
        value.push_back(body[i]);
        continue;
      }
      const char e = body[++i];
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case 'a': value.push_back('\a'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'n': value.push_back('\n'); break;
        case 'r': value.push_back('\r'); break;
        case 't': value.push_back('\t'); break;
        case 'v': value.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t width = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          uint32_t cp = 0;
          for (size_t k = 0; k < width; ++k) {
            const int h = i + 1 + k < body.size() ? hex_value(body[i + 1 + k]) : -1;
            if (h < 0) return error_at(start, fmt::format("truncated \\{} escape in string literal", e));
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          if (cp > 0x10FFFF) return error_at(start, "illegal Unicode character in string literal");
          append_utf8(value, static_cast<char32_t>(cp));
          i += width;
          break;
        }
        case 'N':
          return error_at(start, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
            }
            append_utf8(value, static_cast<char32_t>(cp));
          } else {
            value.push_back('\\');  // unknown escapes stay as written
            value.push_back(e);
          }
      }
    }
    Token t;
    t.kind = TokenKind::kString;
    t.text = std::move(value);
    set_position(t, start);
    tokens_.push_back(std::move(t));
    return p + 1;
  }

  Result<size_t> operator_token(size_t pos, std::vector<char>& brackets) {
    static constexpr std::string_view kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const std::string_view op : kTwoChar) {
      if (src_.compare(pos, 2, op) == 0) {
        push(TokenKind::kOperator, pos, std::string(op));
        return pos + 2;
      }
    }
    const char c = src_[pos];
    static constexpr std::string_view kOneChar = "+-/*%~[](){}><=.:|,;";
    if (kOneChar.find(c) == std::string_view::npos) {
      const size_t n = pystr::char_at(src_, pos).length;
      return error_at(pos, "unexpected char " + pystr::repr(src_.substr(pos, n)));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) return error_at(pos, fmt::format("unexpected '{}'", c));
      if (brackets.back() != c) return error_at(pos, fmt::format("unexpected '{}', expected '{}'", c, brackets.back()));
      brackets.pop_back();
    }
    push(TokenKind::kOperator, pos, std::string(1, c));
    return pos + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

bool is_python_space_at(std::string_view s, size_t pos, size_t* length) {
  const auto byte = static_cast<unsigned char>(s[pos]);
  if (byte < 0x80) {
    *length = 1;
    return byte == ' ' || (byte >= 0x09 && byte <= 0x0D) || (byte >= 0x1C && byte <= 0x1F);
  }
  const pystr::Char ch = pystr::char_at(s, pos);
  *length = ch.length;
  return pystr::is_space(ch.code_point);
}

Result<std::vector<Token>> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace tachyon::jinja
