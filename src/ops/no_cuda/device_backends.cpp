// ops/device_backends.h in a build without the CUDA backend: only the CPU runs ops.
#include "ops/device_backends.h"

namespace tachyon::ops {

bool has_device_backend(DeviceType type) { return type == DeviceType::kCpu; }

Status start_device_backend(Device device) {
  if (device.is_cpu()) return Status::Ok();
  return make_error(ErrorCode::kUnsupported, "{}: this build has no CUDA backend", device.to_string());
}

int available_devices(DeviceType type) { return type == DeviceType::kCpu ? 1 : 0; }

std::string device_description(Device device) { return device.to_string(); }

}  // namespace tachyon::ops
