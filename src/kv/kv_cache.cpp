#include "kv/kv_cache.h"

#include <atomic>
#include <cstring>

#include "core/device_memory.h"

namespace tachyon {

size_t KvCacheConfig::bytes_per_token() const {
  return 2ull * static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads) *
         static_cast<size_t>(head_dim) * dtype_size(dtype);
}

int KvCacheConfig::blocks_for_budget(size_t budget_bytes) const {
  const size_t per_block = bytes_per_block();
  if (per_block == 0) return 0;
  const size_t n = budget_bytes / per_block;
  return n > static_cast<size_t>(INT32_MAX) ? INT32_MAX : static_cast<int>(n);
}

Result<KvCache> KvCache::create(const KvCacheConfig& config) {
  if (config.num_layers <= 0 || config.num_kv_heads <= 0 || config.head_dim <= 0 || config.block_size <= 0 ||
      config.num_blocks <= 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "kv cache: layers={} kv_heads={} head_dim={} block_size={} num_blocks={} must all be positive",
                      config.num_layers, config.num_kv_heads, config.head_dim, config.block_size, config.num_blocks);
  }
  static std::atomic<uint64_t> next_id{1};
  KvCache cache;
  cache.config_ = config;
  cache.id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  const std::vector<int64_t> shape = {config.num_blocks, config.block_size, config.num_kv_heads, config.head_dim};
  for (int l = 0; l < config.num_layers; ++l) {
    auto k = empty_on(shape, config.dtype, config.device, "kv cache");
    auto v = k.ok() ? empty_on(shape, config.dtype, config.device, "kv cache") : k;
    if (!k.ok() || !v.ok()) {
      return make_error(ErrorCode::kOutOfMemory, "kv cache: cannot allocate {} blocks ({} bytes in all) on {}: {}",
                        config.num_blocks, config.bytes_per_block() * static_cast<size_t>(config.num_blocks),
                        config.device.to_string(), (k.ok() ? v : k).status().message());
    }
    cache.k_.push_back(std::move(k).value());
    cache.v_.push_back(std::move(v).value());
  }
  return cache;
}

void KvCache::copy_blocks(std::span<const BlockCopy> copies) {
  if (copies.empty()) return;
  const size_t block_bytes = static_cast<size_t>(config_.block_size) * static_cast<size_t>(config_.num_kv_heads) *
                             static_cast<size_t>(config_.head_dim) * dtype_size(config_.dtype);
  for (const BlockCopy& c : copies) {
    TACHYON_CHECK(c.src >= 0 && c.src < config_.num_blocks && c.dst >= 0 && c.dst < config_.num_blocks && c.src != c.dst,
                  "copy of block {} to {} in a cache of {}", c.src, c.dst, config_.num_blocks);
  }
  for (std::vector<Tensor>* pools : {&k_, &v_}) {
    for (Tensor& t : *pools) {
      if (!t.device().is_cpu()) {
        const int64_t per_block = t.numel() / t.size(0);
        for (const BlockCopy& c : copies) {
          Tensor dst = t.select(0, c.dst).reshape({per_block});
          const Tensor src = t.select(0, c.src).reshape({per_block});
          const Status st = copy_into(dst, src);
          TACHYON_CHECK(st.ok(), "kv cache copy of block {} to {}: {}", c.src, c.dst, st.message());
        }
        continue;
      }
      auto* base = static_cast<uint8_t*>(t.raw_data());
      for (const BlockCopy& c : copies) {
        std::memcpy(base + static_cast<size_t>(c.dst) * block_bytes, base + static_cast<size_t>(c.src) * block_bytes,
                    block_bytes);
      }
    }
  }
}

void KvCache::copy_slots(std::span<const SlotCopy> copies) {
  if (copies.empty()) return;
  const int64_t num_slots = static_cast<int64_t>(config_.num_blocks) * config_.block_size;
  for (const SlotCopy& c : copies) {
    TACHYON_CHECK(c.src >= 0 && c.src < num_slots && c.dst >= 0 && c.dst < num_slots,
                  "kv cache copy of slot {} to {} in a cache of {} slots", c.src, c.dst, num_slots);
  }
  const int64_t per_slot = static_cast<int64_t>(config_.num_kv_heads) * config_.head_dim;
  for (std::vector<Tensor>* pools : {&k_, &v_}) {
    for (Tensor& t : *pools) {
      const Tensor slots = t.reshape({num_slots, per_slot});
      for (const SlotCopy& c : copies) {
        if (c.src == c.dst) continue;
        Tensor dst = slots.select(0, c.dst);
        const Status st = copy_into(dst, slots.select(0, c.src));
        TACHYON_CHECK(st.ok(), "kv cache copy of slot {} to {}: {}", c.src, c.dst, st.message());
      }
    }
  }
}

}  // namespace tachyon
