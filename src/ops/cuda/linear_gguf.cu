// linear() for GGUF block weights (quant/quantize.h's kGguf* layouts: the file's Q8_0, Q4_K and
// Q6_K blocks, core/ggml_blocks.h's bit layouts): a GEMV for 1..kGemvGgufMaxTokens tokens, where a
// step is bound by reading the weight once (8.5, 4.5 and 6.5 bits per weight), and the expansion
// of a whole weight to bf16 rows that lets cuBLASLt multiply it when many tokens share it.
//
// Each GEMV warp owns a few output rows and walks K with 16-byte loads that bypass L1 (every
// weight byte is used once), a row's loads all issued before the first use; codes become floats
// in registers and meet the activations in f32 multiply-adds; block scales multiply sums of 16 or
// 32 products. K splits over the grid for short matrices, the slices' sums reduced in split order
// (linear_gemv.cu's reduction), so results never depend on timing; and a token's result does not
// depend on the batch it came in (the same per-lane order, planned splits and warp sums for any
// token count), which LinearMode::kBatchInvariant relies on.
//
// The K-quants' codes become floats with one byte permute each: a byte 0x80 | c below the byte
// 0x3f is the float 1 + c / 128 (the 0x80 is the exponent's lowest bit), so with xsum = sum_j x_j
// over a run of columns, sum_j (1 + c_j / 128) x_j = xsum + sum_j c_j x_j / 128 gives the codes'
// dot product with no conversion per weight. xsum depends only on the columns, so it is shared by
// the warp's rows, and Q4_K needs it anyway for its mins. Q4_K places its nibble as c = 8 q (the
// float 1 + q / 16), keeping more of the code's bits above the rounding of the sum.
// Q8_0's signed codes go through int8's exact byte trick (device_math.cuh's Elem<kI8>).
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kWarps = kGemvThreads / 32;
constexpr int64_t kBlockK = 256;       // weights per Q4_K / Q6_K block
constexpr int64_t kQ4KBytes = 144;     // a Q4_K block: f16 d, f16 dmin, scales[12], qs[128]
constexpr int64_t kQ6KBytes = 208;     // a Q6_K block less its d: ql[128], qh[64], scales[16]
constexpr int64_t kQ8Step = 32 * 16;   // Q8_0: 16 codes per lane and load
constexpr int64_t kQ4Step = 16 * kBlockK;  // Q4_K: two lanes per block
constexpr int64_t kQ6Step = 8 * kBlockK;   // Q6_K: four lanes per block

struct GgufGemvParams {
  const float* x;  // [n, in] f32, rows x_stride apart
  int64_t x_stride;
  const uint8_t* w;  // [out, w_stride] bytes: the format's packed rows
  int64_t w_stride;
  const uint16_t* d;  // [out, in / block] f16: Q8_0's and Q6_K's block scales; null for Q4_K
  const void* bias;   // [out] or null
  DType bias_dtype;
  float* y;  // [n, out], rows y_stride apart
  int64_t y_stride;
  float* partial;  // [splits, n, out] when splits > 1
  int64_t n, in, out;
  int64_t chunk;  // columns per K slice: a multiple of the format's warp step
  int splits;
};

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

template <int NT>
struct Q4KTile {
  static constexpr int kRows = NT <= 2 ? 4 : (NT <= 4 ? 2 : 1);
};

template <int NT>
struct Q6KTile {
  static constexpr int kRows = NT <= 2 ? 4 : 2;
  static constexpr int kSteps = 1;
};

__device__ __forceinline__ float element(const float4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
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

// Rows of the tokens (tokens past n re-read row n - 1; their sums are never stored).
template <int NT>
__device__ __forceinline__ void token_rows(const GgufGemvParams& p, const float* (&xr)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) xr[t] = p.x + min64(t, p.n - 1) * p.x_stride;
}

// 8 bytes that bypass L1 (Q6_K's per-16 scales of one half block).
__device__ __forceinline__ uint2 load_stream_8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
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

