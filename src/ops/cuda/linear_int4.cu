// The GEMV of linear() for group-wise int4 weights (W4A16, quant/quantize.h's kInt4Group) at 1..8
// tokens, where a step is bound by reading the weight once: half a byte per weight plus a scale
// and a zero point per group, against two bytes for bf16.
//
// Each warp owns a few output rows; a lane's 16-byte load is one block of 32 weights of one row
// (byte j: weight j in the low nibble, j + 16 in the high one), always inside one group since the
// group size is a multiple of 32. A nibble q becomes the float 2^23 + q by moving it into the
// mantissa of 2^23 (a byte permute), and subtracting 2^23 + zero gives q - zero exactly; the
// block's 32 products with the activations are summed, then multiplied by the group's scale:
//   y[t, o] = sum_blocks scale[o, g] * sum_j (q[o, k + j] - zero[o, g]) * x[t, k + j].
// K splits over the grid for short matrices, with partial sums reduced in split order (the
// GEMV's reduction kernel), so results never depend on timing.
//
// Also the tensor-core form for group 128 (1..kGemmMmaMaxTokensInt4 tokens, sm_80+): see
// gemm_mma_i4_kernel below; on sm_90 at 1-2 tokens, linear_int4_stream.cu's kernel.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/gemv_store.cuh"  // store_mma_tile
#include "ops/cuda/int4_mma.cuh"
#include "ops/cuda/launch.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/pdl.cuh"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kWarps = kGemvThreads / 32;
constexpr int kBlock = 32;             // weights per 16-byte load
constexpr int64_t kStep = 32 * kBlock;  // columns one warp covers with one load per lane

struct Int4GemvParams {
  const float* x;  // [n, in] f32
  int64_t x_stride;
  const uint8_t* w;  // [out, in / 2] packed, rows w_stride bytes apart
  int64_t w_stride;
  const float* scales;  // [out, in / group]
  const float* zeros;   // [out, in / group]
  int group;
  const void* bias;
  DType bias_dtype;
  float* y;
  int64_t y_stride;
  float* partial;  // [splits, n, out] when splits > 1
  int64_t n, in, out;
  int64_t chunk;  // multiple of kStep
  int splits;
  bool x_vec;  // x rows 16-byte aligned
};

// Rows per warp, loads in flight per row, and the activations held at once (C columns per token:
// NT * C registers), by token bucket.
template <int NT>
struct Int4Tile;
template <>
struct Int4Tile<1> {
  static constexpr int kRows = 4, kSteps = 2, kCols = 32;
};
template <>
struct Int4Tile<2> {
  static constexpr int kRows = 4, kSteps = 2, kCols = 16;
};
template <>
struct Int4Tile<4> {
  static constexpr int kRows = 4, kSteps = 1, kCols = 8;
};
template <>
struct Int4Tile<8> {
  static constexpr int kRows = 2, kSteps = 1, kCols = 8;
};

// Column j (0..31) of a block: which 32-bit word of the load holds it, and its byte inside the
// masked word (low nibbles for j < 16, high nibbles shifted down for j >= 16).
__device__ __forceinline__ float nibble_minus_zero(const uint32_t (&lo)[4], const uint32_t (&hi)[4], int j,
                                                   float magic_zero) {
  const int b = j & 15;
  const uint32_t word = j < 16 ? lo[b >> 2] : hi[b >> 2];
  return __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7440u | static_cast<uint32_t>(b & 3))) - magic_zero;
}

template <int NT>
__device__ __forceinline__ void load_x(const Int4GemvParams& p, int64_t col, float (&xv)[NT][Int4Tile<NT>::kCols]) {
  constexpr int C = Int4Tile<NT>::kCols;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float* xt = p.x + (t < p.n ? t : p.n - 1) * p.x_stride + col;  // past n: never stored
    if (p.x_vec) {
#pragma unroll
      for (int j = 0; j < C; j += 4) {
        const float4 q = __ldg(reinterpret_cast<const float4*>(xt + j));
        xv[t][j] = q.x;
        xv[t][j + 1] = q.y;
        xv[t][j + 2] = q.z;
        xv[t][j + 3] = q.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < C; ++j) xv[t][j] = __ldg(xt + j);
    }
  }
}

// acc[r][t] += scale_r * sum over the block at column k of (q - zero_r) * x_t.
template <int ROWS, int NT>
__device__ __forceinline__ void int4_block(const Int4GemvParams& p, const uint4 (&raw)[ROWS], const float (&scale)[ROWS],
                                           const float (&magic_zero)[ROWS], int64_t k, float (&acc)[ROWS][NT]) {
  constexpr int C = Int4Tile<NT>::kCols;
  uint32_t lo[ROWS][4], hi[ROWS][4];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const uint32_t words[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[r][i] = words[i] & 0x0f0f0f0fu;
      hi[r][i] = (words[i] >> 4) & 0x0f0f0f0fu;
    }
  }
  float sum[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) sum[r][t] = 0.0f;
  }
