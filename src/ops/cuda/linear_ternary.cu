// Ternary weights (quant/quantize.h's kTernary: codes {-1, 0, +1} in 2 bits, blocks of 32 weights
// in 8 bytes, one f32 scale per group of 32..256) for linear(): the GEMV for 1..kGemvTernaryMaxTokens
// tokens and the expansion to bf16 rows for cuBLASLt beyond.
// The GEMV is multiply-free inside a block: each weight adds its activation, subtracts it or
// skips it (a sign flip and a mask on the f32 bits), and the block's sum is multiplied by its
// group's scale once. A warp owns ROWS rows; each lane streams 16 bytes (two blocks, 64 weights)
// of each row per step with U steps in flight, and reads the tokens' 64 activations of those
// columns through L1, reused across the rows.
// Must never: read weights through L1 (each byte is used once), or depend on timing for results.
#include <algorithm>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/gemv_store.cuh"
#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {
namespace {

constexpr int kTernaryWarps = 4;
constexpr int kTernaryStep = 32 * 64;  // columns one warp covers with one 16-byte load per lane

struct TernaryGemvParams {
  const float* x;  // [n, in] f32, rows x_stride apart (16-byte aligned)
  int64_t x_stride;
  const uint8_t* w;  // [out, w_stride] bytes
  int64_t w_stride;
  const float* scales;  // [out, in / group]
  int group;
  const void* bias;
  DType bias_dtype;
  float* y;
  int64_t y_stride;
  float* partial;  // [splits, n, out] when splits > 1
  int64_t n, in, out;
  int64_t chunk;  // multiple of kTernaryStep
  int splits;
};

template <int NT>
struct TernaryTile;
template <>
struct TernaryTile<1> {
  static constexpr int kRows = 4, kSteps = 2;
};
template <>
struct TernaryTile<2> {
  static constexpr int kRows = 4, kSteps = 2;
};
template <>
struct TernaryTile<4> {
  static constexpr int kRows = 4, kSteps = 1;
};
template <>
struct TernaryTile<8> {
  static constexpr int kRows = 2, kSteps = 1;
};

// x with its code applied: code 0 -> -x, 1 -> 0, 2 -> +x. `bits` holds the code in bits 0-1.
__device__ __forceinline__ float ternary_term(float x, uint32_t bits) {
  const uint32_t sign = (~bits & 2u) << 30;   // codes 0 (and 1): flip the sign
  const uint32_t keep = (bits & 1u) - 1u;     // code 1: all zeros, else all ones
  return __uint_as_float((__float_as_uint(x) ^ sign) & keep);
}

// The terms of 8 consecutive columns 8q..8q+7 of a 32-weight block (its 8 bytes in lo, hi: byte j
// holds weights j, j + 8, j + 16, j + 24 at bits 2q, q = 0..3) against x (a, b: those columns).
__device__ __forceinline__ float chunk_sum(uint32_t lo, uint32_t hi, int q, const float4& a, const float4& b) {
  const uint32_t l = lo >> (2 * q), h = hi >> (2 * q);
  float s0 = ternary_term(a.x, l) + ternary_term(a.y, l >> 8);
  float s1 = ternary_term(a.z, l >> 16) + ternary_term(a.w, l >> 24);
  s0 += ternary_term(b.x, h) + ternary_term(b.y, h >> 8);
  s1 += ternary_term(b.z, h >> 16) + ternary_term(b.w, h >> 24);
  return s0 + s1;
}

template <int NT>
__global__ void __launch_bounds__(kTernaryWarps * 32) gemv_ternary_kernel(const TernaryGemvParams p) {
  constexpr int ROWS = TernaryTile<NT>::kRows;
  constexpr int U = TernaryTile<NT>::kSteps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kTernaryWarps + warp) * ROWS;
  if (row0 >= p.out) return;  // no block-wide synchronisation below
  const int split = blockIdx.y;
  const int64_t k_begin = split * p.chunk;
  const int64_t k_end = min64(p.in, k_begin + p.chunk);  // in is a multiple of 64 (the group)
  const int64_t groups = p.in / p.group;

  const uint8_t* wr[ROWS];
  const float* sr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t row = min64(row0 + r, p.out - 1);  // past out: never stored
    wr[r] = p.w + row * p.w_stride;
    sr[r] = p.scales + row * groups;
  }
  float acc[ROWS][NT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  // Columns [k, k + 64): two blocks, each scaled by its group's scale. Each 8 columns' activations
  // are loaded once per token and applied to every row.
  const auto step = [&](const uint4 (&wv)[ROWS], int64_t k) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      float s[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) s[r] = __ldg(sr[r] + (k + 32 * b) / p.group);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float* xt = p.x + min64(t, p.n - 1) * p.x_stride + k + 32 * b;  // past n: never stored
        float bsum[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) bsum[r] = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float4 xa = __ldg(reinterpret_cast<const float4*>(xt + 8 * q));
          const float4 xb = __ldg(reinterpret_cast<const float4*>(xt + 8 * q + 4));
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const uint32_t lo = b == 0 ? wv[r].x : wv[r].z, hi = b == 0 ? wv[r].y : wv[r].w;
            bsum[r] += chunk_sum(lo, hi, q, xa, xb);
          }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r][t] = fmaf(bsum[r], s[r], acc[r][t]);
      }
    }
  };
  // A row's byte offset of column k is k / 4.
  int64_t k = k_begin + lane * 64;
  const int64_t k_full = k_begin + (k_end - k_begin) / kTernaryStep * kTernaryStep;
  for (; k + (U - 1) * kTernaryStep < k_full; k += U * kTernaryStep) {
    uint4 raw[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) raw[u][r] = load_stream_16(wr[r] + (k + u * kTernaryStep) / 4);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) step(raw[u], k + u * kTernaryStep);
  }
  for (; k < k_end; k += kTernaryStep) {  // single steps, then the slice's last 64-column pieces
    uint4 raw[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) raw[r] = load_stream_16(wr[r] + k / 4);
    step(raw, k);
  }
  store_gemv_sums<ROWS, NT>(acc, row0, split, p.n, p.out, p.splits, p.bias, p.bias_dtype, nullptr, p.y, p.y_stride,
                           p.partial);
}

