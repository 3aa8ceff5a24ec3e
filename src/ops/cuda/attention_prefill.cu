// Prefill / mixed-batch attention over the paged cache, FlashAttention-2 style on CUDA cores:
// grid (query tiles of 32 rows, query heads, sequences). A block keeps its 32 query rows in
// shared memory, walks the keys its rows can see in tiles of 32 (gathered through the block
// table, converted to f32 in shared memory), and keeps an online softmax per row; no score matrix
// ever reaches memory. Thread (r, c) of 4 per row scores keys c, c+4, ...; the 4 threads of a row
// are one quad of a warp, so row max/sum are two shuffles. Causal within the chunk, sliding
// window, GQA (head h reads KV head h / group).
// Invariants: keys a tile's rows cannot see are never loaded (zeros stand in), so poisoned or
// released cache blocks never reach the arithmetic.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"

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

// Rows t < valid of the K/V tile from the cache (element offsets in slot[]), rows valid.. zeroed.
template <DType D>
__device__ inline void load_tile(const void* k_cache, const void* v_cache, const int64_t* slot, int valid,
                                 int64_t head_dim, float* ks, float* vs) {
  using E = Elem<D>;
  using T = typename E::T;
  const T* kc = static_cast<const T*>(k_cache);
  const T* vc = static_cast<const T*>(v_cache);
  const int64_t rs = head_dim + 4;
  const int64_t per_row = head_dim / 4;  // 4-element chunks
  const int64_t total = kKeysPerTile * per_row;
  for (int64_t c = threadIdx.x; c < total; c += kThreads) {
    const int64_t t = c / per_row, off = (c % per_row) * 4;
    float4 kf = make_float4(0.f, 0.f, 0.f, 0.f), vf = kf;
    if (t < valid) {
      const T* kp = kc + slot[t] + off;
      const T* vp = vc + slot[t] + off;
      if constexpr (D == DType::kF32) {
        kf = *reinterpret_cast<const float4*>(kp);
        vf = *reinterpret_cast<const float4*>(vp);
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

  const int ctx = p.batch.context_lens[s];
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
  float m = -INFINITY, l = 0.0f;
  float4 acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int32_t* table = p.batch.block_tables + static_cast<int64_t>(s) * p.batch.max_blocks_per_seq;
  const int64_t bs = p.cache.block_size;

  for (int k0 = key_lo; k0 < key_hi; k0 += kKeysPerTile) {
    const int valid = min(kKeysPerTile, key_hi - k0);
    if (tid < valid) {
      const int key = k0 + tid;
      const int64_t block = table[key / bs];
      slot[tid] = ((block * bs + key % bs) * p.cache.num_kv_heads + kvh) * hd;
    }
    __syncthreads();  // slot ready; also orders the previous tile's reads before these writes
    load_tile<D>(p.cache.k, p.cache.v, slot, valid, hd, ks, vs);
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
      const bool ok = row_valid && t < valid && key <= pos && (window <= 0 || pos - key < window);
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

}  // namespace

size_t prefill_shared_bytes(int64_t head_dim) {
  return prefill_smem_floats(head_dim) * sizeof(float) + kKeysPerTile * sizeof(int64_t);
}

cudaError_t launch_attention_prefill(const AttentionQuery& query, const KvCacheView& cache,
                                     const AttentionBatch& batch, Stream stream) {
  if (batch.num_seqs == 0 || batch.max_query_len == 0) return cudaSuccess;
  if (cache.head_dim > kPrefillMaxHeadDim || cache.head_dim % 4 != 0) return cudaErrorInvalidValue;
  PrefillParams p;
  p.query = query;
  p.cache = cache;
  p.batch = batch;
  p.group = query.num_heads / cache.num_kv_heads;
  switch (cache.dtype) {
    case DType::kBF16: return launch_prefill_dtype<DType::kBF16>(p, stream);
    case DType::kF16: return launch_prefill_dtype<DType::kF16>(p, stream);
    case DType::kF32: return launch_prefill_dtype<DType::kF32>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tachyon::ops::cuda::detail
