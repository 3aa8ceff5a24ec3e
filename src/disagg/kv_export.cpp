#include "disagg/kv_export.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/device_memory.h"
#include "engine/kv_hook.h"
#include "kv/kv_cache.h"
#include "ops/ops.h"

namespace tachyon::disagg {
namespace {

enum class KvCopy : uint8_t { kCacheToHost, kHostToCache };

// Bytes of one position of a pool [num_blocks, block_size, num_kv_heads, row].
size_t pool_row_bytes(const Tensor& pool) {
  return static_cast<size_t>(pool.size(2) * pool.size(3)) * dtype_size(pool.dtype());
}

// Moves the K or V of positions [begin, end) of one table between one layer's pool
// [num_blocks, block_size, num_kv_heads, head_dim] (on the cache's device) and a position-major
// host buffer [end - begin, num_kv_heads, head_dim] of the same dtype. Runs of positions in
// consecutive block ids move as one copy.
Status copy_positions(Tensor& pool, std::span<const int32_t> blocks, int begin, int end, uint8_t* host,
                      KvCopy direction, Device host_device = Device::cpu()) {
  const int64_t block_size = pool.size(1);
  const int64_t row = pool.size(2) * pool.size(3);  // elements per position
  const size_t row_bytes = pool_row_bytes(pool);
  const Tensor slots = pool.reshape({pool.size(0) * block_size, row});
  int64_t p = begin;
  while (p < end) {
    const size_t first_block = static_cast<size_t>(p / block_size);
    const int64_t slot = static_cast<int64_t>(blocks[first_block]) * block_size + p % block_size;
    int64_t count = std::min<int64_t>(block_size - p % block_size, end - p);
    for (size_t b = first_block + 1; p + count < end && blocks[b] == blocks[b - 1] + 1; ++b) {
      count += std::min<int64_t>(block_size, end - p - count);
    }
    Tensor cached = slots.slice(0, slot, slot + count);
    Tensor flat =
        Tensor::view_of(host + static_cast<size_t>(p - begin) * row_bytes, {count, row}, pool.dtype(), nullptr, host_device);
    TACHYON_RETURN_IF_ERROR(direction == KvCopy::kCacheToHost ? copy_into(flat, cached) : copy_into(cached, flat));
    p += count;
  }
  return Status::Ok();
}

// A GPU engine's K/V to or from host vectors pass through one device buffer: the many small
// copies (a run of consecutive blocks each) stay on the device, and each layer crosses the bus
// once, instead of one synchronous host copy per run. Undefined (copies go direct) when the
// engine is on the host or the buffer does not fit.
Tensor host_transfer_staging(Device device, size_t bytes) {
  if (device.is_cpu() || bytes == 0) return {};
  auto t = empty_on({static_cast<int64_t>(bytes)}, DType::kU8, device, "kv transfer staging");
  return t.ok() ? std::move(t).value() : Tensor();
}

// Layer `layer` of the staging buffer (layers of `bytes` each) to or from host memory.
Status copy_layer(Tensor& staging, size_t layer, size_t bytes, uint8_t* host_bytes, bool to_host) {
  const int64_t n = static_cast<int64_t>(bytes);
  Tensor part = staging.slice(0, static_cast<int64_t>(layer) * n, static_cast<int64_t>(layer + 1) * n);
  Tensor host = Tensor::view_of(host_bytes, {n}, DType::kU8);
  return to_host ? copy_into(host, part) : copy_into(part, host);
}

// Moves layer l's history (kv.history_blocks() leading blocks of the table: their rows, then their
// key bounds where the export carries them) between the cache and `at` (KvExport::layers' layout).
// An import into a cache without key bounds skips the export's.
Status copy_history(KvCache& cache, int l, const SequenceBlocks& blocks, const KvExport& kv, uint8_t* at,
                    KvCopy direction, Device host_device) {
  const int num_blocks = cache.config().num_blocks;
  TACHYON_CHECK(blocks.num_history == kv.history_blocks() &&
                    blocks.block_table.size() >= static_cast<size_t>(blocks.num_history),
                "{} history blocks for an export of {}", blocks.num_history, kv.history_blocks());
  std::vector<int32_t> ids(static_cast<size_t>(blocks.num_history));
  for (size_t i = 0; i < ids.size(); ++i) {
    TACHYON_CHECK(blocks.block_table[i] >= num_blocks, "table entry {} ({}) is not a history block", i,
                  blocks.block_table[i]);
    ids[i] = blocks.block_table[i] - num_blocks;
  }
  std::vector<Tensor> pools = cache.history_pools(l);
  for (size_t i = 0; i < pools.size(); ++i) {
    Tensor& pool = pools[i];
    const bool bound = i >= 4;  // the key bounds: a "position" per block
    if (bound && !kv.key_bounds) break;
    const int end = bound ? blocks.num_history : kv.first_position;
    TACHYON_RETURN_IF_ERROR(copy_positions(pool, ids, 0, end, at, direction, host_device));
    at += static_cast<size_t>(end) * pool_row_bytes(pool);
  }
  return Status::Ok();
}

// Copies positions [kv.first_position, kv.num_computed) of every layer out of `blocks` into
// kv.device, or into kv.layers (sized here) when kv.device is empty.
Status read_layers(const SequenceBlocks& blocks, KvExport& kv) {
  KvCache& cache = *blocks.cache;
  const Device device = cache.config().device;
  const size_t layer_bytes = kv.layer_bytes();
  Tensor staging;
  if (!kv.device) {
    kv.layers.resize(static_cast<size_t>(kv.num_layers));
    staging = host_transfer_staging(device, kv.total_bytes());
  }
  Status st = Status::Ok();
  for (int l = 0; l < kv.num_layers && st.ok(); ++l) {
    uint8_t* at = nullptr;
    if (kv.device) {
      at = static_cast<uint8_t*>(kv.device->data) + static_cast<size_t>(l) * layer_bytes;
    } else if (staging.defined()) {
      kv.layers[static_cast<size_t>(l)].resize(layer_bytes);
      at = staging.data<uint8_t>() + static_cast<size_t>(l) * layer_bytes;
    } else {
      std::vector<uint8_t>& bytes = kv.layers[static_cast<size_t>(l)];
      bytes.resize(layer_bytes);
      at = bytes.data();
    }
    // The pools one after another (K, V, then a quantized cache's K and V scales), each
    // position-major.
    const Device host_device = kv.device ? kv.device->device : staging.defined() ? device : Device::cpu();
    for (Tensor* pool : cache.pools(l)) {
      if (!st.ok()) break;
      st = copy_positions(*pool, blocks.block_table, kv.first_position, kv.num_computed, at, KvCopy::kCacheToHost,
                          host_device);
      at += static_cast<size_t>(kv.num_positions()) * pool_row_bytes(*pool);
    }
    if (st.ok() && kv.history_bits != 0) st = copy_history(cache, l, blocks, kv, at, KvCopy::kCacheToHost, host_device);
    if (st.ok() && staging.defined()) {
      st = copy_layer(staging, static_cast<size_t>(l), layer_bytes, kv.layers[static_cast<size_t>(l)].data(), true);
    }
  }
  // Copies within a device run in the device's order: another process reads the region only after
  // they finished.
  if (st.ok() && kv.device && !device.is_cpu()) st = ops::synchronize(device);
  return st;
}

// Copies positions [blocks.begin, blocks.end) of every layer from `kv` (host layers or its
// device region) into `blocks`; the positions before blocks.begin came from the prefix cache (or
// lie before the window), and blocks.begin >= kv.first_position.
Status write_layers(const KvImport& kv, const SequenceBlocks& blocks) {
  KvCache& cache = *blocks.cache;
  const size_t layer_bytes = kv.layer_bytes();
  Status st = Status::Ok();
  Tensor staging = kv.device ? Tensor() : host_transfer_staging(cache.config().device, kv.total_bytes());
  const Device source = kv.device ? kv.device->device : staging.defined() ? cache.config().device : Device::cpu();
  for (int l = 0; l < kv.num_layers && st.ok(); ++l) {
    // Only read: the import is the copies' source.
    uint8_t* at = nullptr;
    if (kv.device) {
      at = static_cast<uint8_t*>(kv.device->data) + static_cast<size_t>(l) * layer_bytes;
    } else if (staging.defined()) {
      // Only read: the host view is the copy's source.
      st = copy_layer(staging, static_cast<size_t>(l), layer_bytes,
                      const_cast<uint8_t*>(kv.layers[static_cast<size_t>(l)].data()), false);
      at = staging.data<uint8_t>() + static_cast<size_t>(l) * layer_bytes;
    } else {
      at = const_cast<uint8_t*>(kv.layers[static_cast<size_t>(l)].data());
    }
    for (Tensor* pool : cache.pools(l)) {
      if (!st.ok()) break;
      const size_t row_bytes = pool_row_bytes(*pool);
      st = copy_positions(*pool, blocks.block_table, blocks.begin, blocks.end,
                          at + static_cast<size_t>(blocks.begin - kv.first_position) * row_bytes, KvCopy::kHostToCache,
                          source);
      at += static_cast<size_t>(kv.num_positions()) * row_bytes;
    }
    if (st.ok() && kv.history_bits != 0) st = copy_history(cache, l, blocks, kv, at, KvCopy::kHostToCache, source);
  }
  // The region is the exporter's (and the staging buffer goes when this returns): copies out of
  // either have finished before it does.
  if (st.ok() && !source.is_cpu()) st = ops::synchronize(source);
  return st;
}

}  // namespace

size_t KvExport::position_bytes() const {
  return 2 * static_cast<size_t>(std::max(num_kv_heads, 0)) * ops::kv_row_bytes(dtype, std::max(head_dim, 0));
}

size_t KvExport::history_bytes() const {
  if (history_bits == 0) return 0;
  const size_t heads = static_cast<size_t>(std::max(num_kv_heads, 0)), hd = static_cast<size_t>(std::max(head_dim, 0));
  const size_t row = (history_bits == 8 ? hd : hd / 2) + 4;  // codes, then an f32 s or f16 s and lo (ops.h KvLayer)
  size_t bytes = static_cast<size_t>(std::max(first_position, 0)) * heads * 2 * row;
  if (key_bounds) {
    bytes += static_cast<size_t>(history_blocks()) * heads *
             (hd + 8 * static_cast<size_t>(ops::key_bound_groups(static_cast<int64_t>(hd))));
  }
  return bytes;
}

size_t KvExport::layer_bytes() const {
  return static_cast<size_t>(std::max(num_positions(), 0)) * position_bytes() + history_bytes();
}

size_t KvExport::total_bytes() const { return static_cast<size_t>(std::max(num_layers, 0)) * layer_bytes(); }

Status KvExport::check_host_layers(int expected_layers) const {
  if (layers.size() != static_cast<size_t>(std::max(expected_layers, 0))) {
    return make_error(ErrorCode::kInvalidArgument, "{} layers of K/V for a model of {}", layers.size(), expected_layers);
  }
  const size_t want = layer_bytes();
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].size() != want) {
      return make_error(ErrorCode::kInvalidArgument, "layer {} has {} bytes; {} positions take {}", l, layers[l].size(),
                        num_positions(), want);
    }
  }
  return Status::Ok();
}

