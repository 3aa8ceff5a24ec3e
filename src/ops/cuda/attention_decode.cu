// Decode attention over the paged cache (flash-decoding): every sequence has one query row, at
// the last position of its context. Grid (splits, kv heads, sequences): a block takes one slice
// of one sequence's context for one KV head and serves all the query heads of that head's GQA
// group, so each K/V row is read from memory once. Tiles of 32 keys are gathered through the
// block table into shared memory (f32) and each tile is read from shared memory once per phase,
// whatever the group size: scores split the head dims over the 4 warps (lane = key, all heads in
// registers), the softmax takes one warp per head, and P·V splits the keys over the warps (lane =
// 4 dims, all heads in registers); the warps' partial outputs meet once at the end. With several
// slices a second kernel combines the partial (max, sum, accumulator) triples in slice order.
// Quantized caches (i8, f8e4m3) run here too: the tile is stored in shared memory as code *
// scale, the reference's values exactly.
// On sm_80+ with a 16-bit or quantized cache and head_dim 64 or 128, decode_mma_kernel does the
// same work with 16-bit tiles behind a cp.async double buffer and the group's heads as rows of
// mma tiles (a quantized cache's codes staged, then expanded to bf16 in shared memory).
// Where the caller asks (AttentionQuery::out16), the kernel that writes an output row also writes
// it rounded to 16 bits, for the o_proj linear after it (no conversion pass there).
// History blocks (block table entries >= num_blocks, ops.h KvLayer): the CUDA-core kernel decodes
// their rows into the f32 tile (slot -1, the history row in row[]); the tensor-core one, for a
// 16-bit cache, into its 16-bit tile (MmaKvPipeline); a quantized cache with history pools is
// planned on CUDA cores.
// Block-sparse decode (batch.sparse_tables): a (sequence, kv head) block reads that head's kept
// blocks as its context, through its row of sparse_tables; slices split that shorter context.
// Invariants: keys outside [window start, context) are never loaded; a block never writes
// another block's output; results do not depend on timing.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/mma.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;  // keys per tile: one per lane when scoring
constexpr float kLog2e = 1.4426950408889634f;

struct DecodeParams {
  AttentionQuery query;
  KvCacheView cache;
  AttentionBatch batch;
  int64_t group;  // query heads per KV head
  int splits;
  float* part_acc;  // [num_seqs, splits, num_heads, head_dim]
  float* part_ml;   // [num_seqs, splits, num_heads, 2]: running max (log2 units), sum
};

struct DecodeSmem {
  float* q;       // [group][head_dim], pre-scaled by scale * log2(e)
  float* k;       // [kTile][head_dim + 4]
  float* v;       // [kTile][head_dim + 4]; after the last tile k/v hold the warps' outputs
  float* red;     // [kWarps][group][head_dim] (aliases k and v)
  float* part;    // [kWarps][group][kTile]: per-warp partial scores
  float* p;       // [group][kTile]
  float* alpha;   // [group]
  float* m;       // [group]
  float* l;       // [group]
  int64_t* slot;  // [kTile]: element offset of each key's row for this KV head
  int64_t* row;   // [kTile]: quantized caches: each key's (slot, kv head) row, its scales' index
};

__host__ __device__ inline int64_t decode_kv_floats(int64_t group, int64_t head_dim) {
  const int64_t tiles = 2 * kTile * (head_dim + 4);
  const int64_t reduce = kWarps * group * head_dim;
  return tiles > reduce ? tiles : reduce;
}

__host__ __device__ inline size_t decode_smem_floats(int64_t group, int64_t head_dim) {
  const int64_t floats = group * head_dim + decode_kv_floats(group, head_dim) + kWarps * group * kTile +
                         group * kTile + 3 * group;
  return static_cast<size_t>((floats + 1) / 2 * 2);  // the int64 slots that follow stay 8-byte aligned
}

__device__ inline DecodeSmem carve(float* base, int64_t group, int64_t head_dim) {
  DecodeSmem s;
  const int64_t rs = head_dim + 4;
  s.q = base;
  s.k = s.q + group * head_dim;
  s.v = s.k + kTile * rs;
  s.red = s.k;
  s.part = s.k + decode_kv_floats(group, head_dim);
  s.p = s.part + kWarps * group * kTile;
  s.alpha = s.p + group * kTile;
  s.m = s.alpha + group;
  s.l = s.m + group;
  s.slot = reinterpret_cast<int64_t*>(base + decode_smem_floats(group, head_dim));
  s.row = s.slot + kTile;
  return s;
}

