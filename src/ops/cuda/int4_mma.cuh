// What the int4 tensor-core GEMMs share (linear_int4.cu, linear_int4_stream.cu): group-128 weights
// (quant/quantize.h's kInt4Group layout) against bf16 activations through mma.m16n8k16.
//
// A 128-column chunk is one group. Lane (g, t) of a warp holds block t of the chunk (16 bytes, 32
// weights) for rows g and g + 8. Two nibbles become a bf16 pair 128 + q by masking them into the
// mantissas of 128.0 (one shift and one mask per pair), and subtracting 128 + zero leaves q - zero
// exactly. Inside the lane's block the K order is permuted identically for weights and
// activations (step (i, h) takes columns 16h + 4i + {0, 2} and {1, 3}), so the sum is unchanged;
// the activations are staged in that order (stage_int4_operands) so that a lane's operands for 16
// columns are two 16-byte shared loads.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/mma.cuh"

namespace tachyon::ops::cuda::detail {

// (q - zero) of the nibbles at bits s and s + 16 of `word`, as a bf16 pair (exact: |q - zero| <= 16).
__device__ __forceinline__ uint32_t nibble_pair_bf16(uint32_t word, int s, __nv_bfloat162 zero_pair) {
  // bf16 128 + q in each half: (w >> s & mask) | magic as one lop3 (0xea = (a & b) | c); written out
  // in C++, the compiler emits an and and an or (two immediates do not fit one lop3).
  uint32_t biased;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(biased) : "r"(word >> s), "n"(0x000f000f), "r"(0x43004300u));
  const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased), zero_pair);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 128 + zero in both halves of a bf16 pair (exact for the integer zeros in [0, 16]).
__device__ __forceinline__ __nv_bfloat162 biased_zero_pair(float zero) {
  return __float2bfloat162_rn(128.0f + zero);
}

// Words per token row of staged activations covering `cols` columns: a bf16 pair per two
// columns, plus 16 bytes (rows padded so that tokens fall in different banks).
__host__ __device__ constexpr int64_t mma_i4_stage_stride(int64_t cols) { return cols / 2 + 4; }

// Half h (columns 16h .. 16h + 15 of the lane's block) of a chunk: four mma steps into `part`.
// wa, wb: the lane's 16-byte blocks of rows g and g + 8; b: the lane's 8 operand words of that
// half (two 16-byte loads of the staged activations).
__device__ __forceinline__ void int4_half_chunk_mma(const uint4& wa, const uint4& wb, int h, __nv_bfloat162 za,
                                                    __nv_bfloat162 zb, const uint32_t (&b)[8], float (&part)[4]) {
  using M = MmaType<DType::kBF16>;
  const uint32_t wa_words[4] = {wa.x, wa.y, wa.z, wa.w}, wb_words[4] = {wb.x, wb.y, wb.z, wb.w};
  const int lo_shift = h == 0 ? 0 : 4;  // low nibbles: columns 4i + {0..3}; high: 16 + 4i + {0..3}
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // word i: columns 16h + 4i .. + 3; operands b[2i], b[2i + 1]
    const uint32_t a[4] = {nibble_pair_bf16(wa_words[i], lo_shift, za), nibble_pair_bf16(wb_words[i], lo_shift, zb),
                           nibble_pair_bf16(wa_words[i], lo_shift + 8, za),
                           nibble_pair_bf16(wb_words[i], lo_shift + 8, zb)};
    M::mma(part, a, b[2 * i], b[2 * i + 1]);
  }
}

// The lane's operand words for half h of the chunk whose staged activations start at `xs`
// (already offset by the lane's 8 * t words and its token row).
__device__ __forceinline__ void load_int4_operands(const uint32_t* xs, int h, uint32_t (&b)[8]) {
  const uint4* q = reinterpret_cast<const uint4*>(xs + 32 * h);
  const uint4 q0 = q[0], q1 = q[1];
  b[0] = q0.x, b[1] = q0.y, b[2] = q0.z, b[3] = q0.w;
  b[4] = q1.x, b[5] = q1.y, b[6] = q1.z, b[7] = q1.w;
}

// Rounds x[tok, k0 .. k0 + cols) (f32, rows x_stride apart, 16-byte aligned, cols a multiple of
// 128) of n tokens to bf16 into `stage` (rows of `stride` words), in the operands' order: column
// quad qd of a 128-column chunk is word i = qd % 4 of lane t = qd % 32 / 8's columns 16h .. 16h +
// 15 (h = qd % 8 / 4), stored in (h, t, i) order, so a quad's four lanes read 128 consecutive bytes.
// Thread `thread` of `threads` takes part; the caller synchronises before the operands are read.
__device__ __forceinline__ void stage_int4_operands(const float* x, int64_t x_stride, int64_t n, int64_t k0,
                                                    int64_t cols, uint32_t* stage, int64_t stride, int thread,
                                                    int threads) {
  using M = MmaType<DType::kBF16>;
  const int64_t quads = cols / 4, total = n * quads;
  uint2* out = reinterpret_cast<uint2*>(stage);
  constexpr int kBatch = 4;  // loads in flight per thread
  for (int64_t i0 = thread; i0 < total; i0 += kBatch * threads) {
    float4 f[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = i0 + b * threads;
      if (i < total) f[b] = __ldg(reinterpret_cast<const float4*>(x + (i / quads) * x_stride + k0 + 4 * (i % quads)));
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = i0 + b * threads;
      if (i < total) {
        const int64_t tok = i / quads, qd = i % quads;
        const int64_t at = (qd / 32) * 32 + ((qd % 8) / 4) * 16 + ((qd % 32) / 8) * 4 + qd % 4;
        out[tok * (stride / 2) + at] = make_uint2(M::pack(f[b].x, f[b].z), M::pack(f[b].y, f[b].w));
      }
    }
  }
}

}  // namespace tachyon::ops::cuda::detail