Result<KvExport> export_kv(Engine& engine, RequestId id, KvExportArena* arena) {
  KvExport kv;
  const Status st = engine.release_transfer(id, [&](const TransferredSequence& seq, const SequenceBlocks& blocks) {
    const KvCacheConfig& cc = blocks.cache->config();
    kv.num_layers = cc.num_layers;
    kv.num_kv_heads = cc.num_kv_heads;
    kv.head_dim = cc.head_dim;
    kv.dtype = cc.dtype;
    kv.vocab_size = engine.model().config().vocab_size;
    kv.block_size = cc.block_size;
    kv.tokens.assign(seq.tokens.begin(), seq.tokens.end());
    kv.num_prompt_tokens = seq.num_prompt_tokens;
    kv.num_computed = seq.num_computed;
    kv.first_position = seq.first_position;
    if (seq.history_blocks > 0) {
      kv.history_bits = cc.tiers.history_bits();
      kv.key_bounds = cc.key_bounds;
    }
    kv.sampler_seed = seq.sampler_seed;
    kv.rng_draws = seq.rng_draws;
    if (arena != nullptr && arena->device() == cc.device && kv.layer_bytes() > 0) {
      kv.device = arena->take(kv.total_bytes());
    }
    const Status copied = read_layers(blocks, kv);
    return copied.ok() ? copied : copied.with_context(fmt::format("exporting the kv of request {}", id));
  });
  if (!st.ok()) return st;
  return kv;
}

