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

// compress_kv_blocks: one warp per (pair, K or V, row of the block). The primary row is staged in
// shared memory as f32 (a quantized cache's code * scale, one rounding, as the reference reads
// it), then quantized to the history row: int8 by quantize_row (the i8 cache's rule), int4 with
// the row's min and (max - min) / 15 rounded to f16 as ops.h KvLayer says, IEEE division and rint
// as in the reference.
constexpr int kCompressWarps = 8;

__device__ __forceinline__ void quantize_row_int4(const float* __restrict__ x, int64_t head_dim,
                                                  uint8_t* __restrict__ codes, uint32_t* __restrict__ params,
                                                  int lane) {
  float lo = INFINITY, hi = -INFINITY;
  bool finite = true;
  for (int64_t i = lane; i < head_dim; i += 32) {
    finite = finite && isfinite(x[i]);
    lo = fminf(lo, x[i]);
    hi = fmaxf(hi, x[i]);
  }
  finite = __all_sync(kFullMask, finite);
  lo = -warp_max(-lo);
  hi = warp_max(hi);
  if (!finite) {
    if (lane == 0) *params = 0x7e007e00u;  // s = lo = NaN
    for (int64_t i = 2 * lane; i < head_dim; i += 64) codes[i / 2] = 0;
    return;
  }
  constexpr float kF16Max = 65504.0f;
  const __half lo16 = __float2half_rn(fminf(fmaxf(lo, -kF16Max), kF16Max));
  const float lo_f = __half2float(lo16);
  const __half s16 = __float2half_rn(fminf(fmaxf(__fdiv_rn(hi - lo_f, 15.0f), 0.0f), kF16Max));
  const float s = __half2float(s16);
  if (lane == 0) {
    *params = static_cast<uint32_t>(__half_as_ushort(s16)) | static_cast<uint32_t>(__half_as_ushort(lo16)) << 16;
  }
  const bool scaled = s > 0.0f;
  for (int64_t i = 2 * lane; i < head_dim; i += 64) {
    const float c0 = scaled ? fminf(fmaxf(rintf(__fdiv_rn(x[i] - lo_f, s)), 0.0f), 15.0f) : 0.0f;
    const float c1 = scaled ? fminf(fmaxf(rintf(__fdiv_rn(x[i + 1] - lo_f, s)), 0.0f), 15.0f) : 0.0f;
    codes[i / 2] = static_cast<uint8_t>(static_cast<uint32_t>(c0) | static_cast<uint32_t>(c1) << 4);
  }
}

template <DType D>
__global__ void __launch_bounds__(kCompressWarps * 32) compress_kv_kernel(const int32_t* __restrict__ pairs,
                                                                          int64_t num_pairs, const KvCacheView cache) {
  extern __shared__ float staged[];  // [kCompressWarps][head_dim]
  pdl_wait();
  pdl_trigger();
  using E = Elem<D>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t hd = cache.head_dim;
  float* x = staged + warp * hd;
  const int64_t rows = cache.block_size * cache.num_kv_heads;  // (slot, head) rows of a block
  const int64_t work = num_pairs * 2 * rows;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kCompressWarps;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kCompressWarps) + warp; w < work; w += warps) {
    const int64_t pair = w / (2 * rows), which = (w / rows) % 2, r = w % rows;
    const int64_t src_row = pairs[2 * pair] * rows + r, dst_row = pairs[2 * pair + 1] * rows + r;
    const auto* pool = static_cast<const typename E::T*>(which == 0 ? cache.k : cache.v);
    const float* scales = which == 0 ? cache.k_scales : cache.v_scales;
    const float scale = is_quantized_kv(D) ? scales[src_row] : 1.0f;
    for (int64_t i = lane; i < hd; i += 32) {
      const float value = E::load(pool, src_row * hd + i);
      x[i] = is_quantized_kv(D) ? value * scale : value;
    }
    __syncwarp();
    auto* codes = static_cast<uint8_t*>(const_cast<void*>(which == 0 ? cache.hk : cache.hv));
    void* params = const_cast<void*>(which == 0 ? cache.hk_params : cache.hv_params);
    if (cache.history_bits == 8) {
      quantize_row<DType::kI8>(x, hd, 127.0f, codes + dst_row * hd, static_cast<float*>(params) + dst_row, lane);
    } else {
      quantize_row_int4(x, hd, codes + dst_row * (hd / 2), static_cast<uint32_t*>(params) + dst_row, lane);
    }
    __syncwarp();  // every lane has read x before the next row overwrites it
  }
}

}  // namespace

cudaError_t launch_compress_kv_blocks(const int32_t* pairs, int64_t num_pairs, const KvCacheView& cache,
                                      Stream stream) {
  if (num_pairs == 0) return cudaSuccess;
  const int64_t rows = num_pairs * 2 * cache.block_size * cache.num_kv_heads;
  const unsigned blocks = grid_for(rows, kCompressWarps);
  const size_t smem = static_cast<size_t>(kCompressWarps * cache.head_dim) * sizeof(float);
  switch (cache.dtype) {
    case DType::kF32:
      return launch_pdl(compress_kv_kernel<DType::kF32>, blocks, kCompressWarps * 32, smem, stream, pairs, num_pairs,
                        cache);
    case DType::kBF16:
      return launch_pdl(compress_kv_kernel<DType::kBF16>, blocks, kCompressWarps * 32, smem, stream, pairs, num_pairs,
                        cache);
    case DType::kF16:
      return launch_pdl(compress_kv_kernel<DType::kF16>, blocks, kCompressWarps * 32, smem, stream, pairs, num_pairs,
                        cache);
    case DType::kI8:
      return launch_pdl(compress_kv_kernel<DType::kI8>, blocks, kCompressWarps * 32, smem, stream, pairs, num_pairs,
                        cache);
    case DType::kF8E4M3:
      return launch_pdl(compress_kv_kernel<DType::kF8E4M3>, blocks, kCompressWarps * 32, smem, stream, pairs,
                        num_pairs, cache);
    default: return cudaErrorInvalidValue;
  }
}

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