// dst[o, i] (bf16) = (code - 1) * scale of its group. One thread per 32-weight block (8 bytes in,
// 64 out), a grid-stride over rows.
__global__ void dequantize_ternary_kernel(const uint8_t* __restrict__ packed, int64_t w_stride,
                                          const float* __restrict__ scales, int group, int64_t out, int64_t in,
                                          uint16_t* __restrict__ dst, int64_t dst_stride) {
  const int64_t blocks = in / 32, groups = in / group;
  for (int64_t o = blockIdx.y; o < out; o += gridDim.y) {
    for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
         b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const uint2 raw = *reinterpret_cast<const uint2*>(packed + o * w_stride + b * 8);
      const float s = scales[o * groups + b * 32 / group];
      const uint16_t pos = f32_to_bf16_bits(s), neg = f32_to_bf16_bits(-s);
      uint16_t* d = dst + o * dst_stride + b * 32;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t h[4];
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          const uint32_t c0 = ((j < 4 ? raw.x >> (8 * j) : raw.y >> (8 * (j - 4))) >> (2 * q)) & 3u;
          const uint32_t c1 = ((j + 1 < 4 ? raw.x >> (8 * (j + 1)) : raw.y >> (8 * (j - 3))) >> (2 * q)) & 3u;
          const uint32_t v0 = c0 == 2 ? pos : c0 == 0 ? neg : 0u;
          const uint32_t v1 = c1 == 2 ? pos : c1 == 0 ? neg : 0u;
          h[j / 2] = v0 | (v1 << 16);
        }
        *reinterpret_cast<uint4*>(d + 8 * q) = make_uint4(h[0], h[1], h[2], h[3]);
      }
    }
  }
}

template <int NT>
cudaError_t launch_ternary_bucket(const TernaryGemvParams& p, Stream stream) {
  const int64_t rows_per_block = static_cast<int64_t>(kTernaryWarps) * TernaryTile<NT>::kRows;
  const dim3 grid(static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(p.splits));
  gemv_ternary_kernel<NT><<<grid, kTernaryWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

int ternary_rows_per_warp(int64_t n) {
  return n <= 1 ? TernaryTile<1>::kRows
         : n <= 2 ? TernaryTile<2>::kRows
         : n <= 4 ? TernaryTile<4>::kRows
                  : TernaryTile<8>::kRows;
}

bool aligned16(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; }

}  // namespace

bool ternary_weight_supported(const LinearArgs& a) {
  return a.scheme == QuantScheme::kTernary && a.w_dtype == DType::kU8 && a.w_scales != nullptr &&
         (a.w_group == 32 || a.w_group == 64 || a.w_group == 128 || a.w_group == 256) && a.in % 64 == 0 &&
         a.in % a.w_group == 0 && a.w_stride % 16 == 0 && a.w_stride * 4 >= a.in && aligned16(a.w);
}

bool gemv_ternary_supported(const LinearArgs& a) {
  return ternary_weight_supported(a) && a.n >= 1 && a.n <= kGemvTernaryMaxTokens && aligned16(a.x) &&
         a.x_stride % 4 == 0;
}

GemvShape plan_gemv_ternary(const LinearArgs& a, int sm_count) {
  GemvShape s;
  s.vector_loads = true;
  s.step = kTernaryStep;
  s.rows_per_warp = ternary_rows_per_warp(a.n);
  plan_k_splits(s, a.in, (a.out + TernaryTile<1>::kRows - 1) / TernaryTile<1>::kRows, kTernaryStep, kTernaryStep,
                sm_count);
  return s;
}

cudaError_t launch_gemv_ternary(const LinearArgs& a, const GemvShape& shape, float* partial, Stream stream) {
  TernaryGemvParams p;
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.w = static_cast<const uint8_t*>(a.w);
  fill_common(p, a, shape, partial);
  p.scales = a.w_scales;
  p.group = a.w_group;
  const cudaError_t e = p.n <= 1   ? launch_ternary_bucket<1>(p, stream)
                        : p.n <= 2 ? launch_ternary_bucket<2>(p, stream)
                        : p.n <= 4 ? launch_ternary_bucket<4>(p, stream)
                                   : launch_ternary_bucket<8>(p, stream);
  if (e != cudaSuccess || shape.splits == 1) return e;
  return launch_gemv_reduce(partial, shape.splits, a.n, a.out, a.bias, a.bias_dtype, nullptr, a.y, a.y_stride, stream);
}

cudaError_t launch_dequantize_ternary(const LinearArgs& a, uint16_t* dst, int64_t dst_stride, Stream stream) {
  if (a.out == 0) return cudaSuccess;
  if (!ternary_weight_supported(a) || dst_stride % 8 != 0 || !aligned16(dst)) return cudaErrorInvalidValue;
  const int threads = 128;
  const int64_t blocks = a.in / 32;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((blocks + threads - 1) / threads, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(a.out, 65535)));
  dequantize_ternary_kernel<<<grid, threads, 0, stream>>>(static_cast<const uint8_t*>(a.w), a.w_stride, a.w_scales,
                                                         a.w_group, a.out, a.in, dst, dst_stride);
  return cudaGetLastError();
}

}  // namespace tachyon::ops::cuda::detail
