// The paged KV cache storage: per layer, K and V pools of fixed-size blocks
// [num_blocks, block_size, num_kv_heads, head_dim]. Which blocks a sequence owns is the
// BlockAllocator's and the BlockTable's business; attention reads through block tables and
// nothing ever copies a sequence's cache to make it contiguous.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kv/block_manager.h"

namespace tachyon {

struct KvCacheConfig {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int num_blocks = 0;
  DType dtype = DType::kF32;  // the CPU reference cache is f32
  Device device = Device::cpu();

  // Bytes one token occupies across all layers (K and V).
  size_t bytes_per_token() const;
  size_t bytes_per_block() const { return bytes_per_token() * static_cast<size_t>(block_size); }
  // How many blocks fit in `budget_bytes`.
  int blocks_for_budget(size_t budget_bytes) const;
};

class KvCache {
 public:
  static Result<KvCache> create(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  // Unique per cache made in this process (what a captured graph that writes it is keyed by).
  uint64_t id() const { return id_; }
  Tensor& k(int layer) { return k_[static_cast<size_t>(layer)]; }  // [num_blocks, block_size, num_kv_heads, head_dim]
  Tensor& v(int layer) { return v_[static_cast<size_t>(layer)]; }  // same
  size_t nbytes() const { return config_.bytes_per_block() * static_cast<size_t>(config_.num_blocks); }
  // Runs copy-on-write copies: block src's K and V, in every layer, into block dst.
  void copy_blocks(std::span<const BlockCopy> copies);
  // Copies slot src's K and V, in every layer, to slot dst, in order (a later copy may read what
  // an earlier one wrote).
  void copy_slots(std::span<const SlotCopy> copies);

 private:
  KvCacheConfig config_;
  uint64_t id_ = 0;
  std::vector<Tensor> k_;
  std::vector<Tensor> v_;
};

}  // namespace tachyon