#pragma unroll
  for (int c0 = 0; c0 < kBlock; c0 += C) {
    float xv[NT][C];
    load_x<NT>(p, k + c0, xv);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int j = 0; j < C; ++j) {
        const float wq = nibble_minus_zero(lo[r], hi[r], c0 + j, magic_zero[r]);
#pragma unroll
        for (int t = 0; t < NT; ++t) sum[r][t] = fmaf(wq, xv[t][j], sum[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(scale[r], sum[r][t], acc[r][t]);
  }
}

template <int NT>
__global__ void __launch_bounds__(kGemvThreads) gemv_int4_kernel(const Int4GemvParams p) {
  pdl_wait();
  pdl_trigger();
  constexpr int ROWS = Int4Tile<NT>::kRows;
  constexpr int U = Int4Tile<NT>::kSteps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * ROWS;
  if (row0 >= p.out) return;  // no block-wide synchronisation below
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t k_end = min64(p.in, k_begin + p.chunk);
  const int64_t groups = p.in / p.group;

  int64_t rows[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) rows[r] = min64(row0 + r, p.out - 1);  // clamped: rows past out are not stored

  float acc[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }

  // Lanes may run different numbers of blocks at the end of a slice (no shuffles until the epilogue).
  int64_t k = k_begin + lane * kBlock;
  for (; k + (U - 1) * kStep < k_end; k += U * kStep) {
    uint4 raw[U][ROWS];
    float scale[U][ROWS], magic_zero[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t col = k + u * kStep;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) raw[u][r] = load_stream_16(p.w + rows[r] * p.w_stride + col / 2);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int64_t sg = rows[r] * groups + col / p.group;
        scale[u][r] = __ldg(p.scales + sg);
        magic_zero[u][r] = 8388608.0f + __ldg(p.zeros + sg);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) int4_block<ROWS, NT>(p, raw[u], scale[u], magic_zero[u], k + u * kStep, acc);
  }
  for (; k < k_end; k += kStep) {
    uint4 raw[ROWS];
    float scale[ROWS], magic_zero[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      raw[r] = load_stream_16(p.w + rows[r] * p.w_stride + k / 2);
      const int64_t sg = rows[r] * groups + k / p.group;
      scale[r] = __ldg(p.scales + sg);
      magic_zero[r] = 8388608.0f + __ldg(p.zeros + sg);
    }
    int4_block<ROWS, NT>(p, raw, scale, magic_zero, k, acc);
  }
  // Every sum through the same butterfly whatever ROWS and NT are, so that a token's result does
  // not depend on the batch it came in (LinearMode::kBatchInvariant); a few more shuffles than the
  // transposed sum of store_gemv_sums.
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float sum = warp_sum(acc[r][t]);
      const int64_t row = row0 + r;
      if (lane == (r * NT + t) % 32 && row < p.out && t < p.n) {
        if (p.splits == 1) {
          p.y[t * p.y_stride + row] = sum + (p.bias != nullptr ? load_as_f32(p.bias, p.bias_dtype, row) : 0.0f);
        } else {
          p.partial[(static_cast<int64_t>(split) * p.n + t) * p.out + row] = sum;
        }
      }
    }
  }
}

template <int NT>
cudaError_t launch_int4_bucket(const Int4GemvParams& p, Stream stream) {
  const int64_t rows_per_block = static_cast<int64_t>(kWarps) * Int4Tile<NT>::kRows;
  const dim3 grid(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(p.splits));
  return launch_pdl(gemv_int4_kernel<NT>, grid, kGemvThreads, 0, stream, p);
}

int int4_rows_per_warp(int64_t n) {
  if (n <= 1) return Int4Tile<1>::kRows;
  if (n <= 2) return Int4Tile<2>::kRows;
  if (n <= 4) return Int4Tile<4>::kRows;
  return Int4Tile<8>::kRows;
}

// ---- tensor cores, group 128 -----------------------------------------------------------------------
// y^T[out, n] = W[out, in] · x^T with mma.m16n8k16 (bf16 in, f32 accumulators), as the int8 GEMM of
// linear_gemv.cu: a warp owns 16 rows (32 past 8 tokens: mma_i4_row_tiles) and up to 8 * NT tokens
// (x already rounded to bf16), with int4_mma.cuh's chunk of 128 columns (one group), nibble
// decoding and K order. Each chunk's
// eight mma steps go to fresh accumulators, which the rows' group scales then add into the sums.
//
// Decode (gemm_mma_i4_staged_kernel, up to kGemmMmaInt4StageMaxTokens tokens): each block rounds
// its K slice of the f32 activations to bf16 (the bits the conversion pass would write) into shared
// memory, already in the operands' order (word pairs (c, c + 2), (c + 1, c + 3) for every 4
// columns c), while its first weights are in flight: the linear is one kernel, and a lane's
// operands for 16 columns are two 16-byte shared loads. With K split, the last block of a row
// range to finish adds the slices up in split order (finish_split_k).
constexpr int kMmaI4Warps = 4;

struct MmaGemmI4Params {
  const uint16_t* x;  // [n, x_stride] bf16
  int64_t x_stride;
  const uint8_t* w;  // [out, in / 2], rows w_stride bytes apart
  int64_t w_stride;
  const float* scales;  // [out, in / 128]
  const float* zeros;
  const void* bias;
  DType bias_dtype;
  float* y;
  int64_t y_stride;
  float* partial;  // [splits, n, out] when splits > 1
  int64_t n, in, out;
  int64_t chunk;  // multiple of 128
  int splits;
};

