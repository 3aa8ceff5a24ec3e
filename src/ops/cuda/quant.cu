// Per-channel int8 and group-wise int4 weights on the device: quantization of 16-bit (or f32)
// rows, exactly as quant/quantize.cpp does it on the host (the same f32 operations in the same
// order, so the packed bytes, scales and zeros are identical), and the expansion to bf16 rows that
// lets cuBLASLt multiply a quantized weight when many tokens share it (linear.cpp); the expansion
// also takes per-channel e4m3 weights.
#include <algorithm>
#include <cstdint>

#include <cuda_fp16.h>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kQuantThreads = 256;

// One block per row: the largest |w| (exact in any order), then each weight rounded to nearest even.
// A row holding a non-finite weight gets a NaN scale and no packed values.
__global__ void __launch_bounds__(kQuantThreads) quantize_int8_rows_kernel(const void* w, DType dtype, int64_t w_stride,
                                                                           int64_t in, int8_t* packed, float* scales) {
  const int64_t o = blockIdx.x;
  const int64_t base = o * w_stride;
  float max_abs = 0.0f;
  bool finite = true;
  for (int64_t i = threadIdx.x; i < in; i += kQuantThreads) {
    const float v = load_as_f32(w, dtype, base + i);
    finite = finite && isfinite(v);
    max_abs = fmaxf(max_abs, fabsf(v));
  }
  for (int off = 16; off > 0; off >>= 1) max_abs = fmaxf(max_abs, __shfl_xor_sync(kFullMask, max_abs, off));
  finite = __all_sync(kFullMask, finite);
  __shared__ float warp_max[kQuantThreads / 32];
  __shared__ bool warp_finite[kQuantThreads / 32];
  if ((threadIdx.x & 31) == 0) {
    warp_max[threadIdx.x >> 5] = max_abs;
    warp_finite[threadIdx.x >> 5] = finite;
  }
  __syncthreads();
  max_abs = 0.0f;
  for (int i = 0; i < kQuantThreads / 32; ++i) {
    max_abs = fmaxf(max_abs, warp_max[i]);
    finite = finite && warp_finite[i];
  }
  if (!finite) {  // the scale says so (NaN); the caller checks the scales
    if (threadIdx.x == 0) scales[o] = NAN;
    return;
  }
  const float scale = __fdiv_rn(max_abs, 127.0f);
  const float inv = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
  for (int64_t i = threadIdx.x; i < in; i += kQuantThreads) {
    const float q = rintf(__fmul_rn(load_as_f32(w, dtype, base + i), inv));
    packed[o * in + i] = static_cast<int8_t>(fminf(fmaxf(q, -127.0f), 127.0f));
  }
  if (threadIdx.x == 0) scales[o] = scale;
}

// dst[o, i] (bf16, rows dst_stride apart) = packed[o, i] * scales[o], rounded to bf16 (packed i8
// or e4m3 codes). Grid: x over 16-column groups of a row, y over rows (grid-stride); each thread
// turns one 16-byte load into two 16-byte stores when the rows allow it (vec), else goes element
// by element.
template <DType D>
__global__ void dequantize_rows_kernel(const uint8_t* packed, int64_t w_stride, const float* scales, int64_t out,
                                       int64_t in, uint16_t* dst, int64_t dst_stride, bool vec) {
  for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
    const float scale = scales[o];
    const uint8_t* src = packed + o * w_stride;
    uint16_t* d = dst + o * dst_stride;
    if (vec) {
      for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 16; i < in;
           i += static_cast<int64_t>(gridDim.x) * blockDim.x * 16) {
        float f[16];
        Elem<D>::unpack(load_stream_16(src + i), f);
        uint32_t h[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          h[j] = f32_to_bf16_bits(f[2 * j] * scale) | (static_cast<uint32_t>(f32_to_bf16_bits(f[2 * j + 1] * scale)) << 16);
        }
        *reinterpret_cast<uint4*>(d + i) = make_uint4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint4*>(d + i + 8) = make_uint4(h[4], h[5], h[6], h[7]);
      }
    } else {
      for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < in;
           i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        d[i] = f32_to_bf16_bits(Elem<D>::load(reinterpret_cast<const typename Elem<D>::T*>(src), i) * scale);
      }
    }
  }
}

