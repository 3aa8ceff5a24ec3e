// silu_mul and softmax (AVX2), row-wise over threads, with the vector exp of vec_avx2.h.
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/thread_pool.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/vec_avx2.h"

namespace tachyon::ops::cpu {
namespace {

int64_t row_grain(int64_t d) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)); }

}  // namespace

void silu_mul(const float* gate, const RowLayout& gate_rows, const float* up, const RowLayout& up_rows, float* out,
              const RowLayout& out_rows) {
  log_path_once("silu_mul: avx2");
  const int64_t d = gate_rows.cols;
  parallel_for(gate_rows.rows, row_grain(d), [&](int64_t begin, int64_t end) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gate + gate_rows.offset(r);
      const float* u = up + up_rows.offset(r);
      float* o = out + out_rows.offset(r);
      int64_t i = 0;
      for (; i + 8 <= d; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = avx2::exp(_mm256_sub_ps(_mm256_setzero_ps(), gv));  // e^-g
        const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
      }
      for (; i < d; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

void softmax(float* x, const RowLayout& rows) {
  log_path_once("softmax: avx2");
  const int64_t d = rows.cols;
  parallel_for(rows.rows, row_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* v = x + rows.offset(r);
      __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      int64_t i = 0;
      for (; i + 8 <= d; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(v + i));
      float mx = avx2::hmax(vmax);
      for (; i < d; ++i) mx = std::max(mx, v[i]);
      const __m256 vm = _mm256_set1_ps(mx);
      __m256 vsum = _mm256_setzero_ps();
      i = 0;
      for (; i + 8 <= d; i += 8) {
        const __m256 e = avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(v + i), vm));
        _mm256_storeu_ps(v + i, e);
        vsum = _mm256_add_ps(vsum, e);
      }
      double sum = avx2::hsum(vsum);
      for (; i < d; ++i) {
        v[i] = std::exp(v[i] - mx);
        sum += v[i];
      }
      const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
      i = 0;
      for (; i + 8 <= d; i += 8) _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(v + i), inv));
      for (; i < d; ++i) v[i] = static_cast<float>(v[i] / sum);
    }
  });
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
