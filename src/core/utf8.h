// Writing one code point as UTF-8: shared by the tokenizer and the grammar front ends, which
// each read UTF-8 their own way (the tokenizer trusts valid text; grammars refuse invalid input).
#pragma once

#include <cstdint>
#include <string>

namespace tachyon {

// Appends `code_point` (at most U+10FFFF; surrogates are written as they are) in 1-4 bytes.
inline void append_utf8(std::string& out, char32_t code_point) {
  const auto byte = [&](uint32_t b) { out.push_back(static_cast<char>(b)); };
  const uint32_t cp = code_point;
  if (cp < 0x80) {
    byte(cp);
  } else if (cp < 0x800) {
    byte(0xC0 | (cp >> 6));
    byte(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    byte(0xE0 | (cp >> 12));
    byte(0x80 | ((cp >> 6) & 0x3F));
    byte(0x80 | (cp & 0x3F));
  } else {
    byte(0xF0 | (cp >> 18));
    byte(0x80 | ((cp >> 12) & 0x3F));
    byte(0x80 | ((cp >> 6) & 0x3F));
    byte(0x80 | (cp & 0x3F));
  }
}

}  // namespace tachyon
