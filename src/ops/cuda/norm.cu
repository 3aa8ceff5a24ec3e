// rms_norm and add_rms_norm: one block per row, two passes over the row (sum of squares, then
// scale), 16-byte accesses when every row is 16-byte aligned. The output rows may also be written
// rounded to 16 bits (Rows16), for the linear that reads them next. Each element is read and written by
// the same thread in both passes, so y may alias x (and residual) element for element.
//
// A decode step's rows are few (one block each), so each block's latency is the kernel's: where the
// row fits in registers (16-byte aligned rows and weight, up to 8 vectors of 4 per thread) a thread
// issues every load of its elements (x, the residual, the weight) at once, keeps them through the
// reduction and writes once, instead of reading the row again after it. Both paths add the squares
// in the same order (per thread, vector after vector) and round the same products: same bits.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

// Four consecutive values of a float-typed buffer as f32 in one load (base + i aligned to four
// elements: 16 bytes for f32, 8 for f16/bf16).
__device__ __forceinline__ float4 load4_as_f32(const void* base, DType dtype, int64_t i) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
  const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(base) + i);
  if (dtype == DType::kBF16) {
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  }
  return make_float4(f16_bits_to_f32(static_cast<uint16_t>(u.x)), f16_bits_to_f32(static_cast<uint16_t>(u.x >> 16)),
                     f16_bits_to_f32(static_cast<uint16_t>(u.y)), f16_bits_to_f32(static_cast<uint16_t>(u.y >> 16)));
}

struct NormParams {
  float* residual;  // add_rms_norm only: [rows, d], updated
  Rows residual_rows;
  const float* x;
  Rows x_rows;
  const void* weight;  // [d]
  DType weight_dtype;
  float eps;
  float* y;
  Rows y_rows;
  Rows16 copy;  // y's rows again in 16 bits, or none
  bool vec4;
};

template <bool kAdd>
__global__ void rms_norm_kernel(const NormParams p) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x;
  const int64_t d = p.x_rows.cols;
  const float* x = p.x + p.x_rows.offset(row);
  float* y = p.y + p.y_rows.offset(row);
  float* res = kAdd ? p.residual + p.residual_rows.offset(row) : nullptr;
  uint16_t* copy = p.copy.data != nullptr ? static_cast<uint16_t*>(p.copy.data) + row * p.copy.stride : nullptr;
  float ss = 0.0f;
  if (p.vec4) {
    for (int64_t i = threadIdx.x * 4; i < d; i += blockDim.x * 4) {
      float4 v = *reinterpret_cast<const float4*>(x + i);
      if (kAdd) {
        const float4 r = *reinterpret_cast<const float4*>(res + i);
        v.x += r.x;
        v.y += r.y;
        v.z += r.z;
        v.w += r.w;
        *reinterpret_cast<float4*>(res + i) = v;
      }
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      float v = x[i];
      if (kAdd) {
        v += res[i];
        res[i] = v;
      }
      ss += v * v;
    }
  }
  const float total = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(d) + p.eps);
  const float* src = kAdd ? res : x;
  if (p.vec4) {
    for (int64_t i = threadIdx.x * 4; i < d; i += blockDim.x * 4) {
      const float4 v = *reinterpret_cast<const float4*>(src + i);
      float4 o;
      o.x = v.x * inv * load_as_f32(p.weight, p.weight_dtype, i);
      o.y = v.y * inv * load_as_f32(p.weight, p.weight_dtype, i + 1);
      o.z = v.z * inv * load_as_f32(p.weight, p.weight_dtype, i + 2);
      o.w = v.w * inv * load_as_f32(p.weight, p.weight_dtype, i + 3);
      *reinterpret_cast<float4*>(y + i) = o;
      if (copy != nullptr) store4_16(copy, p.copy.dtype, i, o);
    }
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float o = src[i] * inv * load_as_f32(p.weight, p.weight_dtype, i);
      y[i] = o;
      if (copy != nullptr) copy[i] = f32_to_16_bits(o, p.copy.dtype);
    }
  }
}

