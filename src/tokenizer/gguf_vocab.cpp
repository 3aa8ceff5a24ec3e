// Loader for the tokenizer.ggml.* metadata of a GGUF file.
//   model "gpt2":  byte-level BPE; tokens spelled in GPT-2's byte alphabet, merges "a b",
//                  tokenizer.ggml.pre picks the split patterns (unknown names are refused:
//                  silently splitting the wrong way would give plausible but wrong ids).
//   model "llama": SentencePiece BPE; tokens + scores + token_type, merging by score, <0xXX>
//                  byte fallback, "▁" for spaces and a "▁" prefix per text segment when
//                  add_space_prefix (default true).
// Control (type 3) and unknown (type 2) tokens are specials, recognized in text only with
// parse_special; user-defined ones (type 4) are matched in any text.
#include "core/log.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tachyon {
namespace {

// GGUF's token_type values.
enum GgufTokenType : int64_t {
  kGgufNormal = 1,
  kGgufUnknown = 2,
  kGgufControl = 3,
  kGgufUserDefined = 4,
  kGgufUnused = 5,
  kGgufByte = 6,
};

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // ▁

Result<int32_t> optional_id(const GgufFile& gguf, const std::string& key, size_t vocab_size) {
  TACHYON_ASSIGN_OR_RETURN(int64_t id, gguf.get_int_or(key, -1));
  if (id < -1 || id >= static_cast<int64_t>(vocab_size)) {
    // Some converters write an id past the vocabulary for "none"; treat it as absent.
    TACHYON_LOG_WARN("{}: {} = {} is outside the vocabulary ({} tokens); ignored", gguf.path(), key, id, vocab_size);
    return -1;
  }
  return static_cast<int32_t>(id);
}

Result<std::unique_ptr<Tokenizer>> load_gguf_vocab(const GgufFile& gguf) {
  const std::string& path = gguf.path();
  TACHYON_ASSIGN_OR_RETURN(std::string model_name, gguf.get_string("tokenizer.ggml.model"));
  const bool byte_level = model_name == "gpt2";
  if (!byte_level && model_name != "llama") {
    const char* what = model_name == "bert" ? " (WordPiece)" : model_name == "t5" ? " (Unigram)" : "";
    return make_error(ErrorCode::kUnsupported,
                      "{}: tokenizer.ggml.model '{}'{} is not supported (only 'gpt2' byte-level BPE and 'llama' "
                      "SentencePiece BPE)",
                      path, model_name, what);
  }
  TACHYON_ASSIGN_OR_RETURN(std::vector<std::string> tokens, gguf.get_string_array("tokenizer.ggml.tokens"));
  const size_t n = tokens.size();
  if (n == 0) return make_error(ErrorCode::kCorruptFile, "{}: tokenizer.ggml.tokens is empty", path);
  if (n > (size_t{1} << 24)) {
    return make_error(ErrorCode::kCorruptFile, "{}: tokenizer.ggml.tokens has {} entries (more than 2^24)", path, n);
  }
  std::vector<int64_t> types(n, kGgufNormal);
  if (gguf.has("tokenizer.ggml.token_type")) {
    TACHYON_ASSIGN_OR_RETURN(types, gguf.get_int_array("tokenizer.ggml.token_type"));
    if (types.size() != n) {
      return make_error(ErrorCode::kCorruptFile, "{}: tokenizer.ggml.token_type has {} entries, tokens has {}", path,
                        types.size(), n);
    }
  }

  TokenizerParts parts;
  parts.source = fmt::format("GGUF ({}, tokenizer.ggml.model '{}')", path, model_name);
  parts.kind = byte_level ? TokenizerKind::kByteLevelBpe : TokenizerKind::kSentencePieceBpe;
  parts.byte_level_spelling = byte_level;
  parts.token_bytes.resize(n);
  parts.token_types.assign(n, TokenType::kNormal);
  BpeModel& model = parts.model;
  model.unit = byte_level ? BpeUnit::kByte : BpeUnit::kCodePoint;

  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    std::string& text = tokens[i];
    if (!is_valid_utf8(text)) {
      return make_error(ErrorCode::kCorruptFile, "{}: tokenizer.ggml.tokens[{}] is not valid UTF-8", path, i);
    }
    switch (types[i]) {
      case kGgufControl:
      case kGgufUserDefined:
        parts.token_bytes[i] = text;
        parts.added_tokens.push_back(AddedToken{text, id, types[i] == kGgufControl});
        parts.token_types[i] = types[i] == kGgufControl ? TokenType::kControl : TokenType::kUserDefined;
        continue;  // matched as added tokens, never produced by BPE
      case kGgufUnused:
        parts.token_types[i] = TokenType::kUnused;
        parts.token_bytes[i] = text;
        continue;
      case kGgufUnknown:
        parts.token_types[i] = TokenType::kUnknown;
        parts.added_tokens.push_back(AddedToken{text, id, true});  // recognized like a special
        break;
      case kGgufByte:
        parts.token_types[i] = TokenType::kByte;
        break;
      default:
        break;
    }
    if (byte_level) {
      if (auto raw = byte_level_decode(text)) text = std::move(*raw);
      parts.token_bytes[i] = text;
    } else if (const auto byte = parse_byte_token(text); byte && types[i] == kGgufByte) {
      parts.token_bytes[i] = std::string(1, static_cast<char>(*byte));
    } else {
      std::string decoded;
      for (size_t pos = 0; pos < text.size();) {
        if (text.compare(pos, kMetaspace.size(), kMetaspace) == 0) {
          decoded.push_back(' ');
          pos += kMetaspace.size();
        } else {
          decoded.push_back(text[pos++]);
        }
      }
      parts.token_bytes[i] = std::move(decoded);
    }
    model.set_piece(id, std::move(text));
  }
  model.pieces.resize(n);
  // A GGUF piece may legitimately be empty (e.g. a hole); give it no lookup entry.
  model.piece_to_id.erase("");

