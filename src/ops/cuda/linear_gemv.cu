// The skinny GEMV of linear() for 1..16 tokens, where a step is bound by reading the weight once.
// Each warp owns a few output rows; each lane streams 16 bytes of each of its rows per step
// (several loads in flight before the first use) and keeps the tokens' x values of that step in
// registers, reused across its rows. Short matrices split K over the grid so that every SM has
// enough loads in flight; the slices' sums meet in a fixed-order reduction kernel.
// Also: the f32 -> f16/bf16 activation conversion feeding cuBLASLt, and a bias kernel.
// Must never: read weights through L1 (each byte is used once), or depend on timing for results.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/gemv_store.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kWarps = kGemvThreads / 32;

struct GemvParams {
  const float* x;  // [n, in] f32
  int64_t x_stride;
  const void* w;  // [out, in]
  int64_t w_stride;
  const void* bias;  // [out] or null
  DType bias_dtype;
  const float* scales;  // [out] per-row weight scales (i8 weights), or null
  float* y;  // [n, out]
  int64_t y_stride;
  float* partial;  // [splits, n, out] when splits > 1
  int64_t n, in, out;
  int64_t chunk;
  int splits;
  bool vector_loads;
  GemvEpilogue epilogue = GemvEpilogue::kStore;  // linear_fused's (launch_gemv_fused)
};

// Rows per warp, 16-byte steps per iteration and the register budget (minimum resident blocks),
// by token bucket: more rows reuse each x load more; more steps put more loads in flight; more
// tokens hold more accumulators and x values, so fewer rows and steps fit without spilling.
// (Also warps per block; launch_gemv_probe tries other tiles at one token.)
template <int R, int U, int MIN_BLOCKS, int WARPS = kWarps>
struct GemvTileOf {
  static constexpr int kRows = R, kSteps = U, kMinBlocks = MIN_BLOCKS, kBlockWarps = WARPS;
};
template <int NT>
struct GemvTile;
template <>
struct GemvTile<1> : GemvTileOf<4, 4, 1> {};
template <>
struct GemvTile<2> : GemvTileOf<4, 4, 1> {};
template <>
struct GemvTile<4> : GemvTileOf<4, 2, 1> {};
template <>
struct GemvTile<8> : GemvTileOf<4, 1, 3> {};
template <>
struct GemvTile<16> : GemvTileOf<2, 1, 3> {};
// By weight type: 16-bit and f32 weights take 2 rows at one token (4 rows: Llama-3-8B's q/o 12.2
// us against 9.7, down 37.6 against 27.9; int8 kept 4, at 2 it decoded 0.87x as fast; docs/perf.md
// 2026-12-02).
template <DType WD, int NT>
struct GemvTileFor : GemvTile<NT> {};
template <>
struct GemvTileFor<DType::kBF16, 1> : GemvTileOf<2, 4, 1> {};
template <>
struct GemvTileFor<DType::kF16, 1> : GemvTileOf<2, 4, 1> {};
template <>
struct GemvTileFor<DType::kF32, 1> : GemvTileOf<2, 4, 1> {};

// acc[r][t] += w_r · x_t over V elements at column k (x rows 16-byte aligned). Tokens past n
// re-read row n - 1; their sums are never stored.
template <int ROWS, int NT, int V>
__device__ __forceinline__ void gemv_step(const float (&wf)[ROWS][V], const float* x, int64_t x_stride, int64_t n,
                                          int64_t k, float (&acc)[ROWS][NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float* xt = x + (t < n ? t : n - 1) * x_stride + k;
    float xv[V];
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const float4 q = __ldg(reinterpret_cast<const float4*>(xt + j));
      xv[j] = q.x;
      xv[j + 1] = q.y;
      xv[j + 2] = q.z;
      xv[j + 3] = q.w;
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int j = 0; j < V; ++j) acc[r][t] = fmaf(wf[r][j], xv[j], acc[r][t]);
    }
  }
}

