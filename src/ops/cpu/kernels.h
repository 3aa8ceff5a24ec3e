// The fast CPU kernels behind ops:: (x86-64: AVX2 + FMA + F16C baseline, AVX-512 variants for
// linear). They take raw pointers, strides (in elements) and sizes — no Tensors, nothing of the
// engine; ops.cpp checks arguments and the CPU backend (backend.cpp) unwraps them. The row layout,
// the cache view and the attention batch are ops/kernel_types.h's, shared with the CUDA kernels.
// Each kernel parallelises itself with parallel_for and logs once which variant ran. Only called
// when active_isa() != kScalar.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "ops/kernel_types.h"
#include "ops/ops.h"

namespace tachyon::ops::cpu {

// y = x · W^T (+ bias).
struct LinearArgs {
  const float* x = nullptr;  // [n, in] f32, rows x_stride apart
  int64_t x_stride = 0;
  const void* w = nullptr;  // [out, in] f32 / f16 / bf16 (w_dtype), rows w_stride apart
  DType w_dtype = DType::kF32;
  int64_t w_stride = 0;
  const float* bias = nullptr;  // [out] f32, or null
  float* y = nullptr;           // [n, out] f32, rows y_stride apart
  int64_t y_stride = 0;
  int64_t n = 0, in = 0, out = 0;
  // GEMV only: every token through the batch-1 tile, so that a row's summation order never
  // depends on how many tokens share the call (batch-invariant outputs).
  bool per_token = false;
};

// How linear runs a problem (chosen by linear(); the benchmark and tests may force one).
enum class LinearAlgo : uint8_t {
  kAuto,
  kGemv,  // register-blocked rows x tokens, the weight streamed once per group of a few tokens
  kGemm,  // packed weight panels, MR x NR micro-tiles, the weight read once for all tokens
};
void linear(const LinearArgs& args, LinearAlgo algo = LinearAlgo::kAuto);

// y[r] = x[r] / rms(x[r]) * weight.
void rms_norm(const float* x, const RowLayout& x_rows,        // [rows, d] f32
              const float* weight,                            // [d] f32
              float eps, float* y, const RowLayout& y_rows);  // [rows, d] f32
// residual[r] += x[r]; y[r] = rms_norm(residual[r]).
void add_rms_norm(float* residual, const RowLayout& residual_rows,  // [rows, d] f32, updated
                  const float* x, const RowLayout& x_rows,          // [rows, d] f32
                  const float* weight,                              // [d] f32
                  float eps, float* y, const RowLayout& y_rows);    // [rows, d] f32

// In place; x[t, h, :] at x + t * token_stride + h * head_stride.
void rope(float* x,  // [n, heads, head_dim] f32
          int64_t n, int64_t heads, int64_t token_stride, int64_t head_stride,
          const int32_t* positions,  // [n] i32
          const RopeTable& table);

void silu_mul(const float* gate, const RowLayout& gate_rows,  // [rows, ff] f32
              const float* up, const RowLayout& up_rows,      // [rows, ff] f32
              float* out, const RowLayout& out_rows);         // [rows, ff] f32

void softmax(float* x, const RowLayout& rows);  // [rows, d] f32, in place

void embedding(const void* table, DType table_dtype, int64_t table_stride,  // [vocab, d] f32/f16/bf16
               int64_t d, const int32_t* ids, int64_t n,                    // ids [n] i32, each < vocab
               float* out, int64_t out_stride);                             // [n, d] f32

// Uniform values offset + bound * [-1, 1): element i from splitmix64(fill_uniform_base(seed,
// stream) + i), 24 random bits, one fused multiply-add; the CUDA backend draws the same values.
uint64_t fill_uniform_base(uint64_t seed, uint64_t stream);
void fill_uniform(void* data, DType dtype, int64_t count, uint64_t seed, uint64_t stream, float bound, float offset);

// k/v[t, h, :] at k + t * k_token_stride + h * k_head_stride (and likewise for v).
void store_kv(const float* k, int64_t k_token_stride, int64_t k_head_stride,  // [n, num_kv_heads, head_dim] f32
              const float* v, int64_t v_token_stride, int64_t v_head_stride,  // [n, num_kv_heads, head_dim] f32
              int64_t n, const int32_t* slot_mapping,                         // [n] i32; < 0: skip the token
              const KvCacheView& cache);

// q[t, h, :] at q + t * q_token_stride + h * q_head_stride; out likewise.
void paged_attention(const float* q, int64_t q_token_stride, int64_t q_head_stride,  // [n, num_heads, head_dim] f32
                     int64_t num_heads, const KvCacheView& cache, const AttentionBatch& batch,
                     const AttentionParams& params,
                     float* out, int64_t out_token_stride, int64_t out_head_stride);  // [n, num_heads, head_dim] f32

}  // namespace tachyon::ops::cpu
