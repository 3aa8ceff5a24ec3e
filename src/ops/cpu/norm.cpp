// rms_norm and the fused residual-add + rms_norm (AVX2). One row per inner loop, rows split over
// threads; the fused form adds, stores the residual and accumulates the sum of squares in one pass,
// then scales from L1 in a second.
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/vec_avx2.h"

namespace tachyon::ops::cpu {
namespace {

// Sum of squares of r[0, d) with four independent accumulators.
float sum_squares(const float* r, int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    const __m256 v0 = _mm256_loadu_ps(r + i), v1 = _mm256_loadu_ps(r + i + 8);
    const __m256 v2 = _mm256_loadu_ps(r + i + 16), v3 = _mm256_loadu_ps(r + i + 24);
    a0 = _mm256_fmadd_ps(v0, v0, a0);
    a1 = _mm256_fmadd_ps(v1, v1, a1);
    a2 = _mm256_fmadd_ps(v2, v2, a2);
    a3 = _mm256_fmadd_ps(v3, v3, a3);
  }
  for (; i + 8 <= d; i += 8) {
    const __m256 v = _mm256_loadu_ps(r + i);
    a0 = _mm256_fmadd_ps(v, v, a0);
  }
  float ss = avx2::hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < d; ++i) ss += r[i] * r[i];
  return ss;
}

// y = r * inv * weight.
void scale_row(const float* r, float inv, const float* weight, int64_t d, float* y) {
  const __m256 vinv = _mm256_set1_ps(inv);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(r + i), vinv), _mm256_loadu_ps(weight + i)));
  }
  for (; i < d; ++i) y[i] = r[i] * inv * weight[i];
}

float inv_rms(float ss, int64_t d, float eps) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(d) + eps));
}

int64_t row_grain(int64_t d) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)); }

}  // namespace

void rms_norm(const float* x, const RowLayout& x_rows, const float* weight, float eps, float* y,
              const RowLayout& y_rows) {
  log_path_once("rms_norm: avx2");
  const int64_t d = x_rows.cols;
  parallel_for(x_rows.rows, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + x_rows.offset(r);
      scale_row(xr, inv_rms(sum_squares(xr, d), d, eps), weight, d, y + y_rows.offset(r));
    }
  });
}

void add_rms_norm(float* residual, const RowLayout& residual_rows, const float* x, const RowLayout& x_rows,
                  const float* weight, float eps, float* y, const RowLayout& y_rows) {
  log_path_once("add_rms_norm: avx2 fused");
  const int64_t d = residual_rows.cols;
  parallel_for(residual_rows.rows, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* rr = residual + residual_rows.offset(r);
      const float* xr = x + x_rows.offset(r);
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 16 <= d; i += 16) {
        const __m256 v0 = _mm256_add_ps(_mm256_loadu_ps(rr + i), _mm256_loadu_ps(xr + i));
        const __m256 v1 = _mm256_add_ps(_mm256_loadu_ps(rr + i + 8), _mm256_loadu_ps(xr + i + 8));
        _mm256_storeu_ps(rr + i, v0);
        _mm256_storeu_ps(rr + i + 8, v1);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
      }
      for (; i + 8 <= d; i += 8) {
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(rr + i), _mm256_loadu_ps(xr + i));
        _mm256_storeu_ps(rr + i, v);
        a0 = _mm256_fmadd_ps(v, v, a0);
      }
      float ss = avx2::hsum(_mm256_add_ps(a0, a1));
      for (; i < d; ++i) {
        rr[i] += xr[i];
        ss += rr[i] * rr[i];
      }
      scale_row(rr, inv_rms(ss, d, eps), weight, d, y + y_rows.offset(r));
    }
  });
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
