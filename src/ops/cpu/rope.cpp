// rope (AVX2): cos/sin for each token's position are computed once per call (the definition in
// reference::rope_cos_sin, so every path rotates by the same angles), then every head of the
// token is rotated with 8-wide FMAs. Neox style pairs (x[i], x[i + half]); interleaved style pairs
// (x[2i], x[2i+1]) and uses cos/sin laid out per lane ([c0, c0, c1, c1, ...], [-s0, s0, ...]).
// Dims past rotary_dim are left alone.
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/reference.h"

namespace tachyon::ops::cpu {
namespace {

// Neox: v[i], v[i + half] for i < half, with c[i], s[i].
void rotate_neox(float* v, const float* c, const float* s, int half) {
  int i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + half + i);
    const __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_loadu_ps(s + i);
    _mm256_storeu_ps(v + i, _mm256_fmsub_ps(a, vc, _mm256_mul_ps(b, vs)));
    _mm256_storeu_ps(v + half + i, _mm256_fmadd_ps(a, vs, _mm256_mul_ps(b, vc)));
  }
  for (; i < half; ++i) {
    const float a = v[i], b = v[half + i];
    v[i] = a * c[i] - b * s[i];
    v[half + i] = a * s[i] + b * c[i];
  }
}

// Interleaved: c2 = [c0, c0, c1, c1, ...], s2 = [-s0, s0, -s1, s1, ...] over rotary_dim lanes.
void rotate_interleaved(float* v, const float* c2, const float* s2, int rotary_dim) {
  int i = 0;
  for (; i + 8 <= rotary_dim; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    const __m256 swapped = _mm256_permute_ps(x, 0xB1);  // [x1, x0, x3, x2, ...]
    _mm256_storeu_ps(v + i,
                     _mm256_fmadd_ps(x, _mm256_loadu_ps(c2 + i), _mm256_mul_ps(swapped, _mm256_loadu_ps(s2 + i))));
  }
  for (; i < rotary_dim; i += 2) {
    const float a = v[i], b = v[i + 1];
    v[i] = a * c2[i] + b * s2[i];
    v[i + 1] = b * c2[i + 1] + a * s2[i + 1];
  }
}

}  // namespace

void rope(float* x, int64_t n, int64_t heads, int64_t token_stride, int64_t head_stride, const int32_t* positions,
          const RopeTable& table) {
  const bool neox = table.style == RopeStyle::kNeox;
  log_path_once("rope: avx2 {}", neox ? "neox" : "interleaved");
  const int half = table.rotary_dim / 2;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, heads * table.rotary_dim));
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    // Per token: neox [cos(half), sin(half)]; interleaved [c2(rotary_dim), s2(rotary_dim)].
    std::vector<float> cs(static_cast<size_t>(2 * table.rotary_dim));
    float* c = cs.data();
    float* s = cs.data() + table.rotary_dim;
    for (int64_t t = begin; t < end; ++t) {
      for (int i = 0; i < half; ++i) {
        float ci, si;
        reference::rope_cos_sin(positions[t], table.inv_freq[static_cast<size_t>(i)], table.attention_scale, &ci, &si);
        if (neox) {
          c[i] = ci;
          s[i] = si;
        } else {
          c[2 * i] = c[2 * i + 1] = ci;
          s[2 * i] = -si;
          s[2 * i + 1] = si;
        }
      }
      float* xt = x + t * token_stride;
      for (int64_t h = 0; h < heads; ++h) {
        if (neox) {
          rotate_neox(xt + h * head_stride, c, s, half);
        } else {
          rotate_interleaved(xt + h * head_stride, c, s, table.rotary_dim);
        }
      }
    }
  });
}

}  // namespace tachyon::ops::cpu

#endif  // __x86_64__
