// 8-bit activations for linear(): the per-token (or static-scale) quantization of f32 activation
// rows (int8 for W8A8 weights, e4m3 for fp8 weights on the tensor cores), an fp8 weight's static
// activation rounding, the W8A8 GEMV (int8 x int8 dot products with
// exact int32 sums, dp4a), and the epilogue that turns the sums of a cuBLASLt int8 or fp8 GEMM
// into y = sum * sx[t] * sw[o] + bias in place.
// W8A8 results are the CPU's bits: the codes are quantize_activation_row's, the sums are exact
// integers in any order, and the epilogue is the same f32 fma.
// Must never: read weights through L1 (each byte is used once), or depend on timing for results.
#include <cuda_fp8.h>

#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kQuantizeThreads = 256;

// One block per row: max |x| (exact in any order) and finiteness, then every code. int8:
// sx = max / 127, codes rint(x * (127 / max)) clamped to +-127; e4m3: sx = max / 448, codes
// x * (448 / max) rounded to nearest even (saturating). An all-zero row: sx 0, codes 0; a row with
// a non-finite value: sx NaN, codes 0. Columns [in, codes_stride) get zero codes. A static scale
// s > 0 stands for max / 127 (max / 448): sx = s, codes x * (1 / s) rounded alike.
template <DType D>
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_activations_kernel(const float* __restrict__ x, int64_t x_stride, int64_t in, uint8_t* __restrict__ codes,
                                int64_t codes_stride, float* __restrict__ sx, float static_scale) {
  constexpr float kMax = D == DType::kI8 ? 127.0f : 448.0f;
  const int64_t t = blockIdx.x;
  const float* xr = x + t * x_stride;
  uint8_t* cr = codes + t * codes_stride;
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = threadIdx.x; i < in; i += kQuantizeThreads) {
    const float v = xr[i];
    finite = finite && isfinite(v);
    amax = fmaxf(amax, fabsf(v));
  }
  amax = warp_max(amax);
  finite = __all_sync(kFullMask, finite);
  __shared__ float warp_amax[kQuantizeThreads / 32];
  __shared__ bool warp_finite[kQuantizeThreads / 32];
  if ((threadIdx.x & 31) == 0) {
    warp_amax[threadIdx.x >> 5] = amax;
    warp_finite[threadIdx.x >> 5] = finite;
  }
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < kQuantizeThreads / 32; ++w) {
    amax = fmaxf(amax, warp_amax[w]);
    finite = finite && warp_finite[w];
  }
  const bool dynamic = !(static_scale > 0.0f);
  const bool zero = !finite || (dynamic && amax == 0.0f);
  const float inv = zero ? 0.0f : dynamic ? __fdiv_rn(kMax, amax) : __fdiv_rn(1.0f, static_scale);
  for (int64_t i = threadIdx.x; i < codes_stride; i += kQuantizeThreads) {
    uint8_t c = 0;
    if (i < in && !zero) {
      const float v = __fmul_rn(xr[i], inv);
      if constexpr (D == DType::kI8) {
        c = static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(rintf(v), -127.0f), 127.0f)));
      } else {
        c = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
      }
    }
    cr[i] = c;
  }
  if (threadIdx.x == 0) {
    sx[t] = !finite ? NAN : !dynamic ? static_scale : (amax == 0.0f ? 0.0f : __fdiv_rn(amax, kMax));
  }
}

// quant/quantize.h's round_activation_row_fp8: y = e4m3(x * (1 / s)) * s, saturating, NaN kept.
__global__ void round_activations_fp8_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n, int64_t in,
                                             float scale, float* __restrict__ y) {
  const float inv = __fdiv_rn(1.0f, scale);
  const int64_t total = n * in;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / in, c = i % in;
    const float v = x[t * x_stride + c];
    const uint8_t code = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fmul_rn(v, inv), __NV_SATFINITE, __NV_E4M3));
    y[i] = isnan(v) ? v : __fmul_rn(Elem<DType::kF8E4M3>::load(&code, 0), scale);
  }
}