template <bool kAdd, int kVecs>
__global__ void rms_norm_regs_kernel(const NormParams p) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x;
  const int64_t lanes = p.x_rows.cols / 4;
  const float* x = p.x + p.x_rows.offset(row);
  float* y = p.y + p.y_rows.offset(row);
  float* res = kAdd ? p.residual + p.residual_rows.offset(row) : nullptr;
  uint16_t* copy = p.copy.data != nullptr ? static_cast<uint16_t*>(p.copy.data) + row * p.copy.stride : nullptr;
  float4 v[kVecs], r[kVecs], w[kVecs];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {  // every load before any store: y and residual may alias x
    const int64_t lane = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (lane < lanes) {
      v[k] = *reinterpret_cast<const float4*>(x + 4 * lane);
      if (kAdd) r[k] = *reinterpret_cast<const float4*>(res + 4 * lane);
      w[k] = load4_as_f32(p.weight, p.weight_dtype, 4 * lane);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int64_t lane = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (lane < lanes) {
      if (kAdd) {
        v[k].x += r[k].x;
        v[k].y += r[k].y;
        v[k].z += r[k].z;
        v[k].w += r[k].w;
        *reinterpret_cast<float4*>(res + 4 * lane) = v[k];
      }
      ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
  }
  const float total = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(p.x_rows.cols) + p.eps);
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int64_t lane = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (lane < lanes) {
      float4 o;
      o.x = v[k].x * inv * w[k].x;
      o.y = v[k].y * inv * w[k].y;
      o.z = v[k].z * inv * w[k].z;
      o.w = v[k].w * inv * w[k].w;
      *reinterpret_cast<float4*>(y + 4 * lane) = o;
      if (copy != nullptr) store4_16(copy, p.copy.dtype, 4 * lane, o);
    }
  }
}

// 8-byte aligned rows of a 16-bit copy (four values per store), or no copy.
bool copy_aligned8(const Rows16& c) {
  return c.data == nullptr || ((reinterpret_cast<uintptr_t>(c.data) & 7u) == 0 && c.stride % 4 == 0);
}

bool rows_aligned16(const float* base, const Rows& r) {
  if (base == nullptr) return true;
  if ((reinterpret_cast<uintptr_t>(base) & 15u) != 0 || r.cols % 4 != 0) return false;
  return r.stride0 % 4 == 0 && r.stride1 % 4 == 0 && r.stride2 % 4 == 0;
}

int threads_for(int64_t d, bool vec4) {
  const int64_t lanes = vec4 ? (d + 3) / 4 : d;
  const int64_t t = (lanes + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(t, 32, 512));
}

template <bool kAdd>
cudaError_t launch(const NormParams& p, Stream stream) {
  if (p.x_rows.rows == 0) return cudaSuccess;
  if (p.x_rows.rows > 0x7fffffff) return cudaErrorInvalidValue;
  const int threads = threads_for(p.x_rows.cols, p.vec4);
  const unsigned grid = static_cast<unsigned>(p.x_rows.rows);
  const int64_t vecs = (p.x_rows.cols / 4 + threads - 1) / threads;
  const bool weight4 = (reinterpret_cast<uintptr_t>(p.weight) & (p.weight_dtype == DType::kF32 ? 15u : 7u)) == 0;
  if (p.vec4 && weight4 && vecs <= 8) {
    if (vecs == 1) return launch_pdl(rms_norm_regs_kernel<kAdd, 1>, grid, threads, 0, stream, p);
    if (vecs == 2) return launch_pdl(rms_norm_regs_kernel<kAdd, 2>, grid, threads, 0, stream, p);
    if (vecs <= 4) return launch_pdl(rms_norm_regs_kernel<kAdd, 4>, grid, threads, 0, stream, p);
    return launch_pdl(rms_norm_regs_kernel<kAdd, 8>, grid, threads, 0, stream, p);
  }
  return launch_pdl(rms_norm_kernel<kAdd>, grid, threads, 0, stream, p);
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const Rows& x_rows, const void* weight, DType weight_dtype, float eps,
                            float* y, const Rows& y_rows, const Rows16& copy16, Stream stream) {
  NormParams p{};
  p.x = x;
  p.x_rows = x_rows;
  p.weight = weight;
  p.weight_dtype = weight_dtype;
  p.eps = eps;
  p.y = y;
  p.y_rows = y_rows;
  p.copy = copy16;
  p.vec4 = rows_aligned16(x, x_rows) && rows_aligned16(y, y_rows) && copy_aligned8(copy16);
  return launch<false>(p, stream);
}

cudaError_t launch_add_rms_norm(float* residual, const Rows& residual_rows, const float* x, const Rows& x_rows,
                                const void* weight, DType weight_dtype, float eps, float* y, const Rows& y_rows,
                                const Rows16& copy16, Stream stream) {
  NormParams p{};
  p.residual = residual;
  p.residual_rows = residual_rows;
  p.x = x;
  p.x_rows = x_rows;
  p.weight = weight;
  p.weight_dtype = weight_dtype;
  p.eps = eps;
  p.y = y;
  p.y_rows = y_rows;
  p.copy = copy16;
  p.vec4 = rows_aligned16(residual, residual_rows) && rows_aligned16(x, x_rows) && rows_aligned16(y, y_rows) &&
           copy_aligned8(copy16);
  return launch<true>(p, stream);
}

}  // namespace tachyon::ops::cuda::detail
