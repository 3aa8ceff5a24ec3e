// Python's str operations over UTF-8 bytes, for the chat-template interpreter: templates index,
// slice, strip, split and case-map strings, and Python counts code points, not bytes. Invalid
// UTF-8 never fails here: each invalid byte counts as one character and is kept as it is.
// Case mapping is Unicode's simple (one code point to one) mapping from utf8proc; Python's full
// mapping differs for a handful of characters ("ß".upper() is "SS" in Python, "ẞ" here).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tachyon::jinja::pystr {

// One character at byte `pos`: its code point (U+FFFD for an invalid byte) and byte length.
struct Char {
  char32_t code_point;
  size_t length;
};
Char char_at(std::string_view s, size_t pos);

// Number of characters.
size_t length(std::string_view s);
// Byte offset where each character starts, plus s.size() at the end.
std::vector<size_t> char_offsets(std::string_view s);
// The character at Python index `index` (negative from the end), or nullopt out of range.
std::optional<std::string> index(std::string_view s, int64_t index);
// s[start:stop:step] with Python's clamping; step != 0 (checked by the caller).
std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step);

// str.isspace() for one character (Unicode White_Space plus U+001C..U+001F).
bool is_space(char32_t code_point);

// str.strip/lstrip/rstrip: `chars` unset strips whitespace.
std::string strip(std::string_view s, std::optional<std::string_view> chars, bool left, bool right);
// str.split / str.rsplit; `separator` unset splits on whitespace runs; `separator` must not be
// empty; maxsplit < 0 means no limit.
std::vector<std::string> split(std::string_view s, std::optional<std::string_view> separator, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, std::optional<std::string_view> separator, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string swapcase(std::string_view s);
std::string capitalize(std::string_view s);
// str.title(): a letter after a cased letter is lowercased, any other letter title-cased.
std::string title(std::string_view s);
// jinja2's |title: words start after runs of whitespace, '-', '(', '{', '[' and '<'.
std::string jinja_title(std::string_view s);

// str.replace; `count` < 0 replaces all.
std::string replace(std::string_view s, std::string_view old_part, std::string_view new_part, int64_t count);
// str.find / str.rfind / str.count, in characters; -1 when absent.
int64_t find(std::string_view s, std::string_view part);
int64_t rfind(std::string_view s, std::string_view part);
int64_t count(std::string_view s, std::string_view part);

bool is_digit(std::string_view s);
bool is_alpha(std::string_view s);
bool is_alnum(std::string_view s);
bool is_all_space(std::string_view s);
bool is_lower(std::string_view s);
bool is_upper(std::string_view s);

// str.center / ljust / rjust / zfill, widths in characters; `fill` is one character.
std::string center(std::string_view s, int64_t width, std::string_view fill);
std::string ljust(std::string_view s, int64_t width, std::string_view fill);
std::string rjust(std::string_view s, int64_t width, std::string_view fill);
std::string zfill(std::string_view s, int64_t width);

// repr(s): quoted with ' (or " when s has ' but no "), escapes as Python writes them.
std::string repr(std::string_view s);
// markupsafe.escape: & < > " ' as entities.
std::string html_escape(std::string_view s);
// Number of \w+ runs (jinja2's |wordcount).
int64_t word_count(std::string_view s);
// Markup.striptags(): tags and comments removed, whitespace collapsed, entities unescaped.
std::string strip_tags(std::string_view s);

}  // namespace tachyon::jinja::pystr
