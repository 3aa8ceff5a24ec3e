// Loader for tiktoken rank files (Llama 3 tokenizer.model, qwen.tiktoken): one
// "<base64 of the token's bytes> <rank>" per line. The rank is the id and the merge priority:
// BPE runs on raw bytes, a pre-token that is itself a token is taken whole, otherwise the
// adjacent pair whose concatenation has the lowest rank merges first. Special tokens are not
// in the file; the caller names them.
#include <algorithm>
#include <array>

#include "core/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace tachyon {
namespace {

// Standard base64 with '=' padding; false on any other character.
bool base64_decode(std::string_view in, std::string& out) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(alphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  out.clear();
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : in) {
    const int8_t v = table[static_cast<uint8_t>(c)];
    if (v < 0) return false;
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xFF));
    }
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_tiktoken(const std::string& path, const std::string& pattern,
                                                            const std::map<std::string, int32_t>& special_tokens,
                                                            const TiktokenOptions& options) {
  TACHYON_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  const std::string_view text(reinterpret_cast<const char*>(file->data()), file->size());

  TokenizerParts parts;
  parts.kind = TokenizerKind::kByteLevelBpe;
  parts.source = fmt::format("tiktoken file ({})", path);
  BpeModel& model = parts.model;
  model.rank_source = BpeRankSource::kPieceRanks;
  model.unit = BpeUnit::kByte;
  model.ignore_merges = true;

  std::string bytes;
  size_t line_number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) {
      return make_error(ErrorCode::kCorruptFile, "{}: line {}: expected '<base64> <rank>', got '{}'", path, line_number,
                        line.substr(0, 80));
    }
    if (!base64_decode(line.substr(0, space), bytes) || bytes.empty()) {
      return make_error(ErrorCode::kCorruptFile, "{}: line {}: token '{}' is not valid base64", path, line_number,
                        line.substr(0, std::min<size_t>(space, 80)));
    }
    const std::string_view rank_text = line.substr(space + 1);
    int64_t rank = 0;
    bool digits = !rank_text.empty() && rank_text.size() <= 9;
    for (char c : rank_text) {
      digits = digits && c >= '0' && c <= '9';
      rank = rank * 10 + (c - '0');
    }
    if (!digits) {
      return make_error(ErrorCode::kCorruptFile, "{}: line {}: rank '{}' is not a number below 10^9", path,
                        line_number, rank_text.substr(0, 20));
    }
    if (static_cast<size_t>(rank) < model.pieces.size() && !model.pieces[static_cast<size_t>(rank)].empty()) {
      return make_error(ErrorCode::kCorruptFile, "{}: line {}: rank {} appears twice", path, line_number, rank);
    }
    model.set_piece(static_cast<int32_t>(rank), bytes);
  }
  if (model.pieces.empty()) return make_error(ErrorCode::kCorruptFile, "{}: no tokens in the file", path);
  for (int b = 0; b < 256; ++b) {
    if (model.find(std::string(1, static_cast<char>(b))) < 0) {
      return make_error(ErrorCode::kCorruptFile, "{}: byte 0x{:02X} has no token; byte-level BPE needs all 256", path,
                        b);
    }
  }
  model.piece_rank.resize(model.pieces.size());
  for (size_t id = 0; id < model.pieces.size(); ++id) {
    model.piece_rank[id] = model.pieces[id].empty() ? -1 : static_cast<int32_t>(id);
  }
  parts.token_bytes = model.pieces;
  parts.token_types.assign(model.pieces.size(), TokenType::kNormal);
  for (size_t id = 0; id < model.pieces.size(); ++id) {
    if (model.pieces[id].empty()) parts.token_types[id] = TokenType::kUnused;
  }

  TACHYON_ASSIGN_OR_RETURN(auto regex, Regex::compile(pattern, path + ": pre-tokenizer pattern"));
  parts.pre_tokenizer.add_split(std::move(regex), SplitBehavior::kIsolated);

  for (const auto& [content, id] : special_tokens) {
    if (id < 0) {
      return make_error(ErrorCode::kInvalidArgument, "{}: special token '{}' has negative id {}", path, content, id);
    }
    if (static_cast<size_t>(id) < model.pieces.size() && !model.pieces[static_cast<size_t>(id)].empty()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: special token '{}' id {} is already the rank of a token",
                        path, content, id);
    }
    parts.added_tokens.push_back(AddedToken{content, id, true});
  }
  auto special_id = [&](const std::string& content, const char* what) -> Result<int32_t> {
    const auto it = special_tokens.find(content);
    if (it == special_tokens.end()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: {} token '{}' is not among the {} special tokens", path, what,
                        content, special_tokens.size());
    }
    return it->second;
  };
  if (!options.bos_token.empty()) {
    TACHYON_ASSIGN_OR_RETURN(parts.bos_id, special_id(options.bos_token, "BOS"));
  }
  for (const std::string& eos : options.eos_tokens) {
    TACHYON_ASSIGN_OR_RETURN(int32_t id, special_id(eos, "EOS"));
    parts.eos_ids.push_back(id);
  }
  parts.add_bos = options.add_bos;
  parts.chat_template = options.chat_template;
  return assemble(std::move(parts));
}

}  // namespace tachyon
