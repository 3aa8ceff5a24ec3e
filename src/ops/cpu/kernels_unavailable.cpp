// Builds for CPUs other than x86-64 have no SIMD kernels yet: active_isa() is kScalar there and
// ops:: runs the reference kernels. These definitions only satisfy the linker.
#if !defined(__x86_64__)

#include "ops/cpu/kernels.h"
#include "ops/cpu/linear_isa.h"

namespace tachyon::ops::cpu {
namespace {
[[noreturn]] void unavailable(const char* op) {
  TACHYON_CHECK(false, "{}: no SIMD kernel in this build (the scalar ISA should be active)", op);
  __builtin_unreachable();
}
}  // namespace

void linear_avx2(const LinearArgs&, LinearAlgo) { unavailable("linear"); }
void linear_avx512(const LinearArgs&, LinearAlgo) { unavailable("linear"); }
void rms_norm(const float*, const RowLayout&, const float*, float, float*, const RowLayout&) {
  unavailable("rms_norm");
}
void add_rms_norm(float*, const RowLayout&, const float*, const RowLayout&, const float*, float, float*,
                  const RowLayout&) {
  unavailable("add_rms_norm");
}
void rope(float*, int64_t, int64_t, int64_t, int64_t, const int32_t*, const RopeTable&) { unavailable("rope"); }
void silu_mul(const float*, const RowLayout&, const float*, const RowLayout&, float*, const RowLayout&) {
  unavailable("silu_mul");
}
void softmax(float*, const RowLayout&) { unavailable("softmax"); }
void embedding(const void*, DType, int64_t, int64_t, const int32_t*, int64_t, float*, int64_t) {
  unavailable("embedding");
}
void store_kv(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, const int32_t*,
              const KvCacheView&) {
  unavailable("store_kv");
}
void paged_attention(const float*, int64_t, int64_t, int64_t, const KvCacheView&, const AttentionBatch&,
                     const AttentionParams&, float*, int64_t, int64_t) {
  unavailable("paged_attention");
}

}  // namespace tachyon::ops::cpu

#endif  // !__x86_64__
