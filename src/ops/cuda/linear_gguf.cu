// linear() for GGUF block weights (quant/quantize.h's kGguf* layouts: the file's Q8_0, Q4_1, Q5_0,
// Q5_1, IQ4_NL, Q4_K, Q5_K and Q6_K blocks, core/ggml_blocks.h's bit layouts): a GEMV for
// 1..kGemvGgufMaxTokens tokens, where a step is bound by reading the weight once (4.5 to 8.5 bits
// per weight). (The expansion of a whole weight to bf16 rows, which lets cuBLASLt multiply it
// when many tokens share it, is linear_gguf_expand.cu; gguf_blocks.cuh holds what both share.)
//
// Codes become floats in registers and meet the activations in f32 multiply-adds; block scales
// multiply sums of 4 to 32 products. K splits over the grid for short matrices, the slices' sums
// reduced in split order (linear_gemv.cu's reduction), so results never depend on timing; and a
// token's result does not depend on the batch it came in (the same per-lane order, planned splits
// and sums for any token count), which LinearMode::kBatchInvariant relies on.
//
// Q8_0: each warp owns a few output rows and walks K with 16-byte loads that bypass L1 (every
// weight byte is used once), a row's loads all issued before the first use. Q4_1, Q5_0, Q5_1 and
// IQ4_NL, whose 20-, 22-, 24- and 18-byte blocks sit only 4-, 2-, 8- and 2-byte aligned, are read
// in place the same way by loads no wider than that, four lanes to a block. Q4_K, Q5_K and Q6_K,
// whose 144-, 176- and 208-byte blocks straddle 32-byte sectors, are copied tile by tile into
// shared memory (cp.async, every instruction 512 consecutive bytes) and decoded from there; see
// their section.
//
// The K-quants' codes become floats with one byte permute each: a byte 0x80 | c below the byte
// 0x3f is the float 1 + c / 128 (the 0x80 is the exponent's lowest bit), so with xsum = sum_j x_j
// over a run of columns, sum_j (1 + c_j / 128) x_j = xsum + sum_j c_j x_j / 128 gives the codes'
// dot product with no conversion per weight. xsum depends only on the columns, so it is shared by
// the lane's rows (Q4_K's, which it needs anyway for its mins, by 8 lanes of a warp too). Q4_K
// places its nibble as c = 8 q (the float 1 + q / 16) and Q5_K its 5-bit code as c = 4 q, keeping
// more of the code's bits above the rounding of the sum; Q4_1, Q5_0 and Q5_1 do the same. At one
// token this decoding (3.4 to 4 instructions per weight) takes about as long as the weight's
// transfer on an H200, so the K-quant GEMVs stay below the memory roofline unless the matrix is
// large; int8 activations (dp4a) would be the next step, at the cost of the f32 activations'
// accuracy.
// Q8_0's signed codes, and IQ4_NL's table values, go through int8's exact byte trick
// (device_math.cuh's Elem<kI8>).
#include <algorithm>

#include "core/ggml_blocks.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/gguf_blocks.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kWarps = kGemvThreads / 32;  // warps per block of Q8_0's and the 32-blocks' GEMVs
constexpr int64_t kQ8Step = 32 * 16;       // Q8_0: 16 codes per lane and load
constexpr int64_t kBlock32Step = 8 * 32;   // Q4_1, Q5_0, Q5_1, IQ4_NL: 8 blocks (4 lanes each)

struct GgufGemvParams {
  const float* x;  // [n, in] f32, rows x_stride apart
  int64_t x_stride;
  const uint8_t* w;  // [out, w_stride] bytes: the format's packed rows
  int64_t w_stride;
  const uint16_t* d;  // [out, in / block] f16: Q8_0's and Q6_K's block scales; null for the others
  const void* bias;   // [out] or null
  DType bias_dtype;
  float* y;  // [n, out], rows y_stride apart
  int64_t y_stride;
  float* partial;  // [splits, n, out] when splits > 1
  int64_t n, in, out;
  int64_t chunk;  // columns per K slice: a multiple of the warp step (Q8_0, the 32-weight
                  // blocks) or of the block (the K-quants)
  int splits;
  // kCodeOr, passed at run time so that the compiler keeps it in a register: a K-quant code's
  // mask-and-set is then one three-input logic op (with two immediates it takes two).
  uint32_t code_or;
};

constexpr uint32_t kCodeOr = 0x80808080u;  // the 0x80 of every code byte (the floats 1 + c / 128)

// Rows per warp and (Q8_0, Q6_K) loads in flight per row, by token bucket: more tokens hold more
// sums and activations in registers, so fewer rows fit.
template <int NT>
struct Q8Tile;
template <>
struct Q8Tile<1> {
  static constexpr int kRows = 4, kSteps = 4;
};
template <>
struct Q8Tile<2> {
  static constexpr int kRows = 4, kSteps = 2;
};
template <>
struct Q8Tile<4> {
  static constexpr int kRows = 4, kSteps = 1;
};
template <>
struct Q8Tile<8> {
  static constexpr int kRows = 4, kSteps = 1;
};

__device__ __forceinline__ float element(const float4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}


// x[t, col .. col + 4) of each token's row (XV: 16-byte aligned rows, one load per token).
template <int NT, bool XV>
__device__ __forceinline__ void load_x4(const float* const (&xr)[NT], int64_t col, float4 (&xv)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float* q = xr[t] + col;
    if constexpr (XV) {
      xv[t] = __ldg(reinterpret_cast<const float4*>(q));
    } else {
      xv[t] = make_float4(__ldg(q), __ldg(q + 1), __ldg(q + 2), __ldg(q + 3));
    }
  }
}

// x[t, col .. col + 4) of one token's row (XV: a 16-byte aligned row).
template <bool XV>
__device__ __forceinline__ float4 load_x4_token(const float* xt, int64_t col) {
  const float* q = xt + col;
  if constexpr (XV) {
    return __ldg(reinterpret_cast<const float4*>(q));
  } else {
    return make_float4(__ldg(q), __ldg(q + 1), __ldg(q + 2), __ldg(q + 3));
  }
}

// Rows of the tokens (tokens past n re-read row n - 1; their sums are never stored).
template <int NT>
__device__ __forceinline__ void token_rows(const GgufGemvParams& p, const float* (&xr)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) xr[t] = p.x + min64(t, p.n - 1) * p.x_stride;
}

// Byte b (0..3) of `e`, 0x80 | c with c < 128, as the float 1 + c / 128.
__device__ __forceinline__ float unit_float(uint32_t e, int b) {
  return __uint_as_float(__byte_perm(e, 0x3f000000u, 0x7044u | static_cast<uint32_t>(b << 8)));
}

