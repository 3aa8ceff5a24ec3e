#include "kv/block_manager.h"

#include <algorithm>
#include <cstring>

namespace tachyon {
namespace {

constexpr uint64_t kRootHash = 0x6a09e667f3bcc908ull;  // parent hash of a sequence's first block

// splitmix64's finalizer: a bijective 64-bit mix with full avalanche.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

const char* kv_history_name(KvHistory history) {
  switch (history) {
    case KvHistory::kSame: return "same";
    case KvHistory::kDrop: return "drop";
    case KvHistory::kInt8: return "int8";
    case KvHistory::kInt4: return "int4";
  }
  return "?";
}

int32_t BlockTable::slot(int position) const {
  TACHYON_CHECK(position >= first_resident_position() && position < num_tokens_,
                "slot of position {} in a table of {} tokens (the first {} released)", position, num_tokens_,
                first_resident_position());
  return blocks_[static_cast<size_t>(position / block_size_)] * block_size_ + position % block_size_;
}

BlockManager::BlockManager(const BlockManagerOptions& options)
    : block_size_(options.block_size), prefix_caching_(options.prefix_caching), tiers_(options.tiers) {
  TACHYON_CHECK(options.num_blocks >= 0 && options.block_size > 0, "block manager: {} blocks of {} tokens",
                options.num_blocks, options.block_size);
  TACHYON_CHECK(options.tiers.window >= 0 && options.num_history_blocks >= 0,
                "block manager: kv window {}, {} history blocks", options.tiers.window, options.num_history_blocks);
  history_refs_.assign(static_cast<size_t>(options.num_history_blocks), 0);
  for (int32_t h = options.num_history_blocks - 1; h >= 0; --h) history_free_.push_back(h);
  meta_.resize(static_cast<size_t>(options.num_blocks));
  free_.reserve(meta_.size());
  for (int32_t b = options.num_blocks - 1; b >= 0; --b) free_.push_back(b);  // block 0 handed out first
  if (prefix_caching_) registered_tokens_.resize(meta_.size() * static_cast<size_t>(block_size_));
}

uint64_t BlockManager::hash_block(uint64_t parent, std::span<const int32_t> tokens) const {
  uint64_t h = mix64(parent ^ static_cast<uint64_t>(tokens.size()));
  for (int32_t t : tokens) h = mix64(h ^ static_cast<uint32_t>(t));
  return h;
}

int BlockManager::blocks_needed(const BlockTable& table, int num_tokens) const {
  const int have = static_cast<int>(table.blocks_.size());
  const int want = (num_tokens + block_size_ - 1) / block_size_;
  return std::max(0, want - have);
}

void BlockManager::lru_push_back(int32_t b) {
  Meta& m = meta_[static_cast<size_t>(b)];
  m.lru_prev = lru_tail_;
  m.lru_next = -1;
  if (lru_tail_ >= 0) {
    meta_[static_cast<size_t>(lru_tail_)].lru_next = b;
  } else {
    lru_head_ = b;
  }
  lru_tail_ = b;
  ++num_cached_;
}

void BlockManager::lru_remove(int32_t b) {
  Meta& m = meta_[static_cast<size_t>(b)];
  if (m.lru_prev >= 0) {
    meta_[static_cast<size_t>(m.lru_prev)].lru_next = m.lru_next;
  } else {
    lru_head_ = m.lru_next;
  }
  if (m.lru_next >= 0) {
    meta_[static_cast<size_t>(m.lru_next)].lru_prev = m.lru_prev;
  } else {
    lru_tail_ = m.lru_prev;
  }
  m.lru_prev = m.lru_next = -1;
  --num_cached_;
}

void BlockManager::unregister(int32_t b) {
  Meta& m = meta_[static_cast<size_t>(b)];
  if (!m.registered) return;
  map_.erase(m.hash);
  m.registered = false;
}

int32_t BlockManager::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    TACHYON_CHECK(lru_head_ >= 0, "take_block with no block available");
    b = lru_head_;  // evict the least recently released cached block
    lru_remove(b);
    unregister(b);
    ++stats_.evictions;
  }
  meta_[static_cast<size_t>(b)].ref_count = 1;
  return b;
}

