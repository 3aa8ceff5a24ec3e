// The expansion of GGUF block weights to bf16 rows (launch_dequantize_gguf, launch.h), which lets
// cuBLASLt multiply a weight when many tokens share it (linear_gguf.cu has the GEMVs for few).
#include <algorithm>

#include "core/ggml_blocks.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/gguf_blocks.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

// ---- expansion to bf16 -----------------------------------------------------------------------------
// dst[o, k] = the weight core/ggml_blocks.h's decoding gives (the same f32 operations, unfused),
// rounded to bf16. One thread per 16 (Q8_0) or 8 (the others) consecutive weights of a row,
// grid-stride over rows; 16-byte stores.

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

// 8 bf16 (one 16-byte store) from 8 f32 values.
__device__ __forceinline__ void store_bf16x8(uint16_t* dst, const float (&v)[8]) {
  uint32_t h[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    h[j] = f32_to_bf16_bits(v[2 * j]) | (static_cast<uint32_t>(f32_to_bf16_bits(v[2 * j + 1])) << 16);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(h[0], h[1], h[2], h[3]);
}

// Byte i (0..15, any value at run time) of a 16-byte vector.
__device__ __forceinline__ uint32_t byte_of(const uint4& v, int i) { return (word(v, i >> 2) >> (8 * (i & 3))) & 0xffu; }

// The other expansions: each thread writes 8 consecutive bf16 of a row (consecutive threads,
// consecutive 16-byte stores) from the 8 code bytes those columns read; a block's header (d, dmin
// or m, scales, qh) is read through L1, shared by the threads of the block. Grid: x over the row's
// 8-column groups (grid-stride), y over rows (grid-stride).
// Q4_1 / Q5_0 / Q5_1 / IQ4_NL column 32b + 16h + j (j = 0..15): nibble h of qs[j] of block b (and
// bit 16h + j of its qh: the fifth bit), as core/ggml_blocks.cpp's dequantize_32 and
// dequantize_iq4_nl compute it. A thread's 8 columns are one nibble of 8 qs bytes, read by loads
// no wider than the block's alignment (Block32's comment).
template <GgufFormat F>
__global__ void expand_block32_kernel(const uint8_t* w, int64_t w_stride, int64_t out, int64_t in, uint16_t* dst,
                                      int64_t dst_stride) {
  constexpr int64_t kBytes = Block32<F>::kBytes;
  const int64_t groups = in / 8;
  for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
    for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
         g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t col = 8 * g;
      const int h = static_cast<int>(col % 32) / 16, j0 = static_cast<int>(col % 16);
      const uint8_t* block = w + o * w_stride + col / 32 * kBytes;
      uint32_t head, qh = 0, qs[2];  // qs: bytes j0 .. j0 + 7
      if constexpr (F == GgufFormat::kQ4_1) {
        head = __ldg(reinterpret_cast<const uint32_t*>(block));
        qs[0] = __ldg(reinterpret_cast<const uint32_t*>(block + 4 + j0));
        qs[1] = __ldg(reinterpret_cast<const uint32_t*>(block + 8 + j0));
      } else if constexpr (F == GgufFormat::kQ5_1) {
        const uint2 hq = __ldg(reinterpret_cast<const uint2*>(block));
        const uint2 q = __ldg(reinterpret_cast<const uint2*>(block + 8 + j0));
        head = hq.x;
        qh = hq.y;
        qs[0] = q.x;
        qs[1] = q.y;
      } else if constexpr (F == GgufFormat::kQ5_0) {
        head = __ldg(reinterpret_cast<const uint16_t*>(block));
        qh = load_u32_align2(block + 2);
        qs[0] = load_u32_align2(block + 6 + j0);
        qs[1] = load_u32_align2(block + 10 + j0);
      } else {
        head = __ldg(reinterpret_cast<const uint16_t*>(block));
        qs[0] = load_u32_align2(block + 2 + j0);
        qs[1] = load_u32_align2(block + 6 + j0);
      }
      const float d = f16_bits_to_f32(static_cast<uint16_t>(head & 0xffffu));
      [[maybe_unused]] const float m = f16_bits_to_f32(static_cast<uint16_t>(head >> 16));
      float vals[8];
      if constexpr (F == GgufFormat::kIq4Nl) {
        const uint2 lo = iq4_nl_levels(qs[0]), hi = iq4_nl_levels(qs[1]);
        const uint32_t levels[2] = {h == 0 ? lo.x : lo.y, h == 0 ? hi.x : hi.y};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int level = static_cast<int>((levels[j / 4] >> (8 * (j % 4))) & 0xffu) - 128;
          vals[j] = __fmul_rn(d, static_cast<float>(level));
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          int q = static_cast<int>((qs[j / 4] >> (8 * (j % 4) + 4 * h)) & 15u);
          if constexpr (F != GgufFormat::kQ4_1) q |= static_cast<int>((qh >> (16 * h + j0 + j)) & 1u) << 4;
          vals[j] = F == GgufFormat::kQ5_0 ? __fmul_rn(d, static_cast<float>(q - 16))
                                           : __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m);
        }
      }
      store_bf16x8(dst + o * dst_stride + col, vals);
    }
  }
}

