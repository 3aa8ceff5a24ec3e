// The paged KV cache's bookkeeping: which block ids are free, which are owned (and by how many
// sequences), and which hold a reusable prefix. Storage lives in KvCache; this file never touches
// K/V data — where data must move (copy-on-write) it returns the copies for the caller to run.
//
// Every block is in exactly one of three pools:
//   used    ref_count > 0: in at least one BlockTable (and maybe also in the prefix cache)
//   cached  ref_count == 0, registered in the prefix cache: reusable by a later request, evicted
//           least-recently-released first, and only when no free block is left
//   free    ref_count == 0, not registered
// num_used() + num_cached() + num_free() == num_blocks() at all times.
//
// Prefix caching: when a full block's K/V are written (commit()), the block is registered under a
// hash chained over (parent block's hash, the block's token ids). A new sequence's match_prefix()
// walks its tokens block by block and reuses every registered block along the chain. A 64-bit hash
// alone could collide, so the cache also keeps each registered block's tokens and parent hash and
// a hit must match both.
//
// Writes go only to private blocks: prepare_write() gives a sequence its own copy of any block in
// the range it is about to write that another table shares (copy-on-write), and unregisters a
// private block from the prefix cache before its contents change (truncate then append).
//
// KV tiers (long context): with a window W, the blocks that every future query can only see as
// history, those wholly before position num_computed - W + 1, leave the full-precision pool when
// the scheduler retires them. KvHistory::kDrop releases them (a true sliding window: attention
// sees the last W positions only, and a sequence holds about W positions of blocks however long
// it runs); their table entries become kReleasedBlock. A table's released entries are always its
// leading ones, and nothing is ever written to or read from them. KvHistory::kInt8 / kInt4 move
// them into a second, smaller pool of history blocks (ops.h KvLayer): retire() takes a history
// block, queues the re-quantization of the full-precision block into it (take_compressions();
// the caller runs them before anything else writes the cache) and releases the full-precision
// block. History block h has the table id num_blocks() + h; its entries follow the released
// ones, and history blocks are never shared with the prefix cache (fork() shares them).
// When the history pool is full a block simply stays as it is until a later retire().
//
// Every operation that allocates is all-or-nothing: on OutOfRange nothing changed.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace tachyon {

// What happens to a sequence's blocks once they leave the window of recent positions.
enum class KvHistory : uint8_t {
  kSame,  // they stay as they are (full attention, full precision)
  kDrop,  // they are freed: attention sees only the window (a sliding window)
  kInt8,  // re-quantized to int8 history blocks (full attention)
  kInt4,  // re-quantized to int4 history blocks (full attention)
};
const char* kv_history_name(KvHistory history);

// The KV cache's tiers: the KV cache config's (KvCacheConfig::tiers) one owner.
struct KvTierOptions {
  int window = 0;  // positions kept in the cache dtype, the newest; 0: no window (every position)
  KvHistory history = KvHistory::kSame;
  bool active() const { return window > 0 && history != KvHistory::kSame; }
  // The attention window the tiers impose (0: none): drop attends to the window only.
  int attention_window() const { return window > 0 && history == KvHistory::kDrop ? window : 0; }
  // Bits per code of the history blocks (8, 4), or 0 without a history pool.
  int history_bits() const {
    return window <= 0 ? 0 : history == KvHistory::kInt8 ? 8 : history == KvHistory::kInt4 ? 4 : 0;
  }
};

// A table entry whose block was released (KvHistory::kDrop): never read, never written.
inline constexpr int32_t kReleasedBlock = -1;

struct BlockManagerOptions {
  int num_blocks = 0;
  int block_size = 0;   // tokens per block: the KV cache config's (KvCacheConfig::block_size)
  bool prefix_caching = true;
  KvTierOptions tiers;  // the KV cache config's (KvCacheConfig::tiers)
  int num_history_blocks = 0;  // with int8 / int4 history: the history pool's (KvCacheConfig's)
};

// One block moving into history: block src's K/V (every layer) re-quantized into history block
// dst (its index in the history pool, table id num_blocks + dst).
struct BlockCompression {
  int32_t src = -1;
  int32_t dst = -1;
};