// ---- Q4_K ------------------------------------------------------------------------------------------
// Two lanes per block (u = lane & 1), the warp's 16 pairs on 16 consecutive blocks of each row. qs
// byte 32c + l holds column 64c + l in its low nibble (sub-block 2c) and 64c + 32 + l in its high
// one (2c + 1); lane u loads the 16-byte qs pieces 2c + u of all four chunks c (bytes l = 16u ..
// 16u + 15), so it holds half of every sub-block: columns 32s + 16u .. + 15 of sub-block s. Lane u
// keeps sub-blocks 4u .. 4u + 3 and its partner the others: a lane sums its half of each sub-block,
// the pair swaps the halves it does not keep (one shuffle per sub-block), and each lane applies the
// scales of the four it keeps, decoded from the block's header (its 16-byte load, shared by the
// pair). Lane u loads the chunks in the order c = (i + 2u) & 3, i = 0..3, so that slots 0-1 hold
// the kept sub-blocks and slots 2-3 the swapped ones for both lanes, and nothing is selected by
// lane. With f = 1 + q / 16:
//   sum_j w_j x_j = d sc sum_j q_j x_j - dmin m xsum = (16 d sc) sum_j f_j x_j - (16 d sc + dmin m) xsum.

// Codes of 4 columns from a word of qs bytes, as bytes 0x80 | q << 3 (the floats 1 + q / 16).
template <int HIGH>
__device__ __forceinline__ uint32_t q4_k_code_bytes(uint32_t qs) {
  return ((HIGH ? qs >> 1 : qs << 3) & 0x78787878u) | 0x80808080u;
}

// sum[r][t] += sum over the 16 columns at col of f(code) * x, and xsum[t] += the columns' x.
template <int ROWS, int NT, bool XV, int HIGH>
__device__ __forceinline__ void q4_k_half_sub_block(const float* const (&xr)[NT], const uint4* const (&piece)[ROWS],
                                                    int64_t col, float (&sum)[ROWS][NT], float (&xsum)[NT]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float4 xv[NT];
    load_x4<NT, XV>(xr, col + 4 * i, xv);
#pragma unroll
    for (int t = 0; t < NT; ++t) xsum[t] += ((xv[t].x + xv[t].y) + xv[t].z) + xv[t].w;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const uint32_t e = q4_k_code_bytes<HIGH>(word(*piece[r], i));
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const float f = unit_float(e, b);
#pragma unroll
        for (int t = 0; t < NT; ++t) sum[r][t] = fmaf(f, element(xv[t], b), sum[r][t]);
      }
    }
  }
}

