// Text normalization applied to each segment of text (between added tokens) before
// pre-tokenization: the Hugging Face normalizers that BPE models use (Prepend, Replace, Unicode
// NFC/NFD/NFKC/NFKD via utf8proc, Lowercase, Strip) and SentencePiece's whitespace escaping
// expressed with them. Input and output are valid UTF-8.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace tachyon {

class Normalizer {
 public:
  enum class Form { kNfc, kNfd, kNfkc, kNfkd };

  void add_prepend(std::string prefix);  // only to non-empty text
  void add_replace(std::string from, std::string to);
  void add_replace_regex(std::shared_ptr<const Regex> regex, std::string to);
  void add_unicode(Form form);
  void add_lowercase();
  void add_strip(bool left, bool right);

  bool empty() const { return steps_.empty(); }
  std::string apply(std::string_view text) const;
  std::string describe() const;

 private:
  enum class Kind { kPrepend, kReplace, kReplaceRegex, kUnicode, kLowercase, kStrip };
  struct Step {
    Kind kind;
    std::string a;  // prefix, or the text to replace
    std::string b;  // replacement
    std::shared_ptr<const Regex> regex;
    Form form = Form::kNfc;
    bool left = false, right = false;
  };
  std::vector<Step> steps_;
};

}  // namespace tachyon