// The warp's sums to y (with the bias) or, with K split, to the slice's partial sums. Every sum
// through the same butterfly whatever ROWS and NT are (batch invariance).
template <int ROWS, int NT>
__device__ __forceinline__ void store_sums(const GgufGemvParams& p, const float (&acc)[ROWS][NT], int64_t row0,
                                           int split) {
  const int lane = threadIdx.x & 31;
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

// ---- Q8_0 ------------------------------------------------------------------------------------------
// A lane's 16-byte load is half a block (16 codes of one row), the warp's 32 loads 512 consecutive
// columns; the block's d (f16) multiplies the 16 products' sum.

// acc[r][t] += d_r * sum_j q[r, k + j] * x[t, k + j] over the 16 columns at k.
template <int ROWS, int NT, bool XV>
__device__ __forceinline__ void q8_0_half_block(const float* const (&xr)[NT], const uint4 (&raw)[ROWS],
                                                const float (&d)[ROWS], int64_t k, float (&acc)[ROWS][NT]) {
  float sum[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) sum[r][t] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float4 xv[NT];
    load_x4<NT, XV>(xr, k + 4 * i, xv);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const uint32_t biased = word(raw[r], i) ^ 0x80808080u;  // q + 128 in each byte
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const float q = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7540u | static_cast<uint32_t>(b))) -
                        8388736.0f;  // (2^23 + 128 + q) - (2^23 + 128)
#pragma unroll
        for (int t = 0; t < NT; ++t) sum[r][t] = fmaf(q, element(xv[t], b), sum[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(d[r], sum[r][t], acc[r][t]);
  }
}

template <int NT, int ROWS, int U, bool XV>
__global__ void __launch_bounds__(kGemvThreads) gemv_q8_0_kernel(const GgufGemvParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * ROWS;
  if (row0 >= p.out) return;  // no block-wide synchronisation below
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t k_end = min64(p.in, k_begin + p.chunk);
  const int64_t blocks = p.in / 32;
  const uint8_t* wr[ROWS];
  const uint16_t* dr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t row = min64(row0 + r, p.out - 1);  // clamped: rows past out are not stored
    wr[r] = p.w + row * p.w_stride;
    dr[r] = p.d + row * blocks;
  }
  const float* xr[NT];
  token_rows<NT>(p, xr);
  float acc[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  // Lanes may run different numbers of loads at the end of a slice (no shuffles until the epilogue).
  int64_t k = k_begin + lane * 16;
  for (; k + (U - 1) * kQ8Step < k_end; k += U * kQ8Step) {
    uint4 raw[U][ROWS];
    float d[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) raw[u][r] = load_stream_16(wr[r] + k + u * kQ8Step);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) d[u][r] = f16_bits_to_f32(__ldg(dr[r] + (k + u * kQ8Step) / 32));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) q8_0_half_block<ROWS, NT, XV>(xr, raw[u], d[u], k + u * kQ8Step, acc);
  }
  for (; k < k_end; k += kQ8Step) {
    uint4 raw[ROWS];
    float d[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      raw[r] = load_stream_16(wr[r] + k);
      d[r] = f16_bits_to_f32(__ldg(dr[r] + k / 32));
    }
    q8_0_half_block<ROWS, NT, XV>(xr, raw, d, k, acc);
  }
  store_sums<ROWS, NT>(p, acc, row0, split);
}

// ---- Q4_1, Q5_0, Q5_1 and IQ4_NL: blocks of 32 read in place ------------------------------------
// Four lanes share a block: lane quad q (lane & 3) takes qs bytes 4q .. 4q + 3, whose low nibbles
// are columns 4q .. 4q + 3 of the block and high nibbles 16 + 4q .. 16 + 4q + 3
// (core/ggml_blocks.h), one float4 of x per token each; a warp's step is 8 consecutive blocks
// (lane >> 2) of each of its rows. The four lanes read the block's header (d, m, qh) alike, one
// transaction. A block sits at the row's 2-byte (Q5_0, IQ4_NL), 4-byte (Q4_1) or 8-byte (Q5_1)
// alignment, so no load is wider: Q5_0's and IQ4_NL's words are pairs of u16. With S = sum f x
// over the lane's 8 columns and X their sum, codes as the K-quants' floats f (Q4_1: 1 + q / 16;
// Q5_0, Q5_1: 1 + q / 32, q with its fifth bit):
//   Q4_1: sum w x = 16 d (S - X) + m X    Q5_1: 32 d (S - X) + m X    Q5_0: d (32 S - 48 X)
// and IQ4_NL's table values (4 looked up per byte permute pair) exact, times d. X is shared by the
// lane's rows; each (row, token) sum sees the same operations in the same order whatever ROWS and
// the token count are.


// Rows per warp and steps whose loads are in flight together, by token bucket, as measured
// fastest on an H100 (tachyon_cuda_bench --quant-only against 4 rows and 4 / 2 / 1 / 1 steps: 11 %
// less time on average over its shapes and 1..8 tokens): two rows at one and two tokens (more
// warps), four at 4 and 8 (each x load serves more rows), with two steps in flight at 8 tokens
// (fewer warps fit). The one-token tile also sets the K split (plan_gemv_gguf). None of this
// changes a sum.
template <int NT>
struct Block32Tile;
template <>
struct Block32Tile<1> {
  static constexpr int kRows = 2, kSteps = 4;
};
template <>
struct Block32Tile<2> {
  static constexpr int kRows = 2, kSteps = 2;
};
template <>
struct Block32Tile<4> {
  static constexpr int kRows = 4, kSteps = 1;
};
template <>
struct Block32Tile<8> {
  static constexpr int kRows = 4, kSteps = 2;
};


// What a lane reads of its block: head = d (low 16 bits) and m (high 16; Q4_1, Q5_1), qh the 32
// fifth bits (Q5_0, Q5_1; bit j for weight j), qs the block's bytes 4q .. 4q + 3.
struct Block32Lane {
  uint32_t head, qh, qs;
};

template <GgufFormat F>
__device__ __forceinline__ Block32Lane load_block32(const uint8_t* block, int quad) {
  Block32Lane b{0u, 0u, 0u};
  if constexpr (F == GgufFormat::kQ4_1) {
    b.head = __ldg(reinterpret_cast<const uint32_t*>(block));
    b.qs = __ldg(reinterpret_cast<const uint32_t*>(block + 4 + 4 * quad));
  } else if constexpr (F == GgufFormat::kQ5_1) {
    const uint2 head = __ldg(reinterpret_cast<const uint2*>(block));
    b.head = head.x;
    b.qh = head.y;
    b.qs = __ldg(reinterpret_cast<const uint32_t*>(block + 8 + 4 * quad));
  } else if constexpr (F == GgufFormat::kQ5_0) {
    b.head = __ldg(reinterpret_cast<const uint16_t*>(block));
    b.qh = load_u32_align2(block + 2);
    b.qs = load_u32_align2(block + 6 + 4 * quad);
  } else {
    b.head = __ldg(reinterpret_cast<const uint16_t*>(block));
    b.qs = load_u32_align2(block + 2 + 4 * quad);
  }
  return b;
}

