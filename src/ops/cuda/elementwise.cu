// Element-wise kernels: silu_mul (the MLP's gate), embedding rows, and a counter-based random
// fill (synthetic weights and benchmark inputs made on the device, reproducible from a seed).
// Grid-stride loops; nothing here keeps state between calls.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

__global__ void silu_mul_kernel(const float* __restrict__ gate, const Rows gate_rows, const float* __restrict__ up,
                                const Rows up_rows, float* __restrict__ out, const Rows out_rows) {
  const int64_t cols = gate_rows.cols;
  const int64_t total = gate_rows.rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float g = gate[gate_rows.offset(r) + c];
    const float u = up[up_rows.offset(r) + c];
    out[out_rows.offset(r) + c] = g / (1.0f + expf(-g)) * u;
  }
}

// One block per token; an id outside the table yields a NaN row (the host checks ids first).
__global__ void embedding_kernel(const void* table, DType table_dtype, int64_t table_stride, int64_t vocab,
                                 int64_t d, const int32_t* __restrict__ ids, float* __restrict__ out,
                                 int64_t out_stride) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + t * out_stride;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = __int_as_float(0x7fc00000);
    return;
  }
  const int64_t base = static_cast<int64_t>(id) * table_stride;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = load_as_f32(table, table_dtype, base + i);
}

__global__ void fill_random_kernel(void* data, DType dtype, int64_t count, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t bits = splitmix64(seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    store_from_f32(data, dtype, i, lo + (hi - lo) * u);
  }
}

}  // namespace

cudaError_t launch_silu_mul(const float* gate, const Rows& gate_rows, const float* up, const Rows& up_rows, float* out,
                            const Rows& out_rows, Stream stream) {
  const int64_t total = gate_rows.rows * gate_rows.cols;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  silu_mul_kernel<<<grid_for(total, threads), threads, 0, stream>>>(gate, gate_rows, up, up_rows, out, out_rows);
  return cudaGetLastError();
}

cudaError_t launch_embedding(const void* table, DType table_dtype, int64_t table_stride, int64_t vocab, int64_t d,
                             const int32_t* ids, int64_t n, float* out, int64_t out_stride, Stream stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  const int threads = static_cast<int>(std::clamp<int64_t>((d + 31) / 32 * 32, 32, 256));
  embedding_kernel<<<static_cast<unsigned>(n), threads, 0, stream>>>(table, table_dtype, table_stride, vocab, d, ids,
                                                                    out, out_stride);
  return cudaGetLastError();
}

cudaError_t launch_fill_random(void* data, DType dtype, int64_t count, uint64_t seed, float lo, float hi,
                               Stream stream) {
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  fill_random_kernel<<<grid_for(count, threads) , threads, 0, stream>>>(data, dtype, count, seed, lo, hi);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