// Quantized rows: chunks of CH codes (16: one 16-byte load; 4: one 4-byte load, for head_dim
// not a multiple of 16), each multiplied by its row's scale. Each thread loads the scales of its
// chunks' rows together with the codes (a separate pass would add a dependent round trip to
// memory to every tile).
template <DType D, int CH>
__device__ inline void load_quantized_kv_tile(const uint8_t* kc, const uint8_t* vc, const float* k_scales,
                                              const float* v_scales, const int64_t* slot, const int64_t* row,
                                              int valid, int64_t head_dim, float* ks, float* vs) {
  using Chunk = std::conditional_t<CH == 16, uint4, uint32_t>;
  const int64_t rs = head_dim + 4;
  constexpr int kBatch = 2;  // chunks of K and of V per thread in flight together
  const int64_t per_row = head_dim / CH;
  const int64_t total = valid * per_row;
  for (int64_t c0 = threadIdx.x; c0 < total; c0 += kThreads * kBatch) {
    Chunk kr[kBatch], vr[kBatch];
    float kscale[kBatch], vscale[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t c = c0 + j * kThreads;
      if (c < total && slot[c / per_row] >= 0) {
        const int64_t t = c / per_row, off = (c % per_row) * CH;
        kr[j] = *reinterpret_cast<const Chunk*>(kc + slot[t] + off);
        vr[j] = *reinterpret_cast<const Chunk*>(vc + slot[t] + off);
        kscale[j] = k_scales[row[t]];
        vscale[j] = v_scales[row[t]];
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t c = c0 + j * kThreads;
      if (c < total && slot[c / per_row] >= 0) {
        const int64_t t = c / per_row, off = (c % per_row) * CH;
        float f[CH];
        dequantize<D>(kr[j], kscale[j], f);
#pragma unroll
        for (int i = 0; i < CH; i += 4) *reinterpret_cast<float4*>(ks + t * rs + off + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
        dequantize<D>(vr[j], vscale[j], f);
#pragma unroll
        for (int i = 0; i < CH; i += 4) *reinterpret_cast<float4*>(vs + t * rs + off + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
      }
    }
  }
}

// 16-bit and f32 rows: 16-byte chunks (8-byte ones for a 16-bit head_dim % 8 == 4).
template <DType D>
__device__ inline void load_float_kv_tile(const void* k_cache, const void* v_cache, const int64_t* slot, int valid,
                                          int64_t head_dim, float* ks, float* vs) {
  using E = Elem<D>;
  using T = typename E::T;
  const T* kc = static_cast<const T*>(k_cache);
  const T* vc = static_cast<const T*>(v_cache);
  const int64_t rs = head_dim + 4;
  constexpr int kBatch = 2;  // chunks of K and of V per thread in flight together
  if (D == DType::kF32 || head_dim % 8 == 0) {
    constexpr int CH = E::kVec;  // 16-byte chunks
    const int64_t per_row = head_dim / CH;
    const int64_t total = valid * per_row;
    for (int64_t c0 = threadIdx.x; c0 < total; c0 += kThreads * kBatch) {
      uint4 kr[kBatch], vr[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t c = c0 + j * kThreads;
        if (c < total && slot[c / per_row] >= 0) {
          const int64_t t = c / per_row, off = (c % per_row) * CH;
          kr[j] = *reinterpret_cast<const uint4*>(kc + slot[t] + off);
          vr[j] = *reinterpret_cast<const uint4*>(vc + slot[t] + off);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t c = c0 + j * kThreads;
        if (c < total && slot[c / per_row] >= 0) {
          const int64_t t = c / per_row, off = (c % per_row) * CH;
          float f[CH];
          E::unpack(kr[j], f);
#pragma unroll
          for (int i = 0; i < CH; i += 4) *reinterpret_cast<float4*>(ks + t * rs + off + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
          E::unpack(vr[j], f);
#pragma unroll
          for (int i = 0; i < CH; i += 4) *reinterpret_cast<float4*>(vs + t * rs + off + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
        }
      }
    }
  } else {
    // 16-bit cache with head_dim % 8 == 4: 8-byte chunks of 4 elements.
    const int64_t per_row = head_dim / 4;
    const int64_t total = valid * per_row;
    for (int64_t c0 = threadIdx.x; c0 < total; c0 += kThreads * kBatch) {
      uint2 kr[kBatch], vr[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t c = c0 + j * kThreads;
        if (c < total && slot[c / per_row] >= 0) {
          const int64_t t = c / per_row, off = (c % per_row) * 4;
          kr[j] = *reinterpret_cast<const uint2*>(kc + slot[t] + off);
          vr[j] = *reinterpret_cast<const uint2*>(vc + slot[t] + off);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t c = c0 + j * kThreads;
        if (c < total && slot[c / per_row] >= 0) {
          const int64_t t = c / per_row, off = (c % per_row) * 4;
          float f[8];
          E::unpack(make_uint4(kr[j].x, kr[j].y, 0u, 0u), f);
          *reinterpret_cast<float4*>(ks + t * rs + off) = make_float4(f[0], f[1], f[2], f[3]);
          E::unpack(make_uint4(vr[j].x, vr[j].y, 0u, 0u), f);
          *reinterpret_cast<float4*>(vs + t * rs + off) = make_float4(f[0], f[1], f[2], f[3]);
        }
      }
    }
  }
}

// Gathers `valid` K and V rows (element offsets in slot[]; quantized caches: their scales at
// row[] of the scale pools; slot -1: history row row[]) into shared memory as f32.
template <DType D>
__device__ inline void load_kv_tile(const KvCacheView& cache, const int64_t* slot, const int64_t* row, int valid,
                                    float* ks, float* vs) {
  const int64_t head_dim = cache.head_dim;
  if constexpr (is_quantized_kv(D)) {
    const uint8_t* kc = static_cast<const uint8_t*>(cache.k);
    const uint8_t* vc = static_cast<const uint8_t*>(cache.v);
    if (head_dim % 16 == 0) {
      load_quantized_kv_tile<D, 16>(kc, vc, cache.k_scales, cache.v_scales, slot, row, valid, head_dim, ks, vs);
    } else {
      load_quantized_kv_tile<D, 4>(kc, vc, cache.k_scales, cache.v_scales, slot, row, valid, head_dim, ks, vs);
    }
  } else {
    load_float_kv_tile<D>(cache.k, cache.v, slot, valid, head_dim, ks, vs);
  }
  if (cache.history_bits != 0) {  // the rows of history blocks (slot -1), 4 elements a thread at a time
    const int64_t rs = head_dim + 4, per_row = head_dim / 4;
    for (int64_t c = threadIdx.x; c < valid * per_row; c += kThreads) {
      const int64_t t = c / per_row, off = (c % per_row) * 4;
      if (slot[t] >= 0) continue;
      float4 kf, vf;
      load_history4(cache, row[t], off, kf, vf);
      *reinterpret_cast<float4*>(ks + t * rs + off) = kf;
      *reinterpret_cast<float4*>(vs + t * rs + off) = vf;
    }
  }
}

// GMAX: the largest group this instantiation serves (group <= GMAX); head_dim <= 256, so a lane
// owns at most two 4-dim chunks of the output (kChunks).
template <DType D, int GMAX>
__global__ void __launch_bounds__(kThreads, 4) decode_kernel(const DecodeParams p) {
  constexpr int kChunks = 2;
  extern __shared__ float smem_raw[];
  pdl_wait();
  pdl_trigger();
  const int split = blockIdx.x;
  const int64_t kvh = blockIdx.y;
  const int s = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q_begin = p.batch.query_start[s];
  const int q_len = p.batch.query_start[s + 1] - q_begin;
  if (q_len <= 0) return;  // a sequence with no query this step (the combine skips it too)

  const int64_t hd = p.cache.head_dim, rs = hd + 4;
  const int group = static_cast<int>(p.group);
  const int64_t chunks = hd / 4;  // 4-dim chunks per head
  const int64_t num_heads = p.query.num_heads;
  const DecodeSmem sm = carve(smem_raw, group, hd);

  // Block-sparse: this kv head's kept blocks are the context (ops.h paged_attention).
  const bool sparse = p.batch.sparse_tables != nullptr;
  const int64_t sparse_row = static_cast<int64_t>(s) * p.cache.num_kv_heads + kvh;
  const int ctx = sparse ? p.batch.sparse_lens[sparse_row] : p.batch.context_lens[s];
  const int pos = ctx - 1;
  const int first = p.query.sliding_window > 0 ? max(0, pos - p.query.sliding_window + 1) : 0;
  const int keys = ctx - first;
  const int per_split = ((keys + p.splits - 1) / p.splits + kTile - 1) / kTile * kTile;
  const int kb = first + split * per_split;
  const int ke = min(ctx, kb + per_split);

  const float qscale = p.query.scale * kLog2e;
  const float* qrow = p.query.q + static_cast<int64_t>(q_begin) * p.query.q_token_stride;
  for (int64_t e = tid; e < group * hd; e += kThreads) {
    const int64_t g = e / hd, d = e % hd;
    sm.q[e] = qrow[(kvh * group + g) * p.query.q_head_stride + d] * qscale;
  }
  if (tid < group) {
    sm.m[tid] = -INFINITY;
    sm.l[tid] = 0.0f;
  }
  // acc[g][j]: this warp's keys' contribution to head g, dims 4 (lane + 32 j) .. + 3.
  float4 acc[GMAX][kChunks];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) acc[g][j] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int32_t* table = sparse ? p.batch.sparse_tables + sparse_row * p.batch.max_blocks_per_seq
                                : p.batch.block_tables + static_cast<int64_t>(s) * p.batch.max_blocks_per_seq;
  const int64_t bs = p.cache.block_size;
  __syncthreads();

  for (int k0 = kb; k0 < ke; k0 += kTile) {
    const int valid = min(kTile, ke - k0);
    if (tid < valid) {
      const int key = k0 + tid;
      const int64_t block = table[key / bs];
      const bool history = block >= p.cache.num_blocks;
      const int64_t row = ((history ? block - p.cache.num_blocks : block) * bs + key % bs) * p.cache.num_kv_heads +
                          kvh;  // (slot, kv head) of the primary or the history pools
      sm.slot[tid] = history ? -1 : row * hd;
      sm.row[tid] = row;
    }
    __syncthreads();
    load_kv_tile<D>(p.cache, sm.slot, sm.row, valid, sm.k, sm.v);
    __syncthreads();

    // Scores: lane = key; warp w sums the chunks c = w, w + 4, ... for every head of the group.
    {
      float part[GMAX];
#pragma unroll
      for (int g = 0; g < GMAX; ++g) part[g] = 0.0f;
      const float* kt = sm.k + lane * rs;
      for (int64_t c = warp; c < chunks; c += kWarps) {
        const float4 b = *reinterpret_cast<const float4*>(kt + 4 * c);
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
          if (g < group) {
            const float4 a = *reinterpret_cast<const float4*>(sm.q + g * hd + 4 * c);
            part[g] = fmaf(a.x, b.x, part[g]);
            part[g] = fmaf(a.y, b.y, part[g]);
            part[g] = fmaf(a.z, b.z, part[g]);
            part[g] = fmaf(a.w, b.w, part[g]);
          }
        }
      }
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        if (g < group) sm.part[(warp * group + g) * kTile + lane] = part[g];
      }
    }
    __syncthreads();

    // Online softmax: one warp per head, lane = key.
    for (int g = warp; g < group; g += kWarps) {
      float score = -INFINITY;
      if (lane < valid) {
        score = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) score += sm.part[(w * group + g) * kTile + lane];
      }
      const float m_old = sm.m[g];
      const float m_new = fmaxf(m_old, warp_max(score));  // finite: lane 0 holds a valid key
      const float pe = lane < valid ? exp2f(score - m_new) : 0.0f;
      const float sum = warp_sum(pe);
      sm.p[g * kTile + lane] = pe;
      __syncwarp();  // every lane has read m[g] before lane 0 replaces it
      if (lane == 0) {
        const float a = exp2f(m_old - m_new);
        sm.alpha[g] = a;
        sm.m[g] = m_new;
        sm.l[g] = sm.l[g] * a + sum;
      }
    }
    __syncthreads();

    // P·V: warp w takes keys w, w + 4, ...; lane owns dims 4 (lane + 32 j) .. + 3 of every head.
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      if (g < group) {
        const float a = sm.alpha[g];
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          acc[g][j].x *= a;
          acc[g][j].y *= a;
          acc[g][j].z *= a;
          acc[g][j].w *= a;
        }
      }
    }
    for (int t = warp; t < valid; t += kWarps) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int64_t c = lane + 32 * j;
        if (c < chunks) {
          const float4 vv = *reinterpret_cast<const float4*>(sm.v + t * rs + 4 * c);
#pragma unroll
          for (int g = 0; g < GMAX; ++g) {
            if (g < group) {
              const float pt = sm.p[g * kTile + t];
              acc[g][j].x = fmaf(pt, vv.x, acc[g][j].x);
              acc[g][j].y = fmaf(pt, vv.y, acc[g][j].y);
              acc[g][j].z = fmaf(pt, vv.z, acc[g][j].z);
              acc[g][j].w = fmaf(pt, vv.w, acc[g][j].w);
            }
          }
        }
      }
    }
    __syncthreads();  // the next tile overwrites slot, k, v, part and p
  }

  // The warps' partial outputs meet in shared memory (k/v are free now), summed in warp order.
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    if (g < group) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int64_t c = lane + 32 * j;
        if (c < chunks) *reinterpret_cast<float4*>(sm.red + (warp * group + g) * hd + 4 * c) = acc[g][j];
      }
    }
  }
  __syncthreads();
  const int64_t slots = group * chunks;  // float4 outputs of the block
  const int64_t base = (static_cast<int64_t>(s) * p.splits + split) * num_heads;
  float* orow = p.query.out + static_cast<int64_t>(q_begin) * p.query.out_token_stride;
  for (int64_t e = tid; e < slots; e += kThreads) {
    const int64_t g = e / chunks, d = (e % chunks) * 4;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 r = *reinterpret_cast<const float4*>(sm.red + (w * group + g) * hd + d);
      o.x += r.x;
      o.y += r.y;
      o.z += r.z;
      o.w += r.w;
    }
    if (p.splits == 1) {
      const float inv = 1.0f / sm.l[g];
      float* out = orow + (kvh * group + g) * p.query.out_head_stride + d;
      const float4 v = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
      out[0] = v.x;
      out[1] = v.y;
      out[2] = v.z;
      out[3] = v.w;
      if (p.query.out16.data != nullptr) {
        store4_16(p.query.out16.data, p.query.out16.dtype,
                  static_cast<int64_t>(q_begin) * p.query.out16.stride + (kvh * group + g) * hd + d, v);
      }
    } else {
      *reinterpret_cast<float4*>(p.part_acc + (base + kvh * group + g) * hd + d) = o;
    }
  }
  if (p.splits > 1 && tid < group) {
    p.part_ml[(base + kvh * group + tid) * 2] = sm.m[tid];
    p.part_ml[(base + kvh * group + tid) * 2 + 1] = sm.l[tid];
  }
}