// linear_fused's epilogue for a warp's sums: the residual add, or SwiGLU of the warp's gate rows
// (values 0 .. kValues/2 - 1, rows j0 ..) with its up rows (the second half, rows half + j0 ..),
// which meet in one lane through a shuffle. With K split, the partial sums of the weight rows
// (the reduction applies the epilogue).
template <int ROWS, int NT>
__device__ __forceinline__ void store_gemv_fused(const float (&acc)[ROWS][NT], const GemvParams& p, int64_t first,
                                                 int split) {
  constexpr int kValues = ROWS * NT;
  static_assert(kValues <= 32 && ROWS % 2 == 0, "one value per lane; gate and up rows in pairs");
  const int lane = threadIdx.x & 31;
  float part[kValues];
  flatten_sums<ROWS, NT>(acc, part);
  const float sum = warp_transpose_sum<kValues>(part);  // value `lane` (r = lane / NT, t = lane % NT)
  const int r = lane / NT;
  const int64_t t = lane % NT;
  const bool swiglu = p.epilogue == GemvEpilogue::kSwiGLU;
  const int64_t half = p.out / 2;
  // The weight row of this lane's value and whether the output it feeds exists.
  int64_t row;
  bool valid;
  if (swiglu) {
    const int64_t j = first + (r % (ROWS / 2));
    row = r < ROWS / 2 ? j : half + j;
    valid = lane < kValues && j < half && t < p.n;
  } else {
    row = first + r;
    valid = lane < kValues && row < p.out && t < p.n;
  }
  if (p.splits > 1) {
    if (valid) p.partial[(static_cast<int64_t>(split) * p.n + t) * p.out + row] = sum;
    return;
  }
  float v = 0.0f;
  if (valid) {
    const float b = p.bias != nullptr ? load_as_f32(p.bias, p.bias_dtype, row) : 0.0f;
    v = (p.scales != nullptr ? sum * p.scales[row] : sum) + b;
  }
  if (swiglu) {
    const float up = __shfl_down_sync(kFullMask, v, kValues / 2);
    if (valid && lane < kValues / 2) p.y[t * p.y_stride + row] = v / (1.0f + expf(-v)) * up;
  } else if (valid) {
    float* y = p.y + t * p.y_stride + row;
    *y = p.epilogue == GemvEpilogue::kAdd ? *y + v : v;
  }
}

template <DType WD, int NT, typename Tile = GemvTileFor<WD, NT>>
__global__ void __launch_bounds__(Tile::kBlockWarps * 32, Tile::kMinBlocks) gemv_kernel(const GemvParams p) {
  using E = Elem<WD>;
  using T = typename E::T;
  constexpr int ROWS = Tile::kRows;
  constexpr int U = Tile::kSteps;
  constexpr int V = E::kVec;
  constexpr int STEP = 32 * V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * Tile::kBlockWarps + warp;
  // The warp's rows: ROWS consecutive rows from `first`, or (SwiGLU) ROWS / 2 gate rows from
  // `first` and the up rows half + first ... that pair with them.
  const bool swiglu = p.epilogue == GemvEpilogue::kSwiGLU;
  const int64_t half = p.out / 2;
  const int64_t first = swiglu ? group * (ROWS / 2) : group * ROWS;
  pdl_wait();
  pdl_trigger();
  if (first >= (swiglu ? half : p.out)) return;  // no block-wide synchronisation below
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t k_end = min64(p.in, k_begin + p.chunk);
  const int64_t k_vec_end = p.vector_loads ? k_begin + (k_end - k_begin) / STEP * STEP : k_begin;

  const T* w = static_cast<const T*>(p.w);
  const T* wr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    // Clamped: rows past the matrix are read again, never stored.
    const int64_t row = !swiglu       ? min64(first + r, p.out - 1)
                        : r < ROWS / 2 ? min64(first + r, half - 1)
                                       : half + min64(first + r - ROWS / 2, half - 1);
    wr[r] = w + row * p.w_stride;
  }

  float acc[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }

  // All lanes run the same number of iterations: k_vec_end - k_begin is a multiple of STEP.
  int64_t k = k_begin + lane * V;
  for (; k + (U - 1) * STEP < k_vec_end; k += U * STEP) {
    uint4 raw[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) raw[u][r] = load_stream_16(wr[r] + k + u * STEP);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float wf[ROWS][V];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) E::unpack(raw[u][r], wf[r]);
      gemv_step<ROWS, NT, V>(wf, p.x, p.x_stride, p.n, k + u * STEP, acc);
    }
  }
  for (; k < k_vec_end; k += STEP) {
    uint4 raw[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) raw[r] = load_stream_16(wr[r] + k);
    float wf[ROWS][V];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) E::unpack(raw[r], wf[r]);
    gemv_step<ROWS, NT, V>(wf, p.x, p.x_stride, p.n, k, acc);
  }
  // Scalar tail (and the whole slice when rows or x are not 16-byte aligned).
  for (int64_t kk = k_vec_end + lane; kk < k_end; kk += 32) {
    float xv[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) xv[t] = p.x[(t < p.n ? t : p.n - 1) * p.x_stride + kk];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float wv = E::load(wr[r], kk);
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(wv, xv[t], acc[r][t]);
    }
  }

  if (p.epilogue == GemvEpilogue::kStore) {
    store_gemv_sums<ROWS, NT>(acc, first, split, p.n, p.out, p.splits, p.bias, p.bias_dtype, p.scales, p.y,
                             p.y_stride, p.partial);
  } else {
    store_gemv_fused<ROWS, NT>(acc, p, first, split);
  }
}