// Bits 0..3 of `bits` (the fifth bits of 4 columns) as bit 6 of bytes 0..3: the multiply's four
// shifted copies of the nibble (by 6, 13, 20, 27) never overlap, so no carries.
__device__ __forceinline__ uint32_t fifth_bits(uint32_t bits) { return ((bits & 15u) * 0x08102040u) & 0x40404040u; }

// Q4_1 / Q5_0 / Q5_1: the codes of the lane's 4 low (HIGH = 0) or high columns as bytes 0x80 | c,
// c = 8 q (Q4_1) or 4 q (the 5-bit codes); bias = kCodeOr.
template <GgufFormat F, int HIGH>
__device__ __forceinline__ uint32_t block32_code_bytes(const Block32Lane& b, int quad, uint32_t bias) {
  if constexpr (F == GgufFormat::kQ4_1) {
    return ((HIGH ? b.qs >> 1 : b.qs << 3) & 0x78787878u) | bias;
  } else {
    const uint32_t nibbles = (HIGH ? b.qs >> 2 : b.qs << 2) & 0x3c3c3c3cu;
    return nibbles | (fifth_bits(b.qh >> (4 * quad + 16 * HIGH)) | bias);
  }
}


// Byte b (selector 0x7540 | b) of `biased`, a level + 128, as the float level.
__device__ __forceinline__ float biased_i8_float(uint32_t biased, int b) {
  return __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7540u | static_cast<uint32_t>(b))) - 8388736.0f;
}

// acc[r][t] += sum over the lane's 8 columns of block (col: its first column) of w[r] * x[t].
template <GgufFormat F, int NT, int ROWS, bool XV>
__device__ __forceinline__ void block32_step(const float* const (&xr)[NT], const Block32Lane (&raw)[ROWS], int quad,
                                             uint32_t bias, int64_t col, float (&acc)[ROWS][NT]) {
  constexpr bool kTable = F == GgufFormat::kIq4Nl;
  float sum[ROWS][NT], xsum[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    xsum[t] = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) sum[r][t] = 0.0f;
  }
  [[maybe_unused]] uint2 levels[ROWS];
  if constexpr (kTable) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) levels[r] = iq4_nl_levels(raw[r].qs);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // the low nibbles' columns, then the high ones'
    float4 xv[NT];
    load_x4<NT, XV>(xr, col + 16 * half + 4 * quad, xv);
    if constexpr (!kTable) {
#pragma unroll
      for (int t = 0; t < NT; ++t) xsum[t] += (xv[t].x + xv[t].y) + (xv[t].z + xv[t].w);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float f[4];
      if constexpr (kTable) {
        const uint32_t v = half == 0 ? levels[r].x : levels[r].y;
#pragma unroll
        for (int b = 0; b < 4; ++b) f[b] = biased_i8_float(v, b);
      } else {
        const uint32_t e = half == 0 ? block32_code_bytes<F, 0>(raw[r], quad, bias)
                                     : block32_code_bytes<F, 1>(raw[r], quad, bias);
#pragma unroll
        for (int b = 0; b < 4; ++b) f[b] = unit_float(e, b);
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int b = 0; b < 4; ++b) sum[r][t] = fmaf(f[b], element(xv[t], b), sum[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float d = f16_bits_to_f32(static_cast<uint16_t>(raw[r].head & 0xffffu));
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if constexpr (F == GgufFormat::kQ4_1 || F == GgufFormat::kQ5_1) {
        const float m = f16_bits_to_f32(static_cast<uint16_t>(raw[r].head >> 16));
        const float unit = (F == GgufFormat::kQ4_1 ? 16.0f : 32.0f) * d;  // exact
        acc[r][t] = fmaf(unit, sum[r][t] - xsum[t], fmaf(m, xsum[t], acc[r][t]));
      } else if constexpr (F == GgufFormat::kQ5_0) {
        acc[r][t] = fmaf(d, fmaf(32.0f, sum[r][t], -48.0f * xsum[t]), acc[r][t]);
      } else {
        acc[r][t] = fmaf(d, sum[r][t], acc[r][t]);
      }
    }
  }
}

template <GgufFormat F, int NT, int ROWS, int U, bool XV>
__global__ void __launch_bounds__(kGemvThreads) gemv_block32_kernel(const GgufGemvParams p) {
  constexpr int64_t kBytes = Block32<F>::kBytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * ROWS;
  if (row0 >= p.out) return;  // no block-wide synchronisation below
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t k_end = min64(p.in, k_begin + p.chunk);
  const int quad = lane & 3;
  const uint8_t* wr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t row = min64(row0 + r, p.out - 1);  // clamped: rows past out are not stored
    wr[r] = p.w + row * p.w_stride;
  }
  const float* xr[NT];
  token_rows<NT>(p, xr);
  float acc[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  const uint32_t code_or = p.code_or;  // kCodeOr
  // col: the first column of the lane's block (k_end is a whole block, so the block is in the
  // slice when col is). Lanes may run different numbers of steps at the end of a slice.
  int64_t col = k_begin + 32 * (lane >> 2);
  for (; col + (U - 1) * kBlock32Step < k_end; col += U * kBlock32Step) {
    Block32Lane raw[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) raw[u][r] = load_block32<F>(wr[r] + (col + u * kBlock32Step) / 32 * kBytes, quad);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) block32_step<F, NT, ROWS, XV>(xr, raw[u], quad, code_or, col + u * kBlock32Step, acc);
  }
  for (; col < k_end; col += kBlock32Step) {
    Block32Lane raw[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) raw[r] = load_block32<F>(wr[r] + col / 32 * kBytes, quad);
    block32_step<F, NT, ROWS, XV>(xr, raw, quad, code_or, col, acc);
  }
  store_sums<ROWS, NT>(p, acc, row0, split);
}

// ---- Q4_K, Q5_K and Q6_K: tiles staged in shared memory -----------------------------------------
// A thread block owns kTileGroups * R consecutive rows (R rows per lane: k_quant_tile) and one
// K slice; its warps share out the slice's blocks (warp w takes blocks w, w + warps, ...) and each
// warp streams its blocks through a private ring of S shared-memory stages: one stage is one block
// of every row of the tile, copied with cp.async by 16-byte pieces in address order, so that each
// copy instruction moves whole sectors and no sector crosses to the SM twice. Lane = part * 8 +
// group: the group (lane & 7) takes rows group + 8 r (r < R) of the tile, the part (lane >> 3) a
// quarter of the block, and a lane decodes its R rows against one load of their activations:
//   Q4_K: part = chunk c, qs[32c .. 32c + 32): sub-blocks 2c (low nibbles, columns 64c + l) and
//         2c + 1 (high nibbles, 64c + 32 + l), whose scales and mins the lane decodes itself; the
//         8 lanes of a part share the two xsums (each adds 8 columns, then shuffles).
//   Q5_K: as Q4_K, each nibble's fifth bit from qh[l] (bit 2c, or 2c + 1 for the high nibbles).
//   Q6_K: part = (h, u) = (part >> 1, part & 1): Q6_K's four runs of 16 columns
//         128h + 32k + 16u .. + 15 (k = 0..3), each inside one scale group (as ggml_blocks.h).
// A quarter-warp's 8 lanes read 8 rows at one offset, rows 144, 176 or 208 bytes apart (an odd
// number of 16-byte bank groups): no bank conflicts. At the end the four parts of a row add up in
// a fixed butterfly, then the warps' sums in warp order through shared memory: whatever R and the
// token count, a row's sum is the same sequence of operations (only the planned warps and slices,
// chosen for one token, shape it).

