// Block-sparse decode attention's two kernels of its own (ops.h select_kv_blocks and KvLayer's
// key bounds); the attention itself is the decode kernels' (attention_decode.cu), which read the
// kept blocks of each (sequence, kv head) as its context.
//
// key_bounds_kernel: one block per (history block, kv head), a thread per head dim: the dim's min
// and max over the block's keys as their history codes decode; a warp's 32 dims are one group, so
// its lo and step are the warp's min and max; then the 4-bit codes, each the answer of ops.h's
// rule (a guess from the division, moved until the condition flips: value(c) never decreases
// with c), so the codes equal the reference's wherever the decoded keys do.
//
// score_kernel: every candidate history block's bound is one warp's (lanes over the head dims,
// then the max over the group's query heads), written as an order-preserving u32 key to the
// workspace; tiles of 64 entries per block, so that a long context spreads over the GPU.
// select_kernel: one block of 1024 threads per (kv head, sequence), the keys copied into shared
// memory once where they fit (up to kSelectSmemKeys history entries). A 4-pass radix select over
// them (8 bits a pass, a 256-bin histogram in shared memory) finds the k-th largest key and how
// many of the keys equal to it the earliest entries take; one ordered pass (block scans) writes
// the kept entries in table order.
#include <algorithm>

#include <cub/block/block_scan.cuh>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kBoundsThreads = 128;
constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
// The selection walks every candidate once per radix pass, in one block per (kv head, sequence):
// as many threads as a block holds (a 128k context has 8k candidates).
constexpr int kSelectThreads = 1024;
constexpr int kSelectSmemKeys = 12288;  // 48 KB of dynamic shared memory: a 196k-token context

// ops.h KvLayer value(c): one rounding for the product, one for the sum.
__device__ __forceinline__ float bound_value(float lo, float step, int c) {
  return __fadd_rn(lo, __fmul_rn(static_cast<float>(c), step));
}

// Element d of history row `row` of K, as the attention kernels decode it.
__device__ __forceinline__ float history_key(const KvCacheView& cache, int64_t row, int64_t d) {
  if (cache.history_bits == 8) {
    return static_cast<float>(static_cast<const int8_t*>(cache.hk)[row * cache.head_dim + d]) *
           static_cast<const float*>(cache.hk_params)[row];
  }
  const uint8_t pair = static_cast<const uint8_t*>(cache.hk)[row * (cache.head_dim / 2) + d / 2];
  const float c = static_cast<float>((pair >> (4 * (d & 1))) & 0xf);
  const float2 p = int4_history_params(cache.hk_params, row);
  return fmaf(c, p.x, p.y);
}

