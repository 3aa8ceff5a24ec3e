#include "kv/block_allocator.h"

namespace tachyon {

BlockAllocator::BlockAllocator(int num_blocks) : ref_counts_(static_cast<size_t>(num_blocks), 0) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

Result<std::vector<int32_t>> BlockAllocator::allocate(int n) {
  if (n < 0 || n > num_free()) {
    return make_error(ErrorCode::kOutOfRange, "kv cache: need {} blocks, {} of {} free", n, num_free(), num_blocks());
  }
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (auto& b : out) {
    b = free_.back();
    free_.pop_back();
    ref_counts_[static_cast<size_t>(b)] = 1;
  }
  return out;
}

void BlockAllocator::retain(int32_t block) {
  TACHYON_CHECK(block >= 0 && block < num_blocks() && ref_counts_[static_cast<size_t>(block)] > 0,
                "retain of free or invalid block {}", block);
  ++ref_counts_[static_cast<size_t>(block)];
}

void BlockAllocator::release(int32_t block) {
  TACHYON_CHECK(block >= 0 && block < num_blocks() && ref_counts_[static_cast<size_t>(block)] > 0,
                "release of free or invalid block {}", block);
  if (--ref_counts_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

Status BlockTable::grow_to(int new_num_tokens, BlockAllocator& allocator) {
  if (new_num_tokens <= num_tokens_) return Status::Ok();
  const int need = (new_num_tokens + block_size_ - 1) / block_size_ - static_cast<int>(blocks_.size());
  if (need > 0) {
    TACHYON_ASSIGN_OR_RETURN(auto fresh, allocator.allocate(need));
    blocks_.insert(blocks_.end(), fresh.begin(), fresh.end());
  }
  num_tokens_ = new_num_tokens;
  return Status::Ok();
}

void BlockTable::truncate(int new_num_tokens, BlockAllocator& allocator) {
  if (new_num_tokens >= num_tokens_) return;
  if (new_num_tokens < 0) new_num_tokens = 0;
  const size_t keep = static_cast<size_t>((new_num_tokens + block_size_ - 1) / block_size_);
  while (blocks_.size() > keep) {
    allocator.release(blocks_.back());
    blocks_.pop_back();
  }
  num_tokens_ = new_num_tokens;
}

void BlockTable::release_all(BlockAllocator& allocator) { truncate(0, allocator); }

int32_t BlockTable::slot(int position) const {
  TACHYON_CHECK(position >= 0 && position < num_tokens_, "slot of position {} in a table of {} tokens", position,
                num_tokens_);
  return blocks_[static_cast<size_t>(position / block_size_)] * block_size_ + position % block_size_;
}

}  // namespace tachyon
