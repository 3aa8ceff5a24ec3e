// Prefill / mixed-batch attention over the paged cache, FlashAttention-2 style. Two kernels:
// - tensor cores (sm_80+, f16/bf16 or quantized i8 / f8e4m3 cache, head_dim 64 or 128; the
//   default where they apply):
//   64-row query tiles, Q in registers, K/V tiles of 64 keys streamed through a cp.async double
//   buffer (a quantized cache's codes and scales, the codes then expanded to bf16 in shared
//   memory), S and P·V on mma.m16n8k16 (described above prefill_mma_kernel);
// - CUDA cores (any cache dtype, quantized i8 / f8e4m3 included; head_dim a multiple of 4 up to
//   256): grid (query tiles of 32 rows, query heads, sequences). A block keeps its 32 query rows
//   in shared memory, walks the keys its rows can see in tiles of 32 (gathered through the block
//   table, converted to f32 in shared memory: a quantized cache's as code * scale), and keeps an
//   online softmax per row; thread (r, c) of 4 per row scores keys c, c+4, ...; the 4 threads of
//   a row are one quad of a warp, so row max/sum are two shuffles.
// History blocks (entries >= num_blocks, ops.h KvLayer) are decoded into the tiles by both kernels
// (the tensor-core one for 16-bit caches; a quantized cache with history runs on CUDA cores).
// Both: no score matrix ever reaches memory; causal within the chunk, sliding window, token-tree
// masks (ops.h AttentionMetadata::tree_masks), GQA (head h reads KV head h / group).
// Invariants: keys a tile's rows cannot see are never loaded (zeros stand in), so poisoned or
// released cache blocks never reach the arithmetic.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/mma.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerTile = 32;  // query rows per block
constexpr int kKeysPerTile = 32;
constexpr int kKeysPerThread = kKeysPerTile / 4;
constexpr int kPStride = kKeysPerTile + 1;
constexpr float kLog2e = 1.4426950408889634f;

struct PrefillParams {
  AttentionQuery query;
  KvCacheView cache;
  AttentionBatch batch;
  int64_t group;
};

__host__ __device__ inline size_t prefill_smem_floats(int64_t head_dim) {
  const int64_t rs = head_dim + 4;
  const int64_t floats = (kRowsPerTile + 2 * kKeysPerTile) * rs + kRowsPerTile * kPStride;
  return static_cast<size_t>((floats + 1) / 2 * 2);
}

// Rows t < valid of the K/V tile from the cache (element offsets in slot[]; quantized caches:
// their scales at row[] of the scale pools, loaded beside the codes; slot -1: history row row[]),
// rows valid.. zeroed.
template <DType D>
__device__ inline void load_tile(const KvCacheView& cache, const int64_t* slot, const int64_t* row, int valid,
                                 float* ks, float* vs) {
  using E = Elem<D>;
  using T = typename E::T;
  const T* kc = static_cast<const T*>(cache.k);
  const T* vc = static_cast<const T*>(cache.v);
  const int64_t head_dim = cache.head_dim;
  const int64_t rs = head_dim + 4;
  const int64_t per_row = head_dim / 4;  // 4-element chunks
  const int64_t total = kKeysPerTile * per_row;
  for (int64_t c = threadIdx.x; c < total; c += kThreads) {
    const int64_t t = c / per_row, off = (c % per_row) * 4;
    float4 kf = make_float4(0.f, 0.f, 0.f, 0.f), vf = kf;
    if (t < valid && slot[t] < 0) {  // a history row (slot -1, its history row in row[])
      load_history4(cache, row[t], off, kf, vf);
    } else if (t < valid) {
      const T* kp = kc + slot[t] + off;
      const T* vp = vc + slot[t] + off;
      if constexpr (D == DType::kF32) {
        kf = *reinterpret_cast<const float4*>(kp);
        vf = *reinterpret_cast<const float4*>(vp);
      } else if constexpr (is_quantized_kv(D)) {
        // 4 one-byte codes (head_dim % 4 == 0 keeps them 4-byte aligned).
        const uint32_t kr = *reinterpret_cast<const uint32_t*>(kp);
        const uint32_t vr = *reinterpret_cast<const uint32_t*>(vp);
        const float k_scale = cache.k_scales[row[t]], v_scale = cache.v_scales[row[t]];
        float f[4];
        dequantize4<D>(kr, k_scale, f);
        kf = make_float4(f[0], f[1], f[2], f[3]);
        dequantize4<D>(vr, v_scale, f);
        vf = make_float4(f[0], f[1], f[2], f[3]);
      } else {
        const uint2 kr = *reinterpret_cast<const uint2*>(kp);
        const uint2 vr = *reinterpret_cast<const uint2*>(vp);
        float f[8];
        E::unpack(make_uint4(kr.x, kr.y, 0u, 0u), f);
        kf = make_float4(f[0], f[1], f[2], f[3]);
        E::unpack(make_uint4(vr.x, vr.y, 0u, 0u), f);
        vf = make_float4(f[0], f[1], f[2], f[3]);
      }
    }
    *reinterpret_cast<float4*>(ks + t * rs + off) = kf;
    *reinterpret_cast<float4*>(vs + t * rs + off) = vf;
  }
}