constexpr int kTileGroups = 8;     // row groups of a warp (lane & 7); 4 parts (lane >> 3)
constexpr int kMaxTileWarps = 16;  // warps of a thread block
constexpr int kPlanTileRows = 32;  // the planner's unit of rows (whatever R a launch takes)

// R rows per lane and S ring stages of a launch, as measured fastest on an H200 (build-cuda/tune's
// gguf_bench) for the planner's warps: Q4_K 2 rows (more warps per SM), with two stages when each
// warp has 3 or more blocks (not at two tokens); Q6_K 4 rows at one token, and at two when the
// slice is long, else 2; one stage. Q5_K takes Q4_K's (not tuned on its own). Neither changes a
// sum.
struct KQuantTile {
  int rows, stages;
};

KQuantTile k_quant_tile(GgufFormat format, int64_t n, int64_t slice_blocks, int64_t warps) {
  const int64_t blocks_per_warp = (slice_blocks + warps - 1) / warps;
  if (format == GgufFormat::kQ4_K || format == GgufFormat::kQ5_K) return {2, n != 2 && blocks_per_warp >= 3 ? 2 : 1};
  if (n <= 1 || (n <= 2 && slice_blocks >= 32)) return {4, 1};
  return {2, 1};
}


// 16 bytes global -> shared without the register file (sm_80 and later: cp.async, L1 bypassed);
// older GPUs copy through registers at once, so the waits below have nothing to wait for.
__device__ __forceinline__ void copy_to_shared_16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
#else
  *static_cast<uint4*>(dst) = load_stream_16(src);
#endif
}

__device__ __forceinline__ void copy_to_shared_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void copy_to_shared_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Byte `sel` picks (__byte_perm selector 0x7044 | b << 8) of `e`, 0x80 | c, as the float 1 + c / 128.
__device__ __forceinline__ float unit_float_sel(uint32_t e, uint32_t sel) {
  return __uint_as_float(__byte_perm(e, 0x3f000000u, sel));
}

// The signed byte `sel` picks (selector 0x7540 | b) of `w ^ 0x80808080`, exactly, as a float.
__device__ __forceinline__ float i8_float_sel(uint32_t biased, uint32_t sel) {
  return __uint_as_float(__byte_perm(biased, 0x4b000000u, sel)) - 8388736.0f;  // (2^23 + 128 + q) - (2^23 + 128)
}

// Q4_K: codes of 4 columns from a word of qs bytes, as bytes 0x80 | q << 3 (the floats 1 + q / 16);
// bias = kCodeOr.
template <int HIGH>
__device__ __forceinline__ uint32_t q4_k_code_bytes(uint32_t qs, uint32_t bias) {
  return ((HIGH ? qs >> 1 : qs << 3) & 0x78787878u) | bias;
}

// Q5_K: the 5-bit codes of 4 columns as bytes 0x80 | q << 2 (the floats 1 + q / 32), from a word
// of qs bytes and the qh bytes of the same l shifted right by 2c (the part), which leaves each
// byte's fifth bit in bit HIGH of the byte (bits coming down from the next byte land at bit 2 or
// higher); bias = kCodeOr.
template <int HIGH>
__device__ __forceinline__ uint32_t q5_k_code_bytes(uint32_t qs, uint32_t qh_shifted, uint32_t bias) {
  const uint32_t nibbles = (HIGH ? qs >> 2 : qs << 2) & 0x3c3c3c3cu;
  return nibbles | (((HIGH ? qh_shifted << 5 : qh_shifted << 6) & 0x40404040u) | bias);
}

// What a Q4_K lane needs to read its two sub-blocks' scales and mins from a block header (as
// core/ggml_blocks.h's q4_k_scale_min): chunk c = part < 2 keeps sub-blocks 2c, 2c + 1 < 4, the low
// 6 bits of header bytes 4 + s (scale) and 8 + s (min); c >= 2 sub-blocks s = 4 + j, the nibbles of
// byte 12 + j and the top 2 bits of bytes 4 + j and 8 + j. Byte j = 2 (c & 1) + v of the words below.
struct Q4KLane {
  uint32_t nibble_mask, high_mask, high_shift;
  uint32_t sel[2];  // unit_float_sel selectors of bytes 2 (c & 1) + v
};

__device__ __forceinline__ Q4KLane q4_k_lane(int part) {
  const bool high = part >= 2;
  Q4KLane l;
  l.nibble_mask = high ? 0x0f0f0f0fu : 0u;
  l.high_mask = high ? 0x30303030u : 0x3f3f3f3fu;
  l.high_shift = high ? 2u : 0u;
#pragma unroll
  for (int v = 0; v < 2; ++v) l.sel[v] = 0x7044u | static_cast<uint32_t>((2 * (part & 1) + v) << 8);
  return l;
}

// Sub-block 2c + v's a = 16 d sc (Q5_K: 32 d sc, its codes' float 1 + q / 32) and c = a + dmin m
// from the header: the scale and min become floats 1 + s / 128, and 2048 d (1 + sc / 128) - 2048 d
// = 16 d sc (4096 d: 32 d sc) and 128 dmin (1 + m / 128) - 128 dmin = dmin m are exact (f16 d times
// 6-bit codes), so a is exact and c rounds once.
template <GgufFormat F>
__device__ __forceinline__ void q4_k_scales(const uint4& h, const Q4KLane& l, float (&a)[2], float (&c)[2]) {
  constexpr float kUnit = F == GgufFormat::kQ5_K ? 4096.0f : 2048.0f;
  const float d_unit = kUnit * f16_bits_to_f32(static_cast<uint16_t>(h.x & 0xffffu));
  const float dmin128 = 128.0f * f16_bits_to_f32(static_cast<uint16_t>(h.x >> 16));
  const uint32_t sc = (h.w & l.nibble_mask) | (((h.y >> l.high_shift) & l.high_mask) | 0x80808080u);
  const uint32_t mn = ((h.w >> 4) & l.nibble_mask) | (((h.z >> l.high_shift) & l.high_mask) | 0x80808080u);
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    a[v] = fmaf(d_unit, unit_float_sel(sc, l.sel[v]), -d_unit);
    c[v] = a[v] + fmaf(dmin128, unit_float_sel(mn, l.sel[v]), -dmin128);
  }
}

