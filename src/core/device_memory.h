// Memory of devices other than the host. A backend (ops/cuda) registers one DeviceMemory for its
// device type when it starts; core allocates and copies through it, so Tensors can live on a
// device without core knowing anything of CUDA. Without a registered backend every request for
// device memory is a clear error.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace tachyon {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // `what` names the allocation in the out-of-memory message (with the sizes involved).
  virtual Result<void*> allocate(Device device, size_t bytes, std::string_view what) = 0;
  virtual void deallocate(Device device, void* ptr) = 0;
  // Copies `bytes` between the host and a device or within a device, in order with the device's
  // work: when it returns, a host destination holds the bytes and a host source may be reused.
  virtual Status copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  virtual Status memset(void* dst, Device device, int byte, size_t bytes) = 0;
  // Free and total bytes of the device now.
  virtual Status memory_info(Device device, size_t& free_bytes, size_t& total_bytes) = 0;
  // Device memory another process on this host can map (CUDA IPC), for moving K/V between
  // workers without the host: an allocation and the handle that names it to other processes.
  // Backends without it answer kUnsupported.
  struct Shared {
    void* data = nullptr;
    std::vector<uint8_t> handle;
  };
  virtual Result<Shared> allocate_shared(Device device, size_t bytes, std::string_view what);
  virtual void deallocate_shared(Device device, void* data);
  // Maps an allocation of another process into this one, on `device`; the same handle maps once
  // (later calls return the same pointer) and stays mapped until the backend goes.
  virtual Result<void*> open_shared(Device device, std::span<const uint8_t> handle);
};

// Registers (or, with null, removes) the memory of a device type; not thread-safe against
// concurrent allocation (backends register at start-up).
void register_device_memory(DeviceType type, DeviceMemory* memory);
// The registered memory of `device`'s type, or an error naming the device.
Result<DeviceMemory*> device_memory(Device device);

// Contiguous tensor on `device` (host: 64-byte aligned). Contents uninitialized.
Result<Tensor> empty_on(const std::vector<int64_t>& shape, DType dtype, Device device, std::string_view what = "tensor");
// A contiguous copy of `src` on `device` (src need not be contiguous when it is on the host).
Result<Tensor> copy_to(const Tensor& src, Device device, std::string_view what = "tensor");
// dst = src, both contiguous with the same dtype and element count, on any devices.
Status copy_into(Tensor& dst, const Tensor& src);
// Free and total bytes of `device` (host: available and total physical memory).
Status memory_info(Device device, size_t& free_bytes, size_t& total_bytes);

}  // namespace tachyon