template <int NT, int ROWS, bool XV>
__global__ void __launch_bounds__(kGemvThreads) gemv_q4_k_kernel(const GgufGemvParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * ROWS;
  if (row0 >= p.out) return;  // no block-wide synchronisation below
  const int split = blockIdx.y;
  const int64_t b_end = min64(p.in, split * p.chunk + p.chunk) / kBlockK;
  const int u = lane & 1;
  const unsigned pair = 3u << (lane & 30);  // the shuffles below run inside per-pair loops
  // Slot i of the lane's qs pieces: chunk (i + 2u) & 3, byte offset 16 + 32 c + 16 u in the block.
  int offset[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) offset[i] = 16 + 32 * ((i + 2 * u) & 3) + 16 * u;
  // Scales and mins of the kept sub-blocks 4u + i, byte i of (as core/ggml_blocks.h's
  // q4_k_scale_min): u = 0: header bytes 4 + i and 8 + i (low 6 bits); u = 1: the nibbles of byte
  // 12 + i and the top 2 bits of bytes 4 + i and 8 + i.
  const uint32_t nibble_mask = u ? 0x0f0f0f0fu : 0u, high_mask = u ? 0x30303030u : 0x3f3f3f3fu;
  const int high_shift = 2 * u;
  const uint8_t* wr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) wr[r] = p.w + min64(row0 + r, p.out - 1) * p.w_stride;  // past out: not stored
  const float* xr[NT];
  token_rows<NT>(p, xr);
  float acc[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  for (int64_t b = split * p.chunk / kBlockK + (lane >> 1); b < b_end; b += kQ4Step / kBlockK) {
    uint4 head[ROWS], qs[ROWS][4];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const uint8_t* block = wr[r] + b * kQ4KBytes;
      head[r] = load_stream_16(block);
#pragma unroll
      for (int i = 0; i < 4; ++i) qs[r][i] = load_stream_16(block + offset[i]);
    }
    float d16[ROWS], dmin[ROWS];
    uint32_t sc_bytes[ROWS], min_bytes[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      d16[r] = 16.0f * f16_bits_to_f32(static_cast<uint16_t>(head[r].x & 0xffffu));
      dmin[r] = f16_bits_to_f32(static_cast<uint16_t>(head[r].x >> 16));
      sc_bytes[r] = (head[r].w & nibble_mask) | ((head[r].y >> high_shift) & high_mask);
      min_bytes[r] = ((head[r].w >> 4) & nibble_mask) | ((head[r].z >> high_shift) & high_mask);
    }
    const int64_t col = b * kBlockK + 16 * u;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // kept sub-block 4u + i, swapped sub-block 4(1 - u) + i
      float kept[ROWS][NT], swapped[ROWS][NT], xs_kept[NT], xs_swapped[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        xs_kept[t] = xs_swapped[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) kept[r][t] = swapped[r][t] = 0.0f;
      }
      const uint4* kept_piece[ROWS];
      const uint4* swapped_piece[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        kept_piece[r] = &qs[r][i >> 1];
        swapped_piece[r] = &qs[r][2 + (i >> 1)];
      }
      if (i & 1) {
        q4_k_half_sub_block<ROWS, NT, XV, 1>(xr, kept_piece, col + 32 * (i + 4 * u), kept, xs_kept);
        q4_k_half_sub_block<ROWS, NT, XV, 1>(xr, swapped_piece, col + 32 * (i + 4 - 4 * u), swapped, xs_swapped);
      } else {
        q4_k_half_sub_block<ROWS, NT, XV, 0>(xr, kept_piece, col + 32 * (i + 4 * u), kept, xs_kept);
        q4_k_half_sub_block<ROWS, NT, XV, 0>(xr, swapped_piece, col + 32 * (i + 4 - 4 * u), swapped, xs_swapped);
      }
      float xsum[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) xsum[t] = xs_kept[t] + __shfl_xor_sync(pair, xs_swapped[t], 1);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float a = d16[r] * static_cast<float>((sc_bytes[r] >> (8 * i)) & 0xffu);
        const float c = fmaf(dmin[r], static_cast<float>((min_bytes[r] >> (8 * i)) & 0xffu), a);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const float total = kept[r][t] + __shfl_xor_sync(pair, swapped[r][t], 1);
          acc[r][t] = fmaf(-c, xsum[t], fmaf(a, total, acc[r][t]));
        }
      }
    }
  }
  store_sums<ROWS, NT>(p, acc, row0, split);
}

// ---- Q6_K ------------------------------------------------------------------------------------------
// Four lanes per block (i = lane & 3: half h = i >> 1, u = i & 1), the warp's 8 groups on 8
// consecutive blocks of each row. Lane i loads ql bytes 64h + 16u .. + 15 (L[l]) and 64h + 32 + 16u
// .. (L[l + 32]), qh bytes 32h + 16u .. (H[l]) and the 8 scales of its half, and decodes the four
// runs of 16 columns 128h + 32k + 16u .. + 15 (k = 0..3), each inside one 16-weight scale group:
// run k takes L's low nibbles (k = 0), L32's (1), L's high ones (2), L32's (3), and bits 2k, 2k + 1
// of H above them. With f = 1 + q / 128, q - 32 = 128 (f - 1) - 32, so a run contributes
//   d sc sum_j (q_j - 32) x_j = d sc (128 sum_j f_j x_j - 160 xsum).