// The sum of x[t] over the 8 columns col + 8 group .. + 7 of each token: a lane's share of the
// column sums that the 8 lanes of its part need alike (fixed order of additions).
template <int NT, bool XV>
__device__ __forceinline__ void x_share(const float* const (&xr)[NT], int64_t col, float (&share)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float4 a = load_x4_token<XV>(xr[t], col), b = load_x4_token<XV>(xr[t], col + 4);
    share[t] = ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
  }
}

// One stage of Q4_K or Q5_K: acc[r][t] += sum over the lane's 64 columns (col = the block's first
// column + 64 c) of w * x, rows 8 r + group of the staged tile. With f = 1 + q / 16 (Q5_K: q / 32):
//   sum_j w_j x_j = d sc sum_j q_j x_j - dmin m xsum = a sum_j f_j x_j - c xsum.
// The sub-blocks' xsums come from the 8 lanes of the part: each adds 8 columns, four lanes one
// sub-block (xor 1, 2: lanes group < 4 hold sub-block 2c's, the others 2c + 1's), xor 4 swaps.
// Few tokens: both sub-blocks at once from one read of the codes; more: one after the other, to
// hold half the activations. Either way each sum sees the same operations in the same order.
template <GgufFormat F, int NT, int R, bool XV>
__device__ __forceinline__ void q4_k_stage(const uint8_t* stage, int group, int part, const Q4KLane& l,
                                           uint32_t bias, const float* const (&xr)[NT], int64_t col,
                                           float (&acc)[R][NT]) {
  constexpr bool kQ5 = F == GgufFormat::kQ5_K;
  const uint8_t* rows[R];
  float a[R][2], c[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    rows[r] = stage + (8 * r + group) * KQuantBlock<F>::kBytes;
    q4_k_scales<F>(*reinterpret_cast<const uint4*>(rows[r]), l, a[r], c[r]);
  }
  float own[NT];  // this lane's sub-block's xsum (2c if group < 4, else 2c + 1)
  x_share<NT, XV>(xr, col + 8 * group, own);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    own[t] += __shfl_xor_sync(kFullMask, own[t], 1);
    own[t] += __shfl_xor_sync(kFullMask, own[t], 2);
  }
  const bool low_sub = group < 4;
  const int qs_offset = (kQ5 ? 48 : 16) + 32 * part;
  [[maybe_unused]] const uint32_t qh_shift = 2 * part;  // Q5_K: chunk c's bits 2c, 2c + 1 of qh[l]
  constexpr int kSubs = NT <= 2 ? 2 : 1;  // sub-blocks per pass over the codes
#pragma unroll
  for (int pass = 0; pass < 2 / kSubs; ++pass) {
    float sum[kSubs][R][NT];
#pragma unroll
    for (int s = 0; s < kSubs; ++s) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int r = 0; r < R; ++r) sum[s][r][t] = 0.0f;
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint4 q[R];
      [[maybe_unused]] uint4 qh[R];  // Q5_K: qh[16 half .. 16 half + 16), the same l as q
#pragma unroll
      for (int r = 0; r < R; ++r) {
        q[r] = *reinterpret_cast<const uint4*>(rows[r] + qs_offset + 16 * half);
        if constexpr (kQ5) qh[r] = *reinterpret_cast<const uint4*>(rows[r] + 16 + 16 * half);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int s = 0; s < kSubs; ++s) {
          const int v = pass + s;  // 0: low nibbles, 1: high nibbles
          float f[R][4];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            uint32_t e;
            if constexpr (kQ5) {
              const uint32_t h = word(qh[r], i) >> qh_shift;
              e = v == 0 ? q5_k_code_bytes<0>(word(q[r], i), h, bias) : q5_k_code_bytes<1>(word(q[r], i), h, bias);
            } else {
              e = v == 0 ? q4_k_code_bytes<0>(word(q[r], i), bias) : q4_k_code_bytes<1>(word(q[r], i), bias);
            }
#pragma unroll
            for (int b = 0; b < 4; ++b) f[r][b] = unit_float(e, b);
          }
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const float4 xv = load_x4_token<XV>(xr[t], col + 32 * v + 16 * half + 4 * i);
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
              for (int b = 0; b < 4; ++b) sum[s][r][t] = fmaf(f[r][b], element(xv, b), sum[s][r][t]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kSubs; ++s) {
      const int v = pass + s;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float other = __shfl_xor_sync(kFullMask, own[t], 4);
        const float xsum = (v == 0) == low_sub ? own[t] : other;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] = fmaf(-c[r][v], xsum, fmaf(a[r][v], sum[s][r][t], acc[r][t]));
      }
    }
  }
}

// Q6_K: the codes of run K for 4 columns (words of L (K even) or L32 (K odd) and H at the same l)
// as bytes 0x80 | q; bias = kCodeOr.
template <int K>
__device__ __forceinline__ uint32_t q6_k_code_bytes(uint32_t lo, uint32_t hi, uint32_t bias) {
  if constexpr (K == 0) return (lo & 0x0f0f0f0fu) | (((hi << 4) & 0x30303030u) | bias);
  if constexpr (K == 1) return (lo & 0x0f0f0f0fu) | (((hi << 2) & 0x30303030u) | bias);
  if constexpr (K == 2) return ((lo >> 4) & 0x0f0f0f0fu) | ((hi & 0x30303030u) | bias);
  return ((lo >> 4) & 0x0f0f0f0fu) | (((hi >> 2) & 0x30303030u) | bias);
}

// acc[r][t] += d sc sum over run K (16 columns at col) of (q - 32) x. With f = 1 + q / 128,
// q - 32 = 128 (f - 1) - 32, so the run contributes d sc (128 sum_j f_j x_j - 160 xsum); d sc is
// exact (f16 times int8). `words`: the lane's L (K even) or L32 (K odd) of each row.
template <int NT, int R, bool XV, int K>
__device__ __forceinline__ void q6_k_run(const float* const (&xr)[NT], const uint4 (&words)[R], const uint4 (&hi)[R],
                                         const uint2 (&scales)[R], const float (&d)[R], uint32_t scale_sel,
                                         uint32_t bias, int64_t col, float (&acc)[R][NT]) {
  float sum[R][NT], xsum[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    xsum[t] = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) sum[r][t] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float f[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t e = q6_k_code_bytes<K>(word(words[r], i), word(hi[r], i), bias);
#pragma unroll
      for (int b = 0; b < 4; ++b) f[r][b] = unit_float(e, b);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4 xv = load_x4_token<XV>(xr[t], col + 4 * i);
      xsum[t] += ((xv.x + xv.y) + xv.z) + xv.w;
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int b = 0; b < 4; ++b) sum[r][t] = fmaf(f[r][b], element(xv, b), sum[r][t]);
      }
    }
  }
  float m160[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) m160[t] = -160.0f * xsum[t];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    // Scale 2K + u of the half block: byte 2 (K & 1) + u of word K >> 1.
    const uint32_t w = (K < 2 ? scales[r].x : scales[r].y) ^ 0x80808080u;
    const float dsc = d[r] * i8_float_sel(w, scale_sel);
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(dsc, fmaf(128.0f, sum[r][t], m160[t]), acc[r][t]);
  }
}