// Q4_K column 64c + 32v + l (l = 0..31): nibble v of qs[32c + l], sub-block 2c + v; Q5_K adds 16
// where bit 2c + v of qh[l] is set.
template <GgufFormat F>
__global__ void expand_q4_k_q5_k_kernel(const uint8_t* w, int64_t w_stride, int64_t out, int64_t in, uint16_t* dst,
                                        int64_t dst_stride) {
  constexpr bool kQ5 = F == GgufFormat::kQ5_K;
  const int64_t groups = in / 8;
  for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
    for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
         g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t col = 8 * g, b = col / kBlockK;
      const int in_block = static_cast<int>(col % kBlockK);
      const int c = in_block / 64, v = (in_block / 32) & 1, l = in_block % 32, sb = 2 * c + v;
      const uint8_t* block = w + o * w_stride + b * KQuantBlock<F>::kBytes;
      const uint4 head = __ldg(reinterpret_cast<const uint4*>(block));
      // core/ggml_blocks.h's q4_k_scale_min on the scales at head bytes 4..15.
      int sc, mn;
      if (sb < 4) {
        sc = static_cast<int>(byte_of(head, 4 + sb) & 63u);
        mn = static_cast<int>(byte_of(head, 8 + sb) & 63u);
      } else {
        sc = static_cast<int>((byte_of(head, 8 + sb) & 15u) | ((byte_of(head, sb) >> 6) << 4));
        mn = static_cast<int>((byte_of(head, 8 + sb) >> 4) | ((byte_of(head, 4 + sb) >> 6) << 4));
      }
      const float scale = __fmul_rn(f16_bits_to_f32(static_cast<uint16_t>(head.x & 0xffffu)), static_cast<float>(sc));
      const float offset = __fmul_rn(f16_bits_to_f32(static_cast<uint16_t>(head.x >> 16)), static_cast<float>(mn));
      const uint2 qs = __ldg(reinterpret_cast<const uint2*>(block + (kQ5 ? 48 : 16) + 32 * c + l));
      [[maybe_unused]] uint2 qh = make_uint2(0u, 0u);
      if constexpr (kQ5) qh = __ldg(reinterpret_cast<const uint2*>(block + 16 + l));
      float vals[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t q = ((j < 4 ? qs.x : qs.y) >> (8 * (j % 4) + 4 * v)) & 15u;
        if constexpr (kQ5) q |= (((j < 4 ? qh.x : qh.y) >> (8 * (j % 4) + sb)) & 1u) << 4;
        vals[j] = __fsub_rn(__fmul_rn(scale, static_cast<float>(q)), offset);
      }
      store_bf16x8(dst + o * dst_stride + col, vals);
    }
  }
}