// The codes of run K for 4 columns (words of L, L32 and H at the same l) as bytes 0x80 | q.
template <int K>
__device__ __forceinline__ uint32_t q6_k_code_bytes(uint32_t lo, uint32_t lo32, uint32_t hi) {
  if constexpr (K == 0) return (lo & 0x0f0f0f0fu) | ((hi << 4) & 0x30303030u) | 0x80808080u;
  if constexpr (K == 1) return (lo32 & 0x0f0f0f0fu) | ((hi << 2) & 0x30303030u) | 0x80808080u;
  if constexpr (K == 2) return ((lo >> 4) & 0x0f0f0f0fu) | (hi & 0x30303030u) | 0x80808080u;
  return ((lo32 >> 4) & 0x0f0f0f0fu) | ((hi >> 2) & 0x30303030u) | 0x80808080u;
}

struct Q6KLanes {
  uint4 lo, lo32, hi;  // ql at l, ql at l + 32, qh at l
  uint2 scales;        // the half block's 8 scales (i8)
};

// blk[r][t] += sc_k * sum over run K (16 columns at col) of (q - 32) * x.
template <int ROWS, int NT, bool XV, int K>
__device__ __forceinline__ void q6_k_run(const float* const (&xr)[NT], const Q6KLanes (&lanes)[ROWS], int u,
                                         int64_t col, float (&blk)[ROWS][NT]) {
  float sum[ROWS][NT], xsum[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    xsum[t] = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) sum[r][t] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float4 xv[NT];
    load_x4<NT, XV>(xr, col + 4 * i, xv);
#pragma unroll
    for (int t = 0; t < NT; ++t) xsum[t] += ((xv[t].x + xv[t].y) + xv[t].z) + xv[t].w;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const uint32_t e = q6_k_code_bytes<K>(word(lanes[r].lo, i), word(lanes[r].lo32, i), word(lanes[r].hi, i));
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const float f = unit_float(e, b);
#pragma unroll
        for (int t = 0; t < NT; ++t) sum[r][t] = fmaf(f, element(xv[t], b), sum[r][t]);
      }
    }
  }
  // Scale 2K + u of the half block: byte 2 (K & 1) + u of word K >> 1.
  const int shift = 8 * (2 * (K & 1) + u);
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const uint32_t w = K < 2 ? lanes[r].scales.x : lanes[r].scales.y;
    const float sc = static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(w >> shift)));
#pragma unroll
    for (int t = 0; t < NT; ++t) blk[r][t] = fmaf(sc, fmaf(128.0f, sum[r][t], -160.0f * xsum[t]), blk[r][t]);
  }
}

