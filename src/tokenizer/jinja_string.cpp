#include "tokenizer/jinja_string.h"

#include <algorithm>

#include <fmt/format.h>
#include <utf8proc.h>

#include "tokenizer/unicode.h"

namespace tachyon::jinja::pystr {
namespace {

constexpr char32_t kInvalid = 0xFFFD;

bool is_cased(char32_t cp) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL || category == UTF8PROC_CATEGORY_LT;
}

bool is_letter(char32_t cp) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return category >= UTF8PROC_CATEGORY_LU && category <= UTF8PROC_CATEGORY_LO;
}

bool is_numeric(char32_t cp) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return category == UTF8PROC_CATEGORY_ND || category == UTF8PROC_CATEGORY_NL || category == UTF8PROC_CATEGORY_NO;
}

bool is_word_char(char32_t cp) { return cp == '_' || is_letter(cp) || is_numeric(cp); }

// Python's str.isprintable() for one character (repr() escapes the others).
bool is_printable(char32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool is_line_break(char32_t cp) {
  switch (cp) {
    case '\n': case '\r': case 0x0B: case 0x0C: case 0x1C: case 0x1D: case 0x1E: case 0x85: case 0x2028: case 0x2029:
      return true;
    default:
      return false;
  }
}

// Appends the character at `pos` mapped by `map`, keeping invalid bytes as they are.
template <typename Map>
void append_mapped(std::string& out, std::string_view s, size_t pos, const Char& ch, Map map) {
  if (ch.code_point == kInvalid && ch.length == 1) {
    out.push_back(s[pos]);
    return;
  }
  append_utf8(out, map(ch.code_point));
}

char32_t to_upper(char32_t cp) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))); }
char32_t to_lower(char32_t cp) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))); }
char32_t to_title(char32_t cp) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp))); }

template <typename Map>
std::string map_chars(std::string_view s, Map map) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const Char ch = char_at(s, pos);
    append_mapped(out, s, pos, ch, map);
    pos += ch.length;
  }
  return out;
}

// Characters of `chars` as code points (for strip's set).
std::vector<char32_t> code_points(std::string_view chars) {
  std::vector<char32_t> out;
  for (size_t pos = 0; pos < chars.size();) {
    const Char ch = char_at(chars, pos);
    out.push_back(ch.code_point);
    pos += ch.length;
  }
  return out;
}

int64_t char_index_of_offset(std::string_view s, size_t offset) {
  int64_t index = 0;
  for (size_t pos = 0; pos < offset;) {
    pos += char_at(s, pos).length;
    ++index;
  }
  return index;
}

std::string pad(std::string_view s, int64_t left, int64_t right, std::string_view fill) {
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < right; ++i) out += fill;
  return out;
}

}  // namespace

Char char_at(std::string_view s, size_t pos) {
  const size_t n = utf8_valid_sequence_length(s.substr(pos));
  if (n == 0) return {kInvalid, 1};
  size_t p = pos;
  return {next_code_point(s, p), n};
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (size_t pos = 0; pos < s.size();) {
    const auto byte = static_cast<unsigned char>(s[pos]);
    pos += byte < 0x80 ? 1 : char_at(s, pos).length;
    ++n;
  }
  return n;
}

std::vector<size_t> char_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t pos = 0; pos < s.size();) {
    offsets.push_back(pos);
    const auto byte = static_cast<unsigned char>(s[pos]);
    pos += byte < 0x80 ? 1 : char_at(s, pos).length;
  }
  offsets.push_back(s.size());
  return offsets;
}

