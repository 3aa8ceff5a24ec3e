// Tensor-core building blocks of the attention kernels (sm_80 and later): asynchronous 16-byte
// copies into shared memory (cp.async), 8x8 matrix loads from shared memory (ldmatrix), and the
// m16n8k16 matrix multiply-accumulate with f16/bf16 inputs and f32 accumulators (mma.sync).
// Fragment layouts (PTX ISA, "mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A 16x16 row-major, 4 registers of 2 elements: {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}
//   B 16x8 "col" (element (k, n)), 2 registers: {(k = 2t..2t+1, n = g), (k = 2t+8.., n = g)}
//   C 16x8 f32, 4 values: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
// so the C fragments of two adjacent 8-column tiles are, once rounded to 16 bits, the A fragment
// of the 16-column slab they cover (FlashAttention-2's trick: softmax(QK^T) feeds P·V from
// registers). On older architectures every function here traps; callers check the device first
// (mma_attention_supported(), mma_decode_supported()). Quantized caches (i8, f8e4m3) go through
// stage_quantized_kv_tile and expand_quantized_tile into the same 16-bit tiles. MmaKvPipeline is
// the K/V tile pipeline that the decode and prefill kernels share.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/cuda_types.h"
#include "ops/cuda/device_math.cuh"

namespace tachyon::ops::cuda::detail {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TACHYON_MMA_ENABLED 1
#else
#define TACHYON_MMA_ENABLED 0
#endif

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes 0 writes 16 zero bytes without reading.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
#if TACHYON_MMA_ENABLED
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#else
  __trap();
#endif
}

// 4 bytes global -> shared (through L1: a quantized cache's scales, gathered one per key);
// src_bytes 0 writes 4 zero bytes without reading.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
#if TACHYON_MMA_ENABLED
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#else
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if TACHYON_MMA_ENABLED
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if TACHYON_MMA_ENABLED
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Four 8x8 b16 matrices; lane i gives the address of row i % 8 of matrix i / 8, and register j
// receives matrix j's elements (g, 2t..2t+1) (transposed: (2t..2t+1, g)).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if TACHYON_MMA_ENABLED
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#else
  __trap();
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if TACHYON_MMA_ENABLED
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#else
  __trap();
#endif
}

// The 16-bit element type of a cache dtype (kBF16 or kF16) as the tensor cores see it.
template <DType D>
struct MmaType;

template <>
struct MmaType<DType::kBF16> {
  // Two f32 -> one register of two bf16 (round to nearest even), lo in the low half.
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if TACHYON_MMA_ENABLED
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
  }
};

template <>
struct MmaType<DType::kF16> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if TACHYON_MMA_ENABLED
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
  }
};

// Stages `rows` K and V rows of head_dim HD (16-bit) from the paged cache into shared memory
// tiles [rows][HD + 8] (the 8-element pad puts the 8 rows of every ldmatrix in distinct banks)
// with cp.async, one 16-byte chunk per thread and step. Row t holds key first_key + t when that
// key is below key_end, zeros otherwise. `slot_of(key)` gives the element offset of a key's row
// for this KV head, or -1 - r for a key in a history block (row r of the history pools):
// `history(r, t, chunk)` then stages that row's codes for tile row t (the thread of each 8-element
// chunk takes a share; the pipeline decodes them into the tile once they landed). Every thread of
// the block (THREADS of them) takes part; the caller commits.
template <int HD, int ROWS, int THREADS, typename SlotOf, typename History>
__device__ __forceinline__ void stage_kv_tile(const uint16_t* k_cache, const uint16_t* v_cache, int first_key,
                                              int key_end, uint16_t* ks, uint16_t* vs, SlotOf slot_of,
                                              History history) {
  constexpr int kChunksPerRow = HD / 8;
  constexpr int kRowsPerStep = THREADS / kChunksPerRow;
  static_assert(THREADS % kChunksPerRow == 0 && ROWS % kRowsPerStep == 0, "tile shape");
  constexpr int kStride = HD + 8;
  const int chunk = threadIdx.x % kChunksPerRow;
#pragma unroll
  for (int t = threadIdx.x / kChunksPerRow; t < ROWS; t += kRowsPerStep) {
    const int key = first_key + t;
    const bool ok = key < key_end;
    const int64_t at = ok ? slot_of(key) : 0;
    if (at < 0) {
      history(-1 - at, t, chunk);
      continue;
    }
    const int64_t off = at + chunk * 8;
    cp_async_16(smem_address(ks + t * kStride + chunk * 8), k_cache + off, ok ? 16 : 0);
    cp_async_16(smem_address(vs + t * kStride + chunk * 8), v_cache + off, ok ? 16 : 0);
  }
}

