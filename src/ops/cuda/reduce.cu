// Row argmax (greedy sampling on the device), the m best tokens of a row (a draft's token tree),
// a decode batch's step on the device, and the counter-based uniform fill of synthetic weights
// (the same draws as ops/cpu/fill.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kArgmaxThreads = 1024;

// Larger value wins, equal values the smaller index; non-finite values count as -inf (as the
// sampler excludes them).
__device__ __forceinline__ void keep_better(float& best_v, int& best_i, float v, int i) {
  if (v > best_v || (v == best_v && i < best_i)) {
    best_v = v;
    best_i = i;
  }
}

struct Best {
  float v;  // the best value so far (-inf: none)
  int i;    // its index (0x7fffffff: none)
};

__device__ __forceinline__ void warp_reduce(Best& b) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_down_sync(kFullMask, b.v, offset);
    const int i = __shfl_down_sync(kFullMask, b.i, offset);
    keep_better(b.v, b.i, v, i);
  }
}

__device__ __forceinline__ float finite_or_neg_inf(float x) { return isfinite(x) ? x : -INFINITY; }

// One block per row: the argmax, then (when logprobs is set) a second pass over the same values
// (cache hits) for sum(exp(x - max)), so that log_softmax(x)[argmax] = -log(sum). Rows 16-byte
// aligned with d % 4 == 0 read float4s.
__global__ void argmax_kernel(const float* x, int64_t x_stride, int64_t d, int32_t* ids, float* logprobs) {
  pdl_wait();
  pdl_trigger();
  const float* row = x + static_cast<int64_t>(blockIdx.x) * x_stride;
  const bool vec = (reinterpret_cast<uintptr_t>(row) & 15u) == 0 && d % 4 == 0;
  Best b{-INFINITY, 0x7fffffff};
  if (vec) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t j = threadIdx.x; j < d / 4; j += blockDim.x) {
      const float4 q = row4[j];
      const int i = static_cast<int>(4 * j);
      keep_better(b.v, b.i, finite_or_neg_inf(q.x), i);
      keep_better(b.v, b.i, finite_or_neg_inf(q.y), i + 1);
      keep_better(b.v, b.i, finite_or_neg_inf(q.z), i + 2);
      keep_better(b.v, b.i, finite_or_neg_inf(q.w), i + 3);
    }
  } else {
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) keep_better(b.v, b.i, finite_or_neg_inf(row[j]), static_cast<int>(j));
  }
  __shared__ Best partial[kArgmaxThreads / 32];
  __shared__ float partial_sum[kArgmaxThreads / 32];
  __shared__ Best best;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  warp_reduce(b);
  if (lane == 0) partial[warp] = b;
  __syncthreads();
  if (warp == 0) {
    b = lane < warps ? partial[lane] : Best{-INFINITY, 0x7fffffff};
    warp_reduce(b);
    if (lane == 0) {
      best = b;
      ids[blockIdx.x] = b.i;
    }
  }
  if (logprobs == nullptr) return;
  __syncthreads();
  const float m = best.v;
  if (m == -INFINITY) {  // nothing finite in the row
    if (threadIdx.x == 0) logprobs[blockIdx.x] = -INFINITY;
    return;
  }
  float sum = 0.0f;
  if (vec) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t j = threadIdx.x; j < d / 4; j += blockDim.x) {
      const float4 q = row4[j];
      sum += __expf(finite_or_neg_inf(q.x) - m) + __expf(finite_or_neg_inf(q.y) - m) +
             __expf(finite_or_neg_inf(q.z) - m) + __expf(finite_or_neg_inf(q.w) - m);
    }
  } else {
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += __expf(finite_or_neg_inf(row[j]) - m);
  }
  sum = warp_sum(sum);
  if (lane == 0) partial_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += partial_sum[w];
    logprobs[blockIdx.x] = -__logf(total);
  }
}

// The argmax of a row in chunks: grid (chunks, rows); block (c, r) reduces columns
// [c * chunk, (c + 1) * chunk) of row r to (max, its first index, sum of exp(x - max)) in
// parts[r * chunks + c]; argmax_merge_kernel then merges a row's chunks in order. Rows with few
// siblings spread over many SMs this way (one block per row reads a 128k-entry vocabulary from a
// single SM).
struct ArgmaxPart {
  float m;
  int i;
  float l;
  float pad;
};

