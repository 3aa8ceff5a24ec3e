// Hands out KV blocks by id from a free list, with reference counts so that a block can be
// shared (forked sequences, prefix caching) and is free again only when its last owner lets go.
// Allocation is all-or-nothing: a request for n blocks either gets n or changes nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace tachyon {

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);

  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return num_blocks() - num_free(); }

  // n fresh blocks with ref count 1, or OutOfRange (and nothing taken) if fewer are free.
  Result<std::vector<int32_t>> allocate(int n);
  // Another owner for an allocated block.
  void retain(int32_t block);
  // Drops one owner; the block returns to the free list at zero.
  void release(int32_t block);
  int ref_count(int32_t block) const { return ref_counts_[static_cast<size_t>(block)]; }

 private:
  std::vector<int32_t> free_;        // LIFO: recently freed blocks are reused first (warm in cache)
  std::vector<int32_t> ref_counts_;  // [num_blocks]
};

// The blocks one sequence owns, in order: token at position p lives in block
// blocks[p / block_size] at offset p % block_size.
class BlockTable {
 public:
  explicit BlockTable(int block_size) : block_size_(block_size) {}

  int block_size() const { return block_size_; }
  int num_tokens() const { return num_tokens_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }

  // Makes room for `new_num_tokens` tokens, taking blocks from `allocator` as needed.
  // All-or-nothing: on OutOfRange nothing is allocated and num_tokens is unchanged.
  Status grow_to(int new_num_tokens, BlockAllocator& allocator);
  // Shrinks to `new_num_tokens` (rolls back tokens), releasing blocks no longer needed.
  void truncate(int new_num_tokens, BlockAllocator& allocator);
  // Releases every block.
  void release_all(BlockAllocator& allocator);
  // Slot (block * block_size + offset) of the token at `position` (< num_tokens).
  int32_t slot(int position) const;

 private:
  int block_size_;
  int num_tokens_ = 0;
  std::vector<int32_t> blocks_;
};

}  // namespace tachyon