// One warp per (row, group): lane l holds columns l, l + 32, ... of the group (one 32-weight block
// each); the range always includes 0 (as on the host), so zeros are integers in [0, 15]. Block
// byte j takes column j's value in its low nibble and column j + 16's in its high one: lane j < 16
// gets its partner's value from lane j + 16. A group holding a non-finite weight gets a NaN scale
// and no packed values.
__global__ void __launch_bounds__(kQuantThreads) quantize_int4_groups_kernel(const void* w, DType dtype, int64_t w_stride,
                                                                             int64_t out, int64_t in, int group,
                                                                             bool f16_scales, uint8_t* packed,
                                                                             float* scales, float* zeros) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = in / group;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kQuantThreads / 32);
  for (int64_t item = blockIdx.x * static_cast<int64_t>(kQuantThreads / 32) + (threadIdx.x >> 5); item < out * groups;
       item += warps) {
    const int64_t o = item / groups, g = item % groups;
    const int64_t base = o * w_stride + g * group;
    float lo = 0.0f, hi = 0.0f;
    bool finite = true;
    for (int i = lane; i < group; i += 32) {
      const float v = load_as_f32(w, dtype, base + i);
      finite = finite && isfinite(v);
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
    }
    for (int off = 16; off > 0; off >>= 1) {
      lo = fminf(lo, __shfl_xor_sync(kFullMask, lo, off));
      hi = fmaxf(hi, __shfl_xor_sync(kFullMask, hi, off));
    }
    if (!__all_sync(kFullMask, finite)) {
      if (lane == 0) scales[item] = NAN;
      continue;
    }
    float scale = __fdiv_rn(__fsub_rn(hi, lo), 15.0f);
    if (f16_scales) {  // the smallest f16 value >= the scale (quant/quantize.cpp's f16_at_least)
      __half_raw h = __float2half_rn(scale);
      if (__half2float(h) < scale) ++h.x;
      scale = __half2float(h);
      if (isinf(scale)) {  // too wide for f16: the caller reports it, as for a non-finite weight
        if (lane == 0) scales[item] = NAN;
        continue;
      }
    }
    const float inv = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
    // std::clamp's comparisons, not fminf/fmaxf: a -0 (a group with no negative weight) stays -0,
    // as on the host.
    const float z = rintf(__fmul_rn(-lo, inv));
    const float zero = z < 0.0f ? 0.0f : (15.0f < z ? 15.0f : z);
    for (int i = lane; i < group; i += 32) {  // every lane runs the same number of rounds
      const float v = load_as_f32(w, dtype, base + i);
      const uint32_t q =
          static_cast<uint32_t>(fminf(fmaxf(__fadd_rn(rintf(__fmul_rn(v, inv)), zero), 0.0f), 15.0f));
      const uint32_t high = __shfl_down_sync(kFullMask, q, 16);
      if (lane < 16) {
        const int64_t col = g * group + i;  // column of this lane's low nibble: block start + lane
        packed[o * (in / 2) + col / 32 * 16 + lane] = static_cast<uint8_t>(q | (high << 4));
      }
    }
    if (lane == 0) {
      scales[item] = scale;
      zeros[item] = zero;
    }
  }
}

// dst[o, k] (bf16, rows dst_stride apart) = (q[o, k] - zeros[o, g]) * scales[o, g], rounded to bf16.
// Grid: x over 32-column blocks of a row, y over rows (grid-stride); one 16-byte load becomes four
// 16-byte stores.
__global__ void dequantize_int4_groups_kernel(const uint8_t* packed, int64_t w_stride, const float* scales,
                                              const float* zeros, int group, int64_t out, int64_t in, uint16_t* dst,
                                              int64_t dst_stride) {
  const int64_t groups = in / group;
  for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
    uint16_t* d = dst + o * dst_stride;
    for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 32; k < in;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x * 32) {
      const uint4 raw = load_stream_16(packed + o * w_stride + k / 2);
      const float scale = scales[o * groups + k / group], zero = zeros[o * groups + k / group];
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      uint32_t h[16];
#pragma unroll
      for (int j = 0; j < 32; j += 2) {
        float f[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = j + e, b = c & 15;
          const uint32_t q = (words[b >> 2] >> (8 * (b & 3) + (c < 16 ? 0 : 4))) & 15u;
          f[e] = (static_cast<float>(q) - zero) * scale;
        }
        h[j / 2] = f32_to_bf16_bits(f[0]) | (static_cast<uint32_t>(f32_to_bf16_bits(f[1])) << 16);
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        *reinterpret_cast<uint4*>(d + k + 8 * s) = make_uint4(h[4 * s], h[4 * s + 1], h[4 * s + 2], h[4 * s + 3]);
      }
    }
  }
}

}  // namespace