// One stage of Q6_K: the lane's runs 0 and 2 (from L, ql at 64h + 16u) then 1 and 3 (from L32,
// ql at 64h + 32 + 16u), H the qh bytes at 32h + 16u; col = the block's first column + 128h + 16u.
template <int NT, int R, bool XV>
__device__ __forceinline__ void q6_k_stage(const uint8_t* stage, int group, int h, int u, const float (&d)[R],
                                           uint32_t bias, const float* const (&xr)[NT], int64_t col,
                                           float (&acc)[R][NT]) {
  const uint8_t* rows[R];
  uint4 words[R], hi[R];
  uint2 scales[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    rows[r] = stage + (8 * r + group) * kQ6KBytes;
    words[r] = *reinterpret_cast<const uint4*>(rows[r] + 64 * h + 16 * u);
    hi[r] = *reinterpret_cast<const uint4*>(rows[r] + 128 + 32 * h + 16 * u);
    scales[r] = *reinterpret_cast<const uint2*>(rows[r] + 192 + 8 * h);
  }
  const uint32_t sel0 = 0x7540u | static_cast<uint32_t>(u), sel1 = 0x7540u | static_cast<uint32_t>(2 + u);
  q6_k_run<NT, R, XV, 0>(xr, words, hi, scales, d, sel0, bias, col, acc);
  q6_k_run<NT, R, XV, 2>(xr, words, hi, scales, d, sel0, bias, col + 64, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) words[r] = *reinterpret_cast<const uint4*>(rows[r] + 64 * h + 32 + 16 * u);
  q6_k_run<NT, R, XV, 1>(xr, words, hi, scales, d, sel1, bias, col + 32, acc);
  q6_k_run<NT, R, XV, 3>(xr, words, hi, scales, d, sel1, bias, col + 96, acc);
}

// Bytes of one ring stage: a block of each of the tile's rows.
template <GgufFormat F, int R>
__host__ __device__ constexpr int k_quant_stage_bytes() {
  return kTileGroups * R * KQuantBlock<F>::kBytes;
}

// blockDim.x = 32 * warps (1..kMaxTileWarps); dynamic shared memory: warps * S stages.
template <GgufFormat F, int NT, int R, int S, bool XV>
__device__ __forceinline__ void k_quant_gemv(const GgufGemvParams& p) {
  constexpr int kBytes = KQuantBlock<F>::kBytes, kPieces = kBytes / 16;
  constexpr int kTileRows = kTileGroups * R, kStageBytes = k_quant_stage_bytes<F, R>();
  constexpr int kChunks = kTileRows * kPieces, kCopies = (kChunks + 31) / 32;
  extern __shared__ uint4 k_quant_shared[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int group = lane & 7, part = lane >> 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int split = blockIdx.y;
  const int64_t blocks = p.in / kBlockK;
  const int64_t b_begin = split * p.chunk / kBlockK;
  const int b_count = static_cast<int>(min64(p.in, split * p.chunk + p.chunk) / kBlockK - b_begin);
  const int my_blocks = warp < b_count ? (b_count - 1 - warp) / warps + 1 : 0;
  // The lane's pieces of a stage: piece i = lane + 32 m is bytes 16 (i % kPieces) of tile row
  // i / kPieces (rows past out re-read the last row; their sums are never stored). Offsets from
  // the tile's first row fit 32 bits (gemv_gguf_supported bounds w_stride).
  const int rows_here = static_cast<int>(min64(kTileRows, p.out - row0));
  uint32_t piece_offset[kCopies];
#pragma unroll
  for (int m = 0; m < kCopies; ++m) {
    const int i = lane + 32 * m;
    const int rr = min(i / kPieces, rows_here - 1);
    piece_offset[m] = static_cast<uint32_t>(rr) * static_cast<uint32_t>(p.w_stride) + 16u * (i % kPieces);
  }
  const uint8_t* tile = p.w + row0 * p.w_stride;
  uint8_t* ring = reinterpret_cast<uint8_t*>(k_quant_shared) + warp * (S * kStageBytes);
  const auto issue = [&](int j) {
    const uint8_t* src = tile + (b_begin + warp + static_cast<int64_t>(warps) * j) * kBytes;
    uint8_t* dst = ring + (j % S) * kStageBytes + 16 * lane;
#pragma unroll
    for (int m = 0; m < kCopies; ++m) {
      if (kChunks % 32 == 0 || lane + 32 * m < kChunks) copy_to_shared_16(dst + 512 * m, src + piece_offset[m]);
    }
  };
  const float* xr[NT];
  token_rows<NT>(p, xr);
  const uint32_t code_or = p.code_or;  // kCodeOr
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  [[maybe_unused]] Q4KLane q4_lane;
  [[maybe_unused]] const uint16_t* d_tile = nullptr;  // Q6_K: the tile's block scales, and the lane's rows'
  [[maybe_unused]] uint32_t d_offset[R];
  if constexpr (F != GgufFormat::kQ6_K) {
    q4_lane = q4_k_lane(part);
  } else {
    d_tile = p.d + row0 * blocks;
#pragma unroll
    for (int r = 0; r < R; ++r) d_offset[r] = static_cast<uint32_t>(min(8 * r + group, rows_here - 1) * blocks);
  }
#pragma unroll
  for (int s = 0; s + 1 < S; ++s) {
    if (s < my_blocks) issue(s);
    copy_to_shared_commit();
  }
  for (int j = 0; j < my_blocks; ++j) {
    if (j + S - 1 < my_blocks) issue(j + S - 1);
    copy_to_shared_commit();
    const int64_t b = b_begin + warp + static_cast<int64_t>(warps) * j;
    [[maybe_unused]] float d[R];
    if constexpr (F == GgufFormat::kQ6_K) {
#pragma unroll
      for (int r = 0; r < R; ++r) d[r] = f16_bits_to_f32(__ldg(d_tile + d_offset[r] + b));
    }
    copy_to_shared_wait<S - 1>();
    __syncwarp();
    const uint8_t* stage = ring + (j % S) * kStageBytes;
    if constexpr (F != GgufFormat::kQ6_K) {
      q4_k_stage<F, NT, R, XV>(stage, group, part, q4_lane, code_or, xr, b * kBlockK + 64 * part, acc);
    } else {
      q6_k_stage<NT, R, XV>(stage, group, part >> 1, part & 1, d, code_or, xr,
                            b * kBlockK + 128 * (part >> 1) + 16 * (part & 1), acc);
    }
    __syncwarp();
  }
  // The four parts of each row (lanes group + 8 part), then the warps in order.
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      acc[r][t] += __shfl_xor_sync(kFullMask, acc[r][t], 8);
      acc[r][t] += __shfl_xor_sync(kFullMask, acc[r][t], 16);
    }
  }
  __syncthreads();  // every ring drained: the sums take their place
  float* sums = reinterpret_cast<float*>(k_quant_shared);  // [warps][NT][kTileRows]
  if (part == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int t = 0; t < NT; ++t) sums[(warp * NT + t) * kTileRows + 8 * r + group] = acc[r][t];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < NT * kTileRows; i += blockDim.x) {
    const int t = i / kTileRows, rr = i % kTileRows;
    const int64_t row = row0 + rr;
    if (row >= p.out || t >= p.n) continue;
    float sum = sums[i];
    for (int w = 1; w < warps; ++w) sum += sums[w * NT * kTileRows + i];
    if (p.splits == 1) {
      p.y[t * p.y_stride + row] = sum + (p.bias != nullptr ? load_as_f32(p.bias, p.bias_dtype, row) : 0.0f);
    } else {
      p.partial[(static_cast<int64_t>(split) * p.n + t) * p.out + row] = sum;
    }
  }
}
template <GgufFormat F, int NT, int R, int S, bool XV>
__global__ void __launch_bounds__(kMaxTileWarps * 32) gemv_k_quant_kernel(const GgufGemvParams p) {
  k_quant_gemv<F, NT, R, S, XV>(p);
}