// Q6_K column 128h + 32k + l (l = 0..31): the low (k < 2) or high nibble of ql[64h + 32(k & 1) + l]
// and bits 2k..2k+1 of qh[32h + l], scale scales[8h + 2k + l / 16].
__global__ void expand_q6_k_kernel(const uint8_t* w, int64_t w_stride, const uint16_t* d, int64_t out, int64_t in,
                                   uint16_t* dst, int64_t dst_stride) {
  const int64_t groups = in / 8, blocks = in / kBlockK;
  for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
    for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
         g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t col = 8 * g, b = col / kBlockK;
      const int in_block = static_cast<int>(col % kBlockK);
      const int h = in_block / 128, k = (in_block / 32) & 3, l = in_block % 32;
      const uint8_t* block = w + o * w_stride + b * kQ6KBytes;
      const uint2 ql = __ldg(reinterpret_cast<const uint2*>(block + 64 * h + 32 * (k & 1) + l));
      const uint2 qh = __ldg(reinterpret_cast<const uint2*>(block + 128 + 32 * h + l));
      const int8_t sc = static_cast<int8_t>(__ldg(block + 192 + 8 * h + 2 * k + l / 16));
      const float scale = __fmul_rn(f16_bits_to_f32(d[o * blocks + b]), static_cast<float>(sc));
      float vals[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int sh = 8 * (j % 4);
        const uint32_t lb = ((j < 4 ? ql.x : ql.y) >> sh) & 0xffu, hb = ((j < 4 ? qh.x : qh.y) >> sh) & 0xffu;
        const int q = static_cast<int>((k < 2 ? lb & 15u : lb >> 4) | (((hb >> (2 * k)) & 3u) << 4));
        vals[j] = __fmul_rn(scale, static_cast<float>(q - 32));
      }
      store_bf16x8(dst + o * dst_stride + col, vals);
    }
  }
}

}  // namespace

cudaError_t launch_dequantize_gguf(const LinearArgs& a, uint16_t* dst, int64_t dst_stride, Stream stream) {
  if (a.out == 0 || a.in == 0) return cudaSuccess;
  if (!gguf_rows_fit(a) || dst_stride % 8 != 0 || (reinterpret_cast<uintptr_t>(dst) & 15u) != 0) {
    return cudaErrorInvalidValue;
  }
  const int threads = 128;
  const int64_t units = a.gguf == GgufFormat::kQ8_0 ? a.in / 16 : a.in / 8;  // per row: 16 or 8 columns a thread
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((units + threads - 1) / threads, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(a.out, 65535)));
  const auto* w = static_cast<const uint8_t*>(a.w);
  switch (a.gguf) {
    case GgufFormat::kQ8_0:
      expand_q8_0_kernel<<<grid, threads, 0, stream>>>(w, a.w_stride, a.w_scales_f16, a.out, a.in, dst, dst_stride);
      break;
    case GgufFormat::kQ4_K:
      expand_q4_k_q5_k_kernel<GgufFormat::kQ4_K><<<grid, threads, 0, stream>>>(w, a.w_stride, a.out, a.in, dst,
                                                                               dst_stride);
      break;
    case GgufFormat::kQ5_K:
      expand_q4_k_q5_k_kernel<GgufFormat::kQ5_K><<<grid, threads, 0, stream>>>(w, a.w_stride, a.out, a.in, dst,
                                                                               dst_stride);
      break;
    case GgufFormat::kQ6_K:
      expand_q6_k_kernel<<<grid, threads, 0, stream>>>(w, a.w_stride, a.w_scales_f16, a.out, a.in, dst, dst_stride);
      break;
    case GgufFormat::kQ4_1:
      expand_block32_kernel<GgufFormat::kQ4_1><<<grid, threads, 0, stream>>>(w, a.w_stride, a.out, a.in, dst,
                                                                            dst_stride);
      break;
    case GgufFormat::kQ5_0:
      expand_block32_kernel<GgufFormat::kQ5_0><<<grid, threads, 0, stream>>>(w, a.w_stride, a.out, a.in, dst,
                                                                            dst_stride);
      break;
    case GgufFormat::kQ5_1:
      expand_block32_kernel<GgufFormat::kQ5_1><<<grid, threads, 0, stream>>>(w, a.w_stride, a.out, a.in, dst,
                                                                            dst_stride);
      break;
    case GgufFormat::kIq4Nl:
      expand_block32_kernel<GgufFormat::kIq4Nl><<<grid, threads, 0, stream>>>(w, a.w_stride, a.out, a.in, dst,
                                                                              dst_stride);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