// The staged kernel's: f32 activations instead of x, and its split-K arrival counts, one per block
// column, zero between launches (null: the reduction kernel finishes).
struct MmaGemmI4StagedParams : MmaGemmI4Params {
  const float* x32;  // [n, x_stride] f32
  unsigned* counters;
  bool w_constant;  // LinearArgs::w_constant: the first round of loads before pdl_wait()
  // SwiGLU in the epilogue (the kI4SwiGLU kernel): out = 2 * half rows, gate rows [0, half) and up
  // rows [half, out); y gets silu(gate) * up, [n, half]. A warp takes 8 outputs: gate rows j0 + g,
  // up rows half + j0 + g.
  bool swiglu;
};

// silu(gate) * up, as silu_mul (elementwise.cu) and the fused GEMV compute it.
__device__ __forceinline__ float swiglu_of(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

// finish_split_k (gemv_store.cuh) for the SwiGLU epilogue: the last block of outputs [j_begin,
// j_begin + count) adds each gate and up row's slices in split order (the bits finish_split_k
// would write for them), then writes silu(gate) * up.
__device__ __forceinline__ void finish_split_k_swiglu(const float* partial, int splits, int64_t n, int64_t out,
                                                      int64_t j_begin, int64_t count, const void* bias,
                                                      DType bias_dtype, float* y, int64_t y_stride,
                                                      unsigned* counter) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == static_cast<unsigned>(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t half = out / 2;
  for (int64_t i = threadIdx.x; i < count * n; i += blockDim.x) {
    const int64_t t = i / count, j = j_begin + i % count;
    float gate = 0.0f, up = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) {
      gate += __ldcg(partial + (s * n + t) * out + j);
      up += __ldcg(partial + (s * n + t) * out + half + j);
    }
    if (bias != nullptr) {
      gate += load_as_f32(bias, bias_dtype, j);
      up += load_as_f32(bias, bias_dtype, half + j);
    }
    y[t * y_stride + j] = swiglu_of(gate, up);
  }
  if (threadIdx.x == 0) *counter = 0u;
}

template <int NT, int U, int R>
__global__ void __launch_bounds__(kMmaI4Warps * 32) gemm_mma_i4_kernel(const MmaGemmI4Params p) {
  pdl_wait();
  pdl_trigger();
#if TACHYON_MMA_ENABLED
  using M = MmaType<DType::kBF16>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kMmaI4Warps + warp) * 16 * R;
  if (row0 >= p.out) return;  // no block-wide synchronisation
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t k_end = min64(p.in, k_begin + p.chunk);
  const int64_t groups = p.in / 128;
  int64_t ra[R], rb[R];  // past out: never stored
  const uint8_t* w0[R];
  const uint8_t* w1[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    ra[r] = min64(row0 + 16 * r + g, p.out - 1);
    rb[r] = min64(row0 + 16 * r + g + 8, p.out - 1);
    w0[r] = p.w + ra[r] * p.w_stride + 16 * t;
    w1[r] = p.w + rb[r] * p.w_stride + 16 * t;
  }
  const uint16_t* xr[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) xr[j] = p.x + min64(8 * j + g, p.n - 1) * p.x_stride + 32 * t;  // past n: never stored

  float acc[R][NT][4];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.0f;
  }

  // wa / wb: R row tiles' 16-byte loads (rows g and g + 8 of each tile) at column k.
  const auto chunk128 = [&](const uint4* wa, const uint4* wb, int64_t k) {
    const int64_t grp = k / 128;
    float sa[R], sb[R];
    __nv_bfloat162 za[R], zb[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      sa[r] = __ldg(p.scales + ra[r] * groups + grp);
      sb[r] = __ldg(p.scales + rb[r] * groups + grp);
      za[r] = biased_zero_pair(__ldg(p.zeros + ra[r] * groups + grp));
      zb[r] = biased_zero_pair(__ldg(p.zeros + rb[r] * groups + grp));
    }
    float part[R][NT][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int j = 0; j < NT; ++j) part[r][j][0] = part[r][j][1] = part[r][j][2] = part[r][j][3] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // columns 32t + 16h .. + 15 of the chunk
      uint4 xv[NT][2];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        xv[j][0] = __ldg(reinterpret_cast<const uint4*>(xr[j] + k + 16 * h));
        xv[j][1] = __ldg(reinterpret_cast<const uint4*>(xr[j] + k + 16 * h + 8));
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // word i: columns 16h + 4i .. + 3
        // Low nibbles of a word are columns 4i + {0..3}, high nibbles 16 + 4i + {0..3}.
        const int lo_shift = h == 0 ? 0 : 4;
#pragma unroll
        for (int r = 0; r < R; ++r) {  // the activations' operands serve every row tile
          const uint32_t wa_word = i == 0 ? wa[r].x : i == 1 ? wa[r].y : i == 2 ? wa[r].z : wa[r].w;
          const uint32_t wb_word = i == 0 ? wb[r].x : i == 1 ? wb[r].y : i == 2 ? wb[r].z : wb[r].w;
          const uint32_t a[4] = {nibble_pair_bf16(wa_word, lo_shift, za[r]), nibble_pair_bf16(wb_word, lo_shift, zb[r]),
                                 nibble_pair_bf16(wa_word, lo_shift + 8, za[r]),
                                 nibble_pair_bf16(wb_word, lo_shift + 8, zb[r])};
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint4& q = xv[j][i / 2];
            const uint32_t u0 = (i & 1) ? q.z : q.x, u1 = (i & 1) ? q.w : q.y;  // x columns c, c+1 | c+2, c+3
            M::mma(part[r][j], a, __byte_perm(u0, u1, 0x5410u), __byte_perm(u0, u1, 0x7632u));
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        acc[r][j][0] = fmaf(sa[r], part[r][j][0], acc[r][j][0]);
        acc[r][j][1] = fmaf(sa[r], part[r][j][1], acc[r][j][1]);
        acc[r][j][2] = fmaf(sb[r], part[r][j][2], acc[r][j][2]);
        acc[r][j][3] = fmaf(sb[r], part[r][j][3], acc[r][j][3]);
      }
    }
  };
  int64_t k = k_begin;
  for (; k + 128 * U <= k_end; k += 128 * U) {
    uint4 wa[U][R], wb[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wa[u][r] = load_stream_16(w0[r] + (k + 128 * u) / 2);
        wb[u][r] = load_stream_16(w1[r] + (k + 128 * u) / 2);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) chunk128(wa[u], wb[u], k + 128 * u);
  }
  for (; k < k_end; k += 128) {
    uint4 wa[R], wb[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wa[r] = load_stream_16(w0[r] + k / 2);
      wb[r] = load_stream_16(w1[r] + k / 2);
    }
    chunk128(wa, wb, k);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    store_mma_tile<NT>(acc[r], row0 + 16 * r, g, t, split, p.n, p.out, p.splits, p.bias, p.bias_dtype, nullptr, p.y,
                       p.y_stride, p.partial);
  }
