// Tokenizer: text <-> token ids for the Llama-family models, built from any of the files they
// ship with: Hugging Face tokenizer.json (+ tokenizer_config.json), GGUF metadata, llama2.c
// tokenizer.bin, tiktoken rank files, or OpenAI's GPT-2 encoder.json + vocab.bpe.
//
// Pipeline of encode(): repair invalid UTF-8 (each maximal invalid subpart -> U+FFFD) -> cut out
// added tokens (specials only with parse_special) -> per text segment: normalize -> pre-tokenize
// (regex splits) -> BPE -> ids, with BOS/EOS around. decode() maps ids to bytes, joins them,
// drops SentencePiece's one leading space when the model adds it, and repairs UTF-8 the same
// way. A loaded Tokenizer is immutable; encode/decode may run on many threads at once.
//
// The per-format loaders live in hf_json.cpp (tokenizer.json and GPT-2's files), gguf_vocab.cpp,
// llama2c_vocab.cpp and tiktoken.cpp; each fills a TokenizerParts and calls assemble().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"

namespace tachyon {

class GgufFile;

enum class TokenizerKind {
  kByteLevelBpe,      // BPE over raw bytes (GPT-2, Llama 3, Qwen2, tiktoken files)
  kSentencePieceBpe,  // BPE over code points with "▁" for spaces and <0xXX> byte fallback
};
const char* tokenizer_kind_name(TokenizerKind kind);

enum class TokenType : uint8_t {
  kNormal,
  kControl,      // special tokens: BOS, EOS, <|im_start|>, ...
  kUserDefined,  // added non-special tokens: always matched in text, never skipped
  kByte,         // byte-fallback <0xXX>
  kUnknown,
  kUnused,       // holes in the id range
};

struct EncodeOptions {
  std::optional<bool> add_bos;  // unset: the tokenizer's default (add_bos_by_default())
  bool parse_special = false;   // recognize special tokens written in the text
  std::optional<bool> add_eos;  // unset: the tokenizer's default (usually no)

  EncodeOptions() = default;
  // EncodeOptions{add_bos, parse_special} and EncodeOptions{add_bos, parse_special, add_eos}.
  EncodeOptions(std::optional<bool> add_bos_, bool parse_special_ = false, std::optional<bool> add_eos_ = std::nullopt)
      : add_bos(add_bos_), parse_special(parse_special_), add_eos(add_eos_) {}
};

// tiktoken files carry only ranks; what the model's code adds around them goes here.
struct TiktokenOptions {
  std::string bos_token;                // empty: none
  std::vector<std::string> eos_tokens;  // the first one is the declared EOS
  bool add_bos = false;
  std::string chat_template;
};

// The largest vocabulary (highest id + 1) accepted from a file that defines `defined` tokens.
// Ids may leave gaps, but a few tokens must not make a table of 16 million entries (1.2 GB).
inline size_t max_token_id_bound(size_t defined) { return 2 * defined + 4096; }

// What a loader fills; Tokenizer::assemble() checks it and builds the lookup structures.
struct TokenizerParts {
  TokenizerKind kind = TokenizerKind::kByteLevelBpe;
  std::string source;  // "tokenizer.json (path)" and the like, for describe()
  BpeModel model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::vector<AddedToken> added_tokens;
  // Per id: the bytes it decodes to and its type. Ids beyond these (added tokens, holes) are
  // completed by assemble().
  std::vector<std::string> token_bytes;
  std::vector<TokenType> token_types;
  // Vocabulary pieces are written in GPT-2's byte-level alphabet in the file ("Ġthe").
  bool byte_level_spelling = false;
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;  // the declared EOS first
  bool add_bos = false;
  bool add_eos = false;
  bool strip_leading_space = false;  // decode drops one leading ' ' (SentencePiece dummy prefix)
  std::string chat_template;
};

class Tokenizer {
 public:
  // Hugging Face tokenizer.json (model.type BPE) and, optionally, tokenizer_config.json for
  // BOS/EOS, add_bos_token/add_eos_token and the chat template.
  static Result<std::unique_ptr<Tokenizer>> from_hf_json(const std::string& tokenizer_json_path,
                                                         const std::string& tokenizer_config_path);
  // GGUF tokenizer.ggml.* metadata: model "gpt2" (byte-level BPE) or "llama" (SentencePiece).
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& gguf);
  // llama2.c tokenizer.bin; `vocab_size` comes from the checkpoint header.
  static Result<std::unique_ptr<Tokenizer>> from_llama2c(const std::string& tokenizer_bin_path, int vocab_size);
  // tiktoken rank file ("<base64> <rank>" per line), with the pre-tokenizer `pattern` and the
  // special tokens the model's code defines.
  static Result<std::unique_ptr<Tokenizer>> from_tiktoken(const std::string& path, const std::string& pattern,
                                                          const std::map<std::string, int32_t>& special_tokens,
                                                          const TiktokenOptions& options = {});
  // OpenAI's GPT-2 files: encoder.json (piece -> id) and vocab.bpe (merges).
  static Result<std::unique_ptr<Tokenizer>> from_gpt2_files(const std::string& encoder_json_path,
                                                            const std::string& vocab_bpe_path);
  static Result<std::unique_ptr<Tokenizer>> assemble(TokenizerParts parts);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Valid UTF-8 (invalid byte sequences become U+FFFD); unknown ids are skipped.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The raw bytes of one token (special tokens: their text; unknown ids: empty). May be an
  // incomplete UTF-8 sequence; see IncrementalDetokenizer for streaming.
  std::string token_to_piece(int32_t id) const;

  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }
  int32_t bos_id() const { return bos_id_; }
  // The declared EOS first, then other end-of-generation specials the vocabulary has
  // (<|eot_id|>, <|im_end|>, <|end|>, ...).
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool is_eos(int32_t id) const;
  // The piece as the vocabulary writes it ("Ġthe" or " the" for byte-level vocabularies,
  // "▁the", "<|im_start|>").
  std::optional<int32_t> token_id(std::string_view piece) const;
  TokenType token_type(int32_t id) const;
  // Control and unknown tokens: what decode(skip_special=true) leaves out.
  bool is_special(int32_t id) const;
  bool add_bos_by_default() const { return add_bos_; }
  bool add_eos_by_default() const { return add_eos_; }
  bool strips_leading_space() const { return strip_leading_space_; }
  TokenizerKind kind() const { return kind_; }
  std::string describe() const;
  const std::string& chat_template() const { return chat_template_; }
  const std::vector<AddedToken>& added_tokens() const { return added_.tokens(); }

 private:
  Tokenizer() = default;
  struct EncodeScratch;
  void encode_segment(std::string_view segment, bool at_text_start, std::vector<int32_t>& out,
                      EncodeScratch& scratch) const;

  TokenizerKind kind_ = TokenizerKind::kByteLevelBpe;
  std::string source_;
  BpeModel model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  AddedTokenMatcher added_;
  PieceMap added_index_;
  std::vector<std::string> token_bytes_;  // [vocab_size]
  std::vector<TokenType> token_types_;    // [vocab_size]
  bool byte_level_spelling_ = false;
  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool strip_leading_space_ = false;
  std::string chat_template_;
};

// The special tokens a Hugging Face tokenizer_config.json declares in added_tokens_decoder
// (content -> id), e.g. for a tiktoken model shipped with an HF config.
Result<std::map<std::string, int32_t>> read_hf_special_tokens(const std::string& tokenizer_config_path);

}  // namespace tachyon