// out[row, h, :] = sum_j 2^(m_j - M) acc_j / sum_j 2^(m_j - M) l_j, slices in order.
__global__ void decode_combine_kernel(const DecodeParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t h = blockIdx.x;
  const int s = blockIdx.y;
  const int q_begin = p.batch.query_start[s];
  if (p.batch.query_start[s + 1] - q_begin <= 0) return;
  const int64_t hd = p.cache.head_dim, num_heads = p.query.num_heads;
  const int64_t base = static_cast<int64_t>(s) * p.splits * num_heads + h;
  float m_max = -INFINITY;
  for (int j = 0; j < p.splits; ++j) m_max = fmaxf(m_max, p.part_ml[(base + j * num_heads) * 2]);
  float denom = 0.0f;
  for (int j = 0; j < p.splits; ++j) {
    const float m = p.part_ml[(base + j * num_heads) * 2];
    if (m != -INFINITY) denom += exp2f(m - m_max) * p.part_ml[(base + j * num_heads) * 2 + 1];
  }
  const float inv = 1.0f / denom;
  float* o = p.query.out + static_cast<int64_t>(q_begin) * p.query.out_token_stride + h * p.query.out_head_stride;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f;
    for (int j = 0; j < p.splits; ++j) {
      const float m = p.part_ml[(base + j * num_heads) * 2];
      if (m != -INFINITY) sum += exp2f(m - m_max) * p.part_acc[(base + j * num_heads) * hd + d];
    }
    o[d] = sum * inv;
    if (p.query.out16.data != nullptr) {
      static_cast<uint16_t*>(p.query.out16.data)[static_cast<int64_t>(q_begin) * p.query.out16.stride + h * hd + d] =
          f32_to_16_bits(sum * inv, p.query.out16.dtype);
    }
  }
}