// ---- launch ----------------------------------------------------------------------------------------

template <int ROWS>
dim3 gemv_grid(const GgufGemvParams& p) {
  const int64_t rows_per_block = static_cast<int64_t>(kWarps) * ROWS;
  return dim3(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(p.splits));
}

template <GgufFormat F, int NT, int R, int S, bool XV>
cudaError_t launch_k_quant_kernel(const GgufGemvParams& p, int warps, Stream stream) {
  const auto kernel = gemv_k_quant_kernel<F, NT, R, S, XV>;
  const int shared = warps * S * k_quant_stage_bytes<F, R>();
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
  if (e != cudaSuccess) return e;
  constexpr int64_t kTileRows = kTileGroups * R;
  const dim3 grid(static_cast<unsigned>((p.out + kTileRows - 1) / kTileRows), static_cast<unsigned>(p.splits));
  kernel<<<grid, warps * 32, static_cast<size_t>(shared), stream>>>(p);
  return cudaGetLastError();
}

// R rows per lane and S stages, or the largest smaller pair the device's shared memory holds
// (one stage, then half the rows). None of this changes a sum.
template <GgufFormat F, int NT, int R, int S, bool XV>
cudaError_t launch_k_quant_fitted(const GgufGemvParams& p, int warps, int shared_limit, Stream stream) {
  if (static_cast<int64_t>(warps) * S * k_quant_stage_bytes<F, R>() <= shared_limit || (R == 1 && S == 1)) {
    return launch_k_quant_kernel<F, NT, R, S, XV>(p, warps, stream);
  }
  if constexpr (S > 1) {
    return launch_k_quant_fitted<F, NT, R, 1, XV>(p, warps, shared_limit, stream);
  } else if constexpr (R > 1) {
    return launch_k_quant_fitted<F, NT, R / 2, 1, XV>(p, warps, shared_limit, stream);
  }
  return cudaErrorInvalidConfiguration;
}

template <GgufFormat F, int NT, bool XV>
cudaError_t launch_k_quant(const GgufGemvParams& p, int warps, Stream stream) {
  int device = 0, limit = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  const KQuantTile tile = k_quant_tile(F, NT, p.chunk / kBlockK, warps);
  if constexpr (F == GgufFormat::kQ6_K && NT <= 2) {
    if (tile.rows == 4) return launch_k_quant_fitted<F, NT, 4, 1, XV>(p, warps, limit, stream);
  }
  if constexpr (F == GgufFormat::kQ4_K || F == GgufFormat::kQ5_K) {
    if (tile.stages == 2) return launch_k_quant_fitted<F, NT, 2, 2, XV>(p, warps, limit, stream);
  }
  return launch_k_quant_fitted<F, NT, 2, 1, XV>(p, warps, limit, stream);
}

