// KvStagingPool: the prefill worker's region of device memory that a decode worker on the same
// host maps (CUDA IPC), so that K/V go from one GPU to another without the host: export_kv()
// (kv_export.h) copies a sequence's K/V into a region of it (KvExportArena), the region message
// names the region (kv_transfer.h), the decode worker's adopt() copies out of its mapping, and the
// region comes back here when the export is gone (after the ack, or a failure). One allocation,
// mapped once by each decode worker (DeviceMemory::open_shared keeps the mapping), carved
// first-fit into regions.
//
// When no region is free (more K/V in flight than the pool holds) take() says so and the export
// goes through the host, as with --kv-transport tcp: a transfer never waits for room here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "disagg/kv_export.h"

namespace tachyon::disagg {

// First-fit ranges of [0, size) in `alignment` units, thread-safe. Exposed for tests.
class RangeAllocator {
 public:
  RangeAllocator(size_t size, size_t alignment);
  // The offset of a free range of at least `bytes`, or nullopt.
  std::optional<size_t> take(size_t bytes);
  // Returns the range taken at `offset` (merged with free neighbours).
  void give_back(size_t offset);
  size_t free_bytes() const;
  size_t size() const { return size_; }

 private:
  const size_t size_, alignment_;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> length, disjoint, never adjacent
  std::map<size_t, size_t> used_;  // offset -> length
};

class KvStagingPool final : public KvExportArena {
 public:
  // `bytes` of shareable memory on `device` (a GPU: DeviceMemory::allocate_shared).
  static Result<std::shared_ptr<KvStagingPool>> create(Device device, size_t bytes);
  // Over memory the caller owns (`release` runs when the pool and every region are gone), named by
  // `handle`: for tests, and for memory shared some other way.
  KvStagingPool(Device device, void* data, size_t bytes, std::vector<uint8_t> handle, std::function<void()> release);
  ~KvStagingPool() override;

  Device device() const override { return device_; }
  std::optional<KvDeviceRegion> take(size_t bytes) override;
  size_t size() const { return ranges_->size(); }
  size_t free_bytes() const { return ranges_->free_bytes(); }

 private:
  Device device_;
  void* data_;
  std::vector<uint8_t> handle_;
  std::function<void()> release_;
  std::shared_ptr<RangeAllocator> ranges_;  // regions keep it (and the memory, through keep_) alive
  std::shared_ptr<void> keep_;
};

// The decode side: maps a region message's handle on `device` (DeviceMemory::open_shared), for
// KvReceiveOptions::map_region.
Result<KvDeviceRegion> map_device_region(Device device, std::span<const uint8_t> handle, uint64_t offset, uint64_t bytes);

}  // namespace tachyon::disagg
