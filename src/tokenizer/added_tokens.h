// Added tokens (specials such as <|im_start|>, and user-defined pieces) are cut out of the text
// before normalization and BPE: at each position the longest token that starts there wins,
// scanning left to right. Special (control) tokens are only recognized when the caller asks
// for it (parse_special); non-special added tokens always are, as in Hugging Face tokenizers and
// llama.cpp. lstrip/rstrip tokens swallow the white space beside them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tachyon {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = true;
  bool lstrip = false;
  bool rstrip = false;
};

// A piece of the input: either text [begin, end) or one added token.
struct TextSegment {
  int32_t token = -1;  // >= 0: an added token's id
  size_t begin = 0;
  size_t end = 0;
};

class AddedTokenMatcher {
 public:
  void build(const std::vector<AddedToken>& tokens);
  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Splits `text` into segments, in order, covering it without gaps (except white space an
  // lstrip/rstrip token swallowed). Text segments are never empty.
  void split(std::string_view text, bool parse_special, std::vector<TextSegment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node
    int32_t token = -1;                                  // index into tokens_
  };
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace tachyon
