// Which device backends this build has, and starting one, for callers that must not see a
// backend's own headers (the CLI). The CUDA build implements these in ops/cuda/backend.cpp; a build
// without CUDA compiles ops/no_cuda/device_backends.cpp into tachyon_ops instead (CMakeLists.txt),
// which knows only the CPU. A started backend registers itself with ops/backend.h.
#pragma once

#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace tachyon::ops {

// True when this build has a backend for `type` (the CPU's is always there).
bool has_device_backend(DeviceType type);
// Starts the backend running `device` (the CPU needs none); kUnsupported when this build has none.
Status start_device_backend(Device device);
// Devices of `type` this process can use now: 1 for the CPU; CUDA devices visible to a build with
// the CUDA backend (0 without one, without a driver, or with no device).
int available_devices(DeviceType type);
// "NVIDIA H100 80GB HBM3", for messages; the type's name when unknown.
std::string device_description(Device device);

}  // namespace tachyon::ops