#else
  __trap();
#endif
}

// The decode form (1..kGemmMmaInt4StageMaxTokens tokens, one token tile): gemm_mma_i4_kernel's
// arithmetic with the activations staged in shared memory, U chunks per round of loads. Constant
// weights (LinearArgs::w_constant): the first round is requested before pdl_wait(), so that its
// latency passes while the kernel before ends.
// Probe modes (launch_gemm_mma_int4_probe, for tachyon_cuda_bench's --int4-sol only; linear() runs
// kI4Full): what the kernel's time is made of. Flags: no decoding or mma (the weights, scales and
// zeros still loaded and folded into the sums), no staging of the activations, and the weights read
// tile-major (each warp's 16 rows x 128 columns of a chunk as 1 KB in a row, as a repacked layout
// would hold them: the same bytes, wrong results).
constexpr int kI4Full = 0, kI4NoMath = 1, kI4NoStaging = 2, kI4TileMajor = 4;
// Not a probe: the SwiGLU epilogue (MmaGemmI4StagedParams::swiglu), a kernel of its own so that the
// plain one keeps its registers (and so its resident blocks).
constexpr int kI4SwiGLU = 8;
// Probe: two sets of registers for the weights, the next round's loads issued before the current
// round is multiplied (twice the bytes in flight per warp while it computes).
constexpr int kI4DoubleBuffer = 16;