__global__ void __launch_bounds__(kBoundsThreads) key_bounds_kernel(const int32_t* __restrict__ pairs,
                                                                    const KvCacheView cache) {
  static_assert(kKeyBoundGroup == 32, "a warp's dims are one group of the key bounds");
  pdl_wait();
  pdl_trigger();
  const int64_t dst = pairs[2 * blockIdx.x + 1];
  const int64_t h = blockIdx.y;
  const int64_t hd = cache.head_dim, bs = cache.block_size, heads = cache.num_kv_heads;
  const int tid = threadIdx.x, lane = tid & 31;
  constexpr int kDims = kDecodeMaxHeadDim / kBoundsThreads;  // dims per thread
  float mn[kDims], mx[kDims];
  bool finite = true;
#pragma unroll
  for (int j = 0; j < kDims; ++j) {
    const int64_t d = tid + j * kBoundsThreads;
    mn[j] = INFINITY;
    mx[j] = -INFINITY;
    if (d >= hd) continue;
    for (int64_t t = 0; t < bs; ++t) {
      const float x = history_key(cache, (dst * bs + t) * heads + h, d);
      finite = finite && isfinite(x);
      mn[j] = fminf(mn[j], x);
      mx[j] = fmaxf(mx[j], x);
    }
  }
  finite = __syncthreads_and(finite) != 0;
  const int64_t groups = key_bound_groups(hd);
  uint8_t* min_codes = const_cast<uint8_t*>(cache.kbounds) + (dst * heads + h) * hd;  // [2][hd / 2]
  uint8_t* max_codes = min_codes + hd / 2;
  float* params = const_cast<float*>(cache.kbound_params) + (dst * heads + h) * 2 * groups;
  if (!finite) {
    const float nan = __uint_as_float(0x7fc00000u);
    for (int64_t i = tid; i < 2 * groups; i += kBoundsThreads) params[i] = nan;
    for (int64_t i = tid; i < hd; i += kBoundsThreads) min_codes[i] = 0;
    return;
  }
#pragma unroll
  for (int j = 0; j < kDims; ++j) {
    const int64_t d = tid + j * kBoundsThreads;
    const int64_t first = d - lane;  // the warp's first dim, where its group starts
    if (first >= hd) continue;       // warp-uniform
    const float lo = -warp_max(-mn[j]), hi = warp_max(mx[j]);
    const float step = __fdiv_rn(hi - lo, 14.0f);
    if (lane == 0) {
      params[2 * (first / kKeyBoundGroup)] = lo;
      params[2 * (first / kKeyBoundGroup) + 1] = step;
    }
    const auto guess = [&](float x) {
      return step > 0.0f ? static_cast<int>(fminf(fmaxf(floorf(__fdiv_rn(x - lo, step)), 0.0f), 15.0f)) : 0;
    };
    int lc = 0, hc = 0;
    if (d < hd) {
      lc = guess(mn[j]);
      while (lc > 0 && bound_value(lo, step, lc) > mn[j]) --lc;
      while (lc < 15 && bound_value(lo, step, lc + 1) <= mn[j]) ++lc;
      hc = guess(mx[j]);
      while (hc < 15 && bound_value(lo, step, hc) < mx[j]) ++hc;
      while (hc > 0 && bound_value(lo, step, hc - 1) >= mx[j]) --hc;
    }
    // Dims 2i and 2i + 1 share a byte: the even lane writes both (d and lane share their parity).
    const int lc_next = __shfl_down_sync(kFullMask, lc, 1), hc_next = __shfl_down_sync(kFullMask, hc, 1);
    if (d < hd && (lane & 1) == 0) {
      min_codes[d / 2] = static_cast<uint8_t>(lc | lc_next << 4);
      max_codes[d / 2] = static_cast<uint8_t>(hc | hc_next << 4);
    }
  }
}

// A float as a u32 whose unsigned order is the float's (NaN given as +inf by the caller).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct SelectParams {
  const float* q;
  int64_t q_token_stride, q_head_stride;
  int64_t num_heads;
  KvCacheView cache;
  AttentionBatch batch;
  int32_t* tables;  // [num_seqs, kv heads, cols]
  int32_t* lens;    // [num_seqs, kv heads]
  uint32_t* keys;   // workspace [num_seqs, kv heads, cols]
};

// Scores of the candidates (history entries past the sinks) of every sequence with a budget:
// grid (entry tiles of kScoreEntries, kv heads, sequences), a warp per entry.
constexpr int kScoreEntries = 64;

__global__ void __launch_bounds__(kScoreThreads) score_kernel(const SelectParams p) {
  extern __shared__ float q_smem[];  // [group][head_dim]
  pdl_wait();
  pdl_trigger();
  const int64_t h = blockIdx.y;
  const int s = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const KvCacheView& cache = p.cache;
  const int64_t heads = cache.num_kv_heads, hd = cache.head_dim, bs = cache.block_size;
  const int64_t cols = p.batch.max_blocks_per_seq;
  const int64_t group = p.num_heads / heads;
  const int entries = static_cast<int>((p.batch.context_lens[s] + bs - 1) / bs);
  const int first = blockIdx.x * kScoreEntries;
  if (p.batch.sparse_budgets[s] <= 0 || first >= entries ||
      p.batch.query_start[s + 1] - p.batch.query_start[s] != 1) {
    return;
  }
  const int32_t* table = p.batch.block_tables + s * cols;
  const float* q = p.q + static_cast<int64_t>(p.batch.query_start[s]) * p.q_token_stride;
  for (int64_t e = tid; e < group * hd; e += kScoreThreads) {
    q_smem[e] = q[(h * group + e / hd) * p.q_head_stride + e % hd];
  }
  __syncthreads();
  uint32_t* keys = p.keys + (s * heads + h) * cols;
  const int last = min(entries, first + kScoreEntries);
  for (int i = first + warp; i < last; i += kScoreWarps) {
    // History entries lead the table; the sinks among them are kept whatever they score.
    if (i < p.batch.sparse_sink_blocks || table[i] < cache.num_blocks) continue;
    const int64_t hb = table[i] - cache.num_blocks;
    const uint8_t* codes = cache.kbounds + (hb * heads + h) * hd;  // [2][hd / 2]
    const float* params = cache.kbound_params + (hb * heads + h) * 2 * key_bound_groups(hd);
    float score = -INFINITY;
    if (isnan(params[0]) || isnan(params[1])) {  // every group's are NaN together
      score = INFINITY;
    } else {
      // The lane's dims 2 lane + 64 j and the next: their bound values, then each query head's sum.
      constexpr int kPairs = kDecodeMaxHeadDim / 64;
      float lo_v[2 * kPairs], hi_v[2 * kPairs];
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int64_t d = 2 * lane + 64 * j;
        if (d >= hd) continue;
        const float lo = params[2 * (d / kKeyBoundGroup)], step = params[2 * (d / kKeyBoundGroup) + 1];
        const uint32_t mnc = codes[d / 2], mxc = codes[hd / 2 + d / 2];
        lo_v[2 * j] = bound_value(lo, step, mnc & 0xfu);
        lo_v[2 * j + 1] = bound_value(lo, step, mnc >> 4);
        hi_v[2 * j] = bound_value(lo, step, mxc & 0xfu);
        hi_v[2 * j + 1] = bound_value(lo, step, mxc >> 4);
      }
      for (int64_t g = 0; g < group; ++g) {
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          const int64_t d = 2 * lane + 64 * j;
          if (d >= hd) continue;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float qd = q_smem[g * hd + d + e];
            sum += fmaxf(qd * lo_v[2 * j + e], qd * hi_v[2 * j + e]);
          }
        }
        sum = warp_sum(sum);
        score = isnan(sum) ? INFINITY : fmaxf(score, sum);
      }
    }
    if (lane == 0) keys[i] = order_key(score);
  }
}