__global__ void argmax_chunk_kernel(const float* x, int64_t x_stride, int64_t d, int64_t chunk, ArgmaxPart* parts,
                                    bool want_sum) {
  pdl_wait();
  pdl_trigger();
  const float* row = x + static_cast<int64_t>(blockIdx.y) * x_stride;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = min64(d, begin + chunk);
  Best b{-INFINITY, 0x7fffffff};
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) keep_better(b.v, b.i, finite_or_neg_inf(row[j]), static_cast<int>(j));
  __shared__ Best partial[kArgmaxThreads / 32];
  __shared__ float partial_sum[kArgmaxThreads / 32];
  __shared__ Best best;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  warp_reduce(b);
  if (lane == 0) partial[warp] = b;
  __syncthreads();
  if (warp == 0) {
    b = lane < warps ? partial[lane] : Best{-INFINITY, 0x7fffffff};
    warp_reduce(b);
    if (lane == 0) best = b;
  }
  __syncthreads();
  const float m = best.v;
  float sum = 0.0f;
  if (want_sum && m != -INFINITY) {
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) sum += __expf(finite_or_neg_inf(row[j]) - m);
  }
  sum = warp_sum(sum);
  if (lane == 0) partial_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += partial_sum[w];
    parts[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = ArgmaxPart{m, best.i, total, 0.0f};
  }
}

// One warp per row: the first chunk holding the row's maximum gives the index (chunks are in
// column order, each reports its first maximum); the sums are rescaled to the row's maximum.
__global__ void argmax_merge_kernel(const ArgmaxPart* parts, int chunks, int32_t* ids, float* logprobs) {
  pdl_wait();
  pdl_trigger();
  const ArgmaxPart* p = parts + static_cast<int64_t>(blockIdx.x) * chunks;
  Best b{-INFINITY, 0x7fffffff};
  for (int c = threadIdx.x; c < chunks; c += 32) keep_better(b.v, b.i, p[c].m, p[c].i);
  warp_reduce(b);
  const float m = __shfl_sync(kFullMask, b.v, 0);
  const int idx = __shfl_sync(kFullMask, b.i, 0);
  float sum = 0.0f;
  if (logprobs != nullptr && m != -INFINITY) {
    for (int c = threadIdx.x; c < chunks; c += 32) {
      if (p[c].m != -INFINITY) sum += p[c].l * __expf(p[c].m - m);
    }
  }
  sum = warp_sum(sum);
  if (threadIdx.x == 0) {
    ids[blockIdx.x] = idx;
    if (logprobs != nullptr) logprobs[blockIdx.x] = m == -INFINITY ? -INFINITY : -__logf(sum);
  }
}

// ---- top_tokens: the m best of a row, in two passes --------------------------------------------
// Pass 1, grid (chunks, rows) of kTopThreads: block (c, r) holds columns [c * chunk, (c + 1) *
// chunk) of row r in registers (kTopPerThread a thread), reduces them to their maximum and sum of
// exp(x - max), and picks its m best in m rounds, each a block-wide search for the best value
// ranked after the previous pick (value descending, then id ascending). Pass 2, one block per
// row, merges the chunks' m best the same way and normalizes by the row's rescaled sum.
constexpr int kTopThreads = 256;
constexpr int kTopPerThread = 16;
constexpr int64_t kTopChunk = static_cast<int64_t>(kTopThreads) * kTopPerThread;

struct TopPart {
  float m;  // the chunk's maximum (-inf: nothing finite)
  float l;  // sum of exp(x - m) over its finite values
};

// Ranked strictly after (pv, pi): smaller value, or the same value and a larger id.
__device__ __forceinline__ bool ranked_after(float v, int i, float pv, int pi) { return v < pv || (v == pv && i > pi); }

// The best (v, i) of the block (every thread passes its own; -inf/0x7fffffff for none), returned
// to every thread.
__device__ __forceinline__ Best block_best(Best b, Best* partial) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  warp_reduce(b);
  __syncthreads();  // partial may still be read by the previous call
  if (lane == 0) partial[warp] = b;
  __syncthreads();
  b = lane < warps ? partial[lane] : Best{-INFINITY, 0x7fffffff};
  warp_reduce(b);
  return Best{__shfl_sync(kFullMask, b.v, 0), __shfl_sync(kFullMask, b.i, 0)};
}

