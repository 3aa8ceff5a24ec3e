// Errors that ops raise while they run, and the faults tests inject to raise them.
//
// The ops of ops.h return nothing: a wrong argument is the caller's bug and aborts (ops.cpp's
// checks). What can go wrong in a correct program — a workspace that cannot be allocated, a kernel
// launch that fails — is recorded instead, the first such error per device (and, on the host, per
// thread), and the caller that owns a unit of work (the model's forward, the batch sampler) takes
// it at the end with take_error() and returns it as a Status: the engine then fails the requests of
// that step and goes on serving. After an error, a device backend skips the ops that follow until
// the error is taken, since they could read a workspace that is not there.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace tachyon::ops {

// The first error an op on `device` raised since the last call (Ok when none), which it clears.
Status take_error(Device device);

// Injected faults, for tests and fault drills: the after-th next point of that kind on devices of
// `type` fails (1: the next one) as the real failure would, with a message that says it was
// injected. kWorkspace: a workspace allocation (attention's) runs out of memory; kKernel: a
// kernel launch (a linear's) fails. The environment variable TACHYON_INJECT_FAULT sets the same
// when the process starts: "workspace:N", "kernel:N" or both, comma-separated (CPU and CUDA).
enum class Fault : uint8_t { kWorkspace, kKernel };
void inject_fault(DeviceType type, Fault fault, int after = 1);

namespace detail {
// Backends: true when this point of `fault`'s kind is the one to fail (counts it down).
bool consume_fault(DeviceType type, Fault fault);
// Backends: the error of an injected fault at `what`.
Status injected_error(Fault fault, const char* what);
}  // namespace detail

}  // namespace tachyon::ops