// The selection from score_kernel's keys: a block per (kv head, sequence).
__global__ void __launch_bounds__(kSelectThreads) select_kernel(const SelectParams p) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int hist[256];
  __shared__ int shared_int[2];
  extern __shared__ uint32_t smem_keys[];  // [min(max_blocks_per_seq, kSelectSmemKeys)]
  pdl_wait();
  pdl_trigger();
  const int64_t h = blockIdx.x;
  const int s = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const KvCacheView& cache = p.cache;
  const int64_t heads = cache.num_kv_heads, bs = cache.block_size;
  const int64_t cols = p.batch.max_blocks_per_seq;
  const int32_t* table = p.batch.block_tables + s * cols;
  int32_t* out = p.tables + (s * heads + h) * cols;
  const int ctx = p.batch.context_lens[s];
  const int entries = static_cast<int>((ctx + bs - 1) / bs);

  // History entries: the leading ones whose ids name history blocks.
  int history = 0;
  for (int base = 0; base < entries; base += kSelectThreads) {
    const int i = base + tid;
    history += __syncthreads_count(i < entries && table[i] >= cache.num_blocks);
  }
  const int sinks = min(p.batch.sparse_sink_blocks, history);
  const int budget = p.batch.sparse_budgets[s];
  const int k = max(1, budget / static_cast<int>(bs));
  const bool one_query = p.batch.query_start[s + 1] - p.batch.query_start[s] == 1;
  if (budget <= 0 || k >= history - sinks || !one_query) {
    for (int64_t i = tid; i < cols; i += kSelectThreads) out[i] = i < entries ? table[i] : -1;
    if (tid == 0) p.lens[s * heads + h] = ctx;
    return;
  }

  const uint32_t* keys = p.keys + (s * heads + h) * cols;
  if (history <= kSelectSmemKeys) {  // the passes below read them four times
    for (int i = sinks + tid; i < history; i += kSelectThreads) smem_keys[i] = keys[i];
    __syncthreads();
    keys = smem_keys;
  }
  // Radix select: the k-th largest key (prefix) and how many of the keys equal to it to keep.
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kSelectThreads) hist[b] = 0;
    __syncthreads();
    // Scores of one block's candidates are alike, so their bins are too: the lanes of a warp
    // that share a bin add once (one shared-memory atomic where 32 would queue).
    for (int base = sinks; base < history; base += kSelectThreads) {
      const int i = base + tid;
      const uint32_t key = i < history ? keys[i] : 0u;
      const bool counted = i < history && (key & mask) == prefix;
      const uint32_t bin = counted ? (key >> shift) & 255u : 256u + static_cast<uint32_t>(lane);
      const unsigned peers = __match_any_sync(kFullMask, bin);
      if (counted && __ffs(peers) - 1 == lane) atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins 255 - 8 l .. 248 - 8 l (highest first).
      int sum = 0;
      for (int j = 0; j < 8; ++j) sum += hist[255 - 8 * lane - j];
      int inclusive = sum;
      for (int o = 1; o < 32; o *= 2) {
        const int other = __shfl_up_sync(kFullMask, inclusive, o);
        if (lane >= o) inclusive += other;
      }
      const int before = inclusive - sum;  // keys in higher bins than this lane's
      const bool here = before < remaining && inclusive >= remaining;
      if (here) {
        int above = before;
        for (int j = 0; j < 8; ++j) {
          const int bin = 255 - 8 * lane - j;
          if (above + hist[bin] >= remaining) {
            shared_int[0] = bin;
            shared_int[1] = remaining - above;
            break;
          }
          above += hist[bin];
        }
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(shared_int[0]) << shift;
    mask |= 255u << shift;
    remaining = shared_int[1];
    __syncthreads();
  }

  // The kept entries in table order: sinks, the candidates above the threshold and the first
  // `remaining` equal to it, the window.
  int written = 0, equal_seen = 0;
  for (int base = 0; base < entries; base += kSelectThreads) {
    const int i = base + tid;
    const bool candidate = i >= sinks && i < history;
    const uint32_t key = candidate ? keys[i] : 0u;
    const int equal = candidate && key == prefix ? 1 : 0;
    int equal_rank, equal_total;
    Scan(scan_storage).ExclusiveSum(equal, equal_rank, equal_total);
    __syncthreads();
    const bool kept = i < entries && (!candidate || key > prefix || (equal && equal_seen + equal_rank < remaining));
    int at, kept_total;
    Scan(scan_storage).ExclusiveSum(kept ? 1 : 0, at, kept_total);
    __syncthreads();
    if (kept) out[written + at] = table[i];
    written += kept_total;
    equal_seen += equal_total;
  }
  for (int64_t i = written + tid; i < cols; i += kSelectThreads) out[i] = -1;
  if (tid == 0) p.lens[s * heads + h] = ctx - (entries - written) * static_cast<int>(bs);
}

}  // namespace