template <DType D, int GMAX>
cudaError_t launch_decode(const DecodeParams& p, size_t shared, Stream stream) {
  const auto kernel = decode_kernel<D, GMAX>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.cache.num_kv_heads),
                  static_cast<unsigned>(p.batch.num_seqs));
  return launch_pdl(kernel, grid, kThreads, shared, stream, p);
}

template <DType D>
cudaError_t launch_decode_dtype(const DecodeParams& p, size_t shared, Stream stream) {
  if (p.group <= 1) return launch_decode<D, 1>(p, shared, stream);
  if (p.group <= 2) return launch_decode<D, 2>(p, shared, stream);
  if (p.group <= 4) return launch_decode<D, 4>(p, shared, stream);
  return launch_decode<D, 8>(p, shared, stream);
}


// ---- tensor cores (sm_80+, 16-bit or quantized caches, head_dim 64 or 128) -------------------------
// Same grid, slices and partial results as decode_kernel. The group's query heads are the rows of
// one 16-row mma tile (rows past the group are zero); K/V tiles of 64 keys stream through a
// two-stage cp.async pipeline in 16 bits, and warp w scores and accumulates keys 16w..16w+15 of
// every tile with its own online softmax; the four warps' (max, sum, output) meet in shared
// memory at the end. Memory-bound: the mma is the cheap way to do the arithmetic, not the point.
// Quantized caches (i8, f8e4m3): the pipeline stages codes and scales instead (kQuantizedStages
// tiles deep), and once a tile has landed the block expands the codes to bf16 in one 16-bit tile
// (exactly: i8 codes and e4m3 values fit bf16's 8-bit significand), which the bf16 mma code reads
// as it reads a bf16 cache's. The scales stay out of the tile: each key's K scale multiplies its
// f32 score, and its V scale its softmax weight before that is rounded to bf16, so the roundings
// are those of the bf16 path (query and weights), none on the cache's values. On the H200 this
// reads half the bytes of bf16 in about the same time (Llama-3-8B heads, batch 32: 164 / 604 us
// at 4k / 16k keys against bf16's 162 / 580 us; the CUDA-core kernel 368 / 1446 us): the
// expansion, not memory, is the limit, and 4 stages (2 blocks per SM instead of 3) ran slower.
// Expanding into the mma fragments in registers is the next step. The pipeline is MmaKvPipeline
// (mma.cuh), shared with prefill_mma_kernel.
template <DType D, int HD>
constexpr size_t decode_mma_shared_bytes(bool history = false) {
  // 16-bit caches: two stages of K and V tiles. Quantized caches: one K and V tile of bf16, then
  // kQuantizedStages stages of codes and scales. After the loop the same memory holds the warps' outputs
  // [kWarps][kDecodeMaxGroup][HD] f32 and their max/sum [kWarps][kDecodeMaxGroup][2].
  const size_t tiles = mma_kv_pipeline_bytes<D, HD>(history);
  constexpr size_t reduce = static_cast<size_t>(kWarps) * kDecodeMaxGroup * (HD + 2) * sizeof(float);
  return tiles > reduce ? tiles : reduce;
}