// y[t, o] = sum over splits of partial[s, t, o] (in split order) (* scales[o]) + bias[o].
__global__ void gemv_reduce_kernel(const float* __restrict__ partial, int splits, int64_t n, int64_t out,
                                   const void* bias, DType bias_dtype, const float* scales, float* __restrict__ y,
                                   int64_t y_stride) {
  pdl_wait();
  pdl_trigger();
  const int64_t total = n * out;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / out, o = i % out;
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[(s * n + t) * out + o];
    if (scales != nullptr) sum *= scales[o];
    if (bias != nullptr) sum += load_as_f32(bias, bias_dtype, o);
    y[t * y_stride + o] = sum;
  }
}

// gemv_reduce_kernel with linear_fused's epilogue: the slices' sums of row o (and, for SwiGLU,
// of its up row half + o) finished exactly as gemv_reduce_kernel finishes them.
__device__ __forceinline__ float reduce_row(const float* __restrict__ partial, int splits, int64_t n, int64_t out,
                                            int64_t t, int64_t o, const void* bias, DType bias_dtype,
                                            const float* scales) {
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) sum += partial[(s * n + t) * out + o];
  if (scales != nullptr) sum *= scales[o];
  if (bias != nullptr) sum += load_as_f32(bias, bias_dtype, o);
  return sum;
}

__global__ void gemv_reduce_fused_kernel(const float* __restrict__ partial, int splits, int64_t n, int64_t out,
                                         const void* bias, DType bias_dtype, const float* scales, float* y,
                                         int64_t y_stride, GemvEpilogue epilogue) {
  pdl_wait();
  pdl_trigger();
  const int64_t cols = epilogue == GemvEpilogue::kSwiGLU ? out / 2 : out;
  const int64_t total = n * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / cols, o = i % cols;
    const float v = reduce_row(partial, splits, n, out, t, o, bias, bias_dtype, scales);
    float* yo = y + t * y_stride + o;
    if (epilogue == GemvEpilogue::kSwiGLU) {
      const float up = reduce_row(partial, splits, n, out, t, cols + o, bias, bias_dtype, scales);
      *yo = v / (1.0f + expf(-v)) * up;
    } else {
      *yo = epilogue == GemvEpilogue::kAdd ? *yo + v : v;
    }
  }
}

template <DType WD, int NT, typename Tile = GemvTileFor<WD, NT>>
cudaError_t launch_bucket(const GemvParams& p, const GemvShape& shape, Stream stream) {
  const bool swiglu = p.epilogue == GemvEpilogue::kSwiGLU;
  const int64_t rows_per_block = static_cast<int64_t>(Tile::kBlockWarps) * Tile::kRows / (swiglu ? 2 : 1);
  const int64_t rows = swiglu ? p.out / 2 : p.out;
  const dim3 grid(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(shape.splits));
  return launch_pdl(gemv_kernel<WD, NT, Tile>, grid, Tile::kBlockWarps * 32, 0, stream, p);
}

template <DType WD>
cudaError_t launch_dtype(const GemvParams& p, const GemvShape& shape, Stream stream) {
  if (p.n <= 1) return launch_bucket<WD, 1>(p, shape, stream);
  if (p.n <= 2) return launch_bucket<WD, 2>(p, shape, stream);
  if (p.n <= 4) return launch_bucket<WD, 4>(p, shape, stream);
  if (p.n <= 8) return launch_bucket<WD, 8>(p, shape, stream);
  return launch_bucket<WD, 16>(p, shape, stream);
}

int rows_per_warp(bool wide, int64_t n) {
  if (n <= 1) return wide ? GemvTileFor<DType::kBF16, 1>::kRows : GemvTile<1>::kRows;
  if (n <= 2) return GemvTile<2>::kRows;
  if (n <= 4) return GemvTile<4>::kRows;
  if (n <= 8) return GemvTile<8>::kRows;
  return GemvTile<16>::kRows;
}

