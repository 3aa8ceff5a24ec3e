#include "kv/kv_cache.h"

#include <atomic>
#include <cstring>

#include "core/device_memory.h"

namespace tachyon {

bool KvCacheConfig::quantized() const { return ops::is_quantized_kv_dtype(dtype); }

size_t KvCacheConfig::bytes_per_token() const {
  return 2ull * static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads) * ops::kv_row_bytes(dtype, head_dim);
}

size_t KvCacheConfig::bytes_per_history_block() const {
  const int bits = tiers.history_bits();
  if (bits == 0) return 0;
  // A row's codes and its f32 s (int8) or f16 s and lo (int4); the key bounds' 4-bit codes and
  // (lo, step) per group of dims, per (block, kv head) (ops.h KvLayer).
  const size_t row = bits == 8 ? static_cast<size_t>(head_dim) + 4 : static_cast<size_t>(head_dim) / 2 + 4;
  const size_t bounds =
      key_bounds ? static_cast<size_t>(head_dim) + 8 * static_cast<size_t>(ops::key_bound_groups(head_dim)) : 0;
  return static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads) *
         (2ull * static_cast<size_t>(block_size) * row + bounds);
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
  if (!ops::is_kv_cache_dtype(config.dtype)) {
    return make_error(ErrorCode::kUnsupported, "kv cache dtype {} (f32, f16, bf16, i8 or f8e4m3)",
                      dtype_name(config.dtype));
  }
  const int bits = config.tiers.history_bits();
  if (config.num_history_blocks < 0 || (bits != 0 && config.num_history_blocks == 0)) {
    return make_error(ErrorCode::kInvalidArgument, "kv cache: {} history blocks for {} history", config.num_history_blocks,
                      kv_history_name(config.tiers.history));
  }
  if (config.key_bounds && bits == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "kv cache: key bounds (block-sparse attention) are kept with int8 / int4 history only");
  }
  if (bits == 4 && config.head_dim % 4 != 0) {
    return make_error(ErrorCode::kUnsupported, "kv cache: int4 history needs head_dim a multiple of 4 (got {})",
                      config.head_dim);
  }
  static std::atomic<uint64_t> next_id{1};
  KvCache cache;
  cache.config_ = config;
  cache.id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  const std::vector<int64_t> shape = {config.num_blocks, config.block_size, config.num_kv_heads, config.head_dim};
  const std::vector<int64_t> scale_shape = {config.num_blocks, config.block_size, config.num_kv_heads, 1};
  const auto allocate = [&](const std::vector<int64_t>& pool_shape, DType dtype, Tensor& out) -> Status {
    auto t = empty_on(pool_shape, dtype, config.device, "kv cache");
    if (!t.ok()) {
      return make_error(ErrorCode::kOutOfMemory, "kv cache: cannot allocate {} blocks ({} bytes in all) on {}: {}",
                        config.num_blocks, config.bytes_per_block() * static_cast<size_t>(config.num_blocks),
                        config.device.to_string(), t.status().message());
    }
    out = std::move(t).value();
    return Status::Ok();
  };
  cache.layers_.resize(static_cast<size_t>(config.num_layers));
  for (KvLayer& layer : cache.layers_) {
    TACHYON_RETURN_IF_ERROR(allocate(shape, config.dtype, layer.k));
    TACHYON_RETURN_IF_ERROR(allocate(shape, config.dtype, layer.v));
    if (config.quantized()) {
      TACHYON_RETURN_IF_ERROR(allocate(scale_shape, DType::kF32, layer.k_scales));
      TACHYON_RETURN_IF_ERROR(allocate(scale_shape, DType::kF32, layer.v_scales));
    }
    if (bits != 0) {
      const int64_t nh = config.num_history_blocks;
      const std::vector<int64_t> codes = {nh, config.block_size, config.num_kv_heads,
                                          bits == 8 ? config.head_dim : config.head_dim / 2};
      const std::vector<int64_t> params = {nh, config.block_size, config.num_kv_heads, bits == 8 ? 1 : 2};
      const DType code_dtype = bits == 8 ? DType::kI8 : DType::kU8;
      TACHYON_RETURN_IF_ERROR(allocate(codes, code_dtype, layer.hk));
      TACHYON_RETURN_IF_ERROR(allocate(codes, code_dtype, layer.hv));
      const DType params_dtype = bits == 8 ? DType::kF32 : DType::kF16;  // ops.h KvLayer
      TACHYON_RETURN_IF_ERROR(allocate(params, params_dtype, layer.hk_params));
      TACHYON_RETURN_IF_ERROR(allocate(params, params_dtype, layer.hv_params));
      if (config.key_bounds) {
        TACHYON_RETURN_IF_ERROR(
            allocate({nh, config.num_kv_heads, 2, config.head_dim / 2}, DType::kU8, layer.kbounds));
        TACHYON_RETURN_IF_ERROR(allocate({nh, config.num_kv_heads, ops::key_bound_groups(config.head_dim), 2},
                                         DType::kF32, layer.kbound_params));
      }
    }
  }
  return cache;
}

