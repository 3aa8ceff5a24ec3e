// Element-wise kernels: silu_mul (the MLP's gate), add (a residual add), embedding rows, and a
// counter-based random fill (synthetic weights and benchmark inputs made on the device,
// reproducible from a seed).
// Grid-stride loops; nothing here keeps state between calls.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

// Grid (column blocks, rows with a grid-stride over rows): each row's offsets are computed once per
// thread, and rows whose pointers and strides allow it move 4 columns per thread as float4.
__global__ void silu_mul_kernel(const float* __restrict__ gate, const Rows gate_rows, const float* __restrict__ up,
                                const Rows up_rows, float* __restrict__ out, const Rows out_rows, const Rows16 copy,
                                bool vec) {
  pdl_wait();
  pdl_trigger();
  const int64_t cols = gate_rows.cols;
  for (int64_t r = blockIdx.y; r < gate_rows.rows; r += gridDim.y) {
    const float* g = gate + gate_rows.offset(r);
    const float* u = up + up_rows.offset(r);
    float* o = out + out_rows.offset(r);
    uint16_t* c16 = copy.data != nullptr ? static_cast<uint16_t*>(copy.data) + r * copy.stride : nullptr;
    if (vec) {
      for (int64_t c = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 4; c < cols;
           c += static_cast<int64_t>(gridDim.x) * blockDim.x * 4) {
        const float4 gv = *reinterpret_cast<const float4*>(g + c);
        const float4 uv = *reinterpret_cast<const float4*>(u + c);
        float4 ov;
        ov.x = gv.x / (1.0f + expf(-gv.x)) * uv.x;
        ov.y = gv.y / (1.0f + expf(-gv.y)) * uv.y;
        ov.z = gv.z / (1.0f + expf(-gv.z)) * uv.z;
        ov.w = gv.w / (1.0f + expf(-gv.w)) * uv.w;
        *reinterpret_cast<float4*>(o + c) = ov;
        if (c16 != nullptr) store4_16(c16, copy.dtype, c, ov);
      }
    } else {
      for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
           c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float gv = g[c];
        const float ov = gv / (1.0f + expf(-gv)) * u[c];
        o[c] = ov;
        if (c16 != nullptr) c16[c] = f32_to_16_bits(ov, copy.dtype);
      }
    }
  }
}

// One block per token; an id outside the table yields a NaN row (the host checks ids first).
__global__ void embedding_kernel(const void* table, DType table_dtype, int64_t table_stride, int64_t vocab,
                                 int64_t d, const int32_t* __restrict__ ids, float* __restrict__ out,
                                 int64_t out_stride) {
  pdl_wait();
  pdl_trigger();
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

// y[r, :] += x[r, :], grid as silu_mul's.
__global__ void add_kernel(float* __restrict__ y, const Rows y_rows, const float* __restrict__ x, const Rows x_rows,
                           bool vec) {
  pdl_wait();
  pdl_trigger();
  const int64_t cols = y_rows.cols;
  for (int64_t r = blockIdx.y; r < y_rows.rows; r += gridDim.y) {
    float* yr = y + y_rows.offset(r);
    const float* xr = x + x_rows.offset(r);
    if (vec) {
      for (int64_t c = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 4; c < cols;
           c += static_cast<int64_t>(gridDim.x) * blockDim.x * 4) {
        float4 a = *reinterpret_cast<const float4*>(yr + c);
        const float4 b = *reinterpret_cast<const float4*>(xr + c);
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
        *reinterpret_cast<float4*>(yr + c) = a;
      }
    } else {
      for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
           c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        yr[c] += xr[c];
      }
    }
  }
}

// 16-byte aligned rows: float4 accesses along every row.
bool rows_aligned(const float* p, const Rows& r) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0 && r.stride0 % 4 == 0 && r.stride1 % 4 == 0 && r.stride2 % 4 == 0;
}

}  // namespace

cudaError_t launch_add(float* y, const Rows& y_rows, const float* x, const Rows& x_rows, Stream stream) {
  if (y_rows.rows * y_rows.cols == 0) return cudaSuccess;
  const bool vec = y_rows.cols % 4 == 0 && rows_aligned(y, y_rows) && rows_aligned(x, x_rows);
  const int threads = 256;
  const int64_t per_block = threads * (vec ? 4 : 1);
  const dim3 grid(static_cast<unsigned>((y_rows.cols + per_block - 1) / per_block),
                  static_cast<unsigned>(std::min<int64_t>(y_rows.rows, 65535)));
  return launch_pdl(add_kernel, grid, threads, 0, stream, y, y_rows, x, x_rows, vec);
}

cudaError_t launch_silu_mul(const float* gate, const Rows& gate_rows, const float* up, const Rows& up_rows, float* out,
                            const Rows& out_rows, const Rows16& copy16, Stream stream) {
  const int64_t total = gate_rows.rows * gate_rows.cols;
  if (total == 0) return cudaSuccess;
  const bool copy_aligned =
      copy16.data == nullptr || ((reinterpret_cast<uintptr_t>(copy16.data) & 7u) == 0 && copy16.stride % 4 == 0);
  const bool vec = gate_rows.cols % 4 == 0 && rows_aligned(gate, gate_rows) && rows_aligned(up, up_rows) &&
                   rows_aligned(out, out_rows) && copy_aligned;
  const int threads = 256;
  const int64_t per_block = threads * (vec ? 4 : 1);
  const dim3 grid(static_cast<unsigned>((gate_rows.cols + per_block - 1) / per_block),
                  static_cast<unsigned>(std::min<int64_t>(gate_rows.rows, 65535)));
  return launch_pdl(silu_mul_kernel, grid, threads, 0, stream, gate, gate_rows, up, up_rows, out, out_rows, copy16,
                    vec);
}

cudaError_t launch_embedding(const void* table, DType table_dtype, int64_t table_stride, int64_t vocab, int64_t d,
                             const int32_t* ids, int64_t n, float* out, int64_t out_stride, Stream stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  const int threads = static_cast<int>(std::clamp<int64_t>((d + 31) / 32 * 32, 32, 256));
  return launch_pdl(embedding_kernel, static_cast<unsigned>(n), threads, 0, stream, table, table_dtype, table_stride,
                    vocab, d, ids, out, out_stride);
}

cudaError_t launch_fill_random(void* data, DType dtype, int64_t count, uint64_t seed, float lo, float hi,
                               Stream stream) {
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  fill_random_kernel<<<grid_for(count, threads) , threads, 0, stream>>>(data, dtype, count, seed, lo, hi);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
