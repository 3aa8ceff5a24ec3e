#include "disagg/kv_staging.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "core/device_memory.h"

namespace tachyon::disagg {

RangeAllocator::RangeAllocator(size_t size, size_t alignment)
    : size_(size / std::max<size_t>(alignment, 1) * std::max<size_t>(alignment, 1)), alignment_(std::max<size_t>(alignment, 1)) {
  if (size_ > 0) free_.emplace(0, size_);
}

std::optional<size_t> RangeAllocator::take(size_t bytes) {
  if (bytes == 0) return std::nullopt;
  const size_t want = (bytes + alignment_ - 1) / alignment_ * alignment_;
  std::lock_guard lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const size_t offset = it->first, left = it->second - want;
    free_.erase(it);
    if (left > 0) free_.emplace(offset + want, left);
    used_.emplace(offset, want);
    return offset;
  }
  return std::nullopt;
}

void RangeAllocator::give_back(size_t offset) {
  std::lock_guard lock(mu_);
  auto used = used_.find(offset);
  if (used == used_.end()) return;
  size_t start = offset, length = used->second;
  used_.erase(used);
  auto next = free_.lower_bound(start);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && start + length == next->first) {
    length += next->second;
    free_.erase(next);
  }
  free_.emplace(start, length);
}

size_t RangeAllocator::free_bytes() const {
  std::lock_guard lock(mu_);
  size_t total = 0;
  for (const auto& [offset, length] : free_) total += length;
  return total;
}

// Regions start on 256-byte boundaries (what cudaMalloc gives the whole allocation), so that every
// layer's copies are aligned as the cache's are.
constexpr size_t kRegionAlignment = 256;

KvStagingPool::KvStagingPool(Device device, void* data, size_t bytes, std::vector<uint8_t> handle,
                             std::function<void()> release)
    : device_(device),
      data_(data),
      handle_(std::move(handle)),
      release_(std::move(release)),
      ranges_(std::make_shared<RangeAllocator>(bytes, kRegionAlignment)) {
  std::function<void()> r = release_;
  keep_ = std::shared_ptr<void>(data_, [r](void*) {
    if (r) r();
  });
}

KvStagingPool::~KvStagingPool() = default;  // the memory goes with the last region (keep_)

Result<std::shared_ptr<KvStagingPool>> KvStagingPool::create(Device device, size_t bytes) {
  if (device.is_cpu()) {
    return make_error(ErrorCode::kUnsupported, "KV staging in shareable device memory needs a GPU (the engine runs on the CPU)");
  }
  if (bytes < kRegionAlignment) {
    return make_error(ErrorCode::kInvalidArgument, "KV staging memory of {} bytes is too small", bytes);
  }
  TACHYON_ASSIGN_OR_RETURN(DeviceMemory * memory, device_memory(device));
  TACHYON_ASSIGN_OR_RETURN(DeviceMemory::Shared shared, memory->allocate_shared(device, bytes, "KV staging memory"));
  void* data = shared.data;
  return std::make_shared<KvStagingPool>(device, data, bytes, std::move(shared.handle),
                                         [memory, device, data] { memory->deallocate_shared(device, data); });
}

std::optional<KvDeviceRegion> KvStagingPool::take(size_t bytes) {
  const std::optional<size_t> offset = ranges_->take(bytes);
  if (!offset) return std::nullopt;
  KvDeviceRegion r;
  r.data = static_cast<uint8_t*>(data_) + *offset;
  r.device = device_;
  r.bytes = bytes;
  r.handle = handle_;
  r.offset = *offset;
  std::shared_ptr<RangeAllocator> ranges = ranges_;
  std::shared_ptr<void> keep = keep_;
  const size_t at = *offset;
  r.lease = std::shared_ptr<void>(r.data, [ranges, keep, at](void*) { ranges->give_back(at); });
  return r;
}

Result<KvDeviceRegion> map_device_region(Device device, std::span<const uint8_t> handle, uint64_t offset,
                                         uint64_t bytes) {
  if (device.is_cpu()) {
    return make_error(ErrorCode::kUnsupported, "mapping another process's device memory needs a GPU engine");
  }
  TACHYON_ASSIGN_OR_RETURN(DeviceMemory * memory, device_memory(device));
  TACHYON_ASSIGN_OR_RETURN(void* base, memory->open_shared(device, handle));
  KvDeviceRegion r;
  r.data = static_cast<uint8_t*>(base) + offset;
  r.device = device;
  r.bytes = static_cast<size_t>(bytes);
  r.offset = offset;
  return r;
}

}  // namespace tachyon::disagg