cudaError_t launch_quantize_int4_groups(const void* w, DType dtype, int64_t w_stride, int64_t out, int64_t in,
                                        int group, bool f16_scales, uint8_t* packed, float* scales, float* zeros,
                                        Stream stream) {
  if (out == 0 || in == 0) return cudaSuccess;
  if (group <= 0 || group % 32 != 0 || in % group != 0) return cudaErrorInvalidValue;
  const int64_t items = out * (in / group);
  const int64_t blocks = std::min<int64_t>((items + kQuantThreads / 32 - 1) / (kQuantThreads / 32), 65535);
  quantize_int4_groups_kernel<<<static_cast<unsigned>(blocks), kQuantThreads, 0, stream>>>(
      w, dtype, w_stride, out, in, group, f16_scales, packed, scales, zeros);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_int4_groups(const uint8_t* packed, int64_t w_stride, const float* scales,
                                          const float* zeros, int group, int64_t out, int64_t in, uint16_t* dst,
                                          int64_t dst_stride, Stream stream) {
  if (out == 0 || in == 0) return cudaSuccess;
  const auto aligned16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  if (group <= 0 || group % 32 != 0 || in % group != 0 || w_stride % 16 != 0 || dst_stride % 8 != 0 ||
      !aligned16(packed) || !aligned16(dst)) {
    return cudaErrorInvalidValue;
  }
  const int threads = 128;
  const int64_t per_block = static_cast<int64_t>(threads) * 32;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((in + per_block - 1) / per_block, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(out, 65535)));
  dequantize_int4_groups_kernel<<<grid, threads, 0, stream>>>(packed, w_stride, scales, zeros, group, out, in, dst,
                                                              dst_stride);
  return cudaGetLastError();
}

cudaError_t launch_quantize_int8_rows(const void* w, DType dtype, int64_t w_stride, int64_t out, int64_t in,
                                      int8_t* packed, float* scales, Stream stream) {
  if (out == 0 || in == 0) return cudaSuccess;
  if (out > 0x7fffffff) return cudaErrorInvalidValue;
  quantize_int8_rows_kernel<<<static_cast<unsigned>(out), kQuantThreads, 0, stream>>>(w, dtype, w_stride, in, packed,
                                                                                       scales);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_rows(const void* packed, DType dtype, int64_t w_stride, const float* scales, int64_t out,
                                   int64_t in, uint16_t* dst, int64_t dst_stride, Stream stream) {
  if (out == 0 || in == 0) return cudaSuccess;
  if (dtype != DType::kI8 && dtype != DType::kF8E4M3) return cudaErrorInvalidValue;
  const auto aligned16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const bool vec = in % 16 == 0 && w_stride % 16 == 0 && dst_stride % 8 == 0 && aligned16(packed) && aligned16(dst);
  const int threads = 128;
  const int64_t per_block = static_cast<int64_t>(threads) * (vec ? 16 : 1);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((in + per_block - 1) / per_block, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(out, 65535)));
  const uint8_t* src = static_cast<const uint8_t*>(packed);
  if (dtype == DType::kI8) {
    dequantize_rows_kernel<DType::kI8><<<grid, threads, 0, stream>>>(src, w_stride, scales, out, in, dst, dst_stride, vec);
  } else {
    dequantize_rows_kernel<DType::kF8E4M3>
        <<<grid, threads, 0, stream>>>(src, w_stride, scales, out, in, dst, dst_stride, vec);
  }
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