template <int NT, int ROWS, int U, bool XV>
__global__ void __launch_bounds__(kGemvThreads) gemv_q6_k_kernel(const GgufGemvParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * ROWS;
  if (row0 >= p.out) return;  // no block-wide synchronisation below
  const int split = blockIdx.y;
  const int64_t b_end = min64(p.in, split * p.chunk + p.chunk) / kBlockK;
  const int64_t blocks = p.in / kBlockK;
  const int h = (lane >> 1) & 1, u = lane & 1;
  const int off_lo = 64 * h + 16 * u, off_hi = 128 + 32 * h + 16 * u, off_scales = 192 + 8 * h;
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
  constexpr int64_t kBlocksPerStep = kQ6Step / kBlockK;
  const auto block = [&](const Q6KLanes (&lanes)[ROWS], const float (&d)[ROWS], int64_t b) {
    float blk[ROWS][NT];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int t = 0; t < NT; ++t) blk[r][t] = 0.0f;
    }
    const int64_t col = b * kBlockK + 128 * h + 16 * u;
    q6_k_run<ROWS, NT, XV, 0>(xr, lanes, u, col, blk);
    q6_k_run<ROWS, NT, XV, 1>(xr, lanes, u, col + 32, blk);
    q6_k_run<ROWS, NT, XV, 2>(xr, lanes, u, col + 64, blk);
    q6_k_run<ROWS, NT, XV, 3>(xr, lanes, u, col + 96, blk);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(d[r], blk[r][t], acc[r][t]);
    }
  };
  const auto load = [&](int64_t b, Q6KLanes (&lanes)[ROWS], float (&d)[ROWS]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const uint8_t* blk = wr[r] + b * kQ6KBytes;
      lanes[r].lo = load_stream_16(blk + off_lo);
      lanes[r].lo32 = load_stream_16(blk + off_lo + 32);
      lanes[r].hi = load_stream_16(blk + off_hi);
      lanes[r].scales = load_stream_8(blk + off_scales);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) d[r] = f16_bits_to_f32(__ldg(dr[r] + b));
  };
  // Lanes may run different numbers of blocks at the end of a slice (no shuffles until the epilogue).
  int64_t b = split * p.chunk / kBlockK + (lane >> 2);
  for (; b + (U - 1) * kBlocksPerStep < b_end; b += U * kBlocksPerStep) {
    Q6KLanes lanes[U][ROWS];
    float d[U][ROWS];
#pragma unroll
    for (int s = 0; s < U; ++s) load(b + s * kBlocksPerStep, lanes[s], d[s]);
#pragma unroll
    for (int s = 0; s < U; ++s) block(lanes[s], d[s], b + s * kBlocksPerStep);
  }
  for (; b < b_end; b += kBlocksPerStep) {
    Q6KLanes lanes[ROWS];
    float d[ROWS];
    load(b, lanes, d);
    block(lanes, d, b);
  }
  store_sums<ROWS, NT>(p, acc, row0, split);
}

// ---- launch ----------------------------------------------------------------------------------------

template <int ROWS>
dim3 gemv_grid(const GgufGemvParams& p) {
  const int64_t rows_per_block = static_cast<int64_t>(kWarps) * ROWS;
  return dim3(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(p.splits));
}

template <int NT, bool XV>
cudaError_t launch_gguf_bucket(GgufFormat format, const GgufGemvParams& p, Stream stream) {
  switch (format) {
    case GgufFormat::kQ8_0: {
      constexpr int R = Q8Tile<NT>::kRows;
      gemv_q8_0_kernel<NT, R, Q8Tile<NT>::kSteps, XV><<<gemv_grid<R>(p), kGemvThreads, 0, stream>>>(p);
      break;
    }
    case GgufFormat::kQ4_K: {
      constexpr int R = Q4KTile<NT>::kRows;
      gemv_q4_k_kernel<NT, R, XV><<<gemv_grid<R>(p), kGemvThreads, 0, stream>>>(p);
      break;
    }
    case GgufFormat::kQ6_K: {
      constexpr int R = Q6KTile<NT>::kRows;
      gemv_q6_k_kernel<NT, R, Q6KTile<NT>::kSteps, XV><<<gemv_grid<R>(p), kGemvThreads, 0, stream>>>(p);
      break;
    }
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <bool XV>
cudaError_t launch_gguf_tokens(GgufFormat format, const GgufGemvParams& p, Stream stream) {
  if (p.n <= 1) return launch_gguf_bucket<1, XV>(format, p, stream);
  if (p.n <= 2) return launch_gguf_bucket<2, XV>(format, p, stream);
  if (p.n <= 4) return launch_gguf_bucket<4, XV>(format, p, stream);
  return launch_gguf_bucket<8, XV>(format, p, stream);
}

// ---- expansion to bf16 -----------------------------------------------------------------------------
// dst[o, k] = the weight core/ggml_blocks.h's decoding gives (the same f32 operations, unfused),
// rounded to bf16. One thread per 16-byte unit of codes (Q8_0: 16 weights; Q4_K: a qs piece, 32
// weights; Q6_K: a lane's three pieces, 64 weights), grid-stride over rows; 16-byte stores.

__device__ __forceinline__ void store_bf16x16(uint16_t* dst, const float (&v)[16]) {
  uint32_t h[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    h[j] = f32_to_bf16_bits(v[2 * j]) | (static_cast<uint32_t>(f32_to_bf16_bits(v[2 * j + 1])) << 16);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(h[0], h[1], h[2], h[3]);
  *reinterpret_cast<uint4*>(dst + 8) = make_uint4(h[4], h[5], h[6], h[7]);
}

__global__ void expand_q8_0_kernel(const uint8_t* w, int64_t w_stride, const uint16_t* d, int64_t out, int64_t in,
                                   uint16_t* dst, int64_t dst_stride) {
  for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
    for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 16; k < in;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x * 16) {
      const uint4 raw = load_stream_16(w + o * w_stride + k);
      const float scale = f16_bits_to_f32(d[o * (in / 32) + k / 32]);
      float v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int8_t q = static_cast<int8_t>(word(raw, j / 4) >> (8 * (j % 4)));
        v[j] = __fmul_rn(scale, static_cast<float>(q));
      }
      store_bf16x16(dst + o * dst_stride + k, v);
    }
  }
}

