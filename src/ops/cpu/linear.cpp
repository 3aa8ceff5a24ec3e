// linear: picks the ISA variant and the algorithm (GEMV for a few tokens, packed GEMM beyond)
// and says which ran.
#include "core/status.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/linear_isa.h"

namespace tachyon::ops::cpu {
namespace {

// Up to this many tokens the GEMV kernel wins: it streams the weight once (re-reading the few
// rows it holds from L1/L2 for each token group) and needs no packing. Measured with
// `tachyon_bench gemv --rows 4864 --cols 896 --tokens N --algo gemv|gemm --dtype D`: on a 16-core
// AVX-512 Xeon the GEMM overtakes from ~32 tokens (16 threads) and ~48 (2 threads); with AVX2 on
// a 2-core EPYC (Zen 1), from ~48 tokens for bf16 (the even/odd GEMV is cheap) and ~8-16 for
// f16/f32.
int64_t gemv_max_tokens(Isa isa, DType w_dtype) {
  if (isa == Isa::kAvx512) return 24;
  return w_dtype == DType::kBF16 ? 32 : 8;
}

const char* algo_name(LinearAlgo algo) { return algo == LinearAlgo::kGemm ? "gemm" : "gemv"; }

}  // namespace

void linear(const LinearArgs& a, LinearAlgo algo) {
  if (a.n == 0 || a.out == 0) return;
  const Isa isa = active_isa();
  TACHYON_CHECK(isa != Isa::kScalar, "cpu::linear called with the scalar ISA active");
  if (a.in == 0) algo = LinearAlgo::kGemv;  // y = bias (or 0): the GEMM loop has no k block to run
  if (algo == LinearAlgo::kAuto) algo = a.n <= gemv_max_tokens(isa, a.w_dtype) ? LinearAlgo::kGemv : LinearAlgo::kGemm;
  log_path_once("linear: {} {} {}", isa_name(isa), dtype_name(a.w_dtype), algo_name(algo));
  if (isa == Isa::kAvx512) {
    linear_avx512(a, algo);
  } else {
    linear_avx2(a, algo);
  }
}

}  // namespace tachyon::ops::cpu
