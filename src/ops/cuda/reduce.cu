// Row argmax (greedy sampling on the device) and the counter-based uniform fill of synthetic
// weights (the same draws as ops/cpu/fill.cpp).
#include <cmath>
#include <cstdint>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"

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

// Running (max, sum of exp(x - max)) of a set of values; merging rescales the smaller side.
__device__ __forceinline__ void merge_lse(float& m, float& l, float om, float ol) {
  if (om == -INFINITY) return;
  if (m == -INFINITY) {
    m = om;
    l = ol;
    return;
  }
  const float nm = fmaxf(m, om);
  l = l * __expf(m - nm) + ol * __expf(om - nm);
  m = nm;
}

struct Best {
  float v;  // the best value so far (-inf: none)
  int i;    // its index (0x7fffffff: none)
  float m;  // running max for log-sum-exp
  float l;  // running sum of exp(x - m)
};

__device__ __forceinline__ void merge(Best& a, const Best& b) {
  keep_better(a.v, a.i, b.v, b.i);
  merge_lse(a.m, a.l, b.m, b.l);
}

__device__ __forceinline__ Best shfl_down(const Best& b, int offset) {
  return Best{__shfl_down_sync(0xffffffffu, b.v, offset), __shfl_down_sync(0xffffffffu, b.i, offset),
              __shfl_down_sync(0xffffffffu, b.m, offset), __shfl_down_sync(0xffffffffu, b.l, offset)};
}

__device__ __forceinline__ void warp_reduce(Best& b) {
  for (int offset = 16; offset > 0; offset >>= 1) merge(b, shfl_down(b, offset));
}

// One block per row: the argmax and, when logprobs is set, log_softmax(x)[argmax].
__global__ void argmax_kernel(const float* x, int64_t x_stride, int64_t d, int32_t* ids, float* logprobs) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * x_stride;
  Best b{-INFINITY, 0x7fffffff, -INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float raw = row[j];
    const float v = isfinite(raw) ? raw : -INFINITY;
    keep_better(b.v, b.i, v, static_cast<int>(j));
    if (v != -INFINITY) merge_lse(b.m, b.l, v, 1.0f);
  }
  warp_reduce(b);
  __shared__ Best partial[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = b;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    b = lane < warps ? partial[lane] : Best{-INFINITY, 0x7fffffff, -INFINITY, 0.0f};
    warp_reduce(b);
    if (lane == 0) {
      ids[blockIdx.x] = b.i;
      if (logprobs != nullptr) logprobs[blockIdx.x] = b.v == -INFINITY ? -INFINITY : b.v - (b.m + __logf(b.l));
    }
  }
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

cudaError_t launch_argmax(const float* x, int64_t x_stride, int64_t n, int64_t d, int32_t* ids, float* logprobs,
                          Stream stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff || d > 0x7ffffffe) return cudaErrorInvalidValue;
  const int threads = d >= kArgmaxThreads ? kArgmaxThreads : static_cast<int>((d + 31) / 32 * 32);
  argmax_kernel<<<static_cast<unsigned>(n), threads, 0, stream>>>(x, x_stride, d, ids, logprobs);
  return cudaGetLastError();
}

cudaError_t launch_fill_uniform(void* data, DType dtype, int64_t count, uint64_t base, float bound, float offset,
                                Stream stream) {
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  fill_uniform_kernel<<<grid_for(count, threads), threads, 0, stream>>>(data, dtype, count, base, bound, offset);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