__global__ void expand_q4_k_kernel(const uint8_t* w, int64_t w_stride, int64_t out, int64_t in, uint16_t* dst,
                                   int64_t dst_stride) {
  const int64_t units = in / kBlockK * 8;  // qs pieces per row
  for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
    for (int64_t unit = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; unit < units;
         unit += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t b = unit / 8;
      const int piece = static_cast<int>(unit % 8), c = piece / 2, u = piece % 2;
      const uint8_t* block = w + o * w_stride + b * kQ4KBytes;
      const uint4 head = __ldg(reinterpret_cast<const uint4*>(block));
      const uint4 raw = load_stream_16(block + 16 + 16 * piece);
      const uint32_t s[3] = {head.y, head.z, head.w};  // scales[0..12)
      const auto byte = [&](int i) { return static_cast<int>((s[i / 4] >> (8 * (i % 4))) & 0xffu); };
      int sc[2], mn[2];
#pragma unroll
      for (int v = 0; v < 2; ++v) {  // core/ggml_blocks.h's q4_k_scale_min for sub-block 2c + v
        const int sb = 2 * c + v;
        if (sb < 4) {
          sc[v] = byte(sb) & 63;
          mn[v] = byte(sb + 4) & 63;
        } else {
          sc[v] = (byte(sb + 4) & 15) | ((byte(sb - 4) >> 6) << 4);
          mn[v] = (byte(sb + 4) >> 4) | ((byte(sb) >> 6) << 4);
        }
      }
      const float dd = f16_bits_to_f32(static_cast<uint16_t>(head.x & 0xffffu));
      const float dmin = f16_bits_to_f32(static_cast<uint16_t>(head.x >> 16));
      uint16_t* row = dst + o * dst_stride + b * kBlockK + 64 * c + 16 * u;
#pragma unroll
      for (int v = 0; v < 2; ++v) {  // low nibbles: column 64c + l; high: 64c + 32 + l
        const float scale = __fmul_rn(dd, static_cast<float>(sc[v]));
        const float offset = __fmul_rn(dmin, static_cast<float>(mn[v]));
        float vals[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const uint32_t q = (word(raw, j / 4) >> (8 * (j % 4) + 4 * v)) & 15u;
          vals[j] = __fsub_rn(__fmul_rn(scale, static_cast<float>(q)), offset);
        }
        store_bf16x16(row + 32 * v, vals);
      }
    }
  }
}

