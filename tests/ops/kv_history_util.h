// Test helpers for caches with history blocks (ops.h KvLayer): move some of a batch's blocks into
// int8 / int4 history pools the way a block manager and compress_kv_blocks would, and read a
// sequence's K/V back through its block table as the attention reference sees them.
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "ops/cpu/reference.h"
#include "ops/ops.h"
#include "ops/ops_test_util.h"

namespace tachyon::testing {

// Gives `cache` history pools of `bits` (8 or 4) and moves about `share` of the blocks the tables
// name (entries >= 0) into them: each is compressed by the reference, its entry becomes
// num_blocks + h, and the primary block is poisoned (NaN values, or NaN scales) so that a kernel
// reading it instead shows up. Blocks must not be shared between sequences.
inline void move_blocks_to_history(KvLayer& cache, AttentionMetadata& meta, int bits, std::mt19937& rng,
                                   double share = 0.5) {
  const int64_t num_blocks = cache.k.size(0), bs = cache.k.size(1), kvh = cache.k.size(2), hd = cache.k.size(3);
  int32_t* tables = meta.block_tables.data<int32_t>();
  std::vector<int32_t*> chosen;
  std::bernoulli_distribution pick(share);
  for (int64_t i = 0; i < meta.block_tables.numel(); ++i) {
    if (tables[i] >= 0 && pick(rng)) chosen.push_back(&tables[i]);
  }
  const int64_t nh = std::max<int64_t>(1, static_cast<int64_t>(chosen.size()));
  const DType code_dtype = bits == 8 ? DType::kI8 : DType::kU8;
  const int64_t row = bits == 8 ? hd : hd / 2, params = bits == 8 ? 1 : 2;
  cache.hk = Tensor::zeros({nh, bs, kvh, row}, code_dtype);
  cache.hv = Tensor::zeros({nh, bs, kvh, row}, code_dtype);
  const DType params_dtype = bits == 8 ? DType::kF32 : DType::kF16;  // ops.h KvLayer
  cache.hk_params = nan_tensor({nh, bs, kvh, params}, params_dtype);
  cache.hv_params = nan_tensor({nh, bs, kvh, params}, params_dtype);
  Tensor pairs = Tensor::empty({static_cast<int64_t>(chosen.size()), 2}, DType::kI32);
  for (size_t h = 0; h < chosen.size(); ++h) {
    pairs.data<int32_t>()[2 * h] = *chosen[h];
    pairs.data<int32_t>()[2 * h + 1] = static_cast<int32_t>(h);
  }
  if (!chosen.empty()) ops::reference::compress_kv_blocks(pairs, cache);
  for (size_t h = 0; h < chosen.size(); ++h) {
    const int64_t b = *chosen[h];
    for (Tensor* pool : {&cache.k, &cache.v}) {
      Tensor block = pool->select(0, b);
      if (ops::is_quantized_kv_dtype(pool->dtype())) continue;
      fill_nan(block);
    }
    for (Tensor* scales : {&cache.k_scales, &cache.v_scales}) {
      if (!scales->defined()) continue;
      Tensor block = scales->select(0, b);
      fill_nan(block);
    }
    *chosen[h] = static_cast<int32_t>(num_blocks + static_cast<int64_t>(h));
  }
}

// Positions [0, context_len) of one sequence's K (which 0) or V (1) through its block table:
// [context_len, num_kv_heads, head_dim] f32, primary blocks as code * scale, history blocks as
// their codes decode. Entries < 0 give NaN.
inline Tensor gather_sequence(const KvLayer& cache, const int32_t* table, int context_len, int which) {
  const int64_t num_blocks = cache.k.size(0), bs = cache.k.size(1), kvh = cache.k.size(2), hd = cache.k.size(3);
  const Tensor& pool = which == 0 ? cache.k : cache.v;
  const Tensor& scales = which == 0 ? cache.k_scales : cache.v_scales;
  const Tensor values = pool.to_f32();
  const int bits = ops::kv_history_bits(cache);
  Tensor out = Tensor::empty({context_len, kvh, hd}, DType::kF32);
  for (int j = 0; j < context_len; ++j) {
    const int64_t block = table[j / bs];
    for (int64_t h = 0; h < kvh; ++h) {
      float* dst = out.data<float>() + (static_cast<int64_t>(j) * kvh + h) * hd;
      if (block < 0) {
        for (int64_t i = 0; i < hd; ++i) dst[i] = std::nanf("");
        continue;
      }
      if (block < num_blocks) {
        const int64_t r = (block * bs + j % bs) * kvh + h;
        const float s = scales.defined() ? scales.data<float>()[r] : 1.0f;
        for (int64_t i = 0; i < hd; ++i) dst[i] = values.data<float>()[r * hd + i] * s;
        continue;
      }
      const int64_t r = ((block - num_blocks) * bs + j % bs) * kvh + h;
      const Tensor& codes = which == 0 ? cache.hk : cache.hv;
      const Tensor& params = which == 0 ? cache.hk_params : cache.hv_params;
      const int64_t code_bytes = bits == 8 ? hd : hd / 2;
      for (int64_t i = 0; i < hd; ++i) {
        dst[i] = ops::reference::history_value(static_cast<const uint8_t*>(codes.raw_data()) + r * code_bytes,
                                               static_cast<const uint8_t*>(params.raw_data()) + r * 4, bits, i);
      }
    }
  }
  return out;
}

}  // namespace tachyon::testing
