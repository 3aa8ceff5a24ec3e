// Tokenizer assembly, encode and decode (see tokenizer.h). Format-specific loading is elsewhere.
#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/log.h"
#include "tokenizer/unicode.h"

namespace tachyon {

const char* tokenizer_kind_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::kByteLevelBpe: return "byte-level BPE";
    case TokenizerKind::kSentencePieceBpe: return "SentencePiece BPE";
  }
  return "unknown";
}

namespace {

// Specials that end a turn or a document in the chat models we load; the engine stops on any.
constexpr std::string_view kEndOfGenerationTokens[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>", "</s>", "<end_of_turn>",
};

}  // namespace

struct Tokenizer::EncodeScratch {
  BpeScratch bpe;
  std::vector<TextSegment> segments;
  std::vector<ByteSpan> spans;
};

Result<std::unique_ptr<Tokenizer>> Tokenizer::assemble(TokenizerParts parts) {
  size_t vocab_size = std::max(parts.model.pieces.size(), parts.token_bytes.size());
  for (const AddedToken& token : parts.added_tokens) {
    if (token.id < 0) {
      return make_error(ErrorCode::kCorruptFile, "{}: added token '{}' has a negative id {}", parts.source,
                        token.content, token.id);
    }
    vocab_size = std::max(vocab_size, static_cast<size_t>(token.id) + 1);
  }
  if (vocab_size == 0) return make_error(ErrorCode::kCorruptFile, "{}: the vocabulary is empty", parts.source);
  const size_t pieces = static_cast<size_t>(std::count_if(parts.model.pieces.begin(), parts.model.pieces.end(),
                                                          [](const std::string& p) { return !p.empty(); }));
  const size_t defined = parts.added_tokens.size() + std::max(pieces, parts.token_bytes.size());
  if (vocab_size > max_token_id_bound(defined)) {
    return make_error(ErrorCode::kCorruptFile,
                      "{}: token id {} is far beyond the {} tokens defined (ids must stay below {})", parts.source,
                      vocab_size - 1, defined, max_token_id_bound(defined));
  }
  if (vocab_size > static_cast<size_t>(INT32_MAX)) {
    return make_error(ErrorCode::kCorruptFile, "{}: vocabulary of {} entries is too large", parts.source, vocab_size);
  }

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->token_bytes_ = std::move(parts.token_bytes);
  tok->token_types_ = std::move(parts.token_types);
  const size_t known_types = tok->token_types_.size();
  tok->token_bytes_.resize(vocab_size);
  tok->token_types_.resize(vocab_size, TokenType::kUnused);
  for (size_t id = 0; id < parts.model.pieces.size(); ++id) {
    if (parts.model.pieces[id].empty()) continue;
    if (id >= known_types) tok->token_types_[id] = TokenType::kNormal;
    if (tok->token_bytes_[id].empty()) tok->token_bytes_[id] = parts.model.pieces[id];
  }
  for (const AddedToken& token : parts.added_tokens) {
    const auto id = static_cast<size_t>(token.id);
    tok->token_bytes_[id] = token.content;
    TokenType& type = tok->token_types_[id];
    if (!(token.special && type == TokenType::kUnknown)) {  // an unknown token stays one
      type = token.special ? TokenType::kControl : TokenType::kUserDefined;
    }
    tok->added_index_.emplace(token.content, token.id);
  }
  auto check_id = [&](int32_t id, const char* what) -> Status {
    if (id < -1 || id >= static_cast<int32_t>(vocab_size)) {
      return make_error(ErrorCode::kCorruptFile, "{}: {} id {} is outside the vocabulary (size {})", parts.source,
                        what, id, vocab_size);
    }
    return Status::Ok();
  };
  TACHYON_RETURN_IF_ERROR(check_id(parts.bos_id, "BOS"));
  for (int32_t id : parts.eos_ids) TACHYON_RETURN_IF_ERROR(check_id(id, "EOS"));

  tok->eos_ids_.clear();
  for (int32_t id : parts.eos_ids) {
    if (id >= 0 && std::find(tok->eos_ids_.begin(), tok->eos_ids_.end(), id) == tok->eos_ids_.end()) {
      tok->eos_ids_.push_back(id);
    }
  }
  for (std::string_view text : kEndOfGenerationTokens) {
    const auto it = tok->added_index_.find(text);
    if (it == tok->added_index_.end() || tok->token_types_[static_cast<size_t>(it->second)] != TokenType::kControl) {
      continue;
    }
    if (std::find(tok->eos_ids_.begin(), tok->eos_ids_.end(), it->second) == tok->eos_ids_.end()) {
      tok->eos_ids_.push_back(it->second);
    }
  }

  if (parts.kind == TokenizerKind::kSentencePieceBpe) {
    // SentencePiece models merge a whole segment as one word; cut it where no merge can reach.
    parts.model.find_word_boundaries({"\xE2\x96\x81", " "});
  }
  tok->kind_ = parts.kind;
  tok->source_ = std::move(parts.source);
  tok->model_ = std::move(parts.model);
  tok->normalizer_ = std::move(parts.normalizer);
  tok->pre_tokenizer_ = std::move(parts.pre_tokenizer);
  tok->added_.build(parts.added_tokens);
  tok->byte_level_spelling_ = parts.byte_level_spelling;
  tok->bos_id_ = parts.bos_id;
  tok->add_bos_ = parts.add_bos && parts.bos_id >= 0;
  tok->add_eos_ = parts.add_eos && !tok->eos_ids_.empty();
  tok->strip_leading_space_ = parts.strip_leading_space;
  tok->chat_template_ = std::move(parts.chat_template);
  TACHYON_LOG_INFO("tokenizer: {}", tok->describe());
  return tok;
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, const EncodeOptions& options) const {
  std::string repaired;
  std::string_view text = input;
  if (!is_valid_utf8(input)) {
    repaired = sanitize_utf8(input);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (options.add_bos.value_or(add_bos_) && bos_id_ >= 0) ids.push_back(bos_id_);

  EncodeScratch scratch;
  if (added_.empty()) {
    if (!text.empty()) encode_segment(text, true, ids, scratch);
  } else {
    added_.split(text, options.parse_special, scratch.segments);
    const std::vector<TextSegment> segments = std::move(scratch.segments);
    for (const TextSegment& segment : segments) {
      if (segment.token >= 0) {
        ids.push_back(segment.token);
      } else {
        encode_segment(text.substr(segment.begin, segment.end - segment.begin), segment.begin == 0, ids, scratch);
      }
    }
  }

  if (options.add_eos.value_or(add_eos_) && !eos_ids_.empty()) ids.push_back(eos_ids_.front());
  return ids;
}

void Tokenizer::encode_segment(std::string_view segment, bool at_text_start, std::vector<int32_t>& out,
                               EncodeScratch& scratch) const {
  std::string normalized;
  std::string_view text = segment;
  if (!normalizer_.empty()) {
    normalized = normalizer_.apply(segment);
    text = normalized;
  }
  std::string transformed;
  if (pre_tokenizer_.has_transform()) {
    transformed = pre_tokenizer_.transform(text, at_text_start);
    text = transformed;
  }
  scratch.spans.clear();
  pre_tokenizer_.split(text, scratch.spans);
  for (const ByteSpan& span : scratch.spans) {
    model_.encode_word(text.substr(span.begin, span.end - span.begin), out, scratch.bpe);
  }
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes_[static_cast<size_t>(id)];
  }
  if (strip_leading_space_ && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
  return is_valid_utf8(bytes) ? bytes : sanitize_utf8(bytes);
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[static_cast<size_t>(id)];
}

bool Tokenizer::is_eos(int32_t id) const { return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end(); }

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUnused;
  return token_types_[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  const TokenType type = token_type(id);
  return type == TokenType::kControl || type == TokenType::kUnknown;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view piece) const {
  if (const auto it = added_index_.find(piece); it != added_index_.end()) return it->second;
  if (byte_level_spelling_) {
    if (const auto raw = byte_level_decode(piece)) {
      if (const int32_t id = model_.find(*raw); id >= 0) return id;
    }
  }
  if (const int32_t id = model_.find(piece); id >= 0) return id;
  return std::nullopt;
}

std::string Tokenizer::describe() const {
  auto id_text = [&](int32_t id) {
    if (id < 0) return std::string("none");
    return fmt::format("{} '{}'", id, sanitize_utf8(token_bytes_[static_cast<size_t>(id)]));
  };
  std::string eos;
  for (int32_t id : eos_ids_) {
    if (!eos.empty()) eos += ", ";
    eos += id_text(id);
  }
  return fmt::format(
      "{}, {} tokens ({} added), from {}; normalizer: {}; pre-tokenizer: {}; model: {}; BOS {}{}; EOS [{}]{}; "
      "decode {}",
      tokenizer_kind_name(kind_), vocab_size(), added_.tokens().size(), source_, normalizer_.describe(),
      pre_tokenizer_.describe(), model_.describe(), id_text(bos_id_), add_bos_ ? " (added by default)" : "", eos,
      add_eos_ ? " (added by default)" : "",
      strip_leading_space_ ? "drops one leading space" : "keeps leading spaces");
}

}  // namespace tachyon
