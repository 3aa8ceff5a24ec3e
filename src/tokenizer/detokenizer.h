// Streaming detokenization: token ids go in one at a time, complete UTF-8 text comes out.
// A character split across tokens (byte-level pieces, <0xXX> byte-fallback tokens) is held back
// until it is complete; a sequence that can no longer become valid is emitted as U+FFFD at once.
// The concatenation of everything push() and flush() return equals Tokenizer::decode() of all
// the ids, including SentencePiece's dropping of one leading space, and no returned chunk is
// ever invalid UTF-8.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tachyon {

struct DetokenizerOptions {
  bool skip_special = false;  // leave out control and unknown tokens, as decode(ids, true)
};

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, DetokenizerOptions options = {});

  // The text that `id` completes (often empty or one character's worth).
  std::string push(int32_t id);
  // What is left at the end; an incomplete trailing sequence becomes U+FFFD.
  std::string flush();
  // Starts a new, independent stream.
  void reset();
  bool has_pending() const { return stream_.has_pending(); }

 private:
  const Tokenizer* tokenizer_;
  DetokenizerOptions options_;
  Utf8Stream stream_;
  bool at_start_ = true;  // no byte seen yet: a leading space may still need dropping
};

}  // namespace tachyon