__global__ void top_chunk_kernel(const float* x, int64_t x_stride, int64_t d, int64_t chunk, int m, TopPart* parts,
                                 Best* candidates) {
  pdl_wait();
  pdl_trigger();
  const float* row = x + static_cast<int64_t>(blockIdx.y) * x_stride;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = min64(d, begin + chunk);
  float v[kTopPerThread];
  float mx = -INFINITY;
#pragma unroll
  for (int e = 0; e < kTopPerThread; ++e) {
    const int64_t j = begin + threadIdx.x + static_cast<int64_t>(e) * kTopThreads;
    v[e] = j < end ? finite_or_neg_inf(row[j]) : -INFINITY;
    mx = fmaxf(mx, v[e]);
  }
  __shared__ Best partial[kTopThreads / 32];
  __shared__ float partial_sum[kTopThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float top = block_best(Best{mx, 0}, partial).v;
  float sum = 0.0f;
  if (top != -INFINITY) {
#pragma unroll
    for (int e = 0; e < kTopPerThread; ++e) sum += __expf(v[e] - top);
  }
  sum = warp_sum(sum);
  if (lane == 0) partial_sum[warp] = sum;
  __syncthreads();
  const int64_t part = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kTopThreads / 32; ++w) total += partial_sum[w];
    parts[part] = TopPart{top, total};
  }
  Best prev{INFINITY, -1};
  for (int r = 0; r < m; ++r) {
    Best b{-INFINITY, 0x7fffffff};
    if (prev.v != -INFINITY) {
#pragma unroll
      for (int e = 0; e < kTopPerThread; ++e) {
        const int i = static_cast<int>(begin + threadIdx.x + static_cast<int64_t>(e) * kTopThreads);
        if (v[e] != -INFINITY && ranked_after(v[e], i, prev.v, prev.i)) keep_better(b.v, b.i, v[e], i);
      }
    }
    prev = block_best(b, partial);
    if (threadIdx.x == 0) candidates[part * m + r] = prev;
  }
}

__global__ void top_merge_kernel(const TopPart* parts, const Best* candidates, int chunks, int m, int32_t* ids,
                                 float* probs) {
  pdl_wait();
  pdl_trigger();
  const TopPart* p = parts + static_cast<int64_t>(blockIdx.x) * chunks;
  const Best* cand = candidates + static_cast<int64_t>(blockIdx.x) * chunks * m;
  const int count = chunks * m;
  __shared__ Best partial[kTopThreads / 32];
  __shared__ float partial_sum[kTopThreads / 32];
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) mx = fmaxf(mx, p[c].m);
  const float top = block_best(Best{mx, 0}, partial).v;
  float sum = 0.0f;
  if (top != -INFINITY) {
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      if (p[c].m != -INFINITY) sum += p[c].l * __expf(p[c].m - top);
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  sum = warp_sum(sum);
  if (lane == 0) partial_sum[warp] = sum;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kTopThreads / 32; ++w) total += partial_sum[w];
  Best prev{INFINITY, -1};
  for (int r = 0; r < m; ++r) {
    Best b{-INFINITY, 0x7fffffff};
    if (prev.v != -INFINITY) {
      for (int c = threadIdx.x; c < count; c += blockDim.x) {
        const Best x = cand[c];
        if (x.v != -INFINITY && ranked_after(x.v, x.i, prev.v, prev.i)) keep_better(b.v, b.i, x.v, x.i);
      }
    }
    prev = block_best(b, partial);
    if (threadIdx.x == 0) {
      const bool have = prev.v != -INFINITY;
      ids[static_cast<int64_t>(blockIdx.x) * m + r] = have ? prev.i : -1;
      probs[static_cast<int64_t>(blockIdx.x) * m + r] = have ? __expf(prev.v - top) / total : 0.0f;
    }
  }
}

// One thread per sequence of a decode batch (ops::advance_decode); a position past the table's
// blocks gets slot -1, which store_kv skips.
__global__ void advance_decode_kernel(const int32_t* next_ids, int32_t* token_ids, int32_t* positions,
                                      int32_t* context_lens, const int32_t* block_tables, int64_t columns,
                                      int block_size, int32_t* slot_mapping, int n) {
  pdl_wait();
  pdl_trigger();
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n) return;
  const int32_t p = positions[s] + 1;
  const int64_t column = p / block_size;
  const int32_t block = column < columns ? block_tables[s * columns + column] : -1;
  token_ids[s] = next_ids[s];
  positions[s] = p;
  context_lens[s] += 1;
  slot_mapping[s] = block >= 0 ? block * block_size + p % block_size : -1;
}

