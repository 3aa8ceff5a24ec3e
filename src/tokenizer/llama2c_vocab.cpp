// Loader for llama2.c's tokenizer.bin: int32 max_token_length, then per token float32 score,
// int32 length and the piece's bytes. Encoding follows llama2.c's run.c: a " " dummy prefix
// before the text, code points looked up in the vocabulary (byte fallback <0xXX> = id 3 + byte
// otherwise), then repeated merging of the adjacent pair whose concatenation is a piece with
// the highest score (leftmost on ties). Pieces already use ' ' where SentencePiece had '▁', so
// no space escaping happens. Deliberate differences from run.c: ids 0..2 are named <unk>, <s>,
// </s> (the file writes BOS and EOS as "\n<s>\n" and "\n</s>\n") and merges never produce those
// or a <0xXX> token (only reachable by text that spells them); a NUL byte is text, not the end
// of the string; decode drops the dummy-prefix space of the first text token whether or not a
// BOS precedes it (run.c only strips it right after BOS), as SentencePiece does.
#include <cstring>

#include "core/log.h"
#include "core/mapped_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tachyon {
namespace {

constexpr int32_t kUnknownId = 0;
constexpr int32_t kBosId = 1;
constexpr int32_t kEosId = 2;

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_llama2c(const std::string& path, int vocab_size) {
  if (vocab_size <= kEosId || vocab_size > (1 << 24)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: vocab_size {} from the checkpoint is out of range (3..{})",
                      path, vocab_size, 1 << 24);
  }
  TACHYON_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  const uint8_t* data = file->data();
  const size_t size = file->size();
  size_t pos = 0;
  auto read_i32 = [&](const char* field, size_t index, int32_t& value) -> Status {
    if (size - pos < 4) {
      return make_error(ErrorCode::kCorruptFile, "{}: truncated at byte {} reading {} of token {} (file has {} bytes)",
                        path, pos, field, index, size);
    }
    std::memcpy(&value, data + pos, 4);
    pos += 4;
    return Status::Ok();
  };

  int32_t max_token_length = 0;
  if (size < 4) {
    return make_error(ErrorCode::kCorruptFile, "{}: {} bytes is too short for the max_token_length header", path, size);
  }
  std::memcpy(&max_token_length, data, 4);
  pos = 4;
  if (max_token_length <= 0 || max_token_length > (1 << 16)) {
    return make_error(ErrorCode::kCorruptFile, "{}: max_token_length {} is out of range (1..65536)", path,
                      max_token_length);
  }

  TokenizerParts parts;
  parts.kind = TokenizerKind::kSentencePieceBpe;
  parts.source = fmt::format("llama2.c tokenizer.bin ({})", path);
  std::vector<float> scores(static_cast<size_t>(vocab_size));
  parts.token_bytes.resize(static_cast<size_t>(vocab_size));
  parts.token_types.assign(static_cast<size_t>(vocab_size), TokenType::kNormal);
  std::vector<std::string> pieces(static_cast<size_t>(vocab_size));
  for (size_t i = 0; i < static_cast<size_t>(vocab_size); ++i) {
    int32_t score_bits = 0, length = 0;
    TACHYON_RETURN_IF_ERROR(read_i32("score", i, score_bits));
    std::memcpy(&scores[i], &score_bits, 4);
    TACHYON_RETURN_IF_ERROR(read_i32("length", i, length));
    if (length < 0 || static_cast<size_t>(length) > size - pos) {
      return make_error(ErrorCode::kCorruptFile,
                        "{}: token {} has length {} but only {} bytes remain (at byte {}); is vocab_size {} right?", path,
                        i, length, size - pos, pos, vocab_size);
    }
    pieces[i].assign(reinterpret_cast<const char*>(data + pos), static_cast<size_t>(length));
    pos += static_cast<size_t>(length);
  }
  if (pos != size) {
    TACHYON_LOG_WARN("{}: {} bytes after the {} tokens are ignored", path, size - pos, vocab_size);
  }

  pieces[kUnknownId] = "<unk>";
  pieces[kBosId] = "<s>";
  pieces[kEosId] = "</s>";
  parts.token_types[kUnknownId] = TokenType::kUnknown;
  parts.token_types[kBosId] = TokenType::kControl;
  parts.token_types[kEosId] = TokenType::kControl;

  BpeModel& model = parts.model;
  model.rank_source = BpeRankSource::kPieceRanks;
  model.unit = BpeUnit::kCodePoint;
  model.unk_id = kUnknownId;
  model.piece_rank = ranks_from_scores(scores);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (const auto byte = parse_byte_token(pieces[i]); byte && i > kEosId) {
      parts.token_types[i] = TokenType::kByte;
      parts.token_bytes[i] = std::string(1, static_cast<char>(*byte));
    } else {
      parts.token_bytes[i] = pieces[i];
    }
    if (parts.token_types[i] != TokenType::kNormal) model.piece_rank[i] = -1;
    model.set_piece(id, pieces[i]);
  }
  model.index_byte_fallback([&](int32_t id) { return parts.token_types[static_cast<size_t>(id)] == TokenType::kByte; });
  // Specials are cut out of the text only with parse_special (run.c never does).
  parts.added_tokens = {AddedToken{"<unk>", kUnknownId, true}, AddedToken{"<s>", kBosId, true},
                        AddedToken{"</s>", kEosId, true}};
  parts.normalizer.add_prepend(" ");
  parts.bos_id = kBosId;
  parts.eos_ids = {kEosId};
  parts.add_bos = true;
  parts.strip_leading_space = true;
  return assemble(std::move(parts));
}

}  // namespace tachyon
