// One sequence's KV between two engines: the exported form (KvExport: tokens, sampling state and
// the K/V bytes, position-major) and the two copies, export_kv() out of a prefill engine's blocks
// and adopt() into a decode engine's. Both go through the engine's narrow hook (engine/kv_hook.h):
// the engine says which blocks hold the sequence and keeps its request state; this file moves the
// bytes. How the bytes travel between the two is kv_transfer.h's business (TCP, or CUDA IPC
// through kv_staging.h's regions).
//
// Both calls are made on the thread that drives the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/engine.h"

namespace tachyon::disagg {

// K/V bytes in memory that is not a host vector: a region of device memory another process on
// the same host can map (CUDA IPC, kv_staging.h), or, on the importing side, that region as
// mapped here. The layers lie one after another, each KvExport::layer_bytes() long.
struct KvDeviceRegion {
  void* data = nullptr;  // this process's pointer to the region's first byte
  Device device;         // where `data` is usable (the engine's device, or the host)
  size_t bytes = 0;
  // What another process needs to find the region: the arena's handle (an opaque cudaIpcMemHandle_t
  // for CUDA) and the region's offset in it.
  std::vector<uint8_t> handle;
  uint64_t offset = 0;
  // Hands the region back to its arena once the last copy of the export is gone (null on import).
  std::shared_ptr<void> lease;
};

// Where export_kv() may put K/V instead of the host: regions of shareable device memory.
class KvExportArena {
 public:
  virtual ~KvExportArena() = default;
  virtual Device device() const = 0;
  // A region of `bytes`, or nullopt when the arena has no room now (the export then goes to the
  // host, as without an arena). Thread-safe: regions come back from other threads.
  virtual std::optional<KvDeviceRegion> take(size_t bytes) = 0;
};

// One sequence after its prompt ran on one engine, for another engine to continue: what
// export_kv() returns and adopt() takes. The K/V are position-major, so the two engines' block
// sizes need not agree; everything else about the cache must.
struct KvExport {
  // The exporting model and cache (adopt() refuses any difference but block_size).
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kF32;             // the K/V bytes' dtype (the cache's)
  int vocab_size = 0;
  int block_size = 0;                    // the exporting cache's, for information
  std::vector<int32_t> tokens;           // [num_tokens]: the prompt, then the generated tokens
  int num_prompt_tokens = 0;
  int num_computed = 0;                  // leading positions whose K/V exist (num_tokens - 1)
  int first_position = 0;                // the K/V that follow are those of [first_position, num_computed):
                                         // > 0 when the exporter dropped older history (KvHistory::kDrop)
                                         // or holds it re-quantized (below)
  // int8 / int4 history (KvHistory::kInt8 / kInt4): 8 or 4, and positions [0, first_position) (whole
  // blocks of block_size) travel as the history rows of ops.h KvLayer; 0: none travel.
  int history_bits = 0;
  bool key_bounds = false;               // ... with their blocks' key bounds
  uint64_t sampler_seed = 0;             // the seed of the request's random stream (given or drawn)
  uint64_t rng_draws = 0;                // values the stream gave so far
  // [num_layers] of K then V, each [num_positions(), num_kv_heads, head_dim] in dtype, then for a
  // quantized dtype (i8, f8e4m3) the K then V scales, each [num_positions(), num_kv_heads] f32:
  // the bytes of positions [first_position, num_computed) as the cache holds them. Then, with
  // history_bits, the history of positions [0, first_position): K then V codes, each
  // [first_position, num_kv_heads, head_dim or head_dim / 2], their K then V params, each
  // [first_position, num_kv_heads] of 4 bytes, and with key_bounds the codes [history blocks,
  // num_kv_heads, head_dim] and params [history blocks, num_kv_heads, 2 key_bound_groups] f32.
  std::vector<std::vector<uint8_t>> layers;
  // Or, with `layers` empty, the same bytes layer after layer in device memory.
  std::optional<KvDeviceRegion> device;

  // Bytes of one position of one layer: K and V (and their scales).
  size_t position_bytes() const;
  int num_positions() const { return num_computed - first_position; }
  int history_blocks() const { return history_bits != 0 && block_size > 0 ? first_position / block_size : 0; }
  // Bytes of one layer's history (0 without): its rows, then its key bounds.
  size_t history_bytes() const;
  // Bytes of one layer: num_positions() * position_bytes() + history_bytes().
  size_t layer_bytes() const;
  // Bytes of every layer: num_layers * layer_bytes() (what `device` holds).
  size_t total_bytes() const;
  // kInvalidArgument unless `layers` holds `expected_layers` host layers of layer_bytes() each.
  Status check_host_layers(int expected_layers) const;
};
using KvImport = KvExport;

// A request of `engine` that finished with kTransfer: copies out its tokens, sampling state and
// the K/V of its computed positions (from the cache's device to the host, or into a region of
// `arena` when one is given, is on the cache's device and has room; the copy has finished when
// this returns), then the engine frees its blocks, whether or not the copy succeeded. kNotFound if
// the request is not held for transfer.
Result<KvExport> export_kv(Engine& engine, RequestId id, KvExportArena* arena = nullptr);

// Continues in `engine` a sequence exported by another engine: the engine allocates blocks for its
// computed positions (the prefix cache's where it holds them), the K/V are written there (from
// the host, or from kv.device, which must be readable from the engine's device; those copies have
// finished when this returns, so the region may be reused at once) and the request runs as
// decoding from its last token, with `params` (those of the original request, prefill_only off).
// Its first output carries the next token; the imported tokens were reported by the exporting
// engine. kInvalidArgument when the model or cache shape, the dtype, the sizes or the sampling
// state disagree. kOutOfRange, with nothing changed, when it does not fit: max_seqs sequences run
// or too few blocks are free (worth retrying after a step, while anything runs), or the sequence
// is longer than the context or the whole cache (never fits, as in Engine::add_request()).
Result<RequestId> adopt(Engine& engine, const KvImport& kv, const GenerationParams& params);

}  // namespace tachyon::disagg