// One copy-on-write: copy block src's K/V (every layer) into block dst before the step runs.
struct BlockCopy {
  int32_t src = -1;
  int32_t dst = -1;
};

// One token's K/V moved between cache slots (block * block_size + offset), in every layer: how
// the accepted branch of a verified token tree joins its sequence's positions.
struct SlotCopy {
  int32_t src = -1;
  int32_t dst = -1;
};

// The blocks one sequence owns, in order: the token at position p lives in block
// blocks()[p / block_size] at offset p % block_size. Changed only through a BlockManager.
class BlockTable {
 public:
  explicit BlockTable(int block_size) : block_size_(block_size) {}

  int block_size() const { return block_size_; }
  int num_tokens() const { return num_tokens_; }  // positions the table has room for
  // [ceil(num_tokens / block_size)]: the first num_released() are kReleasedBlock.
  const std::vector<int32_t>& blocks() const { return blocks_; }
  bool empty() const { return blocks_.empty(); }
  int num_released() const { return num_released_; }
  int num_history() const { return num_history_; }  // entries after the released ones: history blocks
  // Full-precision blocks the table holds (its entries less the released and history ones).
  int num_resident() const { return static_cast<int>(blocks_.size()) - num_released_ - num_history_; }
  // The first position whose K/V the table holds at all (0 unless blocks were released).
  int first_known_position() const { return num_released_ * block_size_; }
  // The first position whose K/V lie in full-precision blocks: slots, writes and truncation start
  // here (history and released blocks are never written).
  int first_resident_position() const { return (num_released_ + num_history_) * block_size_; }
  // Slot (block * block_size + offset) of the token at `position` (< num_tokens).
  int32_t slot(int position) const;
  // Chained hashes of the leading full blocks whose K/V are known (committed or matched).
  const std::vector<uint64_t>& block_hashes() const { return hashes_; }

 private:
  friend class BlockManager;
  int block_size_;
  int num_tokens_ = 0;
  int num_released_ = 0;          // leading entries of blocks_ that are kReleasedBlock
  int num_history_ = 0;           // the entries after them that are history blocks
  std::vector<int32_t> blocks_;
  std::vector<uint64_t> hashes_;  // hashes_.size() <= num_tokens_ / block_size_
};

struct PrefixCacheStats {
  int64_t query_tokens = 0;  // tokens of admitted sequences
  int64_t hit_tokens = 0;    // of which found in the prefix cache
  int64_t evictions = 0;     // cached blocks reclaimed for new data
  double hit_rate() const { return query_tokens > 0 ? static_cast<double>(hit_tokens) / query_tokens : 0.0; }
};

class BlockManager {
 public:
  explicit BlockManager(const BlockManagerOptions& options);

  int num_blocks() const { return static_cast<int>(meta_.size()); }
  int block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  const KvTierOptions& tiers() const { return tiers_; }
  int num_history_blocks() const { return static_cast<int>(history_refs_.size()); }
  int num_history_free() const { return static_cast<int>(history_free_.size()); }
  int num_history_used() const { return num_history_blocks() - num_history_free(); }
  // Re-quantizations queued by retire(), in order; the caller runs them (KvCache::compress_blocks)
  // before anything writes the cache again (a source block may be handed out at once).
  std::vector<BlockCompression> take_compressions() { return std::exchange(compressions_, {}); }
  bool has_compressions() const { return !compressions_.empty(); }
  int num_used() const { return num_blocks() - num_free() - num_cached(); }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_cached() const { return num_cached_; }
  // Blocks an allocation can take now: free ones, then cached ones by eviction.
  int num_available() const { return num_free() + num_cached(); }
  int ref_count(int32_t block) const { return meta_[static_cast<size_t>(block)].ref_count; }
  const PrefixCacheStats& prefix_stats() const { return stats_; }

  // Fresh blocks `table` needs to hold `num_tokens` tokens.
  int blocks_needed(const BlockTable& table, int num_tokens) const;