__global__ void fill_uniform_kernel(void* data, DType dtype, int64_t count, uint64_t base, float bound, float offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(base + static_cast<uint64_t>(i));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    store_from_f32(data, dtype, i, __fmaf_rn(bound, 2.0f * u - 1.0f, offset));
  }
}

}  // namespace

int argmax_chunks(int64_t n, int64_t d) {
  // About 256 blocks in all, chunks of at least 4096 columns, at most 64 per row.
  if (n <= 0 || n > 65535) return 1;
  const int64_t by_grid = (256 + n - 1) / n;
  const int64_t by_size = d / 4096;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({by_grid, by_size, 64})));
}

size_t argmax_workspace_bytes(int64_t n, int64_t d) {
  const int chunks = argmax_chunks(n, d);
  return chunks > 1 ? static_cast<size_t>(n) * chunks * sizeof(ArgmaxPart) : 0;
}

cudaError_t launch_argmax(const float* x, int64_t x_stride, int64_t n, int64_t d, int32_t* ids, float* logprobs,
                          void* workspace, size_t workspace_bytes, Stream stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff || d > 0x7ffffffe) return cudaErrorInvalidValue;
  const int chunks = argmax_chunks(n, d);
  if (chunks > 1 && workspace != nullptr && workspace_bytes >= argmax_workspace_bytes(n, d)) {
    const int64_t chunk = (d + chunks - 1) / chunks;
    auto* parts = static_cast<ArgmaxPart*>(workspace);
    const cudaError_t e = launch_pdl(argmax_chunk_kernel, dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(n)),
                                     256, 0, stream, x, x_stride, d, chunk, parts, logprobs != nullptr);
    if (e != cudaSuccess) return e;
    return launch_pdl(argmax_merge_kernel, static_cast<unsigned>(n), 32, 0, stream, parts, chunks, ids, logprobs);
  }
  const int threads = d >= kArgmaxThreads ? kArgmaxThreads : static_cast<int>((d + 31) / 32 * 32);
  return launch_pdl(argmax_kernel, static_cast<unsigned>(n), threads, 0, stream, x, x_stride, d, ids, logprobs);
}

int top_chunks(int64_t d) { return static_cast<int>((d + kTopChunk - 1) / kTopChunk); }

size_t top_tokens_workspace_bytes(int64_t n, int64_t d, int m) {
  const int64_t parts = n * top_chunks(d);
  return static_cast<size_t>(parts) * (sizeof(TopPart) + static_cast<size_t>(m) * sizeof(Best)) + 16;
}

cudaError_t launch_top_tokens(const float* x, int64_t x_stride, int64_t n, int64_t d, int m, int32_t* ids,
                              float* probs, void* workspace, size_t workspace_bytes, Stream stream) {
  if (n == 0) return cudaSuccess;
  const int chunks = top_chunks(d);
  if (n > 65535 || chunks > 65535 || m < 1 || workspace == nullptr ||
      workspace_bytes < top_tokens_workspace_bytes(n, d, m)) {
    return cudaErrorInvalidValue;
  }
  auto* candidates = static_cast<Best*>(workspace);
  auto* parts = reinterpret_cast<TopPart*>(candidates + n * chunks * m);
  const cudaError_t e = launch_pdl(top_chunk_kernel, dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(n)),
                                   kTopThreads, 0, stream, x, x_stride, d, kTopChunk, m, parts,
                                   static_cast<Best*>(candidates));
  if (e != cudaSuccess) return e;
  return launch_pdl(top_merge_kernel, static_cast<unsigned>(n), kTopThreads, 0, stream,
                    static_cast<const TopPart*>(parts), static_cast<const Best*>(candidates), chunks, m, ids, probs);
}

cudaError_t launch_advance_decode(const int32_t* next_ids, int32_t* token_ids, int32_t* positions,
                                  int32_t* context_lens, const int32_t* block_tables, int64_t columns, int block_size,
                                  int32_t* slot_mapping, int64_t n, Stream stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 128;
  return launch_pdl(advance_decode_kernel, grid_for(n, threads), threads, 0, stream, next_ids, token_ids, positions,
                    context_lens, block_tables, columns, block_size, slot_mapping, static_cast<int>(n));
}

cudaError_t launch_fill_uniform(void* data, DType dtype, int64_t count, uint64_t base, float bound, float offset,
                                Stream stream) {
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  fill_uniform_kernel<<<grid_for(count, threads), threads, 0, stream>>>(data, dtype, count, base, bound, offset);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
