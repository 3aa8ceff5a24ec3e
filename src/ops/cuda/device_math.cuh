// Device-side helpers shared by the kernels: element loads/stores of f32/f16/bf16 buffers (the
// conversions round to nearest even exactly as core/dtype.h does on the host), 16-byte vector
// unpacking (int8 weights and e4m3 codes too), the code * scale reads of quantized KV caches,
// streaming loads and warp reductions. Included by .cu files only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/kernel_types.h"

namespace tachyon::ops::cuda::detail {

constexpr unsigned kFullMask = 0xffffffffu;

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// The splitmix64 finalizer: counter-based random bits (ops/cpu/fill.cpp draws the same).
__host__ __device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Blocks of a grid-stride loop over `total` elements (at least 1, at most 65535).
inline unsigned grid_for(int64_t total, int threads) {
  return static_cast<unsigned>(max64(1, min64((total + threads - 1) / threads, 65535)));
}

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t bits) { return __uint_as_float(bits << 16); }

// f32 -> bf16 bits, round to nearest even, NaN kept quiet (core/dtype.h's f32_to_bf16).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float f16_bits_to_f32(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// f32 -> f16 bits, round to nearest even; overflow to Inf (IEEE, as core/dtype.h's f32_to_f16).
__device__ __forceinline__ uint16_t f32_to_f16_bits(float f) {
  if (f != f) return static_cast<uint16_t>((__float_as_uint(f) >> 16 & 0x8000u) | 0x7e00u);
  return __half_as_ushort(__float2half_rn(f));
}

// Element i of a float-typed buffer as f32; `dtype` is uniform across the launch.
__device__ __forceinline__ float load_as_f32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store_from_f32(void* base, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kF16: static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(value); break;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(value); break;
    default: static_cast<float*>(base)[i] = value; break;
  }
}

// A 16-bit copy's element (cuda_types.h Rows16): f16 or bf16 bits, rounded to nearest even.
__device__ __forceinline__ uint16_t f32_to_16_bits(float value, DType dtype) {
  return dtype == DType::kF16 ? f32_to_f16_bits(value) : f32_to_bf16_bits(value);
}

// Four consecutive values of a 16-bit copy in one 8-byte store (base + i 8-byte aligned).
__device__ __forceinline__ void store4_16(void* base, DType dtype, int64_t i, float4 v) {
  uint2 packed;
  packed.x = static_cast<uint32_t>(f32_to_16_bits(v.x, dtype)) | static_cast<uint32_t>(f32_to_16_bits(v.y, dtype)) << 16;
  packed.y = static_cast<uint32_t>(f32_to_16_bits(v.z, dtype)) | static_cast<uint32_t>(f32_to_16_bits(v.w, dtype)) << 16;
  *reinterpret_cast<uint2*>(static_cast<uint16_t*>(base) + i) = packed;
}

// Compile-time element traits: storage type, elements per 16-byte vector, unpacking.
template <DType D>
struct Elem;

template <>
struct Elem<DType::kF32> {
  using T = float;
  static constexpr int kVec = 4;
  __device__ __forceinline__ static float load(const T* p, int64_t i) { return p[i]; }
  __device__ __forceinline__ static void unpack(const uint4& u, float* f) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
  }
};

template <>
struct Elem<DType::kBF16> {
  using T = uint16_t;
  static constexpr int kVec = 8;
  __device__ __forceinline__ static float load(const T* p, int64_t i) { return bf16_bits_to_f32(p[i]); }
  // Little endian: the element at the lower address is the low half of each word.
  __device__ __forceinline__ static void unpack(const uint4& u, float* f) {
    f[0] = __uint_as_float(u.x << 16);
    f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16);
    f[3] = __uint_as_float(u.y & 0xffff0000u);
    f[4] = __uint_as_float(u.z << 16);
    f[5] = __uint_as_float(u.z & 0xffff0000u);
    f[6] = __uint_as_float(u.w << 16);
    f[7] = __uint_as_float(u.w & 0xffff0000u);
  }
};

template <>
struct Elem<DType::kF16> {
  using T = uint16_t;
  static constexpr int kVec = 8;
  __device__ __forceinline__ static float load(const T* p, int64_t i) { return f16_bits_to_f32(p[i]); }
  __device__ __forceinline__ static void unpack(const uint4& u, float* f) {
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      memcpy(&h, &words[i], 4);
      const float2 v = __half22float2(h);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
};

// int8 weights (per-channel int8, the scale applied once per output): 16 per load. Each byte b
// becomes the float 2^23 + (b + 128) by placing b ^ 0x80 in the mantissa of 2^23, minus 2^23 + 128:
// one byte permute and one add per weight, no integer-to-float conversion.
template <>
struct Elem<DType::kI8> {
  using T = int8_t;
  static constexpr int kVec = 16;
  __device__ __forceinline__ static float load(const T* p, int64_t i) { return static_cast<float>(p[i]); }
  __device__ __forceinline__ static void unpack(const uint4& u, float* f) {
    const uint32_t words[4] = {u.x ^ 0x80808080u, u.y ^ 0x80808080u, u.z ^ 0x80808080u, u.w ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        f[4 * i + b] = __uint_as_float(__byte_perm(words[i], 0x4b000000u, 0x7540u | b)) - 8388736.0f;
      }
    }
  }
};

