// UTF-8 helpers for the tokenizers: validation, replacement of invalid bytes with U+FFFD,
// code point iteration, and the GPT-2 byte-level alphabet (each byte 0..255 shown as one
// printable code point, e.g. ' ' -> 'Ġ'). Pure functions, no state.
//
// Invalid UTF-8 is replaced the way Python's bytes.decode("utf-8", errors="replace") and the
// Unicode standard's "maximal subpart" practice do: every maximal prefix of a would-be valid
// sequence that cannot be completed becomes one U+FFFD. The rule only ever looks at bytes up to
// the end of the subpart plus one, so it can be applied to a stream (see Utf8Stream).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/utf8.h"

namespace tachyon {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Length of the longest valid UTF-8 sequence at the start of `bytes` (1..4), or 0 when the first
// bytes are not a complete valid sequence. `*subpart` (optional) receives, in that case, the
// number of bytes forming the maximal invalid subpart (>= 1) or, when `bytes` ends in the middle
// of a sequence that is still valid so far, the number of bytes that sequence has so far;
// `*incomplete` tells the two apart.
size_t utf8_valid_sequence_length(std::string_view bytes, size_t* subpart = nullptr, bool* incomplete = nullptr);

bool is_valid_utf8(std::string_view bytes);

// `bytes` with every maximal invalid subpart replaced by U+FFFD.
std::string sanitize_utf8(std::string_view bytes);

// Decodes the code point at `bytes[pos]` of valid UTF-8 and advances `pos`.
char32_t next_code_point(std::string_view valid_utf8, size_t& pos);  // append_utf8: core/utf8.h
// Number of bytes of the UTF-8 sequence that starts with `lead` (1 for invalid leads).
size_t utf8_lead_length(uint8_t lead);

// Unicode's White_Space property.
bool is_unicode_white_space(char32_t code_point);
// Byte offset where the code point that ends at `end` begins (valid UTF-8, end > 0).
size_t previous_code_point_start(std::string_view valid_utf8, size_t end);

// Incremental sanitizer: bytes go in, complete valid UTF-8 comes out (with U+FFFD for invalid
// subparts as soon as they are known to be invalid); an incomplete tail waits for more bytes.
class Utf8Stream {
 public:
  // Appends `bytes` and returns what can be emitted now.
  std::string push(std::string_view bytes);
  // Everything left, an incomplete tail becoming one U+FFFD.
  std::string flush();
  bool has_pending() const { return !pending_.empty(); }

 private:
  std::string pending_;
};

// GPT-2's byte-level alphabet.
const std::array<char32_t, 256>& byte_level_alphabet();
// Maps raw bytes to their byte-level spelling ("hello world" -> "helloĠworld").
std::string byte_level_encode(std::string_view raw);
// Maps a byte-level spelling back to raw bytes; nullopt if some character is outside the
// alphabet (e.g. an added token written in plain text).
std::optional<std::string> byte_level_decode(std::string_view spelled);

// "<0x41>" -> 0x41; nullopt for anything else (exactly six characters, two hex digits).
std::optional<uint8_t> parse_byte_token(std::string_view piece);

}  // namespace tachyon
