// Tensor: shape, strides (in elements), dtype, device, and a shared Buffer that either owns
// its memory (aligned heap, or device memory from a backend) or views memory owned by someone
// else (an mmap'd model file, a KV pool). Views keep their owner alive through the Buffer.
// A Tensor never copies implicitly; `contiguous()`/`to()` copies are explicit.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace tachyon {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  std::string to_string() const;
};

// A span of bytes on one device. The deleter (if any) runs when the last Tensor drops it.
class Buffer {
 public:
  Buffer(void* data, size_t size, Device device, std::function<void(void*)> deleter)
      : data_(data), size_(size), device_(device), deleter_(std::move(deleter)) {}
  ~Buffer() {
    if (deleter_) deleter_(data_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }

  // 64-byte aligned host memory. Contents uninitialized.
  static Result<std::shared_ptr<Buffer>> allocate_host(size_t size);
  // Memory owned elsewhere; `owner` is held until this buffer dies.
  static std::shared_ptr<Buffer> view(void* data, size_t size, Device device, std::shared_ptr<const void> owner);

 private:
  void* data_;
  size_t size_;
  Device device_;
  std::function<void(void*)> deleter_;
};

constexpr int kMaxDims = 4;

class Tensor {
 public:
  Tensor() = default;

  // Allocates a contiguous tensor on the host. Aborts only if the host is out of memory;
  // use `try_empty` where the size comes from a user.
  static Tensor empty(std::initializer_list<int64_t> shape, DType dtype);
  static Tensor empty(const std::vector<int64_t>& shape, DType dtype);
  static Result<Tensor> try_empty(const std::vector<int64_t>& shape, DType dtype);
  static Tensor zeros(const std::vector<int64_t>& shape, DType dtype);
  // A contiguous view of `data` (not owned; `owner` kept alive if given).
  static Tensor view_of(void* data, const std::vector<int64_t>& shape, DType dtype,
                        std::shared_ptr<const void> owner = nullptr, Device device = Device::cpu());
  static Tensor from_buffer(std::shared_ptr<Buffer> buffer, size_t byte_offset,
                            const std::vector<int64_t>& shape, DType dtype);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return buffer_ ? buffer_->device() : Device::cpu(); }
  int dim() const { return ndim_; }
  int64_t size(int d) const { return shape_[static_cast<size_t>(d < 0 ? d + ndim_ : d)]; }
  int64_t stride(int d) const { return strides_[static_cast<size_t>(d < 0 ? d + ndim_ : d)]; }
  std::vector<int64_t> shape() const { return {shape_.begin(), shape_.begin() + ndim_}; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  std::string shape_string() const;  // "[2, 3] f32"

  void* raw_data() const { return static_cast<char*>(buffer_->data()) + byte_offset_; }
  template <typename T>
  T* data() const { return static_cast<T*>(raw_data()); }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }

  // Views (share the buffer).
  Tensor slice(int d, int64_t start, int64_t end) const;  // [start, end) along d
  Tensor select(int d, int64_t index) const;              // drops dim d
  Tensor reshape(const std::vector<int64_t>& shape) const;  // contiguous only; one -1 allowed
  // [..., d] with a packed last dim -> [..., parts, d / parts] (e.g. a strided q slice into heads).
  Tensor split_last(int64_t parts) const;
  // Copies.
  Tensor contiguous() const;
  Tensor to_f32() const;  // any float dtype -> contiguous f32 copy (host only)

  void fill_zero();

 private:
  std::shared_ptr<Buffer> buffer_;
  size_t byte_offset_ = 0;
  DType dtype_ = DType::kF32;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace tachyon