  // On an empty table: reuses the longest chain of cached full blocks that matches the start of
  // `tokens`, covering at most `max_tokens` tokens; returns how many tokens it covers (a multiple
  // of the block size; 0 without prefix caching).
  int match_prefix(BlockTable& table, std::span<const int32_t> tokens, int max_tokens);
  // Hit-rate accounting, by the caller that decides a match is used (a sequence admitted).
  void record_prefix_query(int64_t query_tokens, int64_t hit_tokens) {
    stats_.query_tokens += query_tokens;
    stats_.hit_tokens += hit_tokens;
  }
  // Makes room for `num_tokens` tokens (no-op when it already has room).
  Status grow_to(BlockTable& table, int num_tokens);
  // Starts an empty table with `count` fresh history blocks, its positions [0, count * block_size)
  // (a sequence whose older K/V arrive already re-quantized: a disaggregated transfer).
  // kOutOfRange, with nothing taken, when fewer history blocks are free.
  Status take_history(BlockTable& table, int count);
  // Before writing positions [begin, end) of `table` (end <= num_tokens): every block in the range
  // that is shared gets replaced by a private copy, whose copy is appended to `copies`; a private
  // block registered in the prefix cache is unregistered.
  Status prepare_write(BlockTable& table, int begin, int end, std::vector<BlockCopy>& copies);
  // The K/V of positions [0, num_computed) of `table` are written, and `tokens` are the
  // sequence's tokens (at least num_computed of them): hashes the newly full blocks and, with
  // prefix caching, registers them.
  void commit(BlockTable& table, std::span<const int32_t> tokens, int num_computed);
  // Keeps the first `num_tokens` positions (rolls back the rest), releasing blocks no longer needed.
  // Never below the table's first resident position.
  void truncate(BlockTable& table, int num_tokens);
  // Releases the table's blocks that lie wholly before `position` (their entries become
  // kReleasedBlock), first the oldest; where the table is shorter, it grows with released entries
  // up to the block that holds `position` (a sequence adopted with only its recent K/V).
  void release_before(BlockTable& table, int position);
  // After the K/V of positions [0, num_computed) are written (commit()): applies the tiers to the
  // blocks no query from num_computed on can see in the window. Drop releases them; int8 / int4
  // move them into history blocks (queued compressions) while the history pool has room; without
  // active tiers nothing happens. Positions from num_computed on (a draft that may roll back)
  // are never touched. A table shorter than the released range grows with released entries.
  void retire(BlockTable& table, int num_computed);
  // dst (empty) shares every block of src.
  void fork(const BlockTable& src, BlockTable& dst);
  // Releases every block of `table`, last block first (so a sequence's tail is evicted before
  // its head, which other requests are likelier to share).
  void free(BlockTable& table);
  // Drops every cached (unreferenced) block from the prefix cache.
  void clear_prefix_cache();

  // Checks every invariant against the full set of live tables (tests and debug builds).
  Status check(std::span<const BlockTable* const> tables) const;

 private:
  struct Meta {
    int32_t ref_count = 0;
    bool registered = false;  // in map_ under `hash`
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    int32_t lru_prev = -1;    // cached list links (ref_count == 0 && registered)
    int32_t lru_next = -1;
  };

  uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens) const;
  int32_t take_block();                 // a block with ref_count 1 (caller checked availability)
  void release(int32_t block);
  void retain(int32_t block);
  void unregister(int32_t block);
  void lru_push_back(int32_t block);
  void lru_remove(int32_t block);
  const int32_t* block_tokens(int32_t block) const {
    return registered_tokens_.data() + static_cast<size_t>(block) * static_cast<size_t>(block_size_);
  }

  bool is_history(int32_t id) const { return id >= num_blocks(); }

  int block_size_;
  bool prefix_caching_;
  KvTierOptions tiers_;
  std::vector<int32_t> history_refs_;            // [num_history_blocks]: ref counts
  std::vector<int32_t> history_free_;            // LIFO of history indices
  std::vector<BlockCompression> compressions_;   // queued by retire()
  std::vector<Meta> meta_;                       // [num_blocks]
  std::vector<int32_t> free_;                    // LIFO
  int32_t lru_head_ = -1, lru_tail_ = -1;        // cached blocks, least recently released first
  int num_cached_ = 0;
  std::unordered_map<uint64_t, int32_t> map_;    // hash -> registered block
  std::vector<int32_t> registered_tokens_;       // [num_blocks, block_size]: tokens of registered blocks
  PrefixCacheStats stats_;
};

}  // namespace tachyon