template <DType D, int HD>
__global__ void __launch_bounds__(kThreads) decode_mma_kernel(const DecodeParams p) {
  pdl_wait();
  pdl_trigger();
#if TACHYON_MMA_ENABLED
  constexpr bool kQuantized = is_quantized_kv(D);
  using M = MmaType<kQuantized ? DType::kBF16 : D>;
  constexpr int kStride = HD + 8;
  extern __shared__ __align__(16) unsigned char decode_mma_smem[];
  const int split = blockIdx.x;
  const int64_t kvh = blockIdx.y;
  const int s = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int q_begin = p.batch.query_start[s];
  if (p.batch.query_start[s + 1] - q_begin <= 0) return;
  const int group = static_cast<int>(p.group);
  const int64_t num_heads = p.query.num_heads;

  const bool sparse = p.batch.sparse_tables != nullptr;  // as in decode_kernel
  const int64_t sparse_row = static_cast<int64_t>(s) * p.cache.num_kv_heads + kvh;
  const int ctx = sparse ? p.batch.sparse_lens[sparse_row] : p.batch.context_lens[s];
  const int pos = ctx - 1;
  const int first = p.query.sliding_window > 0 ? max(0, pos - p.query.sliding_window + 1) : 0;
  const int keys = ctx - first;
  const int per_split = ((keys + p.splits - 1) / p.splits + kMmaKeys - 1) / kMmaKeys * kMmaKeys;
  const int kb = first + split * per_split;
  const int ke = min(ctx, kb + per_split);

  // Rows g (< group) of the A fragments; rows g + 8 are always past the group (<= 8).
  uint32_t qa[HD / 16][4];
  {
    const float qs = p.query.scale * kLog2e;
    const bool valid = g < group;
    const float* q = p.query.q + static_cast<int64_t>(q_begin) * p.query.q_token_stride +
                     (kvh * group + (valid ? g : 0)) * p.query.q_head_stride;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int d = 16 * kk + 2 * t4;
      qa[kk][0] = valid ? M::pack(q[d] * qs, q[d + 1] * qs) : 0u;
      qa[kk][1] = 0u;
      qa[kk][2] = valid ? M::pack(q[d + 8] * qs, q[d + 9] * qs) : 0u;
      qa[kk][3] = 0u;
    }
  }

  // The slice's keys [kb, ke); nothing is staged for an empty slice (num_tiles 0).
  const MmaKvPipeline<D, HD, kThreads> kv(
      decode_mma_smem, p.cache,
      sparse ? p.batch.sparse_tables + sparse_row * p.batch.max_blocks_per_seq
             : p.batch.block_tables + static_cast<int64_t>(s) * p.batch.max_blocks_per_seq,
      kvh, ke);
  const int num_tiles = kb < ke ? (ke - kb + kMmaKeys - 1) / kMmaKeys : 0;
  kv.prologue(kb, num_tiles);

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // row g's

  for (int it = 0; it < num_tiles; ++it) {
    const int k0 = kb + it * kMmaKeys;
    // The tile's K and V rows [kMmaKeys][HD + 8]; quantized, their scales [kMmaKeys] (null otherwise).
    const auto [ks, vs, k_scale, v_scale] = kv.tile(it, kb, num_tiles);
    const int wk = k0 + 16 * warp;  // the warp's first key
    if (wk < ke) {
      float sc[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
      for (int kk2 = 0; kk2 < HD / 32; ++kk2) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t b[4];
          ldmatrix_x4(b, smem_address(ks + (16 * warp + 8 * j + (lane & 7)) * kStride + 32 * kk2 + 8 * (lane >> 3)));
          M::mma(sc[j], qa[2 * kk2], b[0], b[1]);
          M::mma(sc[j], qa[2 * kk2 + 1], b[2], b[3]);
        }
      }
      if constexpr (kQuantized) {
        // Keys 16 warp + 8 j + 2 t4 + (0, 1) of the tile: scores of the codes times the K scales
        // (rows past the slice: zero scales, masked next).
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int t = 16 * warp + 8 * j + 2 * t4;
          sc[j][0] *= k_scale[t];
          sc[j][1] *= k_scale[t + 1];
        }
      }
      if (wk + 16 > ke) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int key = wk + 8 * j + 2 * t4;
          if (key >= ke) sc[j][0] = -INFINITY;
          if (key + 1 >= ke) sc[j][1] = -INFINITY;
        }
      }
      float mx = fmaxf(m, fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1])));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));  // finite: the warp's first key is valid
      const float alpha = exp2f(m - mx);
      m = mx;
      const float p00 = exp2f(sc[0][0] - mx), p01 = exp2f(sc[0][1] - mx);
      const float p10 = exp2f(sc[1][0] - mx), p11 = exp2f(sc[1][1] - mx);
      l = l * alpha + (p00 + p01 + p10 + p11);
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        o[n][0] *= alpha;
        o[n][1] *= alpha;
      }
      uint32_t pa[4] = {M::pack(p00, p01), 0u, M::pack(p10, p11), 0u};
      if constexpr (kQuantized) {
        // The weights of the V codes: each probability times its key's V scale.
        const int t = 16 * warp + 2 * t4;
        pa[0] = M::pack(p00 * v_scale[t], p01 * v_scale[t + 1]);
        pa[2] = M::pack(p10 * v_scale[t + 8], p11 * v_scale[t + 9]);
      }
