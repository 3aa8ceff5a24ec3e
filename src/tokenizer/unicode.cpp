// UTF-8 validation and repair, code point helpers and the byte-level alphabet (see unicode.h).
#include "tokenizer/unicode.h"

namespace tachyon {

size_t utf8_lead_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 1;
}

size_t utf8_valid_sequence_length(std::string_view bytes, size_t* subpart, bool* incomplete) {
  auto fail = [&](size_t n, bool is_incomplete) -> size_t {
    if (subpart != nullptr) *subpart = n;
    if (incomplete != nullptr) *incomplete = is_incomplete;
    return 0;
  };
  if (bytes.empty()) return fail(0, true);
  const auto b0 = static_cast<uint8_t>(bytes[0]);
  if (b0 < 0x80) return 1;
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 == 0xE0) {
    need = 3, lo = 0xA0;
  } else if (b0 == 0xED) {
    need = 3, hi = 0x9F;  // excludes UTF-16 surrogates
  } else if (b0 >= 0xE1 && b0 <= 0xEF) {
    need = 3;
  } else if (b0 == 0xF0) {
    need = 4, lo = 0x90;  // excludes overlong forms
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 4;
  } else if (b0 == 0xF4) {
    need = 4, hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return fail(1, false);  // continuation byte, C0/C1 overlong lead, F5..FF
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= bytes.size()) return fail(i, true);
    const auto b = static_cast<uint8_t>(bytes[i]);
    const uint8_t l = (i == 1) ? lo : 0x80;
    const uint8_t h = (i == 1) ? hi : 0xBF;
    if (b < l || b > h) return fail(i, false);
  }
  return need;
}

bool is_valid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    // Fast path over ASCII.
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = utf8_valid_sequence_length(bytes.substr(pos));
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      out.push_back(bytes[pos++]);
      continue;
    }
    size_t subpart = 0;
    const size_t n = utf8_valid_sequence_length(bytes.substr(pos), &subpart);
    if (n > 0) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      out.append(kReplacementCharacter);
      pos += subpart;
    }
  }
  return out;
}

char32_t next_code_point(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  const size_t n = utf8_lead_length(b0);
  if (n == 1 || pos + n > s.size()) {
    ++pos;
    return b0;
  }
  char32_t cp = b0 & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3F);
  pos += n;
  return cp;
}

bool is_unicode_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

size_t previous_code_point_start(std::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
  return start;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    if (static_cast<uint8_t>(pending_[pos]) < 0x80) {
      out.push_back(pending_[pos++]);
      continue;
    }
    size_t subpart = 0;
    bool incomplete = false;
    const size_t n = utf8_valid_sequence_length(std::string_view(pending_).substr(pos), &subpart, &incomplete);
    if (n > 0) {
      out.append(pending_, pos, n);
      pos += n;
    } else if (incomplete) {
      break;  // wait for the rest of the sequence
    } else {
      out.append(kReplacementCharacter);
      pos += subpart;
    }
  }
  pending_.erase(0, pos);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

namespace {

// GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes are shifted
// to U+0100 and up in byte order.
std::array<char32_t, 256> make_byte_level_alphabet() {
  std::array<char32_t, 256> table{};
  auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) table[b] = printable(b) ? static_cast<char32_t>(b) : next++;
  return table;
}

}  // namespace

const std::array<char32_t, 256>& byte_level_alphabet() {
  static const std::array<char32_t, 256> table = make_byte_level_alphabet();
  return table;
}

std::string byte_level_encode(std::string_view raw) {
  const auto& table = byte_level_alphabet();
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) append_utf8(out, table[static_cast<uint8_t>(c)]);
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view spelled) {
  // Inverse table over the code points U+0000..U+01FF that the alphabet uses.
  static const std::array<int16_t, 0x200> inverse = [] {
    std::array<int16_t, 0x200> inv{};
    inv.fill(-1);
    const auto& table = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) inv[table[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  std::string out;
  out.reserve(spelled.size());
  size_t pos = 0;
  while (pos < spelled.size()) {
    const size_t n = utf8_valid_sequence_length(spelled.substr(pos));
    if (n == 0) return std::nullopt;
    const char32_t cp = next_code_point(spelled, pos);
    if (cp >= inverse.size() || inverse[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(inverse[cp]));
  }
  return out;
}

std::optional<uint8_t> parse_byte_token(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(piece[3]), lo = hex(piece[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

}  // namespace tachyon
