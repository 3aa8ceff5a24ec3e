// Streaming detokenization (see detokenizer.h).
#include "tokenizer/detokenizer.h"

namespace tachyon {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, DetokenizerOptions options)
    : tokenizer_(&tokenizer), options_(options) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (id < 0 || id >= tokenizer_->vocab_size()) return {};
  if (options_.skip_special && tokenizer_->is_special(id)) return {};
  std::string piece = tokenizer_->token_to_piece(id);
  if (piece.empty()) return {};
  if (at_start_) {
    at_start_ = false;
    if (tokenizer_->strips_leading_space() && piece[0] == ' ') piece.erase(0, 1);
  }
  return stream_.push(piece);
}

std::string IncrementalDetokenizer::flush() { return stream_.flush(); }

void IncrementalDetokenizer::reset() {
  stream_ = Utf8Stream();
  at_start_ = true;
}

}  // namespace tachyon