cudaError_t launch_key_bounds(const int32_t* pairs, int64_t num_pairs, const KvCacheView& cache, Stream stream) {
  if (num_pairs == 0 || cache.kbounds == nullptr) return cudaSuccess;
  if (cache.head_dim > kDecodeMaxHeadDim) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(num_pairs), static_cast<unsigned>(cache.num_kv_heads));
  return launch_pdl(key_bounds_kernel, grid, kBoundsThreads, 0, stream, pairs, cache);
}

size_t select_workspace_bytes(int num_seqs, int64_t num_kv_heads, int64_t cols) {
  return static_cast<size_t>(num_seqs) * static_cast<size_t>(num_kv_heads) * static_cast<size_t>(cols) *
         sizeof(uint32_t);
}

cudaError_t launch_select_kv_blocks(const float* q, int64_t q_token_stride, int64_t q_head_stride, int64_t num_heads,
                                    const KvCacheView& cache, const AttentionBatch& batch, int32_t* tables,
                                    int32_t* lens, void* workspace, Stream stream) {
  if (batch.num_seqs == 0) return cudaSuccess;
  SelectParams p;
  p.q = q;
  p.q_token_stride = q_token_stride;
  p.q_head_stride = q_head_stride;
  p.num_heads = num_heads;
  p.cache = cache;
  p.batch = batch;
  p.tables = tables;
  p.lens = lens;
  p.keys = static_cast<uint32_t*>(workspace);
  const size_t smem = static_cast<size_t>(num_heads / cache.num_kv_heads * cache.head_dim) * sizeof(float);
  const dim3 tiles(static_cast<unsigned>((batch.max_blocks_per_seq + kScoreEntries - 1) / kScoreEntries),
                   static_cast<unsigned>(cache.num_kv_heads), static_cast<unsigned>(batch.num_seqs));
  const cudaError_t e = launch_pdl(score_kernel, tiles, kScoreThreads, smem, stream, p);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(cache.num_kv_heads), static_cast<unsigned>(batch.num_seqs));
  const size_t key_smem =
      static_cast<size_t>(std::min<int64_t>(batch.max_blocks_per_seq, kSelectSmemKeys)) * sizeof(uint32_t);
  return launch_pdl(select_kernel, grid, kSelectThreads, key_smem, stream, p);
}

}  // namespace tachyon::ops::cuda::detail