#pragma unroll
      for (int nn = 0; nn < HD / 16; ++nn) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_address(vs + (16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride +
                                          16 * nn + (lane >> 4) * 8));
        M::mma(o[2 * nn], pa, b[0], b[1]);
        M::mma(o[2 * nn + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // before the next stage overwrites this tile
  }

  // The warps meet: [warp][row][HD] outputs, then [warp][row] (max, sum), in the tile memory.
  float* red = reinterpret_cast<float*>(decode_mma_smem);
  float* red_ml = red + kWarps * kDecodeMaxGroup * HD;
  l += __shfl_xor_sync(kFullMask, l, 1);
  l += __shfl_xor_sync(kFullMask, l, 2);
  if (g < group) {
    float* row = red + (warp * kDecodeMaxGroup + g) * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) *reinterpret_cast<float2*>(row + 8 * n + 2 * t4) = make_float2(o[n][0], o[n][1]);
    if (t4 == 0) {
      red_ml[(warp * kDecodeMaxGroup + g) * 2] = m;
      red_ml[(warp * kDecodeMaxGroup + g) * 2 + 1] = l;
    }
  }
  __syncthreads();
  const int64_t base = (static_cast<int64_t>(s) * p.splits + split) * num_heads;
  float* orow = p.query.out + static_cast<int64_t>(q_begin) * p.query.out_token_stride;
  for (int e = tid; e < group * HD; e += kThreads) {
    const int r = e / HD, d = e % HD;
    float mmax = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mmax = fmaxf(mmax, red_ml[(w * kDecodeMaxGroup + r) * 2]);
    float sum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = red_ml[(w * kDecodeMaxGroup + r) * 2];
      if (mw != -INFINITY) {
        const float f = exp2f(mw - mmax);
        sum += f * red_ml[(w * kDecodeMaxGroup + r) * 2 + 1];
        acc += f * red[(w * kDecodeMaxGroup + r) * HD + d];
      }
    }
    if (p.splits == 1) {
      orow[(kvh * group + r) * p.query.out_head_stride + d] = acc / sum;
      if (p.query.out16.data != nullptr) {
        static_cast<uint16_t*>(p.query.out16.data)[static_cast<int64_t>(q_begin) * p.query.out16.stride +
                                                   (kvh * group + r) * HD + d] = f32_to_16_bits(acc / sum, p.query.out16.dtype);
      }
    } else {
      p.part_acc[(base + kvh * group + r) * HD + d] = acc;
      if (d == 0) {
        p.part_ml[(base + kvh * group + r) * 2] = mmax;
        p.part_ml[(base + kvh * group + r) * 2 + 1] = sum;
      }
    }
  }