// quant/quantize.h's W8A8 output: fma(f32(sum), sx * sw, bias), without a bias the product alone.
__device__ __forceinline__ float w8a8_output(int32_t sum, float sx, float sw, const void* bias, DType bias_dtype,
                                             int64_t o) {
  const float s = __fmul_rn(sx, sw);
  return bias != nullptr ? fmaf(static_cast<float>(sum), s, load_as_f32(bias, bias_dtype, o))
                         : __fmul_rn(static_cast<float>(sum), s);
}

// ---- the W8A8 GEMV (1..kGemvW8A8MaxTokens tokens) -------------------------------------------------
// The structure of linear_gemv.cu's GEMV: a warp owns ROWS output rows, each lane streams 16 bytes
// (16 codes) of each row per step with U steps in flight, and reads the tokens' 16 activation
// codes of the same columns through L1 (shared by the warps of the block); 4 dp4a per row and
// token per step. Sums are int32 (|sum| <= 127 * 127 * in: exact for in < 2^17).
constexpr int kW8A8Warps = 4;
constexpr int kW8A8Step = 32 * 16;  // columns one warp covers with one 16-byte load per lane

struct W8A8GemvParams {
  const int8_t* x;  // [n, x_stride] activation codes
  int64_t x_stride;
  const float* sx;  // [n]
  const int8_t* w;  // [out, w_stride]
  int64_t w_stride;
  const float* sw;  // [out]
  const void* bias;
  DType bias_dtype;
  float* y;
  int64_t y_stride;
  int32_t* partial;  // [splits, n, out] when splits > 1
  int64_t n, in, out;
  int64_t chunk;  // multiple of kW8A8Step
  int splits;
  bool vector_loads;
};

template <int NT>
struct W8A8Tile;
template <>
struct W8A8Tile<1> {
  static constexpr int kRows = 4, kSteps = 4;
};
template <>
struct W8A8Tile<2> {
  static constexpr int kRows = 4, kSteps = 4;
};
template <>
struct W8A8Tile<4> {
  static constexpr int kRows = 4, kSteps = 2;
};
template <>
struct W8A8Tile<8> {
  static constexpr int kRows = 2, kSteps = 2;
};

__device__ __forceinline__ int32_t dot16(const uint4& a, const uint4& b, int32_t acc) {
  acc = __dp4a(static_cast<int>(a.x), static_cast<int>(b.x), acc);
  acc = __dp4a(static_cast<int>(a.y), static_cast<int>(b.y), acc);
  acc = __dp4a(static_cast<int>(a.z), static_cast<int>(b.z), acc);
  return __dp4a(static_cast<int>(a.w), static_cast<int>(b.w), acc);
}

__device__ __forceinline__ int32_t warp_sum_i32(int32_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <int NT>
__global__ void __launch_bounds__(kW8A8Warps * 32) gemv_w8a8_kernel(const W8A8GemvParams p) {
  constexpr int ROWS = W8A8Tile<NT>::kRows;
  constexpr int U = W8A8Tile<NT>::kSteps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kW8A8Warps + warp) * ROWS;
  if (row0 >= p.out) return;  // no block-wide synchronisation below
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t k_end = min64(p.in, k_begin + p.chunk);
  // Whole 16-column groups of the slice, when rows are 16-byte aligned; the rest one by one.
  const int64_t k16_end = p.vector_loads ? k_begin + (k_end - k_begin) / 16 * 16 : k_begin;
  const int64_t k_vec_end = k_begin + (k16_end - k_begin) / kW8A8Step * kW8A8Step;

  const int8_t* wr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) wr[r] = p.w + min64(row0 + r, p.out - 1) * p.w_stride;  // past out: never stored
  const int8_t* xr[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) xr[t] = p.x + min64(t, p.n - 1) * p.x_stride;  // past n: never stored

  int32_t acc[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0;
  }
  const auto step = [&](const uint4 (&wv)[ROWS], int64_t k) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xr[t] + k));
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r][t] = dot16(wv[r], xv, acc[r][t]);
    }
  };

  int64_t k = k_begin + lane * 16;
  for (; k + (U - 1) * kW8A8Step < k_vec_end; k += U * kW8A8Step) {
    uint4 raw[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) raw[u][r] = load_stream_16(wr[r] + k + u * kW8A8Step);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) step(raw[u], k + u * kW8A8Step);
  }
  for (; k < k16_end; k += kW8A8Step) {  // single steps, then the slice's last 16-column groups
    uint4 raw[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) raw[r] = load_stream_16(wr[r] + k);
    step(raw, k);
  }
  for (int64_t kk = k16_end + lane; kk < k_end; kk += 32) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int32_t xv = xr[t][kk];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r][t] += xv * static_cast<int32_t>(wr[r][kk]);
    }
  }