void BlockManager::retain(int32_t b) {
  if (is_history(b)) {
    ++history_refs_[static_cast<size_t>(b - num_blocks())];
    return;
  }
  Meta& m = meta_[static_cast<size_t>(b)];
  if (m.ref_count == 0) {
    TACHYON_CHECK(m.registered, "retain of free block {}", b);
    lru_remove(b);  // a cached block comes back into use
  }
  ++m.ref_count;
}

void BlockManager::release(int32_t b) {
  if (is_history(b)) {
    const int32_t h = b - num_blocks();
    TACHYON_CHECK(history_refs_[static_cast<size_t>(h)] > 0, "release of unreferenced history block {}", h);
    if (--history_refs_[static_cast<size_t>(h)] == 0) history_free_.push_back(h);
    return;
  }
  Meta& m = meta_[static_cast<size_t>(b)];
  TACHYON_CHECK(m.ref_count > 0, "release of unreferenced block {}", b);
  if (--m.ref_count > 0) return;
  if (m.registered) {
    lru_push_back(b);
  } else {
    free_.push_back(b);
  }
}

int BlockManager::match_prefix(BlockTable& table, std::span<const int32_t> tokens, int max_tokens) {
  TACHYON_CHECK(table.blocks_.empty() && table.block_size_ == block_size_, "match_prefix needs an empty table");
  if (!prefix_caching_) return 0;
  const int limit = std::min<int>(max_tokens, static_cast<int>(tokens.size())) / block_size_;
  uint64_t parent = kRootHash;
  for (int i = 0; i < limit; ++i) {
    const auto block_tokens_span = tokens.subspan(static_cast<size_t>(i) * block_size_, static_cast<size_t>(block_size_));
    const uint64_t h = hash_block(parent, block_tokens_span);
    const auto it = map_.find(h);
    if (it == map_.end()) break;
    const int32_t b = it->second;
    const Meta& m = meta_[static_cast<size_t>(b)];
    if (m.parent_hash != parent ||
        !std::equal(block_tokens_span.begin(), block_tokens_span.end(), block_tokens(b))) {
      break;  // a hash collision: treat as a miss
    }
    retain(b);
    table.blocks_.push_back(b);
    table.hashes_.push_back(h);
    parent = h;
  }
  table.num_tokens_ = static_cast<int>(table.blocks_.size()) * block_size_;
  return table.num_tokens_;
}

Status BlockManager::grow_to(BlockTable& table, int num_tokens) {
  if (num_tokens <= table.num_tokens_) return Status::Ok();
  const int need = blocks_needed(table, num_tokens);
  if (need > num_available()) {
    return make_error(ErrorCode::kOutOfRange, "kv cache: need {} more blocks, {} of {} available", need,
                      num_available(), num_blocks());
  }
  for (int i = 0; i < need; ++i) table.blocks_.push_back(take_block());
  table.num_tokens_ = num_tokens;
  return Status::Ok();
}

Status BlockManager::take_history(BlockTable& table, int count) {
  TACHYON_CHECK(table.blocks_.empty() && table.block_size_ == block_size_ && count >= 0,
                "take_history of {} blocks needs an empty table", count);
  if (count > num_history_free()) {
    return make_error(ErrorCode::kOutOfRange, "kv cache: need {} history blocks, {} of {} free", count,
                      num_history_free(), num_history_blocks());
  }
  for (int i = 0; i < count; ++i) {
    const int32_t h = history_free_.back();
    history_free_.pop_back();
    history_refs_[static_cast<size_t>(h)] = 1;
    table.blocks_.push_back(num_blocks() + h);
  }
  table.num_history_ = count;
  table.num_tokens_ = count * block_size_;
  return Status::Ok();
}