// e4m3 (OCP e4m3fn) codes of a quantized KV cache, 16 per load. An e4m3 byte s.eeee.mmm placed in
// f16 bits as s.0eeee.mmm0000000 is the same number times 2^-8, subnormals included (both formats
// step by 2^(exponent - bias - 3) with the exponent field 0 read as 1): unpack_raw() gives that,
// two bytes per f16x2 conversion, and unpack() multiplies the 2^8 back (exact). The NaN codes
// 0x7f / 0xff read as +-480 here; store_kv never writes them (a non-finite row has codes 0 and a
// NaN scale).
template <>
struct Elem<DType::kF8E4M3> {
  using T = uint8_t;
  static constexpr int kVec = 16;
  static constexpr float kRawUnit = 256.0f;  // unpack() = unpack_raw() * kRawUnit
  __device__ __forceinline__ static float load(const T* p, int64_t i) {
    const uint32_t b = p[i];
    return __half2float(__ushort_as_half(static_cast<uint16_t>((b & 0x80u) << 8 | (b & 0x7fu) << 7))) * kRawUnit;
  }
  // f[0..3] = the 4 codes of `w` (lowest address first) times 2^-8.
  __device__ __forceinline__ static void unpack_raw4(uint32_t w, float* f) {
    // Bytes [0, b0, 0, b1] and [0, b2, 0, b3]: each code in the high byte of a 16-bit half, then
    // everything but the sign moved down one bit into the f16 exponent and mantissa.
    const uint32_t lo = __byte_perm(w, 0u, 0x1404u), hi = __byte_perm(w, 0u, 0x3424u);
    const uint32_t h01 = (lo & 0x80008000u) | ((lo & 0x7f007f00u) >> 1);
    const uint32_t h23 = (hi & 0x80008000u) | ((hi & 0x7f007f00u) >> 1);
    __half2 a, b;
    memcpy(&a, &h01, 4);
    memcpy(&b, &h23, 4);
    const float2 fa = __half22float2(a), fb = __half22float2(b);
    f[0] = fa.x;
    f[1] = fa.y;
    f[2] = fb.x;
    f[3] = fb.y;
  }
  __device__ __forceinline__ static void unpack_raw(const uint4& u, float* f) {
    unpack_raw4(u.x, f);
    unpack_raw4(u.y, f + 4);
    unpack_raw4(u.z, f + 8);
    unpack_raw4(u.w, f + 12);
  }
  __device__ __forceinline__ static void unpack(const uint4& u, float* f) {
    unpack_raw(u, f);
#pragma unroll
    for (int i = 0; i < 16; ++i) f[i] *= kRawUnit;
  }
};

// Quantized KV caches (ops.h KvLayer): element = code * scale of its (slot, kv head) row, one f32
// rounding of the exact code value times the scale, as the reference computes it. For e4m3 the
// 2^8 of unpack_raw() goes into the scale instead: (scale * 2^8) is exact (no overflow: a scale
// is at most FLT_MAX / 448), so (scale * 2^8) * (code * 2^-8) rounds the same product once.
__host__ __device__ constexpr bool is_quantized_kv(DType d) { return d == DType::kI8 || d == DType::kF8E4M3; }

// f[0..3] = the 4 codes of `w` (lowest address first) times `scale`.
template <DType D>
__device__ __forceinline__ void dequantize4(uint32_t w, float scale, float* f) {
  static_assert(D == DType::kI8 || D == DType::kF8E4M3, "a quantized KV cache dtype");
  if constexpr (D == DType::kI8) {
    // Elem<kI8>'s trick: byte b ^ 0x80 in the mantissa of 2^23 is 2^23 + 128 + b.
    const uint32_t x = w ^ 0x80808080u;
#pragma unroll
    for (int b = 0; b < 4; ++b) f[b] = (__uint_as_float(__byte_perm(x, 0x4b000000u, 0x7540u | b)) - 8388736.0f) * scale;
  } else {
    Elem<DType::kF8E4M3>::unpack_raw4(w, f);
    const float s = scale * Elem<DType::kF8E4M3>::kRawUnit;
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] *= s;
  }
}

// f[0..15] = the 16 codes of `u` times `scale`.
template <DType D>
__device__ __forceinline__ void dequantize16(const uint4& u, float scale, float* f) {
  dequantize4<D>(u.x, scale, f);
  dequantize4<D>(u.y, scale, f + 4);
  dequantize4<D>(u.z, scale, f + 8);
  dequantize4<D>(u.w, scale, f + 12);
}