#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int32_t sum = warp_sum_i32(acc[r][t]);
      const int64_t row = row0 + r;
      if (lane == (r * NT + t) % 32 && row < p.out && t < p.n) {
        if (p.splits == 1) {
          p.y[t * p.y_stride + row] = w8a8_output(sum, p.sx[t], p.sw[row], p.bias, p.bias_dtype, row);
        } else {
          p.partial[(static_cast<int64_t>(split) * p.n + t) * p.out + row] = sum;
        }
      }
    }
  }
}

__global__ void gemv_w8a8_reduce_kernel(const int32_t* __restrict__ partial, int splits, int64_t n, int64_t out,
                                        const float* sx, const float* sw, const void* bias, DType bias_dtype,
                                        float* __restrict__ y, int64_t y_stride) {
  const int64_t total = n * out;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / out, o = i % out;
    int32_t sum = 0;
    for (int s = 0; s < splits; ++s) sum += partial[(s * n + t) * out + o];
    y[t * y_stride + o] = w8a8_output(sum, sx[t], sw[o], bias, bias_dtype, o);
  }
}

// The epilogue of the 8-bit cuBLASLt GEMMs, in place on y: int32 sums (W8A8, stored in y's words)
// or f32 sums (e4m3) times sx[t] * sw[o], plus the bias.
__global__ void scale_sums_kernel(float* __restrict__ y, int64_t y_stride, int64_t n, int64_t out, bool int_sums,
                                  const float* sx, const float* sw, const void* bias, DType bias_dtype) {
  const int64_t total = n * out;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / out, o = i % out;
    float* p = y + t * y_stride + o;
    if (int_sums) {
      *p = w8a8_output(__float_as_int(*p), sx[t], sw[o], bias, bias_dtype, o);
    } else {
      const float s = __fmul_rn(sx[t], sw[o]);
      *p = bias != nullptr ? fmaf(*p, s, load_as_f32(bias, bias_dtype, o)) : __fmul_rn(*p, s);
    }
  }
}

template <int NT>
cudaError_t launch_w8a8_bucket(const W8A8GemvParams& p, Stream stream) {
  const int64_t rows_per_block = static_cast<int64_t>(kW8A8Warps) * W8A8Tile<NT>::kRows;
  const dim3 grid(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(p.splits));
  gemv_w8a8_kernel<NT><<<grid, kW8A8Warps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

int w8a8_rows_per_warp(int64_t n) {
  return n <= 1 ? W8A8Tile<1>::kRows : n <= 2 ? W8A8Tile<2>::kRows : n <= 4 ? W8A8Tile<4>::kRows : W8A8Tile<8>::kRows;
}

}  // namespace

