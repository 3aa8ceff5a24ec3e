// The epilogues of the GEMV and tensor-core GEMM kernels (linear_gemv.cu, linear_int4.cu): y (with
// the per-row scale and the bias) or, with K split over the grid, the slice's partial sums for
// the reduction kernel or for the last block of the row range (finish_split_k).
#pragma once

#include "ops/cuda/device_math.cuh"

namespace tachyon::ops::cuda::detail {

// A lane's partial sums acc[r][t] as one array, value r * NT + t.
template <int ROWS, int NT>
__device__ __forceinline__ void flatten_sums(const float (&acc)[ROWS][NT], float (&flat)[ROWS * NT]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) flat[r * NT + t] = acc[r][t];
  }
}

// GEMV: each lane holds partial sums acc[r][t] for the warp's ROWS rows and NT tokens; the warp
// adds them up.
template <int ROWS, int NT>
__device__ __forceinline__ void store_gemv_sums(const float (&acc)[ROWS][NT], int64_t row0, int split, int64_t n,
                                                int64_t out, int splits, const void* bias, DType bias_dtype,
                                                const float* scales, float* y, int64_t y_stride, float* partial) {
  // Value i = r * NT + t ends in lane i (mod 32).
  constexpr int kValues = ROWS * NT;
  constexpr int kGroup = kValues < 32 ? kValues : 32;
  const int lane = threadIdx.x & 31;
  float flat[kValues];
  flatten_sums<ROWS, NT>(acc, flat);
#pragma unroll
  for (int g = 0; g < kValues / kGroup; ++g) {
    float part[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) part[i] = flat[g * kGroup + i];
    const float sum = warp_transpose_sum<kGroup>(part);
    if (lane < kGroup) {
      const int idx = g * kGroup + lane;
      const int64_t row = row0 + idx / NT;
      const int64_t t = idx % NT;
      if (row < out && t < n) {
        if (splits == 1) {
          const float b = bias != nullptr ? load_as_f32(bias, bias_dtype, row) : 0.0f;
          y[t * y_stride + row] = (scales != nullptr ? sum * scales[row] : sum) + b;
        } else {
          partial[(static_cast<int64_t>(split) * n + t) * out + row] = sum;
        }
      }
    }
  }
}

// The epilogue shared by the tensor-core GEMMs: acc[j] = y^T rows (g, g + 8) x tokens
// (8j + 2t, 8j + 2t + 1). Per-row scales (int8 weights; null otherwise) multiply finished sums
// only: with K split, the reduction applies them.
template <int NT>
__device__ __forceinline__ void store_mma_tile(const float (&acc)[NT][4], int64_t row0, int g, int t, int split,
                                               int64_t n, int64_t out, int splits, const void* bias, DType bias_dtype,
                                               const float* scales, float* y, int64_t y_stride, float* partial) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
      const int64_t tok = 8 * j + 2 * t + (e & 1);
      if (row < out && tok < n) {
        if (splits == 1) {
          const float b = bias != nullptr ? load_as_f32(bias, bias_dtype, row) : 0.0f;
          y[tok * y_stride + row] = (scales != nullptr ? acc[j][e] * scales[row] : acc[j][e]) + b;
        } else {
          partial[(static_cast<int64_t>(split) * n + tok) * out + row] = acc[j][e];
        }
      }
    }
  }
}

// Split-K without a second kernel: every block of a row range (one per slice, the same
// blockIdx.x) has stored its partial sums; the last of them to arrive at `counter` adds the slices
// up in split order, as the reduction kernel does (so the same bits), and sets the counter back to
// zero for the next launch. Every thread of the block calls it (it synchronises the block).
__device__ __forceinline__ void finish_split_k(const float* partial, int splits, int64_t n, int64_t out,
                                               int64_t row_begin, int64_t rows, const void* bias, DType bias_dtype,
                                               const float* scales, float* y, int64_t y_stride, unsigned* counter) {
  __shared__ bool last;
  __threadfence();  // this thread's partial sums, visible before the count says they are there
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == static_cast<unsigned>(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t i = threadIdx.x; i < rows * n; i += blockDim.x) {
    const int64_t t = i / rows, o = row_begin + i % rows;
    float sum = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) sum += __ldcg(partial + (s * n + t) * out + o);  // past L1: other SMs wrote it
    if (scales != nullptr) sum *= scales[o];
    if (bias != nullptr) sum += load_as_f32(bias, bias_dtype, o);
    y[t * y_stride + o] = sum;
  }
  if (threadIdx.x == 0) *counter = 0u;
}

}  // namespace tachyon::ops::cuda::detail
