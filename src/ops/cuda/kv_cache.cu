// store_kv: this step's K/V rows scattered into the paged cache at slot_mapping (a negative slot
// is a padding token and stores nothing). Rounding to f16/bf16 is core/dtype.h's, bit for bit.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

__global__ void store_kv_kernel(const float* __restrict__ k, int64_t k_token_stride, int64_t k_head_stride,
                                const float* __restrict__ v, int64_t v_token_stride, int64_t v_head_stride, int64_t n,
                                const int32_t* __restrict__ slot_mapping, const KvCacheView cache) {
  const int64_t per_token = cache.num_kv_heads * cache.head_dim;
  const int64_t total = n * per_token;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int64_t rem = i % per_token;
    const int64_t h = rem / cache.head_dim, d = rem % cache.head_dim;
    const int32_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t dst = (static_cast<int64_t>(slot) * cache.num_kv_heads + h) * cache.head_dim + d;
    store_from_f32(cache.k, cache.dtype, dst, k[t * k_token_stride + h * k_head_stride + d]);
    store_from_f32(cache.v, cache.dtype, dst, v[t * v_token_stride + h * v_head_stride + d]);
  }
}

}  // namespace

cudaError_t launch_store_kv(const float* k, int64_t k_token_stride, int64_t k_head_stride, const float* v,
                            int64_t v_token_stride, int64_t v_head_stride, int64_t n, const int32_t* slot_mapping,
                            const KvCacheView& cache, Stream stream) {
  const int64_t total = n * cache.num_kv_heads * cache.head_dim;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads, 65535));
  store_kv_kernel<<<blocks, threads, 0, stream>>>(k, k_token_stride, k_head_stride, v, v_token_stride, v_head_stride,
                                                  n, slot_mapping, cache);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
