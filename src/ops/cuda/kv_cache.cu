// store_kv: this step's K/V rows scattered into the paged cache at slot_mapping (a negative slot
// is a padding token and stores nothing). Rounding to f16/bf16 is core/dtype.h's, bit for bit;
// quantized caches (i8, f8e4m3) get the codes and scales of ops/cpu/reference.cpp's
// quantize_kv_row, bit for bit: IEEE f32 division (never __fdividef: this file must not be built
// with fast math), rint ties to even, and the hardware e4m3 conversion, which rounds to nearest
// even and saturates finite values to +-448 as f32_to_f8e4m3 does.
#include <cuda_fp8.h>

#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

__global__ void store_kv_kernel(const float* __restrict__ k, int64_t k_token_stride, int64_t k_head_stride,
                                const float* __restrict__ v, int64_t v_token_stride, int64_t v_head_stride, int64_t n,
                                const int32_t* __restrict__ slot_mapping, const KvCacheView cache) {
  pdl_wait();
  pdl_trigger();
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

constexpr int kQuantThreads = 256;  // 8 warps, one (token, kv head) row pair each at a time

// One row x[head_dim] (f32) of a quantized cache, by one warp: codes[head_dim] and *scale as
// ops.h KvLayer defines them. Lanes take elements lane, lane + 32, ...; x is read twice (the
// second pass hits L1), so any head_dim works.
template <DType D>
__device__ __forceinline__ void quantize_row(const float* __restrict__ x, int64_t head_dim, float q_max,
                                             uint8_t* __restrict__ codes, float* __restrict__ scale, int lane) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = lane; i < head_dim; i += 32) {
    const float value = x[i];
    finite = finite && isfinite(value);
    amax = fmaxf(amax, fabsf(value));
  }
  finite = __all_sync(kFullMask, finite);
  amax = warp_max(amax);  // exact, so order does not matter; meaningless (unused) when !finite
  // The reference's quiet NaN (std::numeric_limits<float>::quiet_NaN(), 0x7fc00000) bit for bit.
  const float s = finite ? amax / q_max : __uint_as_float(0x7fc00000u);
  if (lane == 0) *scale = s;
  const bool scaled = finite && s > 0.0f;
  for (int64_t i = lane; i < head_dim; i += 32) {
    const float r = scaled ? x[i] / s : 0.0f;
    if constexpr (D == DType::kI8) {
      codes[i] = static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(rintf(r), -127.0f), 127.0f)));
    } else {
      // r is finite here: the conversion's NaN case never arises.
      codes[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(r, __NV_SATFINITE, __NV_E4M3));
    }
  }
}

// Grid-stride over the n * num_kv_heads (token, kv head) rows, one warp per row: its K row and
// its V row.
template <DType D>
__global__ void __launch_bounds__(kQuantThreads) store_kv_quantized_kernel(
    const float* __restrict__ k, int64_t k_token_stride, int64_t k_head_stride, const float* __restrict__ v,
    int64_t v_token_stride, int64_t v_head_stride, int64_t n, const int32_t* __restrict__ slot_mapping,
    const KvCacheView cache, float q_max) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kQuantThreads / 32);
  const int64_t rows = n * cache.num_kv_heads;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(kQuantThreads / 32) + (threadIdx.x >> 5); r < rows;
       r += warps) {
    const int64_t t = r / cache.num_kv_heads, h = r % cache.num_kv_heads;
    const int32_t slot = slot_mapping[t];  // uniform across the warp
    if (slot < 0) continue;
    const int64_t row = static_cast<int64_t>(slot) * cache.num_kv_heads + h;  // (slot, head) index
    quantize_row<D>(k + t * k_token_stride + h * k_head_stride, cache.head_dim, q_max,
                    static_cast<uint8_t*>(cache.k) + row * cache.head_dim, cache.k_scales + row, lane);
    quantize_row<D>(v + t * v_token_stride + h * v_head_stride, cache.head_dim, q_max,
                    static_cast<uint8_t*>(cache.v) + row * cache.head_dim, cache.v_scales + row, lane);
  }
}

}  // namespace

cudaError_t launch_store_kv(const float* k, int64_t k_token_stride, int64_t k_head_stride, const float* v,
                            int64_t v_token_stride, int64_t v_head_stride, int64_t n, const int32_t* slot_mapping,
                            const KvCacheView& cache, Stream stream) {
  const int64_t total = n * cache.num_kv_heads * cache.head_dim;
  if (total == 0) return cudaSuccess;
  if (cache.dtype == DType::kI8 || cache.dtype == DType::kF8E4M3) {
    const int64_t rows = n * cache.num_kv_heads;
    const unsigned blocks = grid_for(rows, kQuantThreads / 32);
    // Q of ops.h KvLayer: the scale maps the row's max |x| to the largest code.
    if (cache.dtype == DType::kI8) {
      return launch_pdl(store_kv_quantized_kernel<DType::kI8>, blocks, kQuantThreads, 0, stream, k, k_token_stride,
                        k_head_stride, v, v_token_stride, v_head_stride, n, slot_mapping, cache, 127.0f);
    }
    return launch_pdl(store_kv_quantized_kernel<DType::kF8E4M3>, blocks, kQuantThreads, 0, stream, k, k_token_stride,
                      k_head_stride, v, v_token_stride, v_head_stride, n, slot_mapping, cache, kF8E4M3Max);
  }
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads, 65535));
  return launch_pdl(store_kv_kernel, blocks, threads, 0, stream, k, k_token_stride, k_head_stride, v, v_token_stride,
                    v_head_stride, n, slot_mapping, cache);
}

}  // namespace tachyon::ops::cuda::detail
