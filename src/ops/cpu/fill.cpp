#include <cmath>

#include "core/thread_pool.h"
#include "ops/cpu/kernels.h"

namespace tachyon::ops::cpu {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t fill_uniform_base(uint64_t seed, uint64_t stream) { return splitmix64(seed ^ splitmix64(stream)); }

void fill_uniform(void* data, DType dtype, int64_t count, uint64_t seed, uint64_t stream, float bound, float offset) {
  const uint64_t base = fill_uniform_base(seed, stream);
  parallel_for(count, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t r = splitmix64(base + static_cast<uint64_t>(i));
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1), exact
      // One fused rounding, as the CUDA kernel does: the same values on every device.
      const float v = std::fma(bound, 2.0f * u - 1.0f, offset);
      switch (dtype) {
        case DType::kF32: static_cast<float*>(data)[i] = v; break;
        case DType::kBF16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(v); break;
        case DType::kF16: static_cast<uint16_t*>(data)[i] = f32_to_f16(v); break;
        default: break;
      }
    }
  });
}

}  // namespace tachyon::ops::cpu