__global__ void expand_q6_k_kernel(const uint8_t* w, int64_t w_stride, const uint16_t* d, int64_t out, int64_t in,
                                   uint16_t* dst, int64_t dst_stride) {
  const int64_t blocks = in / kBlockK, units = blocks * 4;  // four lanes' worth per block
  for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
    for (int64_t unit = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; unit < units;
         unit += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t b = unit / 4;
      const int h = static_cast<int>(unit % 4) / 2, u = static_cast<int>(unit % 2);
      const uint8_t* block = w + o * w_stride + b * kQ6KBytes;
      const uint4 lo = load_stream_16(block + 64 * h + 16 * u), lo32 = load_stream_16(block + 64 * h + 32 + 16 * u);
      const uint4 hi = load_stream_16(block + 128 + 32 * h + 16 * u);
      const uint2 scales = load_stream_8(block + 192 + 8 * h);
      const float dd = f16_bits_to_f32(d[o * blocks + b]);
      uint16_t* row = dst + o * dst_stride + b * kBlockK + 128 * h + 16 * u;
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // run k: columns 128h + 32k + 16u .. + 15, scale 8h + 2k + u
        const uint32_t sw = k < 2 ? scales.x : scales.y;
        const float scale =
            __fmul_rn(dd, static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(sw >> (8 * (2 * (k & 1) + u))))));
        float vals[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int sh = 8 * (j % 4);
          const uint32_t l = (word(k % 2 == 0 ? lo : lo32, j / 4) >> sh) & 0xffu;
          const uint32_t hb = (word(hi, j / 4) >> sh) & 0xffu;
          const int q = static_cast<int>((k < 2 ? l & 15u : l >> 4) | (((hb >> (2 * k)) & 3u) << 4));
          vals[j] = __fmul_rn(scale, static_cast<float>(q - 32));
        }
        store_bf16x16(row + 32 * k, vals);
      }
    }
  }
}

// Rows per warp of a tile family at n tokens (the launch's token bucket).
template <template <int> class Tile>
int tile_rows(int64_t n) {
  return n <= 1 ? Tile<1>::kRows : n <= 2 ? Tile<2>::kRows : n <= 4 ? Tile<4>::kRows : Tile<8>::kRows;
}

int64_t gguf_block(GgufFormat format) { return format == GgufFormat::kQ8_0 ? 32 : kBlockK; }

int64_t gguf_packed_row_bytes(GgufFormat format, int64_t in) {
  switch (format) {
    case GgufFormat::kQ8_0: return in;
    case GgufFormat::kQ4_K: return in / kBlockK * kQ4KBytes;
    case GgufFormat::kQ6_K: return in / kBlockK * kQ6KBytes;
    default: return 0;
  }
}

}  // namespace

bool gemv_gguf_supported(const LinearArgs& a) {
  const auto aligned16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  return a.gguf != GgufFormat::kNone && a.n >= 1 && a.n <= kGemvGgufMaxTokens && a.in % gguf_block(a.gguf) == 0 &&
         a.w_stride >= gguf_packed_row_bytes(a.gguf, a.in) && a.w_stride % 16 == 0 && aligned16(a.w) &&
         (a.gguf == GgufFormat::kQ4_K || a.w_scales_f16 != nullptr);
}