std::vector<Tensor*> KvCache::pools(int layer) {
  KvLayer& l = layers_[static_cast<size_t>(layer)];
  if (!config_.quantized()) return {&l.k, &l.v};
  return {&l.k, &l.v, &l.k_scales, &l.v_scales};
}

std::vector<Tensor> KvCache::history_pools(int layer) {
  KvLayer& l = layers_[static_cast<size_t>(layer)];
  if (!l.hk.defined()) return {};
  std::vector<Tensor> out = {l.hk, l.hv, l.hk_params, l.hv_params};
  if (l.kbounds.defined()) {
    // Per history block: [num_history_blocks, 1 "position", num_kv_heads, bytes of the head].
    const int64_t nh = l.kbounds.size(0), kvh = l.kbounds.size(1);
    out.push_back(l.kbounds.reshape({nh, 1, kvh, l.kbounds.size(2) * l.kbounds.size(3)}));
    out.push_back(l.kbound_params.reshape({nh, 1, kvh, l.kbound_params.size(2) * l.kbound_params.size(3)}));
  }
  return out;
}

void KvCache::copy_blocks(std::span<const BlockCopy> copies) {
  if (copies.empty()) return;
  for (const BlockCopy& c : copies) {
    TACHYON_CHECK(c.src >= 0 && c.src < config_.num_blocks && c.dst >= 0 && c.dst < config_.num_blocks && c.src != c.dst,
                  "copy of block {} to {} in a cache of {}", c.src, c.dst, config_.num_blocks);
  }
  for (int l = 0; l < config_.num_layers; ++l) {
    for (Tensor* t : pools(l)) {
      const int64_t per_block = t->numel() / t->size(0);
      if (!t->device().is_cpu()) {
        for (const BlockCopy& c : copies) {
          Tensor dst = t->select(0, c.dst).reshape({per_block});
          const Tensor src = t->select(0, c.src).reshape({per_block});
          const Status st = copy_into(dst, src);
          TACHYON_CHECK(st.ok(), "kv cache copy of block {} to {}: {}", c.src, c.dst, st.message());
        }
        continue;
      }
      const size_t block_bytes = static_cast<size_t>(per_block) * dtype_size(t->dtype());
      auto* base = static_cast<uint8_t*>(t->raw_data());
      for (const BlockCopy& c : copies) {
        std::memcpy(base + static_cast<size_t>(c.dst) * block_bytes, base + static_cast<size_t>(c.src) * block_bytes,
                    block_bytes);
      }
    }
  }
}

void KvCache::compress_blocks(std::span<const BlockCompression> compressions) {
  if (compressions.empty()) return;
  Tensor pairs = Tensor::empty({static_cast<int64_t>(compressions.size()), 2}, DType::kI32);
  for (size_t i = 0; i < compressions.size(); ++i) {
    const BlockCompression& c = compressions[i];
    TACHYON_CHECK(c.src >= 0 && c.src < config_.num_blocks && c.dst >= 0 && c.dst < config_.num_history_blocks,
                  "compression of block {} into history block {} ({} blocks, {} history blocks)", c.src, c.dst,
                  config_.num_blocks, config_.num_history_blocks);
    pairs.data<int32_t>()[2 * i] = c.src;
    pairs.data<int32_t>()[2 * i + 1] = c.dst;
  }
  if (!config_.device.is_cpu()) {
    // One device buffer, kept: freeing one per call would wait for the device each time.
    if (!pairs_device_.defined() || pairs_device_.size(0) < pairs.size(0)) {
      auto t = empty_on({std::max<int64_t>(pairs.size(0), 64), 2}, DType::kI32, config_.device, "kv compressions");
      TACHYON_CHECK(t.ok(), "kv cache compressions: {}", t.status().message());
      pairs_device_ = std::move(t).value();
    }
    Tensor dst = pairs_device_.slice(0, 0, pairs.size(0));
    const Status copied = copy_into(dst, pairs);
    TACHYON_CHECK(copied.ok(), "kv cache compressions: {}", copied.message());
    pairs = dst;
  }
  for (KvLayer& layer : layers_) ops::compress_kv_blocks(pairs, layer);
}

void KvCache::copy_slots(std::span<const SlotCopy> copies) {
  if (copies.empty()) return;
  const int64_t num_slots = static_cast<int64_t>(config_.num_blocks) * config_.block_size;
  for (const SlotCopy& c : copies) {
    TACHYON_CHECK(c.src >= 0 && c.src < num_slots && c.dst >= 0 && c.dst < num_slots,
                  "kv cache copy of slot {} to {} in a cache of {} slots", c.src, c.dst, num_slots);
  }
  for (int l = 0; l < config_.num_layers; ++l) {
    for (Tensor* t : pools(l)) {
      const Tensor slots = t->reshape({num_slots, t->numel() / num_slots});
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