#else
  __trap();
#endif
}

template <DType D, int HD>
cudaError_t launch_decode_mma(const DecodeParams& p, Stream stream) {
  const auto kernel = decode_mma_kernel<D, HD>;
  const size_t shared = decode_mma_shared_bytes<D, HD>(p.cache.history_bits != 0);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.cache.num_kv_heads),
                  static_cast<unsigned>(p.batch.num_seqs));
  return launch_pdl(kernel, grid, kThreads, shared, stream, p);
}

template <DType D>
cudaError_t launch_decode_mma_dtype(const DecodeParams& p, Stream stream) {
  if (p.cache.head_dim == 64) return launch_decode_mma<D, 64>(p, stream);
  if (p.cache.head_dim == 128) return launch_decode_mma<D, 128>(p, stream);
  return cudaErrorInvalidValue;
}
}  // namespace

size_t decode_workspace_floats(int num_seqs, int64_t num_heads, int64_t head_dim, int splits) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(num_seqs) * splits * num_heads * (head_dim + 2);
}

size_t decode_shared_bytes(int64_t group, int64_t head_dim) {
  // The floats, then slot[kTile] and row[kTile] (int64).
  return decode_smem_floats(group, head_dim) * sizeof(float) + 2 * kTile * sizeof(int64_t);
}