// The SwiGLU kernel is held to the plain one's registers (6 blocks per SM): its epilogue would
// otherwise cost it a resident block.
template <int U, int MODE = kI4Full>
__global__ void __launch_bounds__(kMmaI4Warps * 32, (MODE & kI4SwiGLU) != 0 ? 6 : 0)
    gemm_mma_i4_staged_kernel(const MmaGemmI4StagedParams p) {
  constexpr bool kSwiGLU = (MODE & kI4SwiGLU) != 0;
#if TACHYON_MMA_ENABLED
  extern __shared__ uint4 x_stage[];  // n rows of mma_i4_stage_stride(chunk) words
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kMmaI4Warps + warp;
  const int64_t row0 = tile * 16;
  // SwiGLU: the warp's outputs j0 .. j0 + 7 (gate rows j0 + g, up rows half + j0 + g).
  const int64_t half = p.out / 2, j0 = tile * 8;
  // Warps past the last row still take part in staging and in the split-K finish (no early return).
  const bool active = kSwiGLU ? j0 < half : row0 < p.out;
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t slice_end = min64(p.in, k_begin + p.chunk);
  const int64_t k_end = active ? slice_end : k_begin;
  const int64_t groups = p.in / 128;
  // Rows past the matrix (or past the gate half) are clamped: read again, never stored.
  const int64_t ra = kSwiGLU ? min64(j0 + g, half - 1) : min64(row0 + g, p.out - 1);
  const int64_t rb = kSwiGLU ? half + ra : min64(row0 + g + 8, p.out - 1);
  const uint8_t* w0 = p.w + ra * p.w_stride + 16 * t;
  const uint8_t* w1 = p.w + rb * p.w_stride + 16 * t;
  const float *sc0 = p.scales + ra * groups, *sc1 = p.scales + rb * groups;
  const float *z0 = p.zeros + ra * groups, *z1 = p.zeros + rb * groups;
  // Lane (g, t) reads token min(g, n - 1)'s operands (rows past n: never stored).
  const uint32_t* xs =
      reinterpret_cast<const uint32_t*>(x_stage) + min64(g, p.n - 1) * mma_i4_stage_stride(p.chunk) + 8 * t;

  // kI4TileMajor: the warp's chunk c at (tile * groups + c) KB, lane L's rows g / g + 8 at 16 L / 512 + 16 L.
  const uint8_t* wt = p.w + (row0 / 16) * groups * 1024 + 16 * lane;
  const auto addr_a = [&](int64_t k) { return (MODE & kI4TileMajor) ? wt + (k / 128) * 1024 : w0 + k / 2; };
  const auto addr_b = [&](int64_t k) { return (MODE & kI4TileMajor) ? wt + (k / 128) * 1024 + 512 : w1 + k / 2; };

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const auto chunk128 = [&](const uint4& wa, const uint4& wb, int64_t k) {
    const int64_t grp = k / 128;
    if constexpr ((MODE & kI4NoMath) != 0) {
      const float s = __ldg(sc0 + grp) + __ldg(sc1 + grp) + __ldg(z0 + grp) + __ldg(z1 + grp);
      const uint32_t bits = wa.x ^ wa.y ^ wa.z ^ wa.w ^ wb.x ^ wb.y ^ wb.z ^ wb.w;
      acc[0] += s * __uint_as_float((bits & 0x007fffffu) | 0x3f800000u);
      return;
    }
    const float sa = __ldg(sc0 + grp), sb = __ldg(sc1 + grp);
    const __nv_bfloat162 za = biased_zero_pair(__ldg(z0 + grp));
    const __nv_bfloat162 zb = biased_zero_pair(__ldg(z1 + grp));
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // columns 32t + 16h .. + 15 of the chunk
      uint32_t b[8];
      load_int4_operands(xs + (k - k_begin) / 2, h, b);
      int4_half_chunk_mma(wa, wb, h, za, zb, b, part);
    }
    acc[0] = fmaf(sa, part[0], acc[0]);
    acc[1] = fmaf(sa, part[1], acc[1]);
    acc[2] = fmaf(sb, part[2], acc[2]);
    acc[3] = fmaf(sb, part[3], acc[3]);
  };

  // The first round's weights are in flight while the block stages its activations (and, constant,
  // while the kernel before ends).
  int64_t k = k_begin;
  uint4 wa[U], wb[U];
  const auto load_round = [&](int64_t at) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      wa[u] = load_stream_16(addr_a(at + 128 * u));
      wb[u] = load_stream_16(addr_b(at + 128 * u));
    }
  };
  const bool whole_round = k + 128 * U <= k_end;
  bool loaded = false;
  if (p.w_constant && whole_round) {
    load_round(k);
    loaded = true;
  }
  pdl_wait();
  pdl_trigger();
  if (!loaded && whole_round) {
    load_round(k);
    loaded = true;
  }
  if constexpr ((MODE & kI4NoStaging) == 0) {
    stage_int4_operands(p.x32, p.x_stride, p.n, k_begin, slice_end - k_begin, reinterpret_cast<uint32_t*>(x_stage),
                        mma_i4_stage_stride(p.chunk), threadIdx.x, blockDim.x);
    __syncthreads();
  }
  if constexpr ((MODE & kI4DoubleBuffer) != 0) {
    // Round k is in (wa, wb) when whole_round; rounds alternate between the two sets, each loaded
    // one round ahead of its multiplication.
    uint4 wa2[U], wb2[U];
    const auto load_round2 = [&](int64_t at) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        wa2[u] = load_stream_16(addr_a(at + 128 * u));
        wb2[u] = load_stream_16(addr_b(at + 128 * u));
      }
    };
    while (k + 128 * U <= k_end) {
      const bool next = k + 256 * U <= k_end;
      if (next) load_round2(k + 128 * U);
#pragma unroll
      for (int u = 0; u < U; ++u) chunk128(wa[u], wb[u], k + 128 * u);
      k += 128 * U;
      if (!next) break;
      const bool next2 = k + 256 * U <= k_end;
      if (next2) load_round(k + 128 * U);
#pragma unroll
      for (int u = 0; u < U; ++u) chunk128(wa2[u], wb2[u], k + 128 * u);
      k += 128 * U;
      if (!next2) break;
    }
  } else {
    for (; k + 128 * U <= k_end; k += 128 * U) {
      if (!loaded) load_round(k);
      loaded = false;
#pragma unroll
      for (int u = 0; u < U; ++u) chunk128(wa[u], wb[u], k + 128 * u);
    }
  }
  for (; k < k_end; k += 128) chunk128(load_stream_16(addr_a(k)), load_stream_16(addr_b(k)), k);
  if constexpr (kSwiGLU) {
    // acc[e], acc[2 + e]: the gate and up sums of output j = j0 + g for token 2t + e (j, half
    // computed again here rather than held through the loop).
    const int64_t j =
        (static_cast<int64_t>(blockIdx.x) * kMmaI4Warps + (threadIdx.x >> 5)) * 8 + ((threadIdx.x & 31) >> 2);
    const int64_t hf = p.out / 2;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t tok = 2 * (threadIdx.x & 3) + e;
      if (j >= hf || tok >= p.n) continue;
      if (p.splits == 1) {
        const float bg = p.bias != nullptr ? load_as_f32(p.bias, p.bias_dtype, j) : 0.0f;
        const float bu = p.bias != nullptr ? load_as_f32(p.bias, p.bias_dtype, hf + j) : 0.0f;
        p.y[tok * p.y_stride + j] = swiglu_of(acc[e] + bg, acc[2 + e] + bu);
      } else {
        p.partial[(static_cast<int64_t>(blockIdx.y) * p.n + tok) * p.out + j] = acc[e];
        p.partial[(static_cast<int64_t>(blockIdx.y) * p.n + tok) * p.out + hf + j] = acc[2 + e];
      }
    }
    if (p.splits > 1) {
      const int64_t j_begin = static_cast<int64_t>(blockIdx.x) * kMmaI4Warps * 8;
      finish_split_k_swiglu(p.partial, p.splits, p.n, p.out, j_begin, min64(half - j_begin, kMmaI4Warps * 8), p.bias,
                            p.bias_dtype, p.y, p.y_stride, p.counters + blockIdx.x);
    }
    return;
  }
  const float tile4[1][4] = {{acc[0], acc[1], acc[2], acc[3]}};
  if (active) {
    store_mma_tile<1>(tile4, row0, g, t, split, p.n, p.out, p.splits, p.bias, p.bias_dtype, nullptr, p.y, p.y_stride,
                      p.partial);
  }
  if (p.splits > 1 && p.counters != nullptr) {
    const int64_t block_row0 = static_cast<int64_t>(blockIdx.x) * kMmaI4Warps * 16;
    finish_split_k(p.partial, p.splits, p.n, p.out, block_row0, min64(p.out - block_row0, kMmaI4Warps * 16),
                   p.bias, p.bias_dtype, nullptr, p.y, p.y_stride, p.counters + blockIdx.x);
  }