// Grid (column blocks, rows with a grid-stride over rows); 4 columns per thread (one float4 in, 8
// bytes out) when the rows allow it.
__global__ void convert_rows_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n, int64_t in, void* dst,
                                    DType dst_dtype, int64_t dst_stride, bool vec) {
  pdl_wait();
  pdl_trigger();
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    const float* xr = x + t * x_stride;
    if (vec) {
      uint16_t* d = static_cast<uint16_t*>(dst) + t * dst_stride;
      for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 4; k < in;
           k += static_cast<int64_t>(gridDim.x) * blockDim.x * 4) {
        store4_16(d, dst_dtype, k, *reinterpret_cast<const float4*>(xr + k));
      }
    } else {
      for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < in;
           k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        store_from_f32(dst, dst_dtype, t * dst_stride + k, xr[k]);
      }
    }
  }
}

__global__ void add_bias_kernel(float* __restrict__ y, int64_t y_stride, int64_t n, int64_t out, const void* bias,
                                DType bias_dtype) {
  const int64_t total = n * out;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / out, o = i % out;
    y[t * y_stride + o] += load_as_f32(bias, bias_dtype, o);
  }
}


// ---- tensor-core skinny GEMM (5..64 tokens, 16-bit weights) ---------------------------------------
// y^T[out, n] = W[out, in] · x^T with mma.m16n8k16: a warp owns 16 output rows (the A operand,
// streamed once from memory with 16-byte loads, never staged in shared memory) and all n tokens
// (B, the activations already rounded to the weight's type, read through L1: every warp of the
// block reads the same K slice). The K order inside each 32-element chunk is permuted the same way
// for A and B — lane t's 16-byte load holds elements 8t..8t+7, fed to the mma as logical
// k {2t, 2t+1, 2t+8, 2t+9} of two consecutive k16 steps — so both operands load as whole vectors
// and the sum is unchanged. K slices over the grid with partial sums reduced in split order, as
// the GEMV does.
constexpr int kMmaGemmWarps = 4;

struct MmaGemmParams {
  const uint16_t* x;  // [n, x_stride] 16-bit (the weight's type)
  int64_t x_stride;
  const uint16_t* w;  // [out, w_stride]
  int64_t w_stride;
  const void* bias;
  DType bias_dtype;
  float* y;
  int64_t y_stride;
  float* partial;  // [splits, n, out] when splits > 1
  int64_t n, in, out;
  int64_t chunk;  // multiple of 32
  int splits;
};

// The K loop shared by the tensor-core GEMMs: U 16-byte weight loads per row (rows g and g + 8 of
// the warp's 16) in flight, each covering COLS columns of the warp, then chunk(wa, wb, k) for each.
template <int U, int COLS, typename T, typename Chunk>
__device__ __forceinline__ void mma_k_loop(const T* w0, const T* w1, int64_t k_begin, int64_t k_end, Chunk chunk) {
  int64_t k = k_begin;
  for (; k + COLS * U <= k_end; k += COLS * U) {
    uint4 wa[U], wb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      wa[u] = load_stream_16(w0 + k + COLS * u);
      wb[u] = load_stream_16(w1 + k + COLS * u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) chunk(wa[u], wb[u], k + COLS * u);
  }
  for (; k < k_end; k += COLS) chunk(load_stream_16(w0 + k), load_stream_16(w1 + k), k);
}

template <DType WD, int NT, int U>
__global__ void __launch_bounds__(kMmaGemmWarps * 32) gemm_mma_kernel(const MmaGemmParams p) {
#if TACHYON_MMA_ENABLED
  using M = MmaType<WD>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kMmaGemmWarps + warp) * 16;
  if (row0 >= p.out) return;  // no block-wide synchronisation
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t k_end = min64(p.in, k_begin + p.chunk);
  const uint16_t* w0 = p.w + min64(row0 + g, p.out - 1) * p.w_stride + 8 * t;
  const uint16_t* w1 = p.w + min64(row0 + g + 8, p.out - 1) * p.w_stride + 8 * t;
  const uint16_t* xr[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) xr[j] = p.x + min64(8 * j + g, p.n - 1) * p.x_stride + 8 * t;  // past n: never stored

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  const auto chunk32 = [&](const uint4& wa, const uint4& wb, int64_t k) {
    uint4 xv[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) xv[j] = __ldg(reinterpret_cast<const uint4*>(xr[j] + k));
    const uint32_t a0[4] = {wa.x, wb.x, wa.y, wb.y};
    const uint32_t a1[4] = {wa.z, wb.z, wa.w, wb.w};
#pragma unroll
    for (int j = 0; j < NT; ++j) M::mma(acc[j], a0, xv[j].x, xv[j].y);
#pragma unroll
    for (int j = 0; j < NT; ++j) M::mma(acc[j], a1, xv[j].z, xv[j].w);
  };
  mma_k_loop<U, 32>(w0, w1, k_begin, k_end, chunk32);
  store_mma_tile<NT>(acc, row0, g, t, split, p.n, p.out, p.splits, p.bias, p.bias_dtype, nullptr, p.y, p.y_stride,
                     p.partial);