template <DType D, int HD_MAX>
__global__ void __launch_bounds__(kThreads) prefill_kernel(const PrefillParams p) {
  extern __shared__ float smem_raw[];
  constexpr int kAcc = HD_MAX / 16;  // float4 accumulators per thread: dims 4c + 16i
  const int tile = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int s = blockIdx.z;
  const int tid = threadIdx.x;
  const int q_begin = p.batch.query_start[s];
  const int q_len = p.batch.query_start[s + 1] - q_begin;
  const int row_begin = tile * kRowsPerTile;
  if (row_begin >= q_len) return;

  const int64_t hd = p.cache.head_dim, rs = hd + 4;
  const int64_t kvh = h / p.group;
  const int window = p.query.sliding_window;
  float* qs = smem_raw;                   // [kRowsPerTile][rs]
  float* ks = qs + kRowsPerTile * rs;     // [kKeysPerTile][rs]
  float* vs = ks + kKeysPerTile * rs;     // [kKeysPerTile][rs]
  float* ps = vs + kKeysPerTile * rs;     // [kRowsPerTile][kPStride]
  int64_t* slot = reinterpret_cast<int64_t*>(smem_raw + prefill_smem_floats(hd));  // [kKeysPerTile]
  int64_t* row = slot + kKeysPerTile;  // [kKeysPerTile]: quantized caches: each key's (slot, kv head) row

  // Block-sparse: this kv head's kept blocks are the context (ops.h paged_attention).
  const bool sparse = p.batch.sparse_tables != nullptr;
  const int64_t sparse_row = static_cast<int64_t>(s) * p.cache.num_kv_heads + kvh;
  const int ctx = sparse ? p.batch.sparse_lens[sparse_row] : p.batch.context_lens[s];
  const int rows = min(kRowsPerTile, q_len - row_begin);
  const int first_pos = ctx - q_len + row_begin;   // absolute position of the tile's first row
  const int last_pos = first_pos + rows - 1;
  const int key_lo = window > 0 ? max(0, first_pos - window + 1) : 0;
  const int key_hi = last_pos + 1;

  const float qscale = p.query.scale * kLog2e;
  for (int64_t e = tid; e < kRowsPerTile * hd; e += kThreads) {
    const int64_t r = e / hd, d = e % hd;
    float v = 0.0f;
    if (r < rows) v = p.query.q[(q_begin + row_begin + r) * p.query.q_token_stride + h * p.query.q_head_stride + d] * qscale;
    qs[r * rs + d] = v;
  }

  const int r = tid >> 2, c = tid & 3;
  const bool row_valid = r < rows;
  const int pos = first_pos + r;
  // Token trees: of the chunk's keys [chunk_start, ctx), only those whose bit is set.
  const int chunk_start = ctx - q_len;
  const uint64_t tree = p.batch.tree_masks != nullptr && row_valid ? p.batch.tree_masks[q_begin + row_begin + r]
                                                                     : ~uint64_t{0};
  float m = -INFINITY, l = 0.0f;
  float4 acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int32_t* table = sparse ? p.batch.sparse_tables + sparse_row * p.batch.max_blocks_per_seq
                                : p.batch.block_tables + static_cast<int64_t>(s) * p.batch.max_blocks_per_seq;
  const int64_t bs = p.cache.block_size;

  for (int k0 = key_lo; k0 < key_hi; k0 += kKeysPerTile) {
    const int valid = min(kKeysPerTile, key_hi - k0);
    if (tid < valid) {
      const int key = k0 + tid;
      const int64_t block = table[key / bs];
      const bool history = block >= p.cache.num_blocks;
      const int64_t kv_row = ((history ? block - p.cache.num_blocks : block) * bs + key % bs) * p.cache.num_kv_heads +
                             kvh;  // (slot, kv head) of the primary or the history pools
      slot[tid] = history ? -1 : kv_row * hd;
      row[tid] = kv_row;
    }
    __syncthreads();  // slot ready; also orders the previous tile's reads before these writes
    load_tile<D>(p.cache, slot, row, valid, ks, vs);
    __syncthreads();

    float sc[kKeysPerThread];
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) sc[j] = 0.0f;
    const float* qr = qs + r * rs;
    for (int64_t d = 0; d < hd; d += 4) {
      const float4 a = *reinterpret_cast<const float4*>(qr + d);
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        const float4 b = *reinterpret_cast<const float4*>(ks + (c + 4 * j) * rs + d);
        sc[j] = fmaf(a.x, b.x, sc[j]);
        sc[j] = fmaf(a.y, b.y, sc[j]);
        sc[j] = fmaf(a.z, b.z, sc[j]);
        sc[j] = fmaf(a.w, b.w, sc[j]);
      }
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) {
      const int t = c + 4 * j;
      const int key = k0 + t;
      const bool ok = row_valid && t < valid && key <= pos && (window <= 0 || pos - key < window) &&
                      (tree == ~uint64_t{0} || key < chunk_start || (tree >> (key - chunk_start) & 1) != 0);
      sc[j] = ok ? sc[j] : -INFINITY;
      tile_max = fmaxf(tile_max, sc[j]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row that sees nothing yet keeps zeros
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) {
      const float pe = exp2f(sc[j] - m_use);
      ps[r * kPStride + c + 4 * j] = pe;
      sum += pe;
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    const float alpha = exp2f(m - m_use);
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();  // the quad's probabilities are in ps

    const float* pr = ps + r * kPStride;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int64_t d = 4 * c + 16 * i;
      if (d < hd) {
        float4 o = acc[i];
        o.x *= alpha;
        o.y *= alpha;
        o.z *= alpha;
        o.w *= alpha;
        for (int t = 0; t < valid; ++t) {
          const float pt = pr[t];
          const float4 vv = *reinterpret_cast<const float4*>(vs + t * rs + d);
          o.x = fmaf(pt, vv.x, o.x);
          o.y = fmaf(pt, vv.y, o.y);
          o.z = fmaf(pt, vv.z, o.z);
          o.w = fmaf(pt, vv.w, o.w);
        }
        acc[i] = o;
      }
    }
    __syncthreads();  // before the next tile replaces slot, ks, vs
  }

  if (!row_valid) return;
  const float inv = 1.0f / l;
  float* o = p.query.out + (q_begin + row_begin + r) * p.query.out_token_stride + h * p.query.out_head_stride;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int64_t d = 4 * c + 16 * i;
    if (d < hd) {
      o[d] = acc[i].x * inv;
      o[d + 1] = acc[i].y * inv;
      o[d + 2] = acc[i].z * inv;
      o[d + 3] = acc[i].w * inv;
    }
  }
}