template <GgufFormat F, int NT, bool XV>
cudaError_t launch_block32(const GgufGemvParams& p, Stream stream) {
  constexpr int R = Block32Tile<NT>::kRows;
  gemv_block32_kernel<F, NT, R, Block32Tile<NT>::kSteps, XV><<<gemv_grid<R>(p), kGemvThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int NT, bool XV>
cudaError_t launch_gguf_bucket(GgufFormat format, const GgufGemvParams& p, int warps, Stream stream) {
  switch (format) {
    case GgufFormat::kQ8_0: {
      constexpr int R = Q8Tile<NT>::kRows;
      gemv_q8_0_kernel<NT, R, Q8Tile<NT>::kSteps, XV><<<gemv_grid<R>(p), kGemvThreads, 0, stream>>>(p);
      return cudaGetLastError();
    }
    case GgufFormat::kQ4_K: return launch_k_quant<GgufFormat::kQ4_K, NT, XV>(p, warps, stream);
    case GgufFormat::kQ5_K: return launch_k_quant<GgufFormat::kQ5_K, NT, XV>(p, warps, stream);
    case GgufFormat::kQ6_K: return launch_k_quant<GgufFormat::kQ6_K, NT, XV>(p, warps, stream);
    case GgufFormat::kQ4_1: return launch_block32<GgufFormat::kQ4_1, NT, XV>(p, stream);
    case GgufFormat::kQ5_0: return launch_block32<GgufFormat::kQ5_0, NT, XV>(p, stream);
    case GgufFormat::kQ5_1: return launch_block32<GgufFormat::kQ5_1, NT, XV>(p, stream);
    case GgufFormat::kIq4Nl: return launch_block32<GgufFormat::kIq4Nl, NT, XV>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <bool XV>
cudaError_t launch_gguf_tokens(GgufFormat format, const GgufGemvParams& p, int warps, Stream stream) {
  if (p.n <= 1) return launch_gguf_bucket<1, XV>(format, p, warps, stream);
  if (p.n <= 2) return launch_gguf_bucket<2, XV>(format, p, warps, stream);
  if (p.n <= 4) return launch_gguf_bucket<4, XV>(format, p, warps, stream);
  return launch_gguf_bucket<8, XV>(format, p, warps, stream);
}

// Rows per warp of a tile family at n tokens (the launch's token bucket).
template <template <int> class Tile>
int tile_rows(int64_t n) {
  return n <= 1 ? Tile<1>::kRows : n <= 2 ? Tile<2>::kRows : n <= 4 ? Tile<4>::kRows : Tile<8>::kRows;
}

bool is_k_quant(GgufFormat format) {
  return format == GgufFormat::kQ4_K || format == GgufFormat::kQ5_K || format == GgufFormat::kQ6_K;
}

// K-quant thread blocks of kPlanTileRows rows (planned at one token whatever n is: the same
// slices and warps, so the same summation order for a token alone or in any batch). K splits only
// when the tiles leave more than half the SMs idle, into slices of at least kMinTileWarps blocks;
// then as many warps per thread block as keep about 8 warps per SM (Q6_K with long slices 16) when
// the grid's blocks all run at once (fewer when several share an SM), at most one per block of the
// slice. The targets are what measured fastest on an H200 (build-cuda/tune's gguf_bench).
constexpr int64_t kMinTileWarps = 4;

int64_t k_quant_target_warps_per_sm(GgufFormat format, int64_t slice_blocks) {
  return format == GgufFormat::kQ6_K && slice_blocks >= 32 ? 16 : 8;
}

GemvShape plan_k_quant(const LinearArgs& a, int sm_count) {
  const int64_t sms = std::max(sm_count, 1);
  const int64_t blocks = a.in / kBlockK;
  const int64_t tiles = (a.out + kPlanTileRows - 1) / kPlanTileRows;
  int64_t splits = 1;
  if (tiles * 2 <= sms) {
    splits = std::min<int64_t>({(sms + tiles - 1) / tiles, 32, std::max<int64_t>(1, blocks / kMinTileWarps)});
  }
  const int64_t slice_blocks = (blocks + splits - 1) / splits;
  splits = (blocks + slice_blocks - 1) / slice_blocks;
  const int64_t blocks_per_sm = (tiles * splits + sms - 1) / sms;
  const int64_t target = k_quant_target_warps_per_sm(a.gguf, slice_blocks);
  int64_t warps = kMinTileWarps;
  while (warps * 2 <= kMaxTileWarps && warps * 2 * blocks_per_sm <= target) warps *= 2;
  warps = std::min(warps, slice_blocks);
  GemvShape s;
  s.vector_loads = true;
  s.splits = static_cast<int>(splits);
  s.chunk = slice_blocks * kBlockK;
  s.step = warps * kBlockK;  // the columns a thread block's warps cover with one stage each
  s.rows_per_warp = kTileGroups * k_quant_tile(a.gguf, a.n, slice_blocks, warps).rows;
  return s;
}

}  // namespace

bool gguf_rows_fit(const LinearArgs& a) {
  const int64_t align = gguf_row_alignment(a.gguf);
  return a.gguf != GgufFormat::kNone && a.in % gguf_block(a.gguf) == 0 &&
         a.w_stride >= gguf_packed_row_bytes(a.gguf, a.in) && a.w_stride % align == 0 &&
         reinterpret_cast<uintptr_t>(a.w) % static_cast<uintptr_t>(align) == 0 &&
         gguf_separate_scales(a.gguf) == (a.w_scales_f16 != nullptr);
}

int64_t gguf_block(GgufFormat format) {
  return format == GgufFormat::kNone ? 0 : is_k_quant(format) ? kBlockK : 32;
}

int64_t gguf_packed_row_bytes(GgufFormat format, int64_t in) {
  switch (format) {
    case GgufFormat::kQ8_0: return in;
    case GgufFormat::kQ4_K: return in / kBlockK * kQ4KBytes;
    case GgufFormat::kQ5_K: return in / kBlockK * kQ5KBytes;
    case GgufFormat::kQ6_K: return in / kBlockK * kQ6KBytes;
    case GgufFormat::kQ4_1: return in / 32 * Block32<GgufFormat::kQ4_1>::kBytes;
    case GgufFormat::kQ5_0: return in / 32 * Block32<GgufFormat::kQ5_0>::kBytes;
    case GgufFormat::kQ5_1: return in / 32 * Block32<GgufFormat::kQ5_1>::kBytes;
    case GgufFormat::kIq4Nl: return in / 32 * Block32<GgufFormat::kIq4Nl>::kBytes;
    default: return 0;
  }
}

// The widest load each layout's kernels make at a block's start: 16 bytes (Q8_0's codes, the
// K-quants' 16-byte pieces), and for the 32-weight blocks the alignment a row of them keeps.
int64_t gguf_row_alignment(GgufFormat format) {
  switch (format) {
    case GgufFormat::kQ4_1: return 4;
    case GgufFormat::kQ5_0: return 2;
    case GgufFormat::kQ5_1: return 8;
    case GgufFormat::kIq4Nl: return 2;
    default: return 16;
  }
}

bool gguf_separate_scales(GgufFormat format) { return format == GgufFormat::kQ8_0 || format == GgufFormat::kQ6_K; }

bool gemv_gguf_supported(const LinearArgs& a) {
  return gguf_rows_fit(a) && a.n >= 1 && a.n <= kGemvGgufMaxTokens &&
         a.w_stride < (int64_t{1} << 26);  // the K-quant tiles' 32-bit row offsets
}

GemvShape plan_gemv_gguf(const LinearArgs& a, int sm_count) {
  if (is_k_quant(a.gguf)) return plan_k_quant(a, sm_count);
  GemvShape s;
  s.vector_loads = true;
  if (a.gguf == GgufFormat::kQ8_0) {
    s.step = kQ8Step;
    s.rows_per_warp = tile_rows<Q8Tile>(a.n);
    plan_k_splits(s, a.in, (a.out + Q8Tile<1>::kRows - 1) / Q8Tile<1>::kRows, kQ8Step * Q8Tile<1>::kSteps, s.step,
                  sm_count);
    return s;
  }
  s.step = kBlock32Step;
  s.rows_per_warp = tile_rows<Block32Tile>(a.n);
  plan_k_splits(s, a.in, (a.out + Block32Tile<1>::kRows - 1) / Block32Tile<1>::kRows,
                kBlock32Step * Block32Tile<1>::kSteps, s.step, sm_count);
  return s;
}

cudaError_t launch_gemv_gguf(const LinearArgs& a, const GemvShape& shape, float* partial, Stream stream) {
  GgufGemvParams p;
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.w = static_cast<const uint8_t*>(a.w);
  fill_common(p, a, shape, partial);
  p.d = a.w_scales_f16;
  p.code_or = kCodeOr;
  const int warps = static_cast<int>(std::clamp<int64_t>(shape.step / kBlockK, 1, kMaxTileWarps));  // K-quants
  const bool x_vec = (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0 && a.x_stride % 4 == 0;
  cudaError_t e = x_vec ? launch_gguf_tokens<true>(a.gguf, p, warps, stream)
                        : launch_gguf_tokens<false>(a.gguf, p, warps, stream);
  if (e != cudaSuccess || shape.splits == 1) return e;
  return launch_gemv_reduce(partial, shape.splits, a.n, a.out, a.bias, a.bias_dtype, nullptr, a.y, a.y_stride, stream);
}

}  // namespace tachyon::ops::cuda::detail