GemvShape plan_gemv_gguf(const LinearArgs& a, int sm_count) {
  GemvShape s;
  s.vector_loads = true;
  int64_t min_chunk = 0;
  switch (a.gguf) {
    case GgufFormat::kQ8_0:
      s.step = kQ8Step;
      s.rows_per_warp = tile_rows<Q8Tile>(a.n);
      min_chunk = kQ8Step * Q8Tile<1>::kSteps;
      break;
    case GgufFormat::kQ4_K:
      s.step = kQ4Step;
      s.rows_per_warp = tile_rows<Q4KTile>(a.n);
      min_chunk = kQ4Step;
      break;
    default:
      s.step = kQ6Step;
      s.rows_per_warp = tile_rows<Q6KTile>(a.n);
      min_chunk = kQ6Step * Q6KTile<1>::kSteps;
      break;
  }
  // Enough warps for ~32 per SM; every slice at least one full iteration of the unrolled loop.
  // Planned as for one token whatever n is: the same slices, so the same summation order for a
  // token alone or in any batch (LinearMode::kBatchInvariant relies on it).
  const int64_t rows1 = a.gguf == GgufFormat::kQ8_0 ? Q8Tile<1>::kRows
                        : a.gguf == GgufFormat::kQ4_K ? Q4KTile<1>::kRows
                                                      : Q6KTile<1>::kRows;
  const int64_t row_warps = (a.out + rows1 - 1) / rows1;
  const int64_t target_warps = static_cast<int64_t>(std::max(sm_count, 1)) * 32;
  const int64_t max_splits = std::max<int64_t>(1, std::min<int64_t>(a.in / min_chunk, 32));
  const int64_t want =
      std::max<int64_t>(1, std::min<int64_t>(target_warps / std::max<int64_t>(row_warps, 1), max_splits));
  int64_t chunk = (a.in + want - 1) / want;
  chunk = (chunk + s.step - 1) / s.step * s.step;
  s.chunk = std::max<int64_t>(chunk, s.step);
  s.splits = static_cast<int>((a.in + s.chunk - 1) / s.chunk);
  return s;
}

cudaError_t launch_gemv_gguf(const LinearArgs& a, const GemvShape& shape, float* partial, Stream stream) {
  GgufGemvParams p;
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.w = static_cast<const uint8_t*>(a.w);
  p.w_stride = a.w_stride;
  p.d = a.w_scales_f16;
  p.bias = a.bias;
  p.bias_dtype = a.bias_dtype;
  p.y = a.y;
  p.y_stride = a.y_stride;
  p.partial = partial;
  p.n = a.n;
  p.in = a.in;
  p.out = a.out;
  p.chunk = shape.chunk;
  p.splits = shape.splits;
  const bool x_vec = (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0 && a.x_stride % 4 == 0;
  cudaError_t e = x_vec ? launch_gguf_tokens<true>(a.gguf, p, stream) : launch_gguf_tokens<false>(a.gguf, p, stream);
  if (e != cudaSuccess || shape.splits == 1) return e;
  return launch_gemv_reduce(partial, shape.splits, a.n, a.out, a.bias, a.bias_dtype, nullptr, a.y, a.y_stride, stream);
}

cudaError_t launch_dequantize_gguf(const LinearArgs& a, uint16_t* dst, int64_t dst_stride, Stream stream) {
  if (a.out == 0 || a.in == 0) return cudaSuccess;
  const auto aligned16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  if (a.gguf == GgufFormat::kNone || a.in % gguf_block(a.gguf) != 0 || a.w_stride % 16 != 0 || dst_stride % 8 != 0 ||
      !aligned16(a.w) || !aligned16(dst) || (a.gguf != GgufFormat::kQ4_K && a.w_scales_f16 == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int threads = 128;
  const int64_t units = a.gguf == GgufFormat::kQ8_0   ? a.in / 16
                        : a.gguf == GgufFormat::kQ4_K ? a.in / kBlockK * 8
                                                      : a.in / kBlockK * 4;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((units + threads - 1) / threads, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(a.out, 65535)));
  const auto* w = static_cast<const uint8_t*>(a.w);
  switch (a.gguf) {
    case GgufFormat::kQ8_0:
      expand_q8_0_kernel<<<grid, threads, 0, stream>>>(w, a.w_stride, a.w_scales_f16, a.out, a.in, dst, dst_stride);
      break;
    case GgufFormat::kQ4_K:
      expand_q4_k_kernel<<<grid, threads, 0, stream>>>(w, a.w_stride, a.out, a.in, dst, dst_stride);
      break;
    default:
      expand_q6_k_kernel<<<grid, threads, 0, stream>>>(w, a.w_stride, a.w_scales_f16, a.out, a.in, dst, dst_stride);
      break;
  }
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