template <DType D, int HD_MAX>
cudaError_t launch_prefill(const PrefillParams& p, Stream stream) {
  const auto kernel = prefill_kernel<D, HD_MAX>;
  const size_t shared = prefill_shared_bytes(p.cache.head_dim);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((p.batch.max_query_len + kRowsPerTile - 1) / kRowsPerTile),
                  static_cast<unsigned>(p.query.num_heads), static_cast<unsigned>(p.batch.num_seqs));
  kernel<<<grid, kThreads, shared, stream>>>(p);
  return cudaGetLastError();
}

template <DType D>
cudaError_t launch_prefill_dtype(const PrefillParams& p, Stream stream) {
  if (p.cache.head_dim <= 64) return launch_prefill<D, 64>(p, stream);
  if (p.cache.head_dim <= 128) return launch_prefill<D, 128>(p, stream);
  return launch_prefill<D, 256>(p, stream);
}


// ---- tensor cores (sm_80+, 16-bit or quantized caches, head_dim 64 or 128) -------------------------
// Grid (query tiles of 64 rows, last tile first so the longest causal rows start early; query
// heads; sequences), 4 warps of 16 rows. Q stays in registers as bf16/f16 A fragments (scaled by
// scale * log2 e); K/V tiles of 64 keys are staged in 16 bits through a two-stage cp.async
// pipeline (the next tile loads while this one is multiplied); S = Q K^T and O += P V run on
// mma.m16n8k16 with f32 accumulators, P rounded to the cache's 16-bit type between the two.
// Masking (causal, window) is applied only to tiles that reach past a warp's first row or when a
// window is set; keys past the tile's end are zero-filled, never read.
// Quantized caches (i8, f8e4m3), as in decode_mma_kernel (attention_decode.cu): the pipeline
// stages codes and scales (stage_quantized_kv_tile, kQuantizedStages tiles deep); once a tile has
// landed the block expands its codes into one bf16 K/V tile pair (expand_quantized_tile, exact),
// and the bf16 mma code runs on it. Each key's K scale multiplies its f32 scores and its V scale
// the softmax weights before they are rounded to bf16 (the row sums keep the unscaled weights),
// so the roundings are the bf16 path's (query and weights), none on the cache's values. On the
// H200 (Llama-3-8B heads, one causal sequence; bench/cuda/cuda_bench.cpp) an i8 cache takes
// 1,308 / 4,713 us at 4k / 8k tokens against bf16's 1,207 / 4,319 us (the CUDA-core kernel:
// 11,974 / 45,207 us): the expansion and its extra barrier cost 8-9 %.
constexpr int kMmaThreads = 128;
constexpr int kMmaRows = 64;

