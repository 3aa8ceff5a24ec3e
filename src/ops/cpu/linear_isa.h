// The per-ISA entry points of linear (defined in linear_avx2.cpp / linear_avx512.cpp; the AVX-512
// one may only be called after isa_supported(Isa::kAvx512)). `algo` is already resolved (never
// kAuto) by linear() in linear.cpp.
#pragma once

#include "ops/cpu/kernels.h"

namespace tachyon::ops::cpu {

void linear_avx2(const LinearArgs& args, LinearAlgo algo);
void linear_avx512(const LinearArgs& args, LinearAlgo algo);

}  // namespace tachyon::ops::cpu
