// store_kv: copies each token's K/V heads into its cache slot (f32 rows by memcpy; f16/bf16
// caches through the scalar round-to-nearest-even conversions of core/dtype.h, i8/f8e4m3 caches
// through the reference row quantizer, so every path stores identical bits), tokens split over
// the threads. Tokens with a negative slot (padding) are skipped.
#if defined(__x86_64__)

#include <algorithm>
#include <cstring>

#include "core/thread_pool.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/reference.h"

namespace tachyon::ops::cpu {
namespace {

// Row `row` ((slot, head) index) of the cache from src[head_dim].
void store_row(const float* src, int64_t head_dim, DType dtype, void* cache, float* scales, int64_t row) {
  const int64_t offset = row * head_dim;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(cache) + offset, src, static_cast<size_t>(head_dim) * sizeof(float));
      break;
    case DType::kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(cache) + offset;
      for (int64_t i = 0; i < head_dim; ++i) dst[i] = f32_to_bf16(src[i]);
      break;
    }
    case DType::kF16: {
      uint16_t* dst = static_cast<uint16_t*>(cache) + offset;
      for (int64_t i = 0; i < head_dim; ++i) dst[i] = f32_to_f16(src[i]);
      break;
    }
    case DType::kI8:
    case DType::kF8E4M3:
      reference::quantize_kv_row(src, head_dim, dtype, static_cast<uint8_t*>(cache) + offset, scales + row);
      break;
    default: TACHYON_CHECK(false, "store_kv: cache dtype {}", dtype_name(dtype));
  }
}

}  // namespace

void store_kv(const float* k, int64_t k_token_stride, int64_t k_head_stride, const float* v, int64_t v_token_stride,
              int64_t v_head_stride, int64_t n, const int32_t* slot_mapping, const KvCacheView& cache) {
  log_path_once("store_kv: cpu {} cache", dtype_name(cache.dtype));
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, cache.num_kv_heads * cache.head_dim));
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = slot_mapping[t];
      if (slot < 0) continue;
      for (int64_t h = 0; h < cache.num_kv_heads; ++h) {
        const int64_t row = slot * cache.num_kv_heads + h;
        store_row(k + t * k_token_stride + h * k_head_stride, cache.head_dim, cache.dtype, cache.k, cache.k_scales, row);
        store_row(v + t * v_token_stride + h * v_head_stride, cache.head_dim, cache.dtype, cache.v, cache.v_scales, row);
      }
    }
  });
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
