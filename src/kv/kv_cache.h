// History (long context): with int8 / int4 history the layers also hold the history pools of
// ops.h KvLayer, [num_history_blocks, ...], filled by compress_blocks().
// The paged KV cache storage: per layer, K and V pools of fixed-size blocks
// [num_blocks, block_size, num_kv_heads, head_dim], and for a quantized cache (i8, f8e4m3) their
// scale pools [num_blocks, block_size, num_kv_heads, 1] f32 (ops.h KvLayer). Which blocks a
// sequence owns is the BlockAllocator's and the BlockTable's business; attention reads through
// block tables and nothing ever copies a sequence's cache to make it contiguous. Every copy
// (copy-on-write, slot moves, transfers) moves a slot's codes and scales together: a layer's
// pools(), all indexed [block, offset, head, ...] alike.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kv/block_manager.h"
#include "ops/ops.h"

namespace tachyon {

// Tokens per KV block when nothing else is asked for.
inline constexpr int kDefaultBlockSize = 16;

struct KvCacheConfig {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = kDefaultBlockSize;
  int num_blocks = 0;
  DType dtype = DType::kF32;  // f32 (the CPU reference), f16, bf16, or quantized i8 / f8e4m3
  Device device = Device::cpu();
  KvTierOptions tiers;        // the window of recent positions and what becomes of older ones
  int num_history_blocks = 0; // int8 / int4 history (tiers.history_bits() > 0): the history pool's blocks
  // Block-sparse attention: the history blocks keep key bounds (ops.h KvLayer), head_dim + 8 x
  // ceil(head_dim / 32) bytes per (block, kv head) and layer.
  bool key_bounds = false;

  bool quantized() const;
  // Bytes one history block takes across all layers (K and V codes with their parameters; 0
  // without history).
  size_t bytes_per_history_block() const;
  // Bytes one token occupies across all layers (K and V, with their scales).
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
  KvLayer& layer(int layer) { return layers_[static_cast<size_t>(layer)]; }
  // The layer's pools in a fixed order: K, V, then (quantized) K scales, V scales.
  std::vector<Tensor*> pools(int layer);
  // The layer's history pools as views of [blocks, positions per block, num_kv_heads, row]: the K
  // then V codes and the K then V params (block_size positions a block), then where the layer
  // keeps them the key bound codes and params (one "position" a block); empty without history.
  std::vector<Tensor> history_pools(int layer);
  size_t nbytes() const {
    return config_.bytes_per_block() * static_cast<size_t>(config_.num_blocks) +
           config_.bytes_per_history_block() * static_cast<size_t>(config_.num_history_blocks);
  }
  // Runs the block manager's queued compressions (BlockManager::take_compressions): block src
  // re-quantized into history block dst, in every layer.
  void compress_blocks(std::span<const BlockCompression> compressions);
  // Runs copy-on-write copies: block src's K and V, in every layer, into block dst.
  void copy_blocks(std::span<const BlockCopy> copies);
  // Copies slot src's K and V, in every layer, to slot dst, in order (a later copy may read what
  // an earlier one wrote).
  void copy_slots(std::span<const SlotCopy> copies);

 private:
  KvCacheConfig config_;
  uint64_t id_ = 0;
  std::vector<KvLayer> layers_;
  Tensor pairs_device_;  // [capacity, 2] i32 on a device: compress_blocks()' pairs
};

}  // namespace tachyon
