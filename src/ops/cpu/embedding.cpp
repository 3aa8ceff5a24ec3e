// embedding (AVX2): rows of an f32 table are copied; f16/bf16 rows are widened 8 at a time.
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/thread_pool.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/vec_avx2.h"

namespace tachyon::ops::cpu {
namespace {

template <class L>
void widen_row(const typename L::T* src, int64_t d, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(dst + i, L::load(src + i));
  for (; i < d; ++i) dst[i] = L::scalar(src[i]);
}

}  // namespace

void embedding(const void* table, DType table_dtype, int64_t table_stride, int64_t d, const int32_t* ids, int64_t n,
               float* out, int64_t out_stride) {
  log_path_once("embedding: avx2 {}", dtype_name(table_dtype));
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1));
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row = static_cast<int64_t>(ids[t]) * table_stride;
      float* dst = out + t * out_stride;
      switch (table_dtype) {
        case DType::kF32:
          std::memcpy(dst, static_cast<const float*>(table) + row, static_cast<size_t>(d) * sizeof(float));
          break;
        case DType::kBF16: widen_row<avx2::LoadBf16>(static_cast<const uint16_t*>(table) + row, d, dst); break;
        case DType::kF16: widen_row<avx2::LoadF16>(static_cast<const uint16_t*>(table) + row, d, dst); break;
        default: TACHYON_CHECK(false, "embedding: table dtype {}", dtype_name(table_dtype));
      }
    }
  });
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