  if (byte_level) {
    model.rank_source = BpeRankSource::kPairRanks;
    TACHYON_ASSIGN_OR_RETURN(std::vector<std::string> merges, gguf.get_string_array("tokenizer.ggml.merges"));
    size_t skipped = 0;
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string& m = merges[i];
      const size_t space = m.find(' ', 1);  // a merge part is never empty
      if (space == std::string::npos) {
        return make_error(ErrorCode::kCorruptFile, "{}: tokenizer.ggml.merges[{}] = '{}' is not 'a b'", path, i, m);
      }
      auto left = byte_level_decode(std::string_view(m).substr(0, space));
      auto right = byte_level_decode(std::string_view(m).substr(space + 1));
      if (!left || !right || !model.add_merge(*left, *right, static_cast<int32_t>(i))) ++skipped;
    }
    if (skipped > 0) {
      TACHYON_LOG_WARN("{}: {} of {} tokenizer.ggml.merges name pieces outside the vocabulary and are ignored", path,
                       skipped, merges.size());
    }
    if (!gguf.has("tokenizer.ggml.pre")) {
      TACHYON_LOG_WARN("{}: no tokenizer.ggml.pre; splitting with GPT-2's pattern ('default')", path);
    }
    TACHYON_ASSIGN_OR_RETURN(std::string pre, gguf.get_string_or("tokenizer.ggml.pre", "default"));
    const auto patterns = gguf_pretokenizer_patterns(pre);
    if (!patterns) {
      return make_error(ErrorCode::kUnsupported, "{}: tokenizer.ggml.pre '{}' is not a known pre-tokenizer (known: {})",
                        path, pre, known_gguf_pretokenizers());
    }
    for (std::string_view pattern : *patterns) {
      TACHYON_ASSIGN_OR_RETURN(auto regex, Regex::compile(pattern, path + ": tokenizer.ggml.pre " + pre));
      parts.pre_tokenizer.add_split(std::move(regex), SplitBehavior::kIsolated);
    }
    model.ignore_merges = gguf_pretokenizer_ignores_merges(pre);
  } else {
    model.rank_source = BpeRankSource::kPieceRanks;
    TACHYON_ASSIGN_OR_RETURN(std::vector<double> scores, gguf.get_float_array("tokenizer.ggml.scores"));
    if (scores.size() != n) {
      return make_error(ErrorCode::kCorruptFile, "{}: tokenizer.ggml.scores has {} entries, tokens has {}", path,
                        scores.size(), n);
    }
    model.piece_rank = ranks_from_scores(std::vector<float>(scores.begin(), scores.end()));
    for (size_t i = 0; i < n; ++i) {
      if (parts.token_types[i] != TokenType::kNormal) model.piece_rank[i] = -1;
    }
    model.index_byte_fallback([&](int32_t id) { return parts.token_types[static_cast<size_t>(id)] == TokenType::kByte; });
    bool add_space_prefix = true;
    if (gguf.has("tokenizer.ggml.add_space_prefix")) {
      TACHYON_ASSIGN_OR_RETURN(add_space_prefix, gguf.get_bool("tokenizer.ggml.add_space_prefix"));
    }
    parts.normalizer.add_replace(" ", std::string(kMetaspace));
    if (add_space_prefix) {
      parts.normalizer.add_prepend(std::string(kMetaspace));
      parts.strip_leading_space = true;
    }
  }

  TACHYON_ASSIGN_OR_RETURN(model.unk_id, optional_id(gguf, "tokenizer.ggml.unknown_token_id", n));
  if (model.unk_id < 0) {
    for (size_t i = 0; i < n && model.unk_id < 0; ++i) {
      if (parts.token_types[i] == TokenType::kUnknown) model.unk_id = static_cast<int32_t>(i);
    }
  }
  TACHYON_ASSIGN_OR_RETURN(parts.bos_id, optional_id(gguf, "tokenizer.ggml.bos_token_id", n));
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    TACHYON_ASSIGN_OR_RETURN(int32_t id, optional_id(gguf, key, n));
    if (id >= 0) parts.eos_ids.push_back(id);
  }
  bool add_bos = !byte_level, add_eos = false;
  if (gguf.has("tokenizer.ggml.add_bos_token")) {
    TACHYON_ASSIGN_OR_RETURN(add_bos, gguf.get_bool("tokenizer.ggml.add_bos_token"));
  }
  if (gguf.has("tokenizer.ggml.add_eos_token")) {
    TACHYON_ASSIGN_OR_RETURN(add_eos, gguf.get_bool("tokenizer.ggml.add_eos_token"));
  }
  parts.add_bos = add_bos;
  parts.add_eos = add_eos;
  TACHYON_ASSIGN_OR_RETURN(parts.chat_template, gguf.get_string_or("tokenizer.chat_template", ""));
  return Tokenizer::assemble(std::move(parts));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& gguf) { return load_gguf_vocab(gguf); }

}  // namespace tachyon
