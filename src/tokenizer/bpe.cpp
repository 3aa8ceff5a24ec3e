// BPE merging over a linked list of symbols with a heap of candidate pairs (see bpe.h).
#include "tokenizer/bpe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "tokenizer/unicode.h"

namespace tachyon {
namespace {

// std heap functions build a max-heap; "a after b" puts the lowest rank, then the leftmost
// pair, on top.
bool comes_after(const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
  if (a.rank != b.rank) return a.rank > b.rank;
  return a.begin > b.begin;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

void BpeModel::set_piece(int32_t id, std::string piece) {
  if (static_cast<size_t>(id) >= pieces.size()) pieces.resize(static_cast<size_t>(id) + 1);
  piece_to_id.emplace(piece, id);
  max_piece_bytes = std::max(max_piece_bytes, piece.size());
  pieces[static_cast<size_t>(id)] = std::move(piece);
}

bool BpeModel::add_merge(std::string_view left, std::string_view right, int32_t rank) {
  const int32_t l = find(left), r = find(right);
  if (l < 0 || r < 0) return false;
  std::string merged;
  merged.reserve(left.size() + right.size());
  merged.append(left).append(right);
  const int32_t result = find(merged);
  if (result < 0) return false;
  pair_merges.emplace(pair_key(l, r), Merge{rank, result});  // a repeated pair keeps its first rank
  return true;
}

void BpeModel::index_byte_fallback(const std::function<bool(int32_t)>& eligible) {
  byte_fallback.fill(-1);
  int found = 0;
  for (size_t id = 0; id < pieces.size(); ++id) {
    const auto byte = parse_byte_token(pieces[id]);
    if (!byte || byte_fallback[*byte] >= 0 || !eligible(static_cast<int32_t>(id))) continue;
    byte_fallback[*byte] = static_cast<int32_t>(id);
    ++found;
  }
  has_byte_fallback = found > 0;
}

bool BpeModel::candidate(const BpeScratch& scratch, std::string_view word, int32_t left, int32_t right,
                         BpeScratch::Candidate& out) const {
  const auto& l = scratch.symbols[static_cast<size_t>(left)];
  const auto& r = scratch.symbols[static_cast<size_t>(right)];
  int32_t rank = -1, result = -1;
  if (rank_source == BpeRankSource::kPairRanks) {
    if (l.id < 0 || r.id < 0) return false;
    const auto it = pair_merges.find(pair_key(l.id, r.id));
    if (it == pair_merges.end()) return false;
    rank = it->second.rank;
    result = it->second.result;
  } else {
    if (l.length + r.length > max_piece_bytes) return false;
    result = find(word.substr(l.begin, l.length + r.length));
    if (result < 0 || static_cast<size_t>(result) >= piece_rank.size()) return false;
    rank = piece_rank[static_cast<size_t>(result)];
    if (rank < 0) return false;
  }
  out = BpeScratch::Candidate{rank, l.begin, left, right, l.length + r.length, result};
  return true;
}

void BpeModel::find_word_boundaries(const std::vector<std::string>& candidates) {
  boundary_markers.clear();
  if (ignore_merges) return;  // whole-word lookup needs the whole word
  for (const std::string& marker : candidates) {
    if (marker.empty()) continue;
    bool used = false, safe = true;
    for (const std::string& piece : pieces) {
      if (piece.compare(0, marker.size(), marker) == 0) used = true;
      // Any occurrence of the marker that follows a different character breaks the rule.
      for (size_t pos = piece.find(marker, 1); safe && pos != std::string::npos; pos = piece.find(marker, pos + 1)) {
        if (pos < marker.size() || piece.compare(pos - marker.size(), marker.size(), marker) != 0) safe = false;
      }
      if (!safe) break;
    }
    if (used && safe) boundary_markers.push_back(marker);
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const {
  if (boundary_markers.empty()) {
    encode_cached(word, out, scratch);
    return;
  }
  // Cut before each marker that follows a different character.
  size_t start = 0;
  for (size_t pos = 1; pos < word.size(); ++pos) {
    for (const std::string& m : boundary_markers) {
      if (word.compare(pos, m.size(), m) == 0 && !(pos >= m.size() && word.compare(pos - m.size(), m.size(), m) == 0)) {
        encode_cached(word.substr(start, pos - start), out, scratch);
        start = pos;
        break;
      }
    }
  }
  encode_cached(word.substr(start), out, scratch);
}

void BpeModel::encode_cached(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const {
  constexpr size_t kMaxCachedWordBytes = 64;
  constexpr size_t kMaxCachedWords = 1 << 16;
  if (word.size() > kMaxCachedWordBytes) {
    merge_word(word, out, scratch);
    return;
  }
  if (const auto it = scratch.cache.find(word); it != scratch.cache.end()) {
    const auto [offset, count] = it->second;
    out.insert(out.end(), scratch.cached_ids.begin() + offset, scratch.cached_ids.begin() + offset + count);
    return;
  }
  const size_t first = out.size();
  merge_word(word, out, scratch);
  if (scratch.cache.size() < kMaxCachedWords) {
    const auto offset = static_cast<uint32_t>(scratch.cached_ids.size());
    scratch.cached_ids.insert(scratch.cached_ids.end(), out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    scratch.cache.emplace(std::string(word), std::make_pair(offset, static_cast<uint32_t>(out.size() - first)));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const {
  if (word.empty()) return;
  // Symbol offsets are 32-bit; a pre-token of a gigabyte or more is merged in 1 GiB parts
  // (cut at a code point start), which only differs at the cuts.
  constexpr size_t kMaxWordBytes = size_t{1} << 30;
  if (word.size() > kMaxWordBytes) {
    size_t cut = kMaxWordBytes;
    while (cut > 0 && (static_cast<uint8_t>(word[cut]) & 0xC0) == 0x80) --cut;
    merge_word(word.substr(0, cut), out, scratch);
    merge_word(word.substr(cut), out, scratch);
    return;
  }
  if (ignore_merges) {
    const int32_t whole = find(word);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }

  // Initial symbols.
  auto& symbols = scratch.symbols;
  symbols.clear();
  bool previous_unknown = false;
  auto push_symbol = [&](size_t begin, size_t length, int32_t id) {
    BpeScratch::Symbol s;
    s.begin = static_cast<uint32_t>(begin);
    s.length = static_cast<uint32_t>(length);
    s.id = id;
    symbols.push_back(s);
  };
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t length =
        unit == BpeUnit::kByte ? 1 : std::min(utf8_lead_length(static_cast<uint8_t>(word[pos])), word.size() - pos);
    const int32_t id = find(word.substr(pos, length));
    bool unknown = false;
    if (id >= 0) {
      push_symbol(pos, length, id);
    } else {
      bool fallback = has_byte_fallback;
      for (size_t i = 0; fallback && i < length; ++i) fallback = byte_fallback[static_cast<uint8_t>(word[pos + i])] >= 0;
      if (fallback) {
        for (size_t i = 0; i < length; ++i) push_symbol(pos + i, 1, byte_fallback[static_cast<uint8_t>(word[pos + i])]);
      } else if (fuse_unk && previous_unknown && !symbols.empty()) {
        symbols.back().length += static_cast<uint32_t>(length);
        unknown = true;
      } else {
        push_symbol(pos, length, unk_id);  // -1 without an unknown token: dropped below
        unknown = true;
      }
    }
    previous_unknown = unknown;
    pos += length;
  }
  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols[static_cast<size_t>(i)].prev = i - 1;
    symbols[static_cast<size_t>(i)].next = (i + 1 < n) ? i + 1 : -1;
  }

  // Merge, lowest rank first.
  auto& heap = scratch.heap;
  heap.clear();
  BpeScratch::Candidate c;
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (candidate(scratch, word, i, i + 1, c)) heap.push_back(c);
  }
  std::make_heap(heap.begin(), heap.end(), comes_after);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), comes_after);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    auto& left = symbols[static_cast<size_t>(top.left)];
    auto& right = symbols[static_cast<size_t>(top.right)];
    if (left.length == 0 || right.length == 0 || left.next != top.right || left.length + right.length != top.length) {
      continue;  // one side changed since this pair was queued
    }
    left.length += right.length;
    left.id = top.result;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.left;
    right.length = 0;
    if (left.prev >= 0 && candidate(scratch, word, left.prev, top.left, c)) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), comes_after);
    }
    if (left.next >= 0 && candidate(scratch, word, top.left, left.next, c)) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), comes_after);
    }
  }

  // Symbol 0 is never merged away (merges fold the right symbol into the left one).
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[static_cast<size_t>(i)].next) {
    const int32_t id = symbols[static_cast<size_t>(i)].id;
    if (id >= 0) out.push_back(id);
  }
}

std::string BpeModel::describe() const {
  std::string out = rank_source == BpeRankSource::kPairRanks
                        ? "merges by merge-list rank"
                        : "merges by piece rank";
  out += unit == BpeUnit::kByte ? " over bytes" : " over code points";
  if (ignore_merges) out += ", whole-word lookup first";
  if (has_byte_fallback) out += ", <0xXX> byte fallback";
  if (unk_id >= 0) out += ", unknown id " + std::to_string(unk_id);
  for (const std::string& marker : boundary_markers) out += ", words cut before '" + marker + "'";
  return out;
}

std::vector<int32_t> ranks_from_scores(const std::vector<float>& scores) {
  // A NaN score (a corrupt file) ranks last instead of breaking the ordering.
  auto clean = [](float s) { return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s; };
  std::map<float, int32_t, std::greater<float>> order;
  for (float s : scores) order.emplace(clean(s), 0);
  int32_t next = 0;
  for (auto& [score, rank] : order) rank = next++;
  std::vector<int32_t> ranks(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) ranks[i] = order[clean(scores[i])];
  return ranks;
}

}  // namespace tachyon