// The same for a chunk of 4 or 16 codes, by its load type.
template <DType D>
__device__ __forceinline__ void dequantize(uint32_t w, float scale, float* f) { dequantize4<D>(w, scale, f); }
template <DType D>
__device__ __forceinline__ void dequantize(const uint4& u, float scale, float* f) { dequantize16<D>(u, scale, f); }

// An int4 history row's (s, lo) (.x, .y) from its 4 bytes of params, two f16 (ops.h KvLayer).
__device__ __forceinline__ float2 int4_history_params(uint32_t bits) {
  return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu))),
                     __half2float(__ushort_as_half(static_cast<unsigned short>(bits >> 16))));
}
__device__ __forceinline__ float2 int4_history_params(const void* params, int64_t row) {
  return int4_history_params(static_cast<const uint32_t*>(params)[row]);
}

// Elements off .. off + 3 (off % 4 == 0) of K and V history row `row` (ops.h KvLayer: int8 as
// code * s, int4 as lo + code * s). Rows are 4-byte (int8) or 2-byte (int4) aligned: head_dim % 4 == 0.
__device__ __forceinline__ void load_history4(const KvCacheView& cache, int64_t row, int64_t off, float4& kf,
                                              float4& vf) {
  const int64_t hd = cache.head_dim;
  float f[4];
  if (cache.history_bits == 8) {
    const int64_t at = row * hd + off;
    dequantize4<DType::kI8>(*reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(cache.hk) + at),
                            static_cast<const float*>(cache.hk_params)[row], f);
    kf = make_float4(f[0], f[1], f[2], f[3]);
    dequantize4<DType::kI8>(*reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(cache.hv) + at),
                            static_cast<const float*>(cache.hv_params)[row], f);
    vf = make_float4(f[0], f[1], f[2], f[3]);
    return;
  }
  const int64_t at = row * (hd / 2) + off / 2;
  const uint32_t kc = *reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(cache.hk) + at);
  const uint32_t vc = *reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(cache.hv) + at);
  const float2 kp = int4_history_params(cache.hk_params, row), vp = int4_history_params(cache.hv_params, row);
  const float ks = kp.x, klo = kp.y, vs = vp.x, vlo = vp.y;
  kf = make_float4(klo + static_cast<float>(kc & 0xfu) * ks, klo + static_cast<float>((kc >> 4) & 0xfu) * ks,
                   klo + static_cast<float>((kc >> 8) & 0xfu) * ks, klo + static_cast<float>(kc >> 12) * ks);
  vf = make_float4(vlo + static_cast<float>(vc & 0xfu) * vs, vlo + static_cast<float>((vc >> 4) & 0xfu) * vs,
                   vlo + static_cast<float>((vc >> 8) & 0xfu) * vs, vlo + static_cast<float>(vc >> 12) * vs);
}

// A 16-byte load that bypasses L1 (each weight byte is read once per call): read-only path.
__device__ __forceinline__ uint4 load_stream_16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// One level of warp_transpose_sum: lanes with bit S set keep values [S, 2S), the others [0, S),
// and each receives the half it keeps from its partner lane^S. Recursion keeps every index a
// compile-time constant (so the array stays in registers).
template <int S, int N>
__device__ __forceinline__ void transpose_sum_level(float (&v)[N], int lane) {
  if constexpr (S >= 1) {
    const bool upper = (lane & S) != 0;
#pragma unroll
    for (int i = 0; i < S; ++i) {
      const float send = upper ? v[i] : v[i + S];
      const float keep = upper ? v[i + S] : v[i];
      v[i] = keep + __shfl_xor_sync(kFullMask, send, S);
    }
    transpose_sum_level<S / 2, N>(v, lane);
  }
}

// Sums N values (a power of two <= 32) of every lane across the warp in fewer shuffles than N
// warp_sum()s (N - 1 + N log2(32 / N) instead of 5 N). On return lane L holds the warp's total of
// value (L mod N). Lanes combine in warp_sum()'s order (xor 16, 8, ..., 1) whatever N is — the
// levels above N on all N values first, then the transposed ones — so every total has
// warp_sum()'s bits: a GEMV's result does not depend on how many tokens shared the warp.
template <int N>
__device__ __forceinline__ float warp_transpose_sum(float (&v)[N]) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N must be a power of two <= 32");
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 16; offset >= N; offset /= 2) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(kFullMask, v[i], offset);
  }
  transpose_sum_level<N / 2, N>(v, lane);
  return v[0];
}

// Block-wide sum (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// `scratch` holds 32 floats of shared memory; the call ends with the block synchronised.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < warps; ++i) total += scratch[i];
  return total;
}

}  // namespace tachyon::ops::cuda::detail