Result<RequestId> adopt(Engine& engine, const KvImport& kv, const GenerationParams& params) {
  const ModelConfig& c = engine.model().config();
  const KvCacheConfig& cc = engine.kv_cache().config();
  if (kv.num_layers != cc.num_layers || kv.num_kv_heads != cc.num_kv_heads || kv.head_dim != cc.head_dim ||
      kv.dtype != cc.dtype || kv.vocab_size != c.vocab_size) {
    return make_error(ErrorCode::kInvalidArgument,
                      "kv import: {} layers x {} kv heads x head_dim {}, {} K/V, vocabulary {}; this engine has {} x {} "
                      "x {}, {}, vocabulary {}",
                      kv.num_layers, kv.num_kv_heads, kv.head_dim, dtype_name(kv.dtype), kv.vocab_size, cc.num_layers,
                      cc.num_kv_heads, cc.head_dim, dtype_name(cc.dtype), c.vocab_size);
  }
  if (kv.device) {
    if (!kv.layers.empty() || kv.device->data == nullptr || kv.device->bytes != kv.total_bytes()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "kv import: a device region of {} bytes (and {} host layers) for {} layers of {} bytes",
                        kv.device->bytes, kv.layers.size(), cc.num_layers, kv.layer_bytes());
    }
    if (!kv.device->device.is_cpu() && kv.device->device != cc.device) {
      return make_error(ErrorCode::kInvalidArgument, "kv import: K/V on {}, this engine runs on {}",
                        kv.device->device.to_string(), cc.device.to_string());
    }
  } else {
    TACHYON_RETURN_IF_ERROR(kv.check_host_layers(cc.num_layers).with_context("kv import"));
  }
  if (kv.history_bits != 0) {
    if (kv.history_bits != cc.tiers.history_bits() || kv.block_size != cc.block_size ||
        kv.first_position % std::max(kv.block_size, 1) != 0 || (cc.key_bounds && !kv.key_bounds)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "kv import: int{} history of {} positions in blocks of {}{}; this engine keeps {} history in "
                        "blocks of {}{} (run both workers with the same --kv-history, and --sparse-budget on the "
                        "exporting one where the importing one has it)",
                        kv.history_bits, kv.first_position, kv.block_size, kv.key_bounds ? " with key bounds" : "",
                        kv_history_name(cc.tiers.history), cc.block_size, cc.key_bounds ? " with key bounds" : "");
    }
  }
  TransferredSequence seq;
  seq.history_blocks = kv.history_blocks();
  seq.tokens = kv.tokens;
  seq.num_prompt_tokens = kv.num_prompt_tokens;
  seq.num_computed = kv.num_computed;
  seq.first_position = kv.first_position;
  seq.sampler_seed = kv.sampler_seed;
  seq.rng_draws = kv.rng_draws;
  return engine.adopt_sequence(seq, params, [&kv](const SequenceBlocks& blocks) { return write_layers(kv, blocks); });
}

}  // namespace tachyon::disagg
