// Longest-match cutting of added tokens with a byte trie (see added_tokens.h).
#include "tokenizer/added_tokens.h"

#include "tokenizer/unicode.h"

namespace tachyon {

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  for (const auto& [b, next] : nodes_[static_cast<size_t>(node)].children) {
    if (b == byte) return next;
  }
  return -1;
}

void AddedTokenMatcher::build(const std::vector<AddedToken>& tokens) {
  tokens_.clear();
  nodes_.assign(1, Node{});
  first_byte_.fill(false);
  for (const AddedToken& token : tokens) {
    if (token.content.empty() || token.id < 0) continue;
    int32_t node = 0;
    for (char c : token.content) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        nodes_[static_cast<size_t>(node)].children.emplace_back(byte, next);
      }
      node = next;
    }
    if (nodes_[static_cast<size_t>(node)].token >= 0) continue;  // the first of two equal contents wins
    nodes_[static_cast<size_t>(node)].token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
    first_byte_[static_cast<uint8_t>(token.content[0])] = true;
  }
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special, std::vector<TextSegment>& out) const {
  size_t text_begin = 0;  // start of the text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t best = -1;
    size_t best_end = 0;
    int32_t node = 0;
    for (size_t k = pos; k < text.size(); ++k) {
      node = child(node, static_cast<uint8_t>(text[k]));
      if (node < 0) break;
      const int32_t t = nodes_[static_cast<size_t>(node)].token;
      if (t >= 0 && (parse_special || !tokens_[static_cast<size_t>(t)].special)) {
        best = t;
        best_end = k + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<size_t>(best)];
    size_t begin = pos, end = best_end;
    if (token.lstrip) {
      while (begin > text_begin) {
        const size_t start = previous_code_point_start(text, begin);
        size_t p = start;
        if (!is_unicode_white_space(next_code_point(text, p))) break;
        begin = start;
      }
    }
    if (token.rstrip) {
      while (end < text.size()) {
        size_t p = end;
        if (!is_unicode_white_space(next_code_point(text, p))) break;
        end = p;
      }
    }
    if (begin > text_begin) out.push_back(TextSegment{-1, text_begin, begin});
    out.push_back(TextSegment{token.id, begin, end});
    pos = text_begin = end;
  }
  if (text_begin < text.size()) out.push_back(TextSegment{-1, text_begin, text.size()});
}

}  // namespace tachyon