cudaError_t launch_quantize_activations(const float* x, int64_t x_stride, int64_t n, int64_t in, DType codes_dtype,
                                        void* codes, int64_t codes_stride, float* sx, float static_scale,
                                        Stream stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff || codes_stride < in) return cudaErrorInvalidValue;
  uint8_t* c = static_cast<uint8_t*>(codes);
  const unsigned grid = static_cast<unsigned>(n);
  if (codes_dtype == DType::kI8) {
    quantize_activations_kernel<DType::kI8>
        <<<grid, kQuantizeThreads, 0, stream>>>(x, x_stride, in, c, codes_stride, sx, static_scale);
  } else if (codes_dtype == DType::kF8E4M3) {
    quantize_activations_kernel<DType::kF8E4M3>
        <<<grid, kQuantizeThreads, 0, stream>>>(x, x_stride, in, c, codes_stride, sx, static_scale);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_round_activations_fp8(const float* x, int64_t x_stride, int64_t n, int64_t in, float scale,
                                         float* y, Stream stream) {
  if (n == 0 || in == 0) return cudaSuccess;
  if (!(scale > 0.0f)) return cudaErrorInvalidValue;
  const int threads = 256;
  round_activations_fp8_kernel<<<grid_for(n * in, threads), threads, 0, stream>>>(x, x_stride, n, in, scale, y);
  return cudaGetLastError();
}

bool gemv_w8a8_supported(const LinearArgs& a) {
  return a.scheme == QuantScheme::kW8A8 && a.w_dtype == DType::kI8 && a.w_scales != nullptr && a.n >= 1 &&
         a.n <= kGemvW8A8MaxTokens && a.in < (int64_t{1} << 17);
}

GemvShape plan_gemv_w8a8(const LinearArgs& a, int64_t x_stride, int sm_count) {
  GemvShape s;
  s.step = kW8A8Step;
  s.rows_per_warp = w8a8_rows_per_warp(a.n);
  const auto aligned16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  s.vector_loads = aligned16(a.w) && a.w_stride % 16 == 0 && x_stride % 16 == 0;
  // (Integer sums: any split gives the same bits; planned as for one token like the others.)
  plan_k_splits(s, a.in, (a.out + W8A8Tile<1>::kRows - 1) / W8A8Tile<1>::kRows, kW8A8Step * W8A8Tile<1>::kSteps,
                kW8A8Step, sm_count);
  return s;
}

cudaError_t launch_gemv_w8a8(const LinearArgs& a, const int8_t* x_codes, int64_t x_stride, const float* sx,
                             const GemvShape& shape, int32_t* partial, Stream stream) {
  W8A8GemvParams p;
  p.x = x_codes;
  p.x_stride = x_stride;
  p.sx = sx;
  p.w = static_cast<const int8_t*>(a.w);
  fill_common(p, a, shape, partial);
  p.sw = a.w_scales;
  p.vector_loads = shape.vector_loads;
  const cudaError_t e = p.n <= 1   ? launch_w8a8_bucket<1>(p, stream)
                        : p.n <= 2 ? launch_w8a8_bucket<2>(p, stream)
                        : p.n <= 4 ? launch_w8a8_bucket<4>(p, stream)
                                   : launch_w8a8_bucket<8>(p, stream);
  if (e != cudaSuccess || shape.splits == 1) return e;
  const int threads = 256;
  gemv_w8a8_reduce_kernel<<<grid_for(a.n * a.out, threads), threads, 0, stream>>>(
      partial, shape.splits, a.n, a.out, sx, a.w_scales, a.bias, a.bias_dtype, a.y, a.y_stride);
  return cudaGetLastError();
}

cudaError_t launch_scale_sums(float* y, int64_t y_stride, int64_t n, int64_t out, bool int_sums, const float* sx,
                              const float* sw, const void* bias, DType bias_dtype, Stream stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  scale_sums_kernel<<<grid_for(n * out, threads), threads, 0, stream>>>(y, y_stride, n, out, int_sums, sx, sw, bias,
                                                                        bias_dtype);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