cudaError_t launch_attention_decode(const AttentionQuery& query, const KvCacheView& cache,
                                    const AttentionBatch& batch, int splits, bool tensor_cores, float* workspace,
                                    Stream stream) {
  if (batch.num_seqs == 0) return cudaSuccess;
  DecodeParams p;
  p.query = query;
  p.cache = cache;
  p.batch = batch;
  p.group = query.num_heads / cache.num_kv_heads;
  p.splits = splits;
  p.part_acc = workspace;
  p.part_ml = splits > 1 ? workspace + static_cast<size_t>(batch.num_seqs) * splits * query.num_heads * cache.head_dim
                         : nullptr;
  if (p.group > kDecodeMaxGroup || cache.head_dim > kDecodeMaxHeadDim || cache.head_dim % 4 != 0 || splits < 1 ||
      splits > kDecodeMaxSplits) {
    return cudaErrorInvalidValue;
  }
  cudaError_t e = cudaErrorInvalidValue;
  if (tensor_cores) {
    if (!mma_decode_supported(cache.dtype, cache.head_dim)) return cudaErrorInvalidValue;
    switch (cache.dtype) {
      case DType::kBF16: e = launch_decode_mma_dtype<DType::kBF16>(p, stream); break;
      case DType::kF16: e = launch_decode_mma_dtype<DType::kF16>(p, stream); break;
      case DType::kI8: e = launch_decode_mma_dtype<DType::kI8>(p, stream); break;
      case DType::kF8E4M3: e = launch_decode_mma_dtype<DType::kF8E4M3>(p, stream); break;
      default: return cudaErrorInvalidValue;
    }
    if (e != cudaSuccess || splits == 1) return e;
    const dim3 grid(static_cast<unsigned>(query.num_heads), static_cast<unsigned>(batch.num_seqs));
    return launch_pdl(decode_combine_kernel, grid, 128, 0, stream, p);
  }
  const size_t shared = decode_shared_bytes(p.group, cache.head_dim);
  switch (cache.dtype) {
    case DType::kBF16: e = launch_decode_dtype<DType::kBF16>(p, shared, stream); break;
    case DType::kF16: e = launch_decode_dtype<DType::kF16>(p, shared, stream); break;
    case DType::kF32: e = launch_decode_dtype<DType::kF32>(p, shared, stream); break;
    case DType::kI8: e = launch_decode_dtype<DType::kI8>(p, shared, stream); break;
    case DType::kF8E4M3: e = launch_decode_dtype<DType::kF8E4M3>(p, shared, stream); break;
    default: break;
  }
  if (e != cudaSuccess || splits == 1) return e;
  const dim3 grid(static_cast<unsigned>(query.num_heads), static_cast<unsigned>(batch.num_seqs));
  return launch_pdl(decode_combine_kernel, grid, 128, 0, stream, p);
}

}  // namespace tachyon::ops::cuda::detail