// The quantized cache's counterpart (i8 / f8e4m3 codes, ops.h KvLayer): stages `rows` K and V
// code rows [rows][HD] (bytes, unpadded: they are read back in 16-byte chunks, never by
// ldmatrix) and their scales [rows] f32 with cp.async; rows past key_end are zero codes and zero
// scales. `row_of(key)` gives the (slot, kv head) index of a key's row: codes at row * HD, its
// scale at row.
template <int HD, int ROWS, int THREADS, typename RowOf>
__device__ __forceinline__ void stage_quantized_kv_tile(const uint8_t* k_cache, const uint8_t* v_cache,
                                                        const float* k_scales, const float* v_scales, int first_key,
                                                        int key_end, uint8_t* kq, uint8_t* vq, float* k_scale,
                                                        float* v_scale, RowOf row_of) {
  constexpr int kChunksPerRow = HD / 16;
  constexpr int kRowsPerStep = THREADS / kChunksPerRow;
  static_assert(THREADS % kChunksPerRow == 0 && ROWS % kRowsPerStep == 0, "tile shape");
  const int chunk = threadIdx.x % kChunksPerRow;
#pragma unroll
  for (int t = threadIdx.x / kChunksPerRow; t < ROWS; t += kRowsPerStep) {
    const int key = first_key + t;
    const bool ok = key < key_end;
    const int64_t row = ok ? row_of(key) : 0;
    const int64_t off = row * HD + chunk * 16;
    cp_async_16(smem_address(kq + t * HD + chunk * 16), k_cache + off, ok ? 16 : 0);
    cp_async_16(smem_address(vq + t * HD + chunk * 16), v_cache + off, ok ? 16 : 0);
    if (chunk == 0) {
      cp_async_4(smem_address(k_scale + t), k_scales + row, ok ? 4 : 0);
      cp_async_4(smem_address(v_scale + t), v_scales + row, ok ? 4 : 0);
    }
  }
}