Status BlockManager::prepare_write(BlockTable& table, int begin, int end, std::vector<BlockCopy>& copies) {
  TACHYON_CHECK(begin >= 0 && begin <= end && end <= table.num_tokens_, "prepare_write [{}, {}) of {} tokens", begin,
                end, table.num_tokens_);
  if (begin == end) return Status::Ok();
  TACHYON_CHECK(begin >= table.first_resident_position(), "prepare_write at {} before the first resident position {}",
                begin, table.first_resident_position());
  const size_t first = static_cast<size_t>(begin / block_size_);
  const size_t last = static_cast<size_t>((end - 1) / block_size_);
  int shared = 0;
  for (size_t i = first; i <= last; ++i) shared += meta_[static_cast<size_t>(table.blocks_[i])].ref_count > 1;
  if (shared > num_available()) {
    return make_error(ErrorCode::kOutOfRange, "kv cache: copy-on-write needs {} blocks, {} of {} available", shared,
                      num_available(), num_blocks());
  }
  for (size_t i = first; i <= last; ++i) {
    int32_t& b = table.blocks_[i];
    if (meta_[static_cast<size_t>(b)].ref_count > 1) {
      const int32_t copy = take_block();
      copies.push_back({b, copy});
      release(b);
      b = copy;
    } else {
      unregister(b);  // its contents are about to change
    }
  }
  // Blocks from `first` on no longer hold what their hashes described.
  if (table.hashes_.size() > first) table.hashes_.resize(first);
  return Status::Ok();
}

void BlockManager::commit(BlockTable& table, std::span<const int32_t> tokens, int num_computed) {
  TACHYON_CHECK(num_computed <= table.num_tokens_ && static_cast<size_t>(num_computed) <= tokens.size(),
                "commit of {} tokens: table holds {}, sequence has {}", num_computed, table.num_tokens_, tokens.size());
  const size_t full = static_cast<size_t>(num_computed / block_size_);
  while (table.hashes_.size() < full) {
    const size_t i = table.hashes_.size();
    const uint64_t parent = i == 0 ? kRootHash : table.hashes_[i - 1];
    const auto span = tokens.subspan(i * static_cast<size_t>(block_size_), static_cast<size_t>(block_size_));
    const uint64_t h = hash_block(parent, span);
    table.hashes_.push_back(h);
    const int32_t b = table.blocks_[i];
    if (!prefix_caching_ || b == kReleasedBlock || is_history(b)) continue;  // never shared
    Meta& m = meta_[static_cast<size_t>(b)];
    if (m.registered || map_.count(h) != 0) continue;  // already cached (this block or a twin)
    m.registered = true;
    m.hash = h;
    m.parent_hash = parent;
    std::copy(span.begin(), span.end(),
              registered_tokens_.begin() + static_cast<ptrdiff_t>(b) * static_cast<ptrdiff_t>(block_size_));
    map_.emplace(h, b);
  }
}

void BlockManager::truncate(BlockTable& table, int num_tokens) {
  num_tokens = std::max(num_tokens, 0);
  if (num_tokens >= table.num_tokens_) return;
  const size_t keep = static_cast<size_t>((num_tokens + block_size_ - 1) / block_size_);
  TACHYON_CHECK(num_tokens >= table.first_resident_position(), "truncate to {} tokens, the first {} released",
                num_tokens, table.first_resident_position());
  while (table.blocks_.size() > keep) {
    release(table.blocks_.back());
    table.blocks_.pop_back();
  }
  table.num_tokens_ = num_tokens;
  const size_t full = static_cast<size_t>(num_tokens / block_size_);
  if (table.hashes_.size() > full) table.hashes_.resize(full);
}

