// The argument structs every backend's kernels share: the rows of an activation, the paged KV
// cache of one layer, one step's batch as attention reads it. Plain data (pointers, strides in
// elements, sizes), defined once here for the CPU kernels (ops/cpu) and the CUDA kernels
// (ops/cuda), so nothing here may need more than nvcc parses: no fmt, no Tensor, nothing of the
// engine. What builds them from Tensors lives with the backends (ops/cpu/rows.h row_layout,
// ops/backend.h kv_cache_view).
#pragma once

#include <cstdint>

#include "core/dtype.h"

// Members the CUDA kernels call on the device as well as the host.
#if defined(__CUDACC__)
#define TACHYON_HOST_DEVICE __host__ __device__
#else
#define TACHYON_HOST_DEVICE
#endif

namespace tachyon::ops {

// Key bounds of the history blocks (ops.h KvLayer) code their dims in groups of kKeyBoundGroup,
// each with its own lo and step.
constexpr int64_t kKeyBoundGroup = 32;
TACHYON_HOST_DEVICE inline int64_t key_bound_groups(int64_t head_dim) {
  return (head_dim + kKeyBoundGroup - 1) / kKeyBoundGroup;
}

// The rows of an activation tensor whose last dim is packed (stride 1) and whose leading dims (up
// to three of them) have any strides, e.g. the q part of a fused QKV output ([n, num_heads,
// head_dim] with a row stride of (num_heads + 2 * num_kv_heads) * head_dim). Row-wise kernels
// (norms, softmax, activations) walk rows through it and never assume packing.
struct RowLayout {
  int64_t rows = 0;   // product of the leading dims
  int64_t cols = 0;   // the last dim
  int64_t size1 = 1;  // leading dims, innermost last: rows = size0 * size1 * size2
  int64_t size2 = 1;
  int64_t stride0 = 0;  // strides in elements of the leading dims
  int64_t stride1 = 0;
  int64_t stride2 = 0;

  // Element offset of row r's first element.
  TACHYON_HOST_DEVICE int64_t offset(int64_t r) const {
    const int64_t i2 = r % size2;
    const int64_t r1 = r / size2;
    const int64_t i1 = r1 % size1;
    const int64_t i0 = r1 / size1;
    return i0 * stride0 + i1 * stride1 + i2 * stride2;
  }

  // Packed rows: [rows, cols] with rows `stride` elements apart.
  static RowLayout packed(int64_t rows, int64_t cols, int64_t stride) {
    RowLayout r;
    r.rows = rows;
    r.cols = cols;
    r.stride2 = stride;
    r.size2 = rows > 0 ? rows : 1;
    return r;
  }
};

// The paged K/V cache of one layer (ops.h KvLayer): [num_blocks, block_size, num_kv_heads,
// head_dim], packed, in the memory of the backend that runs the kernel. dtype has no meaningful
// default: whoever builds a view sets it.
struct KvCacheView {
  void* k = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim]: f32 / f16 / bf16 / i8 / f8e4m3 (dtype)
  void* v = nullptr;
  // i8 / f8e4m3 caches: [num_blocks, block_size, num_kv_heads] f32, element = code * scale of its
  // (slot, kv head) row (ops.h KvLayer); null for the others.
  float* k_scales = nullptr;
  float* v_scales = nullptr;
  DType dtype = DType::kF32;
  int64_t num_blocks = 0, block_size = 0, num_kv_heads = 0, head_dim = 0;
  // History pools (ops.h KvLayer): block table entries >= num_blocks. history_bits 0: none; 8:
  // hk/hv [num_history_blocks, block_size, num_kv_heads, head_dim] i8, params [.., 1] f32 (s);
  // 4: [.., head_dim / 2] u8, params [.., 2] f16 (s, lo). Either way 4 bytes of params a row.
  const void* hk = nullptr;
  const void* hv = nullptr;
  const void* hk_params = nullptr;
  const void* hv_params = nullptr;
  int history_bits = 0;
  int64_t num_history_blocks = 0;
  // Key bounds of the history blocks (ops.h KvLayer), or null: [num_history_blocks, num_kv_heads,
  // 2, head_dim / 2] u8 4-bit codes and [.., ceil(head_dim / 32), 2] f32 (lo, step) per group.
  const uint8_t* kbounds = nullptr;
  const float* kbound_params = nullptr;
};

// One step's batch as paged attention reads it (ops.h AttentionMetadata): the arrays in the
// memory of the backend that runs the kernel, the maxima on the host (the CUDA kernels size
// their launch grids with them; the CPU kernels walk the arrays and leave them unread).
struct AttentionBatch {
  int num_seqs = 0;
  const int32_t* query_start = nullptr;   // [num_seqs + 1] i32
  const int32_t* context_lens = nullptr;  // [num_seqs] i32
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq] i32
  int64_t max_blocks_per_seq = 0;
  int max_query_len = 0;    // max over sequences of query_start[s + 1] - query_start[s]
  int max_context_len = 0;  // max of context_lens
  const uint64_t* tree_masks = nullptr;  // [n_tokens], or null (ops.h AttentionMetadata::tree_masks)
  // Block-sparse decode (ops.h AttentionMetadata): null for dense. Sequence s, kv head h reads the
  // blocks sparse_tables[(s * num_kv_heads + h) * max_blocks_per_seq + i] as a context of
  // sparse_lens[s * num_kv_heads + h] positions.
  const int32_t* sparse_tables = nullptr;
  const int32_t* sparse_lens = nullptr;
  // select_kv_blocks: [num_seqs] budgets, and the sink blocks.
  const int32_t* sparse_budgets = nullptr;
  int sparse_sink_blocks = 1;
};

}  // namespace tachyon::ops
