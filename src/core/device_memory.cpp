#include "core/device_memory.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>

#include "core/log.h"

namespace tachyon {
namespace {

std::array<std::atomic<DeviceMemory*>, 2> g_memory{};

size_t element_count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (auto d : shape) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

void register_device_memory(DeviceType type, DeviceMemory* memory) {
  g_memory[static_cast<size_t>(type)].store(memory);
}

Result<DeviceMemory*> device_memory(Device device) {
  DeviceMemory* m = g_memory[static_cast<size_t>(device.type)].load();
  if (m == nullptr) {
    return make_error(ErrorCode::kUnsupported, "no backend for {} is running (a build without it, or not started)",
                      device.to_string());
  }
  return m;
}

Result<Tensor> empty_on(const std::vector<int64_t>& shape, DType dtype, Device device, std::string_view what) {
  if (device.is_cpu()) return Tensor::try_empty(shape, dtype);
  for (auto v : shape) {
    if (v < 0) return make_error(ErrorCode::kInvalidArgument, "{}: negative dimension {}", what, v);
  }
  TACHYON_ASSIGN_OR_RETURN(DeviceMemory * memory, device_memory(device));
  const size_t bytes = element_count(shape) * dtype_size(dtype);
  TACHYON_ASSIGN_OR_RETURN(void* data, memory->allocate(device, bytes == 0 ? 1 : bytes, what));
  auto buffer = std::make_shared<Buffer>(data, bytes, device, [memory, device](void* p) { memory->deallocate(device, p); });
  return Tensor::from_buffer(std::move(buffer), 0, shape, dtype);
}

Status copy_into(Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    return make_error(ErrorCode::kInvalidArgument, "copy: {} into {}", src.shape_string(), dst.shape_string());
  }
  if (!dst.is_contiguous() || !src.is_contiguous()) {
    return make_error(ErrorCode::kInvalidArgument, "copy: {} into {} needs contiguous tensors", src.shape_string(),
                      dst.shape_string());
  }
  if (src.nbytes() == 0) return Status::Ok();
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
    return Status::Ok();
  }
  const Device device = dst.device().is_cpu() ? src.device() : dst.device();
  TACHYON_ASSIGN_OR_RETURN(DeviceMemory * memory, device_memory(device));
  return memory->copy(dst.raw_data(), dst.device(), src.raw_data(), src.device(), src.nbytes());
}

Result<Tensor> copy_to(const Tensor& src, Device device, std::string_view what) {
  Tensor source = src;
  if (!source.is_contiguous()) {
    if (!source.device().is_cpu()) {
      return make_error(ErrorCode::kUnsupported, "{}: copying a strided {} tensor off {}", what, src.shape_string(),
                        src.device().to_string());
    }
    source = source.contiguous();
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor dst, empty_on(source.shape(), source.dtype(), device, what));
  TACHYON_RETURN_IF_ERROR(copy_into(dst, source));
  return dst;
}

Status memory_info(Device device, size_t& free_bytes, size_t& total_bytes) {
  if (device.is_cpu()) {
    const long page = sysconf(_SC_PAGESIZE);
    free_bytes = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<size_t>(page);
    total_bytes = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(page);
    return Status::Ok();
  }
  TACHYON_ASSIGN_OR_RETURN(DeviceMemory * memory, device_memory(device));
  return memory->memory_info(device, free_bytes, total_bytes);
}

Result<DeviceMemory::Shared> DeviceMemory::allocate_shared(Device device, size_t, std::string_view) {
  return make_error(ErrorCode::kUnsupported, "{}: no memory that other processes can map", device.to_string());
}

void DeviceMemory::deallocate_shared(Device, void*) {}

Result<void*> DeviceMemory::open_shared(Device device, std::span<const uint8_t>) {
  return make_error(ErrorCode::kUnsupported, "{}: cannot map another process's memory", device.to_string());
}

}  // namespace tachyon