std::optional<std::string> index(std::string_view s, int64_t i) {
  const std::vector<size_t> offsets = char_offsets(s);
  const auto n = static_cast<int64_t>(offsets.size()) - 1;
  if (i < 0) i += n;
  if (i < 0 || i >= n) return std::nullopt;
  return std::string(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
}

std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step) {
  const std::vector<size_t> offsets = char_offsets(s);
  const auto n = static_cast<int64_t>(offsets.size()) - 1;
  // Python's PySlice_AdjustIndices.
  auto clamp = [n, step](std::optional<int64_t> v, bool is_start) {
    if (!v) {
      if (step > 0) return is_start ? int64_t{0} : n;
      return is_start ? n - 1 : int64_t{-1};
    }
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t begin = clamp(start, true);
  const int64_t end = clamp(stop, false);
  std::string out;
  if (step == 1 && begin < end) return std::string(s.substr(offsets[begin], offsets[end] - offsets[begin]));
  for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) {
    out.append(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  return out;
}

bool is_space(char32_t cp) { return is_unicode_white_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

std::string strip(std::string_view s, std::optional<std::string_view> chars, bool left, bool right) {
  const std::vector<char32_t> set = chars ? code_points(*chars) : std::vector<char32_t>{};
  auto strippable = [&](char32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_space(cp);
  };
  size_t begin = 0;
  size_t end = s.size();
  if (left) {
    while (begin < end) {
      const Char ch = char_at(s, begin);
      if (!strippable(ch.code_point)) break;
      begin += ch.length;
    }
  }
  if (right) {
    const std::vector<size_t> offsets = char_offsets(s.substr(begin, end - begin));
    size_t i = offsets.size() - 1;
    while (i > 0) {
      const Char ch = char_at(s, begin + offsets[i - 1]);
      if (!strippable(ch.code_point)) break;
      --i;
    }
    end = begin + offsets[i];
  }
  return std::string(s.substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view s, std::optional<std::string_view> separator, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (separator) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t found = s.find(*separator, pos);
      if (found == std::string_view::npos) break;
      parts.emplace_back(s.substr(pos, found - pos));
      pos = found + separator->size();
    }
    parts.emplace_back(s.substr(pos));
    return parts;
  }
  size_t pos = 0;
  while (true) {
    while (pos < s.size()) {  // skip whitespace
      const Char ch = char_at(s, pos);
      if (!is_space(ch.code_point)) break;
      pos += ch.length;
    }
    if (pos >= s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      // The rest, with trailing whitespace kept, as Python does.
      parts.emplace_back(s.substr(pos));
      break;
    }
    const size_t start = pos;
    while (pos < s.size()) {
      const Char ch = char_at(s, pos);
      if (is_space(ch.code_point)) break;
      pos += ch.length;
    }
    parts.emplace_back(s.substr(start, pos - start));
  }
  return parts;
}

std::vector<std::string> rsplit(std::string_view s, std::optional<std::string_view> separator, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (separator) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < separator->size()) break;
      const size_t found = s.rfind(*separator, end - separator->size());
      if (found == std::string_view::npos) break;
      parts.emplace_back(s.substr(found + separator->size(), end - found - separator->size()));
      end = found;
    }
    parts.emplace_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  // Whitespace: split the reversed character sequence, as CPython's rsplit does.
  const std::vector<size_t> offsets = char_offsets(s);
  auto space_at = [&](size_t i) { return is_space(char_at(s, offsets[i]).code_point); };
  size_t i = offsets.size() - 1;  // characters [0, i) remain
  while (true) {
    while (i > 0 && space_at(i - 1)) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.emplace_back(s.substr(0, offsets[i]));
      break;
    }
    const size_t end = i;
    while (i > 0 && !space_at(i - 1)) --i;
    parts.emplace_back(s.substr(offsets[i], offsets[end] - offsets[i]));
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> splitlines(std::string_view s) {
  std::vector<std::string> lines;
  size_t start = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    const Char ch = char_at(s, pos);
    if (is_line_break(ch.code_point)) {
      lines.emplace_back(s.substr(start, pos - start));
      pos += ch.length;
      if (ch.code_point == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
      start = pos;
    } else {
      pos += ch.length;
    }
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

std::string upper(std::string_view s) { return map_chars(s, to_upper); }
std::string lower(std::string_view s) { return map_chars(s, to_lower); }

std::string swapcase(std::string_view s) {
  return map_chars(s, [](char32_t cp) {
    const char32_t up = to_upper(cp);
    return up != cp ? up : to_lower(cp);
  });
}

std::string capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool first = true;
  for (size_t pos = 0; pos < s.size();) {
    const Char ch = char_at(s, pos);
    append_mapped(out, s, pos, ch, first ? to_title : to_lower);
    first = false;
    pos += ch.length;
  }
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const Char ch = char_at(s, pos);
    append_mapped(out, s, pos, ch, previous_cased ? to_lower : to_title);
    previous_cased = is_cased(ch.code_point);
    pos += ch.length;
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool word_start = true;
  for (size_t pos = 0; pos < s.size();) {
    const Char ch = char_at(s, pos);
    const char32_t cp = ch.code_point;
    const bool boundary = is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (boundary) {
      // A separator run is an item of its own: its first character is upper-cased (a no-op for
      // these), the rest lower-cased (also a no-op).
      out.append(s.substr(pos, ch.length));
      word_start = true;
    } else {
      append_mapped(out, s, pos, ch, word_start ? to_upper : to_lower);
      word_start = false;
    }
    pos += ch.length;
  }
  return out;
}

std::string replace(std::string_view s, std::string_view old_part, std::string_view new_part, int64_t count) {
  std::string out;
  if (old_part.empty()) {
    // Python inserts `new_part` before every character and at the end, up to `count` times.
    const std::vector<size_t> offsets = char_offsets(s);
    int64_t done = 0;
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_part;
        ++done;
      }
      out.append(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
    }
    if (count < 0 || done < count) out += new_part;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t found = s.find(old_part, pos);
    if (found == std::string_view::npos) break;
    out.append(s.substr(pos, found - pos));
    out.append(new_part);
    pos = found + old_part.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t find(std::string_view s, std::string_view part) {
  const size_t found = s.find(part);
  return found == std::string_view::npos ? -1 : char_index_of_offset(s, found);
}

int64_t rfind(std::string_view s, std::string_view part) {
  const size_t found = s.rfind(part);
  return found == std::string_view::npos ? -1 : char_index_of_offset(s, found);
}

int64_t count(std::string_view s, std::string_view part) {
  if (part.empty()) return static_cast<int64_t>(length(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(part); pos != std::string_view::npos; pos = s.find(part, pos + part.size())) ++n;
  return n;
}

namespace {
template <typename Predicate>
bool all_chars(std::string_view s, Predicate predicate) {
  if (s.empty()) return false;
  for (size_t pos = 0; pos < s.size();) {
    const Char ch = char_at(s, pos);
    if (!predicate(ch.code_point)) return false;
    pos += ch.length;
  }
  return true;
}

// islower/isupper: at least one cased character and all cased characters of the wanted case.
template <typename WrongCase>
bool cased_all(std::string_view s, WrongCase wrong_case) {
  bool any_cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const Char ch = char_at(s, pos);
    if (is_cased(ch.code_point)) {
      if (wrong_case(ch.code_point)) return false;
      any_cased = true;
    }
    pos += ch.length;
  }
  return any_cased;
}
}  // namespace

bool is_digit(std::string_view s) {
  return all_chars(s, [](char32_t cp) {
    return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_ND;
  });
}
bool is_alpha(std::string_view s) { return all_chars(s, is_letter); }
bool is_alnum(std::string_view s) { return all_chars(s, [](char32_t cp) { return is_letter(cp) || is_numeric(cp); }); }
bool is_all_space(std::string_view s) { return all_chars(s, is_space); }
bool is_lower(std::string_view s) {
  return cased_all(s, [](char32_t cp) { return to_lower(cp) != cp; });
}
bool is_upper(std::string_view s) {
  return cased_all(s, [](char32_t cp) { return to_upper(cp) != cp; });
}

std::string center(std::string_view s, int64_t width, std::string_view fill) {
  const auto n = static_cast<int64_t>(length(s));
  if (width <= n) return std::string(s);
  const int64_t margin = width - n;
  const int64_t left = margin / 2 + (margin & width & 1);
  return pad(s, left, margin - left, fill);
}

std::string ljust(std::string_view s, int64_t width, std::string_view fill) {
  const auto n = static_cast<int64_t>(length(s));
  return width <= n ? std::string(s) : pad(s, 0, width - n, fill);
}

std::string rjust(std::string_view s, int64_t width, std::string_view fill) {
  const auto n = static_cast<int64_t>(length(s));
  return width <= n ? std::string(s) : pad(s, width - n, 0, fill);
}

std::string zfill(std::string_view s, int64_t width) {
  const auto n = static_cast<int64_t>(length(s));
  if (width <= n) return std::string(s);
  std::string out;
  size_t rest = 0;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    out.push_back(s[0]);
    rest = 1;
  }
  out.append(static_cast<size_t>(width - n), '0');
  out.append(s.substr(rest));
  return out;
}

std::string repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t pos = 0; pos < s.size();) {
    const Char ch = char_at(s, pos);
    const char32_t cp = ch.code_point;
    if (ch.code_point == kInvalid && ch.length == 1) {
      // Not representable in Python (its strings hold code points); shown as the byte.
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(s[pos]));
    } else if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else if (cp < 0x7F || is_printable(cp)) {
      out.append(s.substr(pos, ch.length));
    } else if (cp <= 0xFF) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else if (cp <= 0xFFFF) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<unsigned>(cp));
    }
    pos += ch.length;
  }
  out.push_back(quote);
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