void BlockManager::fork(const BlockTable& src, BlockTable& dst) {
  TACHYON_CHECK(dst.blocks_.empty() && dst.block_size_ == src.block_size_, "fork into a non-empty table");
  for (int32_t b : src.blocks_) {
    if (b != kReleasedBlock) retain(b);
  }
  dst.blocks_ = src.blocks_;
  dst.hashes_ = src.hashes_;
  dst.num_tokens_ = src.num_tokens_;
  dst.num_released_ = src.num_released_;
  dst.num_history_ = src.num_history_;
}

void BlockManager::free(BlockTable& table) {
  for (auto it = table.blocks_.rbegin(); it != table.blocks_.rend(); ++it) {
    if (*it != kReleasedBlock) release(*it);
  }
  table.blocks_.clear();
  table.hashes_.clear();
  table.num_tokens_ = 0;
  table.num_released_ = 0;
  table.num_history_ = 0;
}

void BlockManager::release_before(BlockTable& table, int position) {
  const int whole = std::max(position, 0) / block_size_;  // blocks wholly before `position`
  if (whole <= table.num_released_) return;
  const int held = std::min<int>(whole, static_cast<int>(table.blocks_.size()));
  for (int i = table.num_released_; i < held; ++i) {
    release(table.blocks_[static_cast<size_t>(i)]);
    table.blocks_[static_cast<size_t>(i)] = kReleasedBlock;
  }
  while (static_cast<int>(table.blocks_.size()) < whole) table.blocks_.push_back(kReleasedBlock);
  table.num_released_ = whole;
  table.num_tokens_ = std::max(table.num_tokens_, whole * block_size_);
}

void BlockManager::retire(BlockTable& table, int num_computed) {
  if (!tiers_.active()) return;
  // The next query, at position num_computed, sees keys from num_computed - window + 1 on.
  const int first_visible = num_computed - tiers_.window + 1;
  if (tiers_.history == KvHistory::kDrop) {
    release_before(table, first_visible);
    return;
  }
  // int8 / int4: the leading full-precision blocks wholly before first_visible, in order.
  const int whole = std::min<int>(std::max(first_visible, 0) / block_size_, static_cast<int>(table.blocks_.size()));
  for (int i = table.num_released_ + table.num_history_; i < whole && !history_free_.empty(); ++i) {
    int32_t& b = table.blocks_[static_cast<size_t>(i)];
    const int32_t h = history_free_.back();
    history_free_.pop_back();
    history_refs_[static_cast<size_t>(h)] = 1;
    compressions_.push_back({b, h});
    release(b);  // registered: cached for prefix hits, its K/V kept until evicted
    b = num_blocks() + h;
    ++table.num_history_;
  }
}

void BlockManager::clear_prefix_cache() {
  while (lru_head_ >= 0) {
    const int32_t b = lru_head_;
    lru_remove(b);
    unregister(b);
    free_.push_back(b);
  }
}