#else
  __trap();
#endif
}

// Sixteen int8 weights (one 16-byte load) as eight bf16 pairs, exactly (|q| <= 127 needs 8 bits of
// mantissa at most): each byte becomes the float 2^23 + (b + 128) through the mantissa trick of
// Elem<kI8>, minus 2^23 + 128, and a float holding a small integer is its bf16 in the upper half.
__device__ __forceinline__ void int8x16_to_bf16x8(const uint4& u, uint32_t (&out)[8]) {
  const uint32_t words[4] = {u.x ^ 0x80808080u, u.y ^ 0x80808080u, u.z ^ 0x80808080u, u.w ^ 0x80808080u};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float f[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) f[b] = __uint_as_float(__byte_perm(words[i], 0x4b000000u, 0x7540u | b)) - 8388736.0f;
    out[2 * i] = __byte_perm(__float_as_uint(f[0]), __float_as_uint(f[1]), 0x7632u);
    out[2 * i + 1] = __byte_perm(__float_as_uint(f[2]), __float_as_uint(f[3]), 0x7632u);
  }
}

// The tensor-core GEMM for per-channel int8 weights (W8A16): the same tiling as gemm_mma_kernel,
// but a lane's 16-byte load holds 16 weights, k 16t..16t+15 of a 64-column chunk, expanded to bf16
// in registers and fed as four k16 steps against the activations at the same 16 columns (two
// 16-byte loads per token). The per-row scale multiplies the finished sums (in the split-K
// reduction when K is split).
struct MmaGemmI8Params {
  const uint16_t* x;  // [n, x_stride] bf16
  int64_t x_stride;
  const int8_t* w;  // [out, w_stride] int8
  int64_t w_stride;
  const float* scales;  // [out]
  const void* bias;
  DType bias_dtype;
  float* y;
  int64_t y_stride;
  float* partial;
  int64_t n, in, out;
  int64_t chunk;  // multiple of 64
  int splits;
};

template <int NT, int U>
__global__ void __launch_bounds__(kMmaGemmWarps * 32) gemm_mma_i8_kernel(const MmaGemmI8Params p) {
#if TACHYON_MMA_ENABLED
  using M = MmaType<DType::kBF16>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kMmaGemmWarps + warp) * 16;
  if (row0 >= p.out) return;  // no block-wide synchronisation
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t k_end = min64(p.in, k_begin + p.chunk);
  const int8_t* w0 = p.w + min64(row0 + g, p.out - 1) * p.w_stride + 16 * t;
  const int8_t* w1 = p.w + min64(row0 + g + 8, p.out - 1) * p.w_stride + 16 * t;
  const uint16_t* xr[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) xr[j] = p.x + min64(8 * j + g, p.n - 1) * p.x_stride + 16 * t;  // past n: never stored

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  const auto chunk64 = [&](const uint4& wa, const uint4& wb, int64_t k) {
    uint32_t a[8], b[8];
    int8x16_to_bf16x8(wa, a);
    int8x16_to_bf16x8(wb, b);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // columns 16t + 8h .. + 7
      uint4 xv[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) xv[j] = __ldg(reinterpret_cast<const uint4*>(xr[j] + k + 8 * h));
      const uint32_t a0[4] = {a[4 * h], b[4 * h], a[4 * h + 1], b[4 * h + 1]};
      const uint32_t a1[4] = {a[4 * h + 2], b[4 * h + 2], a[4 * h + 3], b[4 * h + 3]};
#pragma unroll
      for (int j = 0; j < NT; ++j) M::mma(acc[j], a0, xv[j].x, xv[j].y);
#pragma unroll
      for (int j = 0; j < NT; ++j) M::mma(acc[j], a1, xv[j].z, xv[j].w);
    }
  };
  mma_k_loop<U, 64>(w0, w1, k_begin, k_end, chunk64);
  store_mma_tile<NT>(acc, row0, g, t, split, p.n, p.out, p.splits, p.bias, p.bias_dtype, p.scales, p.y, p.y_stride,
                     p.partial);