#else
  pdl_wait();
  __trap();
#endif
}

// Chunks per round of loads; slices are planned to hold whole rounds.
constexpr int mma_i4_unroll(int64_t n) { return n <= 8 ? 4 : 2; }

// Row tiles of 16 per warp in gemm_mma_i4_kernel. Past 8 tokens a warp's activation operands for
// a chunk (n x 128 bf16: 4-8 KB) outweigh its 16 rows of weights (1 KB), and every warp of every
// block reads them again: two row tiles per warp halve those reads per weight byte.
constexpr int mma_i4_row_tiles(int64_t n) { return n <= 8 ? 1 : 2; }

// Shared memory the staged kernel takes: the block's K slice of every token as bf16.
constexpr int64_t kMmaI4StageBytes = 48 * 1024;
int64_t mma_i4_stage_bytes(int64_t n, int64_t chunk) { return n * mma_i4_stage_stride(chunk) * 4; }

template <int NT>
cudaError_t launch_gemm_mma_i4_nt(const MmaGemmI4Params& p, Stream stream) {
  constexpr int U = mma_i4_unroll(8 * NT);  // 16-byte weight loads in flight per row and lane
  constexpr int R = mma_i4_row_tiles(8 * NT);
  const int64_t row_warps = (p.out + 16 * R - 1) / (16 * R);
  const dim3 grid(static_cast<unsigned>((row_warps + kMmaI4Warps - 1) / kMmaI4Warps), static_cast<unsigned>(p.splits));
  return launch_pdl(gemm_mma_i4_kernel<NT, U, R>, grid, kMmaI4Warps * 32, 0, stream, p);
}

template <int MODE = kI4Full, int U = 2>
cudaError_t launch_gemm_mma_i4_staged(const MmaGemmI4StagedParams& p, Stream stream) {
  // Two chunks per round: fewer registers held across the staging than a round of four, more
  // blocks resident (faster on the H200 at one token, docs/perf.md 2026-12-02).
  const int64_t row_tiles = p.swiglu ? (p.out / 2 + 7) / 8 : (p.out + 15) / 16;
  const dim3 grid(static_cast<unsigned>((row_tiles + kMmaI4Warps - 1) / kMmaI4Warps), static_cast<unsigned>(p.splits));
  const size_t smem = static_cast<size_t>(mma_i4_stage_bytes(p.n, p.chunk));
  if constexpr (MODE == kI4Full && U == 2) {
    if (p.swiglu) return launch_pdl(gemm_mma_i4_staged_kernel<U, kI4SwiGLU>, grid, kMmaI4Warps * 32, smem, stream, p);
  }
  return launch_pdl(gemm_mma_i4_staged_kernel<U, MODE>, grid, kMmaI4Warps * 32, smem, stream, p);
}

struct I4ProbeMode {
  const char* name;
  cudaError_t (*launch)(const MmaGemmI4StagedParams&, Stream);
};
constexpr I4ProbeMode kI4ProbeModes[] = {
    {"as linear() runs it", &launch_gemm_mma_i4_staged<kI4Full>},
    {"no decoding or mma", &launch_gemm_mma_i4_staged<kI4NoMath>},
    {"no staging", &launch_gemm_mma_i4_staged<kI4NoStaging>},
    {"tile-major weights", &launch_gemm_mma_i4_staged<kI4TileMajor>},
    {"tile-major, no decoding or mma", &launch_gemm_mma_i4_staged<kI4TileMajor | kI4NoMath>},
    {"no staging, no decoding or mma", &launch_gemm_mma_i4_staged<kI4NoStaging | kI4NoMath>},
    {"rounds of 4 chunks", &launch_gemm_mma_i4_staged<kI4Full, 4>},
    {"double-buffered", &launch_gemm_mma_i4_staged<kI4DoubleBuffer>},
    {"double-buffered, no decoding or mma", &launch_gemm_mma_i4_staged<kI4DoubleBuffer | kI4NoMath>},
    {"rounds of 4, double-buffered", &launch_gemm_mma_i4_staged<kI4DoubleBuffer, 4>},
    {"rounds of 4, double-buffered, no mma", &launch_gemm_mma_i4_staged<kI4DoubleBuffer | kI4NoMath, 4>},
};

}  // namespace