// A staged quantized code tile [ROWS][HD] (stage_quantized_kv_tile's) as the codes' values in
// bf16 in a 16-bit tile [ROWS][HD + 8] that the bf16 mma code reads as it reads a bf16 cache's:
// exact, i8 codes and e4m3 values fit bf16's 8-bit significand; zero codes (rows past the end)
// give zeros. The scales stay out (the kernels apply them to scores and softmax weights). Every
// thread of the block (THREADS of them) takes part; the caller synchronizes around it.
template <DType D, int HD, int ROWS, int THREADS>
__device__ __forceinline__ void expand_quantized_tile(const uint8_t* codes, uint16_t* tile) {
  constexpr int kChunksPerRow = HD / 16;
  for (int c = threadIdx.x; c < ROWS * kChunksPerRow; c += THREADS) {
    const int t = c / kChunksPerRow, off = (c % kChunksPerRow) * 16;
    float f[16];
    dequantize16<D>(*reinterpret_cast<const uint4*>(codes + t * HD + off), 1.0f, f);
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = MmaType<DType::kBF16>::pack(f[2 * i], f[2 * i + 1]);
    uint4* dst = reinterpret_cast<uint4*>(tile + t * (HD + 8) + off);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

// ---- the K/V tile pipeline of the tensor-core attention kernels (decode_mma_kernel, prefill_mma_kernel) ----
constexpr int kMmaKeys = 64;  // keys per tile
constexpr int kQuantizedStages = 2;  // a quantized cache's stages of codes and scales

template <int HD>
__host__ __device__ constexpr int mma_tile_elems() {
  return kMmaKeys * (HD + 8);
}

// A quantized stage: K codes [kMmaKeys][HD], V codes [kMmaKeys][HD], K scales [kMmaKeys], V
// scales [kMmaKeys] (f32), in that order.
template <int HD>
__host__ __device__ constexpr size_t quantized_stage_bytes() {
  return 2 * static_cast<size_t>(kMmaKeys) * HD + 2 * static_cast<size_t>(kMmaKeys) * sizeof(float);
}

// The shared memory MmaKvPipeline<D, HD, ...> stages through. 16-bit caches: two stages of a K
// and V tile pair. Quantized caches: one bf16 K and V tile pair, then kQuantizedStages stages of
// codes and scales.
// A 16-bit cache with history pools also stages history rows' codes and parameters, per stage:
// K codes [kMmaKeys][HD] (int8; int4 uses the first HD / 2 bytes of each row), V codes, then K
// params [kMmaKeys][2] and V params (f32), in that order.
template <int HD>
__host__ __device__ constexpr size_t history_stage_bytes() {
  return 2 * static_cast<size_t>(kMmaKeys) * HD + 2 * static_cast<size_t>(kMmaKeys) * sizeof(uint32_t);
}

template <DType D, int HD>
__host__ __device__ constexpr size_t mma_kv_pipeline_bytes(bool history = false) {
  constexpr size_t tile = static_cast<size_t>(mma_tile_elems<HD>()) * sizeof(uint16_t);
  if (!is_quantized_kv(D) && history) return 2 * 2 * tile + 2 * history_stage_bytes<HD>() + kMmaKeys * sizeof(int32_t);
  return is_quantized_kv(D) ? 2 * tile + kQuantizedStages * quantized_stage_bytes<HD>() : 2 * 2 * tile;
}

// Streams the keys [first_key, key_end) of one sequence's paged cache for one KV head through
// shared memory (mma_kv_pipeline_bytes<D, HD>()) in tiles of kMmaKeys, with cp.async. 16-bit
// caches: a double buffer of K/V tile pairs (the next tile loads while this one is multiplied).
// Quantized caches (i8, f8e4m3): kQuantizedStages stages of codes and scales; once a tile's stage
// has landed the block expands its codes into the one bf16 K/V tile pair (expand_quantized_tile).
// Every thread of the block (THREADS of them) calls prologue(first_key, num_tiles) once, then
// tile(it, first_key, num_tiles) for it = 0 .. num_tiles - 1 in order, and ends each iteration
// with a __syncthreads() after its last read of the tile: the next tile() stages (16-bit) or
// expands (quantized) into the memory that tile was read from. Keys at or past key_end are
// staged as zeros (zero codes and zero scales). A kernel-local object, every function inlined:
// its members end up in the registers the kernels' own lambdas held before it was shared.
template <DType D, int HD, int THREADS>
struct MmaKvPipeline {
  static constexpr bool kQuantized = is_quantized_kv(D);

  // A staged tile as the mma code reads it.
  struct Tile {
    const uint16_t* ks;     // [kMmaKeys][HD + 8] the tile's K rows, 16 bits (bf16 for a quantized cache)
    const uint16_t* vs;     // [kMmaKeys][HD + 8] its V rows
    const float* k_scale;   // quantized: [kMmaKeys] scales of the tile's K rows; null otherwise
    const float* v_scale;   // and of its V rows
  };

  uint16_t* tiles;       // [2 stages (16-bit) or 1 (quantized)][K, V][kMmaKeys][HD + 8]
  uint8_t* code_stages;  // quantized: [kQuantizedStages] stages of quantized_stage_bytes<HD>(), after the tile pair
  const void* k_cache;   // KvCacheView's: [num_blocks, block_size, num_kv_heads, HD], D
  const void* v_cache;
  const float* k_scales;  // quantized: [num_blocks, block_size, num_kv_heads] f32
  const float* v_scales;
  const int32_t* block_table;  // [max_blocks_per_seq] i32, the sequence's
  int64_t block_size, num_kv_heads, kv_head;
  int key_end;
  KvCacheView history;  // its history pools (16-bit caches: entries >= num_blocks; history_bits 0: none)
  uint8_t* history_stages;  // 16-bit caches with history: 2 stages of history_stage_bytes<HD>(), after the tiles
  int32_t* history_flags;   // then [kMmaKeys]: which rows of the tile being read are history rows

  __device__ __forceinline__ MmaKvPipeline(unsigned char* smem, const KvCacheView& cache, const int32_t* table,
                                           int64_t kvh, int end)
      : tiles(reinterpret_cast<uint16_t*>(smem)),
        code_stages(smem + 2 * static_cast<size_t>(mma_tile_elems<HD>()) * sizeof(uint16_t)),
        k_cache(cache.k),
        v_cache(cache.v),
        k_scales(cache.k_scales),
        v_scales(cache.v_scales),
        block_table(table),
        block_size(cache.block_size),
        num_kv_heads(cache.num_kv_heads),
        kv_head(kvh),
        key_end(end),
        history(cache),
        history_stages(smem + 2 * 2 * static_cast<size_t>(mma_tile_elems<HD>()) * sizeof(uint16_t)),
        history_flags(reinterpret_cast<int32_t*>(history_stages + 2 * history_stage_bytes<HD>())) {}

  // The history row of a key in a history block, or -1 (a 16-bit cache's primary block).
  __device__ __forceinline__ int64_t history_row(int key) const {
    const int bs = static_cast<int>(block_size);  // <= 1024: 32-bit division
    const int64_t block = block_table[key / bs];
    if (history.history_bits == 0 || block < history.num_blocks) return -1;
    return ((block - history.num_blocks) * bs + key % bs) * num_kv_heads + kv_head;
  }

  // The (slot, kv head) row of a key: its codes or elements at row * HD, its scale at row.
  __device__ __forceinline__ int64_t row_of(int key) const {
    const int64_t block = block_table[key / block_size];
    return (block * block_size + key % block_size) * num_kv_heads + kv_head;
  }

  // Stages keys [first_key, first_key + kMmaKeys) (those below key_end) into stage `stage`; the
  // caller commits.
  __device__ __forceinline__ void stage_tile(int first_key, int stage) const {
    if constexpr (kQuantized) {
      uint8_t* kq = code_stages + stage * quantized_stage_bytes<HD>();
      uint8_t* vq = kq + kMmaKeys * HD;
      float* k_scale = reinterpret_cast<float*>(vq + kMmaKeys * HD);
      stage_quantized_kv_tile<HD, kMmaKeys, THREADS>(
          static_cast<const uint8_t*>(k_cache), static_cast<const uint8_t*>(v_cache), k_scales, v_scales, first_key,
          key_end, kq, vq, k_scale, k_scale + kMmaKeys, [this](int key) { return row_of(key); });
    } else {
      uint16_t* kt = tiles + stage * 2 * mma_tile_elems<HD>();
      stage_kv_tile<HD, kMmaKeys, THREADS>(
          static_cast<const uint16_t*>(k_cache), static_cast<const uint16_t*>(v_cache), first_key, key_end, kt,
          kt + mma_tile_elems<HD>(),
          [this](int key) -> int64_t {
            const int bs = static_cast<int>(block_size);  // <= 1024: 32-bit division
            const int64_t block = block_table[key / bs];
            if (history.history_bits != 0 && block >= history.num_blocks) {
              return -1 - (((block - history.num_blocks) * bs + key % bs) * num_kv_heads + kv_head);
            }
            return ((block * bs + key % bs) * num_kv_heads + kv_head) * HD;
          },
          [this, stage](int64_t row, int t, int chunk) {
            // Codes: 16-byte chunks of the row (HD / 2 bytes for int4, HD for int8), then its 4
            // bytes of parameters (an f32 s, or f16 s and lo) by the thread of the next chunk.
            uint8_t* kq = history_stages + stage * history_stage_bytes<HD>();
            uint8_t* vq = kq + kMmaKeys * HD;
            uint32_t* kp = reinterpret_cast<uint32_t*>(vq + kMmaKeys * HD);
            uint32_t* vp = kp + kMmaKeys;
            const int code_bytes = history.history_bits == 8 ? HD : HD / 2;
            const auto* kc = static_cast<const uint8_t*>(history.hk) + row * code_bytes;
            const auto* vc = static_cast<const uint8_t*>(history.hv) + row * code_bytes;
            if (chunk * 16 < code_bytes) {
              cp_async_16(smem_address(kq + t * HD + chunk * 16), kc + chunk * 16, 16);
              cp_async_16(smem_address(vq + t * HD + chunk * 16), vc + chunk * 16, 16);
            } else if (chunk * 16 == code_bytes) {
              cp_async_4(smem_address(kp + t), static_cast<const uint32_t*>(history.hk_params) + row, 4);
              cp_async_4(smem_address(vp + t), static_cast<const uint32_t*>(history.hv_params) + row, 4);
            }
          });
    }
  }

  // 16-bit caches with history: the staged codes of the tile's history rows (history_flags) of
  // stage `stage`, decoded (lo + c * s, or c * s for int8) and rounded to D into the
  // tile rows, 8 elements per thread and step.
  __device__ __forceinline__ void expand_history_rows(int stage, uint16_t* kt, uint16_t* vt) const {
    constexpr int kChunksPerRow = HD / 8;
    constexpr int kStride = HD + 8;
    const uint8_t* kq = history_stages + stage * history_stage_bytes<HD>();
    const uint8_t* vq = kq + kMmaKeys * HD;
    const uint32_t* kp = reinterpret_cast<const uint32_t*>(vq + kMmaKeys * HD);
    const uint32_t* vp = kp + kMmaKeys;
    const bool int8 = history.history_bits == 8;
    for (int e = threadIdx.x; e < kMmaKeys * kChunksPerRow; e += THREADS) {
      const int t = e / kChunksPerRow, chunk = e % kChunksPerRow;
      if (history_flags[t] == 0) continue;
      float kf[8], vf[8];
      if (int8) {
        const uint2 kc = *reinterpret_cast<const uint2*>(kq + t * HD + chunk * 8);
        const uint2 vc = *reinterpret_cast<const uint2*>(vq + t * HD + chunk * 8);
        const float ks = __uint_as_float(kp[t]), vs = __uint_as_float(vp[t]);
        dequantize4<DType::kI8>(kc.x, ks, kf);
        dequantize4<DType::kI8>(kc.y, ks, kf + 4);
        dequantize4<DType::kI8>(vc.x, vs, vf);
        dequantize4<DType::kI8>(vc.y, vs, vf + 4);
      } else {
        const uint32_t kc = *reinterpret_cast<const uint32_t*>(kq + t * HD + chunk * 4);
        const uint32_t vc = *reinterpret_cast<const uint32_t*>(vq + t * HD + chunk * 4);
        const float2 kpar = int4_history_params(kp[t]), vpar = int4_history_params(vp[t]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          kf[i] = kpar.y + static_cast<float>((kc >> (4 * i)) & 0xfu) * kpar.x;
          vf[i] = vpar.y + static_cast<float>((vc >> (4 * i)) & 0xfu) * vpar.x;
        }
      }
      *reinterpret_cast<uint4*>(kt + t * kStride + chunk * 8) =
          make_uint4(MmaType<D>::pack(kf[0], kf[1]), MmaType<D>::pack(kf[2], kf[3]), MmaType<D>::pack(kf[4], kf[5]),
                     MmaType<D>::pack(kf[6], kf[7]));
      *reinterpret_cast<uint4*>(vt + t * kStride + chunk * 8) =
          make_uint4(MmaType<D>::pack(vf[0], vf[1]), MmaType<D>::pack(vf[2], vf[3]), MmaType<D>::pack(vf[4], vf[5]),
                     MmaType<D>::pack(vf[6], vf[7]));
    }
  }

  // Starts the first tiles' loads. num_tiles may be 0 (an empty decode slice): nothing is staged.
  __device__ __forceinline__ void prologue(int first_key, int num_tiles) const {
    if constexpr (kQuantized) {
      // One commit group per tile, empty past the last, so that the wait in tile() counts uniformly.
      for (int st = 0; st < kQuantizedStages - 1; ++st) {
        if (st < num_tiles) stage_tile(first_key + st * kMmaKeys, st);
        cp_async_commit();
      }
    } else if (num_tiles > 0) {
      stage_tile(first_key, 0);
      cp_async_commit();
    }
  }

  // Stages the tile after tile `it` (16-bit) or kQuantizedStages - 1 after it (quantized), waits
  // for tile it and returns it, after the barrier(s) that make it visible to every thread.
  __device__ __forceinline__ Tile tile(int it, int first_key, int num_tiles) const {
    if constexpr (kQuantized) {
      // Stage it + kQuantizedStages - 1 reuses the stage tile it - 1 was expanded from (done at
      // the last barrier); then tile it's group is complete once at most the later ones pend.
      const int next = it + kQuantizedStages - 1;
      if (next < num_tiles) stage_tile(first_key + next * kMmaKeys, next % kQuantizedStages);
      cp_async_commit();
      cp_async_wait<kQuantizedStages - 1>();
    } else if (it + 1 < num_tiles) {
      stage_tile(first_key + it * kMmaKeys + kMmaKeys, (it + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    if constexpr (!kQuantized) {
      // Which rows of tile `it` are history rows, for expand_history_rows after the barrier (the
      // previous tile's expansion read these flags before the caller's last barrier).
      if (history.history_bits != 0 && threadIdx.x < kMmaKeys) {
        const int key = first_key + it * kMmaKeys + static_cast<int>(threadIdx.x);
        history_flags[threadIdx.x] = key < key_end && history_row(key) >= 0;
      }
    }
    __syncthreads();
    Tile t;
    t.ks = tiles + (kQuantized ? 0 : (it & 1) * 2 * mma_tile_elems<HD>());
    t.vs = t.ks + mma_tile_elems<HD>();
    if constexpr (!kQuantized) {
      if (history.history_bits != 0) {  // decode the tile's history rows into it (uniform branch)
        expand_history_rows(it & 1, const_cast<uint16_t*>(t.ks), const_cast<uint16_t*>(t.vs));
        __syncthreads();
      }
    }
    t.k_scale = nullptr;
    t.v_scale = nullptr;
    if constexpr (kQuantized) {
      // The previous tile's mma reads of the 16-bit tile ended at the caller's last barrier.
      const uint8_t* kq = code_stages + (it % kQuantizedStages) * quantized_stage_bytes<HD>();
      const uint8_t* vq = kq + kMmaKeys * HD;
      t.k_scale = reinterpret_cast<const float*>(vq + kMmaKeys * HD);
      t.v_scale = t.k_scale + kMmaKeys;
      expand_quantized_tile<D, HD, kMmaKeys, THREADS>(kq, tiles);
      expand_quantized_tile<D, HD, kMmaKeys, THREADS>(vq, tiles + mma_tile_elems<HD>());
      __syncthreads();
    }
    return t;
  }
};

}  // namespace tachyon::ops::cuda::detail