#else
  __trap();
#endif
}

template <int NT>
cudaError_t launch_gemm_mma_i8_nt(const MmaGemmI8Params& p, Stream stream) {
  constexpr int U = NT <= 2 ? 4 : (NT <= 4 ? 2 : 1);  // 16-byte weight loads in flight per row and lane
  const int64_t row_tiles = (p.out + 15) / 16;
  const dim3 grid(static_cast<unsigned>((row_tiles + kMmaGemmWarps - 1) / kMmaGemmWarps),
                  static_cast<unsigned>(p.splits));
  gemm_mma_i8_kernel<NT, U><<<grid, kMmaGemmWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

template <DType WD, int NT>
cudaError_t launch_gemm_mma_nt(const MmaGemmParams& p, Stream stream) {
  constexpr int U = NT <= 2 ? 8 : (NT <= 4 ? 4 : 2);  // 16-byte weight loads in flight per row and lane
  const int64_t row_tiles = (p.out + 15) / 16;
  const dim3 grid(static_cast<unsigned>((row_tiles + kMmaGemmWarps - 1) / kMmaGemmWarps),
                  static_cast<unsigned>(p.splits));
  gemm_mma_kernel<WD, NT, U><<<grid, kMmaGemmWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

template <DType WD>
cudaError_t launch_gemm_mma_dtype(const MmaGemmParams& p, Stream stream) {
  if (p.n <= 8) return launch_gemm_mma_nt<WD, 1>(p, stream);
  if (p.n <= 16) return launch_gemm_mma_nt<WD, 2>(p, stream);
  if (p.n <= 32) return launch_gemm_mma_nt<WD, 4>(p, stream);
  return launch_gemm_mma_nt<WD, 8>(p, stream);
}
}  // namespace

GemvShape plan_gemv(const LinearArgs& a, int sm_count) {
  GemvShape s;
  const size_t esize = dtype_size(a.w_dtype);
  const int vec = static_cast<int>(16 / esize);
  s.step = 32 * vec;
  const bool wide = a.w_dtype == DType::kBF16 || a.w_dtype == DType::kF16 || a.w_dtype == DType::kF32;
  s.rows_per_warp = rows_per_warp(wide, a.n);
  const auto aligned16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  s.vector_loads = aligned16(a.w) && (a.w_stride * static_cast<int64_t>(esize)) % 16 == 0 && aligned16(a.x) &&
                   a.x_stride % 4 == 0;
  // 16-bit and f32 weights: 8 warps per SM, each lane with 8 loads of 16 bytes in flight, keep
  // the H200's copy rate; splitting further to 32 cost more in the split-K reduction than it won
  // (Llama-3-8B's q/o 12.6 -> 9.9 us, down 31.0 -> 28.5 us at one token; docs/perf.md 2026-12-02).
  const int one_rows = rows_per_warp(wide, 1);
  plan_k_splits(s, a.in, (a.out + one_rows - 1) / one_rows, s.step * GemvTile<1>::kSteps, s.step, sm_count,
                wide ? 8 : 32);
  return s;
}

cudaError_t launch_gemv(const LinearArgs& a, const GemvShape& shape, float* partial, Stream stream) {
  return launch_gemv_fused(a, GemvFusion{}, shape, partial, stream);
}

bool gemv_fused_supported(const LinearArgs& a, const GemvFusion& f) {
  const bool dtype_ok = a.w_dtype == DType::kBF16 || a.w_dtype == DType::kF16 || a.w_dtype == DType::kF32 ||
                        a.w_dtype == DType::kI8 || a.w_dtype == DType::kF8E4M3;
  return dtype_ok && a.n >= 1 && a.n <= kGemvMaxTokens && (f.epilogue != GemvEpilogue::kSwiGLU || a.out % 2 == 0);
}

cudaError_t launch_gemv_fused(const LinearArgs& a, const GemvFusion& f, const GemvShape& shape, float* partial,
                              Stream stream) {
  GemvParams p;
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.w = a.w;
  fill_common(p, a, shape, partial);
  p.scales = a.w_dtype == DType::kI8 || a.w_dtype == DType::kF8E4M3 ? a.w_scales : nullptr;
  p.vector_loads = shape.vector_loads;
  p.epilogue = f.epilogue;
  cudaError_t e = cudaSuccess;
  switch (a.w_dtype) {
    case DType::kBF16: e = launch_dtype<DType::kBF16>(p, shape, stream); break;
    case DType::kF16: e = launch_dtype<DType::kF16>(p, shape, stream); break;
    case DType::kF32: e = launch_dtype<DType::kF32>(p, shape, stream); break;
    case DType::kI8: e = launch_dtype<DType::kI8>(p, shape, stream); break;
    case DType::kF8E4M3: e = launch_dtype<DType::kF8E4M3>(p, shape, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (e != cudaSuccess || shape.splits == 1) return e;
  const int threads = 256;
  if (f.epilogue == GemvEpilogue::kStore) {
    return launch_pdl(gemv_reduce_kernel, grid_for(a.n * a.out, threads), threads, 0, stream, partial, shape.splits,
                      a.n, a.out, a.bias, a.bias_dtype, p.scales, a.y, a.y_stride);
  }
  const int64_t cols = f.epilogue == GemvEpilogue::kSwiGLU ? a.out / 2 : a.out;
  return launch_pdl(gemv_reduce_fused_kernel, grid_for(a.n * cols, threads), threads, 0, stream, partial,
                    shape.splits, a.n, a.out, a.bias, a.bias_dtype, p.scales, a.y, a.y_stride, f.epilogue);
}

namespace {
struct ProbeVariant {
  const char* name;
  cudaError_t (*launch)(const GemvParams&, const GemvShape&, Stream);
};
template <int R, int U, int W>
constexpr ProbeVariant probe_variant(const char* name) {
  return {name, &launch_bucket<DType::kBF16, 1, GemvTileOf<R, U, 1, W>>};
}
constexpr ProbeVariant kProbeVariants[] = {
    {"the one-token tile (kept)", &launch_bucket<DType::kBF16, 1>}, probe_variant<4, 4, 4>("rows 4, steps 4, warps 4"),
    probe_variant<2, 8, 4>("rows 2, steps 8, warps 4"),             probe_variant<4, 2, 4>("rows 4, steps 2, warps 4"),
    probe_variant<8, 2, 4>("rows 8, steps 2, warps 4"),             probe_variant<2, 2, 4>("rows 2, steps 2, warps 4"),
    probe_variant<4, 4, 8>("rows 4, steps 4, warps 8"),             probe_variant<2, 4, 2>("rows 2, steps 4, warps 2"),
    probe_variant<2, 4, 8>("rows 2, steps 4, warps 8"),             probe_variant<4, 8, 4>("rows 4, steps 8, warps 4"),
};
}  // namespace

int gemv_probe_variants() { return static_cast<int>(sizeof(kProbeVariants) / sizeof(kProbeVariants[0])); }
const char* gemv_probe_name(int variant) { return kProbeVariants[variant].name; }

cudaError_t launch_gemv_probe(const LinearArgs& a, int variant, Stream stream) {
  if (variant < 0 || variant >= gemv_probe_variants() || a.w_dtype != DType::kBF16 || a.n != 1) {
    return cudaErrorInvalidValue;
  }
  GemvShape shape = plan_gemv(a, 1);  // one SM: no K split
  if (shape.splits != 1 || !shape.vector_loads) return cudaErrorInvalidValue;
  GemvParams p;
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.w = a.w;
  fill_common(p, a, shape, static_cast<float*>(nullptr));
  p.scales = nullptr;
  p.vector_loads = true;
  return kProbeVariants[variant].launch(p, shape, stream);
}

cudaError_t launch_gemv_reduce(const float* partial, int splits, int64_t n, int64_t out, const void* bias,
                               DType bias_dtype, const float* scales, float* y, int64_t y_stride, Stream stream) {
  const int threads = 256;
  return launch_pdl(gemv_reduce_kernel, grid_for(n * out, threads), threads, 0, stream,
                    partial, splits, n, out, bias, bias_dtype, scales, y, y_stride);
}

bool gemm_mma_supported(const LinearArgs& a, int64_t x_stride) {
  const auto aligned16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  if (a.w_dtype == DType::kI8) {
    return a.w_scales != nullptr && a.n >= 1 && a.n <= kGemmMmaMaxTokens && a.in % 64 == 0 && a.w_stride % 16 == 0 &&
           x_stride % 8 == 0 && aligned16(a.w);
  }
  return (a.w_dtype == DType::kBF16 || a.w_dtype == DType::kF16) && a.n >= 1 && a.n <= kGemmMmaMaxTokens &&
         a.in % 32 == 0 && a.w_stride % 8 == 0 && x_stride % 8 == 0 && aligned16(a.w);
}

GemvShape plan_gemm_mma(const LinearArgs& a, int sm_count) {
  GemvShape s;
  s.vector_loads = true;
  s.rows_per_warp = 16;
  s.step = 32;
  const int64_t row_warps = (a.out + 15) / 16;
  const int64_t target_warps = static_cast<int64_t>(std::max(sm_count, 1)) * 32;
  const int64_t step = a.w_dtype == DType::kI8 ? 64 : 32;  // columns per 16-byte weight load of the warp's lanes
  const int64_t unroll = a.w_dtype == DType::kI8 ? (a.n <= 16 ? 4 : (a.n <= 32 ? 2 : 1))
                                                 : (a.n <= 16 ? 8 : (a.n <= 32 ? 4 : 2));
  const int64_t max_splits = std::max<int64_t>(1, std::min<int64_t>(a.in / (step * unroll), 32));
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(target_warps / std::max<int64_t>(row_warps, 1), max_splits));
  int64_t chunk = (a.in + want - 1) / want;
  chunk = (chunk + step - 1) / step * step;
  s.chunk = std::max<int64_t>(chunk, step);
  s.step = static_cast<int>(step);
  s.splits = static_cast<int>((a.in + s.chunk - 1) / s.chunk);
  return s;
}

cudaError_t launch_gemm_mma(const LinearArgs& a, const void* x16, int64_t x_stride, const GemvShape& shape,
                            float* partial, Stream stream) {
  if (a.w_dtype == DType::kI8) {
    MmaGemmI8Params q;
    q.x = static_cast<const uint16_t*>(x16);
    q.x_stride = x_stride;
    q.w = static_cast<const int8_t*>(a.w);
    fill_common(q, a, shape, partial);
    q.scales = a.w_scales;
    cudaError_t e = q.n <= 8    ? launch_gemm_mma_i8_nt<1>(q, stream)
                    : q.n <= 16 ? launch_gemm_mma_i8_nt<2>(q, stream)
                    : q.n <= 32 ? launch_gemm_mma_i8_nt<4>(q, stream)
                                : launch_gemm_mma_i8_nt<8>(q, stream);
    if (e != cudaSuccess || shape.splits == 1) return e;
    const int threads = 256;
    return launch_pdl(gemv_reduce_kernel, grid_for(a.n * a.out, threads), threads, 0, stream,
                      partial, shape.splits, a.n, a.out, a.bias, a.bias_dtype, a.w_scales, a.y, a.y_stride);
  }
  MmaGemmParams p;
  p.x = static_cast<const uint16_t*>(x16);
  p.x_stride = x_stride;
  p.w = static_cast<const uint16_t*>(a.w);
  fill_common(p, a, shape, partial);
  cudaError_t e = a.w_dtype == DType::kBF16 ? launch_gemm_mma_dtype<DType::kBF16>(p, stream)
                                             : launch_gemm_mma_dtype<DType::kF16>(p, stream);
  if (e != cudaSuccess || shape.splits == 1) return e;
  const int threads = 256;
  return launch_pdl(gemv_reduce_kernel, grid_for(a.n * a.out, threads), threads, 0, stream,
                    partial, shape.splits, a.n, a.out, a.bias, a.bias_dtype, nullptr, a.y, a.y_stride);
}

cudaError_t launch_convert_rows(const float* x, int64_t x_stride, int64_t n, int64_t in, void* dst, DType dst_dtype,
                                int64_t dst_stride, Stream stream) {
  if (n == 0 || in == 0) return cudaSuccess;
  const bool vec = (dst_dtype == DType::kBF16 || dst_dtype == DType::kF16) && in % 4 == 0 && x_stride % 4 == 0 &&
                   dst_stride % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(dst) & 7u) == 0;
  const int threads = 256;
  const int64_t per_block = threads * (vec ? 4 : 1);
  const dim3 grid(static_cast<unsigned>((in + per_block - 1) / per_block),
                  static_cast<unsigned>(std::min<int64_t>(n, 65535)));
  return launch_pdl(convert_rows_kernel, grid, threads, 0, stream, x, x_stride, n, in, dst, dst_dtype, dst_stride,
                    vec);
}

cudaError_t launch_add_bias(float* y, int64_t y_stride, int64_t n, int64_t out, const void* bias, DType bias_dtype,
                            Stream stream) {
  const int threads = 256;
  add_bias_kernel<<<grid_for(n * out, threads), threads, 0, stream>>>(y, y_stride, n, out, bias, bias_dtype);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