// 16-bit caches: two stages of K and V tiles. Quantized caches: one bf16 K and V tile, then
// kQuantizedStages stages of codes and scales (about the same bytes: 68.6 KB against 69.6 KB at
// head_dim 128, so as many blocks per SM).
template <DType D, int HD>
constexpr size_t prefill_mma_shared_bytes(bool history = false) {
  return mma_kv_pipeline_bytes<D, HD>(history);
}

template <DType D, int HD>
__global__ void __launch_bounds__(kMmaThreads) prefill_mma_kernel(const PrefillParams p) {
#if TACHYON_MMA_ENABLED
  constexpr bool kQuantized = is_quantized_kv(D);
  using M = MmaType<kQuantized ? DType::kBF16 : D>;
  constexpr int kStride = HD + 8;
  extern __shared__ __align__(16) unsigned char prefill_mma_smem[];
  const int tile = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int64_t h = blockIdx.y;
  const int s = blockIdx.z;
  const int q_begin = p.batch.query_start[s];
  const int q_len = p.batch.query_start[s + 1] - q_begin;
  const int row_begin = tile * kMmaRows;
  if (row_begin >= q_len) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t kvh = h / p.group;
  const int window = p.query.sliding_window;
  const bool sparse = p.batch.sparse_tables != nullptr;  // as in prefill_kernel
  const int64_t sparse_row = static_cast<int64_t>(s) * p.cache.num_kv_heads + kvh;
  const int ctx = sparse ? p.batch.sparse_lens[sparse_row] : p.batch.context_lens[s];
  const int rows = min(kMmaRows, q_len - row_begin);
  const int first_pos = ctx - q_len + row_begin;
  const int last_pos = first_pos + rows - 1;
  const int key_lo = window > 0 ? max(0, first_pos - window + 1) : 0;
  const int key_hi = last_pos + 1;

  const int wr = warp * 16;  // the warp's first row in the tile
  const bool warp_active = wr < rows;
  const int pos0 = first_pos + wr + g, pos1 = pos0 + 8;
  const int warp_first_pos = first_pos + wr;
  const int warp_last_pos = first_pos + min(wr + 15, rows - 1);
  const int warp_key_lo = window > 0 ? max(0, warp_first_pos - window + 1) : 0;
  // Token trees: of the chunk's keys [chunk_start, ctx), only those whose bit is set in the row's mask.
  const int chunk_start = ctx - q_len;
  const bool tree = p.batch.tree_masks != nullptr;
  uint64_t tree0 = ~uint64_t{0}, tree1 = ~uint64_t{0};
  if (tree) {
    const int r0 = row_begin + wr + g, r1 = r0 + 8;
    if (r0 < q_len) tree0 = p.batch.tree_masks[q_begin + r0];
    if (r1 < q_len) tree1 = p.batch.tree_masks[q_begin + r1];
  }

  uint32_t qa[HD / 16][4];
  {
    const float qs = p.query.scale * kLog2e;
    const int r0 = row_begin + wr + g, r1 = r0 + 8;
    const float* q0 = p.query.q + static_cast<int64_t>(q_begin + r0) * p.query.q_token_stride + h * p.query.q_head_stride;
    const float* q1 = q0 + 8 * p.query.q_token_stride;
    const bool v0 = r0 < q_len, v1 = r1 < q_len;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int d = 16 * kk + 2 * t4;
      qa[kk][0] = v0 ? M::pack(q0[d] * qs, q0[d + 1] * qs) : 0u;
      qa[kk][1] = v1 ? M::pack(q1[d] * qs, q1[d + 1] * qs) : 0u;
      qa[kk][2] = v0 ? M::pack(q0[d + 8] * qs, q0[d + 9] * qs) : 0u;
      qa[kk][3] = v1 ? M::pack(q1[d + 8] * qs, q1[d + 9] * qs) : 0u;
    }
  }

  // The keys [key_lo, key_hi) the tile's rows can see.
  const MmaKvPipeline<D, HD, kMmaThreads> kv(
      prefill_mma_smem, p.cache,
      sparse ? p.batch.sparse_tables + sparse_row * p.batch.max_blocks_per_seq
             : p.batch.block_tables + static_cast<int64_t>(s) * p.batch.max_blocks_per_seq,
      kvh, key_hi);
  const int num_tiles = (key_hi - key_lo + kMmaKeys - 1) / kMmaKeys;  // at least 1: rows >= 1
  kv.prologue(key_lo, num_tiles);

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  for (int it = 0; it < num_tiles; ++it) {
    const int k0 = key_lo + it * kMmaKeys;
    // The tile's K and V rows [kMmaKeys][HD + 8]; quantized, their scales [kMmaKeys] (null otherwise).
    const auto [ks, vs, k_scale, v_scale] = kv.tile(it, key_lo, num_tiles);
    if (warp_active && k0 <= warp_last_pos && k0 + kMmaKeys > warp_key_lo) {
      float sc[kMmaKeys / 8][4];
#pragma unroll
      for (int j = 0; j < kMmaKeys / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
      for (int kk2 = 0; kk2 < HD / 32; ++kk2) {
#pragma unroll
        for (int j = 0; j < kMmaKeys / 8; ++j) {
          uint32_t b[4];
          ldmatrix_x4(b, smem_address(ks + (8 * j + (lane & 7)) * kStride + 32 * kk2 + 8 * (lane >> 3)));
          M::mma(sc[j], qa[2 * kk2], b[0], b[1]);
          M::mma(sc[j], qa[2 * kk2 + 1], b[2], b[3]);
        }
      }
      if constexpr (kQuantized) {
        // Keys 8 j + 2 t4 + (0, 1) of the tile, for rows g and g + 8: scores of the codes times
        // the K scales (keys past key_hi: zero scales, masked next as past every row).
#pragma unroll
        for (int j = 0; j < kMmaKeys / 8; ++j) {
          const float2 ksc = *reinterpret_cast<const float2*>(k_scale + 8 * j + 2 * t4);
          sc[j][0] *= ksc.x;
          sc[j][1] *= ksc.y;
          sc[j][2] *= ksc.x;
          sc[j][3] *= ksc.y;
        }
      }
      if (k0 + kMmaKeys - 1 > warp_first_pos || window > 0 || (tree && k0 + kMmaKeys > chunk_start)) {
#pragma unroll
        for (int j = 0; j < kMmaKeys / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = k0 + 8 * j + 2 * t4 + (e & 1);
            const int pos = e < 2 ? pos0 : pos1;
            const uint64_t bits = e < 2 ? tree0 : tree1;
            const bool ok = key <= pos && (window <= 0 || pos - key < window) &&
                            (bits == ~uint64_t{0} || key < chunk_start || (bits >> (key - chunk_start) & 1) != 0);
            if (!ok) sc[j][e] = -INFINITY;
          }
        }
      }
      float mx0 = m0, mx1 = m1;
#pragma unroll
      for (int j = 0; j < kMmaKeys / 8; ++j) {
        mx0 = fmaxf(mx0, fmaxf(sc[j][0], sc[j][1]));
        mx1 = fmaxf(mx1, fmaxf(sc[j][2], sc[j][3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(kFullMask, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(kFullMask, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(kFullMask, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(kFullMask, mx1, 2));
      const float mu0 = mx0 == -INFINITY ? 0.0f : mx0;  // a row that sees nothing yet keeps zeros
      const float mu1 = mx1 == -INFINITY ? 0.0f : mx1;
      const float a0 = exp2f(m0 - mu0), a1 = exp2f(m1 - mu1);
      m0 = mx0;
      m1 = mx1;
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int j = 0; j < kMmaKeys / 8; ++j) {
        sc[j][0] = exp2f(sc[j][0] - mu0);
        sc[j][1] = exp2f(sc[j][1] - mu0);
        sc[j][2] = exp2f(sc[j][2] - mu1);
        sc[j][3] = exp2f(sc[j][3] - mu1);
        s0 += sc[j][0] + sc[j][1];
        s1 += sc[j][2] + sc[j][3];
      }
      l0 = l0 * a0 + s0;
      l1 = l1 * a1 + s1;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        o[n][0] *= a0;
        o[n][1] *= a0;
        o[n][2] *= a1;
        o[n][3] *= a1;
      }
      if constexpr (kQuantized) {
        // The weights of the V codes: each probability times its key's V scale (after the row
        // sums above, which take the probabilities themselves).
#pragma unroll
        for (int j = 0; j < kMmaKeys / 8; ++j) {
          const float2 vsc = *reinterpret_cast<const float2*>(v_scale + 8 * j + 2 * t4);
          sc[j][0] *= vsc.x;
          sc[j][1] *= vsc.y;
          sc[j][2] *= vsc.x;
          sc[j][3] *= vsc.y;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kMmaKeys / 16; ++kk) {
        const uint32_t pa[4] = {M::pack(sc[2 * kk][0], sc[2 * kk][1]), M::pack(sc[2 * kk][2], sc[2 * kk][3]),
                                M::pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                M::pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int nn = 0; nn < HD / 16; ++nn) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, smem_address(vs + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride +
                                            16 * nn + (lane >> 4) * 8));
          M::mma(o[2 * nn], pa, b[0], b[1]);
          M::mma(o[2 * nn + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // before the next stage overwrites this tile
  }

  if (!warp_active) return;
  l0 += __shfl_xor_sync(kFullMask, l0, 1);
  l0 += __shfl_xor_sync(kFullMask, l0, 2);
  l1 += __shfl_xor_sync(kFullMask, l1, 1);
  l1 += __shfl_xor_sync(kFullMask, l1, 2);
  const int r0 = wr + g, r1 = r0 + 8;
  if (r0 < rows) {
    const float inv = 1.0f / l0;
    float* out = p.query.out + static_cast<int64_t>(q_begin + row_begin + r0) * p.query.out_token_stride +
                 h * p.query.out_head_stride;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      out[8 * n + 2 * t4] = o[n][0] * inv;
      out[8 * n + 2 * t4 + 1] = o[n][1] * inv;
    }
  }
  if (r1 < rows) {
    const float inv = 1.0f / l1;
    float* out = p.query.out + static_cast<int64_t>(q_begin + row_begin + r1) * p.query.out_token_stride +
                 h * p.query.out_head_stride;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      out[8 * n + 2 * t4] = o[n][2] * inv;
      out[8 * n + 2 * t4 + 1] = o[n][3] * inv;
    }
  }
#else
  __trap();
#endif
}

template <DType D, int HD>
cudaError_t launch_prefill_mma(const PrefillParams& p, Stream stream) {
  const auto kernel = prefill_mma_kernel<D, HD>;
  const size_t shared = prefill_mma_shared_bytes<D, HD>(p.cache.history_bits != 0);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((p.batch.max_query_len + kMmaRows - 1) / kMmaRows),
                  static_cast<unsigned>(p.query.num_heads), static_cast<unsigned>(p.batch.num_seqs));
  kernel<<<grid, kMmaThreads, shared, stream>>>(p);
  return cudaGetLastError();
}

template <DType D>
cudaError_t launch_prefill_mma_dtype(const PrefillParams& p, Stream stream) {
  if (p.cache.head_dim == 64) return launch_prefill_mma<D, 64>(p, stream);
  if (p.cache.head_dim == 128) return launch_prefill_mma<D, 128>(p, stream);
  return cudaErrorInvalidValue;
}
}  // namespace

size_t prefill_shared_bytes(int64_t head_dim) {
  // The floats, then slot[kKeysPerTile] and row[kKeysPerTile] (int64).
  return prefill_smem_floats(head_dim) * sizeof(float) + 2 * kKeysPerTile * sizeof(int64_t);
}

cudaError_t launch_attention_prefill(const AttentionQuery& query, const KvCacheView& cache,
                                     const AttentionBatch& batch, bool tensor_cores, Stream stream) {
  if (batch.num_seqs == 0 || batch.max_query_len == 0) return cudaSuccess;
  if (cache.head_dim > kPrefillMaxHeadDim || cache.head_dim % 4 != 0) return cudaErrorInvalidValue;
  PrefillParams p;
  p.query = query;
  p.cache = cache;
  p.batch = batch;
  p.group = query.num_heads / cache.num_kv_heads;
  if (tensor_cores) {
    if (!mma_attention_supported(cache.dtype, cache.head_dim)) return cudaErrorInvalidValue;
    switch (cache.dtype) {
      case DType::kBF16: return launch_prefill_mma_dtype<DType::kBF16>(p, stream);
      case DType::kF16: return launch_prefill_mma_dtype<DType::kF16>(p, stream);
      case DType::kI8: return launch_prefill_mma_dtype<DType::kI8>(p, stream);
      case DType::kF8E4M3: return launch_prefill_mma_dtype<DType::kF8E4M3>(p, stream);
      default: return cudaErrorInvalidValue;
    }
  }
  switch (cache.dtype) {
    case DType::kBF16: return launch_prefill_dtype<DType::kBF16>(p, stream);
    case DType::kF16: return launch_prefill_dtype<DType::kF16>(p, stream);
    case DType::kF32: return launch_prefill_dtype<DType::kF32>(p, stream);
    case DType::kI8: return launch_prefill_dtype<DType::kI8>(p, stream);
    case DType::kF8E4M3: return launch_prefill_dtype<DType::kF8E4M3>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tachyon::ops::cuda::detail