bool gemv_int4_supported(const LinearArgs& a) {
  const auto aligned16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  return a.w_dtype == DType::kU8 && a.w_scales != nullptr && a.w_zeros != nullptr && a.w_group > 0 &&
         a.w_group % kBlock == 0 && a.in % a.w_group == 0 && a.n >= 1 && a.n <= kGemvInt4MaxTokens &&
         a.w_stride % 16 == 0 && aligned16(a.w);
}

GemvShape plan_gemv_int4(const LinearArgs& a, int sm_count) {
  GemvShape s;
  s.step = kStep;
  s.vector_loads = true;
  s.rows_per_warp = int4_rows_per_warp(a.n);
  plan_k_splits(s, a.in, (a.out + Int4Tile<1>::kRows - 1) / Int4Tile<1>::kRows, kStep * Int4Tile<1>::kSteps, kStep,
                sm_count);
  return s;
}

bool gemm_mma_int4_supported(const LinearArgs& a, int64_t x_stride) {
  const auto aligned16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  return a.w_dtype == DType::kU8 && a.w_scales != nullptr && a.w_zeros != nullptr && a.w_group == 128 &&
         a.in % 128 == 0 && a.n >= 1 && a.n <= kGemmMmaMaxTokensInt4 && a.w_stride % 16 == 0 && x_stride % 8 == 0 &&
         aligned16(a.w);
}

int64_t gemm_mma_int4_row_blocks(const LinearArgs& a) {
  const int64_t rows_per_warp = 16 * mma_i4_row_tiles(a.n);
  return ((a.out + rows_per_warp - 1) / rows_per_warp + kMmaI4Warps - 1) / kMmaI4Warps;
}

bool gemm_mma_int4_stages_x(const LinearArgs& a, const GemvShape& shape) {
  return a.n <= kGemmMmaInt4StageMaxTokens && (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0 && a.x_stride % 4 == 0 &&
         mma_i4_stage_bytes(a.n, shape.chunk) <= kMmaI4StageBytes;
}

namespace {

// Blocks of the staged kernel resident per SM (the occupancy calculator, asked once; its registers
// bound it, so a typical slice's shared memory stands for all), 0 if the question fails.
int staged_resident_blocks() {
  static const int resident = [] {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemm_mma_i4_staged_kernel<2>, kMmaI4Warps * 32,
                                                      16 * 1024) != cudaSuccess) {
      cudaGetLastError();
      blocks = 0;
    }
    return blocks;
  }();
  return resident;
}

// The staged kernel's K slicing (1..kGemmMmaInt4StageMaxTokens tokens): the grid runs in waves of
// SMs x resident blocks, and a wave that is partly empty costs as much as a full one (the decode
// GEMMs are one or two waves: a Llama-3-8B down projection in 14 slices is 896 blocks, 1.13 waves
// of an H100's 792, and took 20.9 us against 16.2 us in 12 slices, 768 blocks; docs/perf.md
// 2026-12-06). So each slicing is costed as waves x (chunks per slice + kBlockOverheadChunks) and
// the cheapest taken, fewer slices on a tie. Slices hold whole rounds of the kernel (2 chunks) and
// fit its shared memory. 0 chunk: nothing fits (or the occupancy is unknown).
constexpr int64_t kBlockOverheadChunks = 2;  // a block's staging, sums and split-K finish, fitted on an H100
int64_t plan_staged_slice(const LinearArgs& a, int sm_count) {
  const int resident = staged_resident_blocks();
  if (resident <= 0) return 0;
  const int64_t chunks = a.in / 128;
  const int64_t row_blocks = ((a.out + 15) / 16 + kMmaI4Warps - 1) / kMmaI4Warps;
  const int64_t wave = static_cast<int64_t>(std::max(sm_count, 1)) * resident;
  int64_t best = 0, best_cost = 0;
  for (int64_t want = 1; want <= std::min<int64_t>(chunks, 32); ++want) {
    int64_t slice = (chunks + want - 1) / want;
    if (slice < chunks) slice = (slice + 1) / 2 * 2;
    if ((chunks + slice - 1) / slice != want) continue;  // the slicing of fewer splits
    if (mma_i4_stage_bytes(a.n, slice * 128) > kMmaI4StageBytes) continue;
    const int64_t waves = (row_blocks * want + wave - 1) / wave;
    const int64_t cost = waves * (slice + kBlockOverheadChunks);
    if (best == 0 || cost < best_cost) {
      best = slice;
      best_cost = cost;
    }
  }
  return best * 128;
}

}  // namespace