int64_t word_count(std::string_view s) {
  int64_t n = 0;
  bool in_word = false;
  for (size_t pos = 0; pos < s.size();) {
    const Char ch = char_at(s, pos);
    const bool word = is_word_char(ch.code_point);
    if (word && !in_word) ++n;
    in_word = word;
    pos += ch.length;
  }
  return n;
}

std::string strip_tags(std::string_view s) {
  // Drop comments and tags.
  std::string text;
  for (size_t pos = 0; pos < s.size();) {
    if (s.compare(pos, 4, "<!--") == 0) {
      const size_t end = s.find("-->", pos + 4);
      if (end != std::string_view::npos) {
        pos = end + 3;
        continue;
      }
    }
    if (s[pos] == '<') {
      const size_t end = s.find('>', pos + 1);
      if (end != std::string_view::npos) {
        pos = end + 1;
        continue;
      }
    }
    text.push_back(s[pos++]);
  }
  // Collapse whitespace, then unescape the entities markupsafe knows best.
  std::string collapsed;
  for (const std::string& word : split(text, std::nullopt, -1)) {
    if (!collapsed.empty()) collapsed.push_back(' ');
    collapsed += word;
  }
  static const std::pair<std::string_view, std::string_view> kEntities[] = {
      {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#34;", "\""}, {"&#39;", "'"}, {"&nbsp;", "\xC2\xA0"}};
  std::string out;
  for (size_t pos = 0; pos < collapsed.size();) {
    bool matched = false;
    if (collapsed[pos] == '&') {
      for (const auto& [entity, replacement] : kEntities) {
        if (collapsed.compare(pos, entity.size(), entity) == 0) {
          out += replacement;
          pos += entity.size();
          matched = true;
          break;
        }
      }
    }
    if (!matched) out.push_back(collapsed[pos++]);
  }
  return out;
}

}  // namespace tachyon::jinja::pystr
