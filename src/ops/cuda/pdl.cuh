// Programmatic dependent launch (sm_90+): a kernel launched by launch_pdl() may be scheduled while
// the kernel before it on the stream is still running, so that its blocks are resident and waiting
// when that kernel's last block retires instead of paying a launch between the two (a decode step
// is ~400 short kernels; in a CUDA graph the dependency becomes a programmatic edge).
//
// The contract, for every kernel launched this way:
//   - every thread calls pdl_wait() before it reads anything an earlier kernel of the stream wrote
//     and before its first global write (the kernel before may still be reading what it writes);
//     only what no kernel that may still run writes (LinearArgs::w_constant: a loaded model's
//     weights) may be read before it;
//   - every thread calls pdl_wait() before it exits, so that this grid's completion implies the
//     completion of all the work before it (the next kernel waits on this grid alone);
//   - pdl_trigger() (after pdl_wait()) lets the next kernel be scheduled early; without it the next
//     kernel starts as this one's blocks exit.
// Kernels launched with <<<>>> are ordered fully as always; pdl_wait() and pdl_trigger() are no-ops
// for them and below sm_90. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "ops/cuda/launch.h"

namespace tachyon::ops::cuda::detail {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared, stream>>>(args...), allowed to overlap the kernel before it when
// pdl_enabled(). Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, Stream stream,
                       Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace tachyon::ops::cuda::detail