Status BlockManager::check(std::span<const BlockTable* const> tables) const {
  std::vector<int32_t> refs(meta_.size(), 0);
  std::vector<int32_t> history_refs(history_refs_.size(), 0);
  for (const BlockTable* t : tables) {
    if (t->blocks_.size() != static_cast<size_t>((t->num_tokens_ + block_size_ - 1) / block_size_)) {
      return make_error(ErrorCode::kInternal, "table of {} tokens holds {} blocks", t->num_tokens_, t->blocks_.size());
    }
    if (t->hashes_.size() > static_cast<size_t>(t->num_tokens_ / block_size_)) {
      return make_error(ErrorCode::kInternal, "table of {} tokens has {} block hashes", t->num_tokens_,
                        t->hashes_.size());
    }
    if (t->num_released_ < 0 || t->num_history_ < 0 ||
        static_cast<size_t>(t->num_released_ + t->num_history_) > t->blocks_.size()) {
      return make_error(ErrorCode::kInternal, "table of {} blocks has {} released and {} history", t->blocks_.size(),
                        t->num_released_, t->num_history_);
    }
    for (size_t i = 0; i < t->blocks_.size(); ++i) {
      const int32_t b = t->blocks_[i];
      const bool released = i < static_cast<size_t>(t->num_released_);
      const bool history = !released && i < static_cast<size_t>(t->num_released_ + t->num_history_);
      if (released != (b == kReleasedBlock) || history != (b >= num_blocks())) {
        return make_error(ErrorCode::kInternal, "table entry {} is {} with {} leading entries released, {} history", i,
                          b, t->num_released_, t->num_history_);
      }
      if (released) continue;
      if (history) {
        if (b - num_blocks() >= num_history_blocks()) return make_error(ErrorCode::kInternal, "history block id {}", b);
        ++history_refs[static_cast<size_t>(b - num_blocks())];
        continue;
      }
      if (b < 0) return make_error(ErrorCode::kInternal, "block id {}", b);
      ++refs[static_cast<size_t>(b)];
    }
  }
  std::vector<uint8_t> pool(meta_.size(), 0);  // 1 free, 2 cached
  for (int32_t b : free_) {
    if (pool[static_cast<size_t>(b)] != 0) return make_error(ErrorCode::kInternal, "block {} twice in free list", b);
    pool[static_cast<size_t>(b)] = 1;
  }
  int cached = 0;
  for (int32_t b = lru_head_, prev = -1; b >= 0; prev = b, b = meta_[static_cast<size_t>(b)].lru_next) {
    if (meta_[static_cast<size_t>(b)].lru_prev != prev) return make_error(ErrorCode::kInternal, "lru links at {}", b);
    if (pool[static_cast<size_t>(b)] != 0) return make_error(ErrorCode::kInternal, "block {} free and cached", b);
    pool[static_cast<size_t>(b)] = 2;
    if (++cached > num_blocks()) return make_error(ErrorCode::kInternal, "lru list has a cycle");
  }
  if (cached != num_cached_) return make_error(ErrorCode::kInternal, "{} cached blocks counted as {}", cached, num_cached_);
  size_t registered = 0;
  for (size_t b = 0; b < meta_.size(); ++b) {
    const Meta& m = meta_[b];
    if (m.ref_count != refs[b]) {
      return make_error(ErrorCode::kInternal, "block {}: ref count {} but {} owners", b, m.ref_count, refs[b]);
    }
    const uint8_t want_pool = m.ref_count > 0 ? 0 : m.registered ? 2 : 1;
    if (pool[b] != want_pool) {
      return make_error(ErrorCode::kInternal, "block {} (ref {}, registered {}) in pool {}", b, m.ref_count,
                        m.registered, pool[b]);
    }
    if (m.registered) {
      ++registered;
      const auto it = map_.find(m.hash);
      if (it == map_.end() || it->second != static_cast<int32_t>(b)) {
        return make_error(ErrorCode::kInternal, "registered block {} missing from the hash map", b);
      }
    }
  }
  if (registered != map_.size()) {
    return make_error(ErrorCode::kInternal, "{} registered blocks, {} hash entries", registered, map_.size());
  }
  std::vector<uint8_t> history_free(history_refs_.size(), 0);
  for (int32_t h : history_free_) {
    if (h < 0 || h >= num_history_blocks() || history_free[static_cast<size_t>(h)] != 0) {
      return make_error(ErrorCode::kInternal, "history block {} in the free list twice or out of range", h);
    }
    history_free[static_cast<size_t>(h)] = 1;
  }
  for (size_t h = 0; h < history_refs_.size(); ++h) {
    if (history_refs_[h] != history_refs[h] || (history_refs_[h] == 0) != (history_free[h] == 1)) {
      return make_error(ErrorCode::kInternal, "history block {}: ref count {} but {} owners, {}free", h,
                        history_refs_[h], history_refs[h], history_free[h] ? "" : "not ");
    }
  }
  if (num_used() + num_cached() + num_free() != num_blocks()) {
    return make_error(ErrorCode::kInternal, "accounting: used {} + cached {} + free {} != {}", num_used(), num_cached(),
                      num_free(), num_blocks());
  }
  return Status::Ok();
}

}  // namespace tachyon
