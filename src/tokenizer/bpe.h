// The BPE model: a vocabulary of pieces and the rule that merges adjacent symbols of one
// pre-token, lowest rank first (ties: leftmost). Three rank sources cover every format:
//   - pair ranks: an explicit merge list "a b" (Hugging Face BPE, GGUF "gpt2");
//   - piece ranks: the rank of the merged piece itself (tiktoken: its rank; SentencePiece and
//     llama2.c: the order of its score, highest first).
// Symbols start as single bytes (byte-level vocabularies) or single code points (SentencePiece
// style); a code point missing from the vocabulary becomes its byte-fallback tokens <0xXX> or
// the unknown token. Merging uses a doubly linked list of symbols and a binary heap of candidate
// pairs, so a word of n symbols costs O(n log n), not O(n^2).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tachyon {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
// Piece -> id, searchable by string_view without a copy.
using PieceMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

enum class BpeRankSource { kPairRanks, kPieceRanks };
enum class BpeUnit { kByte, kCodePoint };

// Per-call working memory, reused across the words of one encode call.
struct BpeScratch {
  struct Symbol {
    uint32_t begin = 0;
    uint32_t length = 0;
    int32_t prev = -1;
    int32_t next = -1;
    int32_t id = -1;  // -1: no token (an unknown code point without fallback)
  };
  struct Candidate {
    int32_t rank = 0;
    uint32_t begin = 0;  // of the left symbol: ties go to the leftmost pair
    int32_t left = 0;
    int32_t right = 0;
    uint32_t length = 0;  // combined length when pushed; a different one means stale
    int32_t result = 0;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  // Words seen in this call -> (offset, count) in cached_ids: long texts repeat words a lot.
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> cached_ids;
};

class BpeModel {
 public:
  // The text form of each id as matched against the (normalized, pre-tokenized) input: raw
  // bytes for byte-level vocabularies, "▁"-spelled pieces for SentencePiece ones. Empty for ids
  // that are not part of the model (added tokens, holes).
  std::vector<std::string> pieces;
  PieceMap piece_to_id;
  size_t max_piece_bytes = 0;  // no merge can produce anything longer

  BpeRankSource rank_source = BpeRankSource::kPairRanks;
  BpeUnit unit = BpeUnit::kByte;
  // kPairRanks: (left id << 32 | right id) -> merge.
  struct Merge {
    int32_t rank = 0;
    int32_t result = 0;
  };
  std::unordered_map<uint64_t, Merge> pair_merges;
  // kPieceRanks: rank of each id as a merge result; -1 where the id may not be produced by a
  // merge (control, byte and unused tokens).
  std::vector<int32_t> piece_rank;

  std::array<int32_t, 256> byte_fallback{};  // -1 where there is none
  bool has_byte_fallback = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  // A pre-token that is itself in the vocabulary is emitted whole (tiktoken, Llama 3).
  bool ignore_merges = false;
  // Code points (e.g. "▁") before which a word may be cut into independent parts: no piece
  // contains another character followed by one of them, so no merge can cross such a point.
  // Filled by find_word_boundaries(); it lets SentencePiece models, which see a whole text
  // segment as one word, merge word by word (and use the cache).
  std::vector<std::string> boundary_markers;

  BpeModel() { byte_fallback.fill(-1); }

  // Sets pieces[id] = piece and indexes it (the first id of a repeated piece wins).
  void set_piece(int32_t id, std::string piece);
  // Registers the merge of two pieces; false when a part or the result is not in the vocabulary.
  bool add_merge(std::string_view left, std::string_view right, int32_t rank);
  // Fills byte_fallback from pieces spelled "<0xXX>" (only those ids whose `eligible` is true).
  void index_byte_fallback(const std::function<bool(int32_t)>& eligible);

  // Sets boundary_markers to those of `candidates` that are safe for this vocabulary.
  void find_word_boundaries(const std::vector<std::string>& candidates);

  // Appends the ids of one pre-token to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const;

  // "merges by pair rank over bytes, byte fallback, ..." for Tokenizer::describe().
  std::string describe() const;

  int32_t find(std::string_view piece) const {
    const auto it = piece_to_id.find(piece);
    return it == piece_to_id.end() ? -1 : it->second;
  }

 private:
  void encode_cached(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const;
  bool candidate(const BpeScratch& scratch, std::string_view word, int32_t left, int32_t right,
                 BpeScratch::Candidate& out) const;
};

// Dense ranks from scores, highest score first (equal scores share a rank).
std::vector<int32_t> ranks_from_scores(const std::vector<float>& scores);

}  // namespace tachyon