GemvShape plan_gemm_mma_int4(const LinearArgs& a, int sm_count) {
  GemvShape s;
  s.vector_loads = true;
  s.rows_per_warp = 16;
  s.step = 128;
  if (a.n <= kGemmMmaInt4StageMaxTokens && a.in % 128 == 0) {
    if (const int64_t chunk = plan_staged_slice(a, sm_count); chunk > 0) {
      s.chunk = chunk;
      s.splits = static_cast<int>((a.in + chunk - 1) / chunk);
      return s;
    }
  }
  const int64_t rows_per_warp = 16 * mma_i4_row_tiles(a.n);
  const int64_t row_warps = (a.out + rows_per_warp - 1) / rows_per_warp;
  const int64_t target_warps = static_cast<int64_t>(std::max(sm_count, 1)) * 32;
  const int64_t round = 128 * mma_i4_unroll(a.n);
  const int64_t max_splits = std::max<int64_t>(1, std::min<int64_t>(a.in / round, 32));
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(target_warps / std::max<int64_t>(row_warps, 1), max_splits));
  int64_t chunk = (a.in + want - 1) / want;
  // Where the staged kernel may run, whole rounds per slice (a short last round costs a load
  // latency of its own); elsewhere whole chunks.
  const int64_t unit = a.n <= kGemmMmaInt4StageMaxTokens && a.in >= round ? round : 128;
  chunk = (chunk + unit - 1) / unit * unit;
  s.chunk = std::max<int64_t>(chunk, 128);
  s.splits = static_cast<int>((a.in + s.chunk - 1) / s.chunk);
  return s;
}

cudaError_t launch_gemm_mma_int4(const LinearArgs& a, const uint16_t* x16, int64_t x_stride, const GemvShape& shape,
                                 float* partial, unsigned* counters, Stream stream, bool swiglu) {
  MmaGemmI4StagedParams q;
  const bool staged = x16 == nullptr;
  q.x = x16;
  q.x32 = a.x;
  q.x_stride = staged ? a.x_stride : x_stride;
  q.w = static_cast<const uint8_t*>(a.w);
  fill_common(q, a, shape, partial);
  q.scales = a.w_scales;
  q.zeros = a.w_zeros;
  // The kernel finishes split-K itself when it stages the activations (a block adds up at most 64
  // rows of 2 tokens); more tokens are faster through the reduction kernel's whole grid.
  q.counters = staged ? counters : nullptr;
  q.w_constant = a.w_constant;
  q.swiglu = swiglu;
  if (staged && !gemm_mma_int4_stages_x(a, shape)) return cudaErrorInvalidValue;
  if (swiglu && (!staged || a.out % 2 != 0 || (shape.splits > 1 && counters == nullptr))) return cudaErrorInvalidValue;
  const cudaError_t e = staged      ? launch_gemm_mma_i4_staged(q, stream)
                        : q.n <= 8  ? launch_gemm_mma_i4_nt<1>(q, stream)
                        : q.n <= 16 ? launch_gemm_mma_i4_nt<2>(q, stream)
                                    : launch_gemm_mma_i4_nt<4>(q, stream);
  if (e != cudaSuccess || shape.splits == 1 || q.counters != nullptr) return e;
  return launch_gemv_reduce(partial, shape.splits, a.n, a.out, a.bias, a.bias_dtype, nullptr, a.y, a.y_stride, stream);
}

int gemm_mma_int4_probe_modes() { return static_cast<int>(sizeof(kI4ProbeModes) / sizeof(kI4ProbeModes[0])); }
const char* gemm_mma_int4_probe_name(int mode) { return kI4ProbeModes[mode].name; }

cudaError_t launch_gemm_mma_int4_probe(const LinearArgs& a, const GemvShape& shape, int mode, float* partial,
                                       unsigned* counters, Stream stream) {
  if (mode < 0 || mode >= gemm_mma_int4_probe_modes() || a.out % 16 != 0 || !gemm_mma_int4_stages_x(a, shape)) {
    return cudaErrorInvalidValue;
  }
  MmaGemmI4StagedParams q;
  q.x = nullptr;
  q.x32 = a.x;
  q.x_stride = a.x_stride;
  q.w = static_cast<const uint8_t*>(a.w);
  fill_common(q, a, shape, partial);
  q.scales = a.w_scales;
  q.zeros = a.w_zeros;
  q.counters = counters;
  q.w_constant = a.w_constant;
  q.swiglu = false;
  return kI4ProbeModes[mode].launch(q, stream);
}

cudaError_t launch_gemv_int4(const LinearArgs& a, const GemvShape& shape, float* partial, Stream stream) {
  Int4GemvParams p;
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.w = static_cast<const uint8_t*>(a.w);
  fill_common(p, a, shape, partial);
  p.scales = a.w_scales;
  p.zeros = a.w_zeros;
  p.group = a.w_group;
  p.x_vec = (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0 && a.x_stride % 4 == 0;
  cudaError_t e = a.n <= 1   ? launch_int4_bucket<1>(p, stream)
                  : a.n <= 2 ? launch_int4_bucket<2>(p, stream)
                  : a.n <= 4 ? launch_int4_bucket<4>(p, stream)
                             : launch_int4_bucket<8>(p, stream);
  if (e != cudaSuccess || shape.splits == 1) return e;
  return launch_gemv_reduce(partial, shape.splits, a.n, a.out, a.bias, a.bias_dtype, nullptr, a.y, a.y_stride, stream);
}

}  // namespace tachyon::ops::cuda::detail
