#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>

namespace tachyon {

std::string Device::to_string() const {
  return type == DeviceType::kCpu ? std::string("cpu") : fmt::format("cuda:{}", index);
}

Result<std::shared_ptr<Buffer>> Buffer::allocate_host(size_t size) {
  const size_t rounded = (size + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) {
    return make_error(ErrorCode::kOutOfMemory, "host allocation of {} bytes failed", size);
  }
  return std::make_shared<Buffer>(p, size, Device::cpu(), [](void* q) { std::free(q); });
}

std::shared_ptr<Buffer> Buffer::view(void* data, size_t size, Device device,
                                     std::shared_ptr<const void> owner) {
  if (!owner) return std::make_shared<Buffer>(data, size, device, nullptr);
  return std::make_shared<Buffer>(data, size, device, [owner](void*) mutable { owner.reset(); });
}

namespace {
void set_contiguous(const std::vector<int64_t>& shape, int& ndim, std::array<int64_t, kMaxDims>& sh,
                    std::array<int64_t, kMaxDims>& st) {
  TACHYON_CHECK(shape.size() <= kMaxDims, "tensor rank {} > {}", shape.size(), kMaxDims);
  ndim = static_cast<int>(shape.size());
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    sh[static_cast<size_t>(d)] = shape[static_cast<size_t>(d)];
    st[static_cast<size_t>(d)] = s;
    s *= shape[static_cast<size_t>(d)];
  }
}
int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto v : shape) n *= v;
  return n;
}
}  // namespace

Result<Tensor> Tensor::try_empty(const std::vector<int64_t>& shape, DType dtype) {
  for (auto v : shape) {
    if (v < 0) return make_error(ErrorCode::kInvalidArgument, "negative dimension {}", v);
  }
  TACHYON_ASSIGN_OR_RETURN(auto buffer,
                           Buffer::allocate_host(static_cast<size_t>(product(shape)) * dtype_size(dtype)));
  return from_buffer(std::move(buffer), 0, shape, dtype);
}

Tensor Tensor::empty(const std::vector<int64_t>& shape, DType dtype) {
  auto r = try_empty(shape, dtype);
  if (!r.ok()) throw std::bad_alloc();
  return std::move(r).value();
}

Tensor Tensor::empty(std::initializer_list<int64_t> shape, DType dtype) {
  return empty(std::vector<int64_t>(shape), dtype);
}

Tensor Tensor::zeros(const std::vector<int64_t>& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill_zero();
  return t;
}

Tensor Tensor::view_of(void* data, const std::vector<int64_t>& shape, DType dtype,
                       std::shared_ptr<const void> owner, Device device) {
  const size_t bytes = static_cast<size_t>(product(shape)) * dtype_size(dtype);
  return from_buffer(Buffer::view(data, bytes, device, std::move(owner)), 0, shape, dtype);
}

Tensor Tensor::from_buffer(std::shared_ptr<Buffer> buffer, size_t byte_offset,
                           const std::vector<int64_t>& shape, DType dtype) {
  Tensor t;
  t.buffer_ = std::move(buffer);
  t.byte_offset_ = byte_offset;
  t.dtype_ = dtype;
  set_contiguous(shape, t.ndim_, t.shape_, t.strides_);
  TACHYON_CHECK(byte_offset + t.nbytes() <= t.buffer_->size(), "tensor {} at offset {} overruns buffer of {} bytes",
                t.shape_string(), byte_offset, t.buffer_->size());
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[static_cast<size_t>(d)];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[static_cast<size_t>(d)] != 1 && strides_[static_cast<size_t>(d)] != s) return false;
    s *= shape_[static_cast<size_t>(d)];
  }
  return true;
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < ndim_; ++d) s += fmt::format("{}{}", d ? ", " : "", shape_[static_cast<size_t>(d)]);
  return s + "] " + dtype_name(dtype_);
}

Tensor Tensor::slice(int d, int64_t start, int64_t end) const {
  if (d < 0) d += ndim_;
  TACHYON_CHECK(d >= 0 && d < ndim_ && 0 <= start && start <= end && end <= shape_[static_cast<size_t>(d)],
                "slice({}, {}, {}) of {}", d, start, end, shape_string());
  Tensor t = *this;
  t.byte_offset_ += static_cast<size_t>(start * strides_[static_cast<size_t>(d)]) * dtype_size(dtype_);
  t.shape_[static_cast<size_t>(d)] = end - start;
  return t;
}

Tensor Tensor::split_last(int64_t parts) const {
  TACHYON_CHECK(ndim_ >= 1 && ndim_ < kMaxDims && parts > 0 && shape_[static_cast<size_t>(ndim_ - 1)] % parts == 0 &&
                    (strides_[static_cast<size_t>(ndim_ - 1)] == 1 || shape_[static_cast<size_t>(ndim_ - 1)] <= 1),
                "split_last({}) of {}", parts, shape_string());
  Tensor t = *this;
  const size_t last = static_cast<size_t>(ndim_ - 1);
  const int64_t inner = shape_[last] / parts;
  t.shape_[last] = parts;
  t.strides_[last] = inner;
  t.shape_[last + 1] = inner;
  t.strides_[last + 1] = 1;
  t.ndim_ = ndim_ + 1;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  if (d < 0) d += ndim_;
  Tensor t = slice(d, index, index + 1);
  for (int i = d; i + 1 < ndim_; ++i) {
    t.shape_[static_cast<size_t>(i)] = t.shape_[static_cast<size_t>(i) + 1];
    t.strides_[static_cast<size_t>(i)] = t.strides_[static_cast<size_t>(i) + 1];
  }
  --t.ndim_;
  return t;
}

Tensor Tensor::reshape(const std::vector<int64_t>& shape) const {
  TACHYON_CHECK(is_contiguous(), "reshape of a non-contiguous tensor {}", shape_string());
  std::vector<int64_t> s = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      TACHYON_CHECK(infer < 0, "reshape with two -1");
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[static_cast<size_t>(infer)] = known == 0 ? 0 : numel() / known;
  TACHYON_CHECK(product(s) == numel(), "reshape of {} to {} elements", shape_string(), product(s));
  Tensor t = *this;
  set_contiguous(s, t.ndim_, t.shape_, t.strides_);
  return t;
}

namespace {
// Calls fn(element_offset_in_src, linear_index) over all elements in row-major order.
template <typename Fn>
void for_each_offset(const Tensor& t, Fn&& fn) {
  const int nd = t.dim();
  std::array<int64_t, kMaxDims> idx{};
  const int64_t n = t.numel();
  for (int64_t linear = 0; linear < n; ++linear) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += idx[static_cast<size_t>(d)] * t.stride(d);
    fn(off, linear);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < t.size(d)) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
}
}  // namespace

Tensor Tensor::contiguous() const {
  TACHYON_CHECK(device().is_cpu(), "contiguous() on {}", device().to_string());
  Tensor out = empty(shape(), dtype_);
  const size_t es = dtype_size(dtype_);
  if (is_contiguous()) {
    std::memcpy(out.raw_data(), raw_data(), nbytes());
    return out;
  }
  const char* src = static_cast<const char*>(raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for_each_offset(*this, [&](int64_t off, int64_t i) {
    std::memcpy(dst + static_cast<size_t>(i) * es, src + static_cast<size_t>(off) * es, es);
  });
  return out;
}

Tensor Tensor::to_f32() const {
  TACHYON_CHECK(device().is_cpu(), "to_f32() on {}", device().to_string());
  Tensor out = empty(shape(), DType::kF32);
  float* dst = out.data<float>();
  const char* src = static_cast<const char*>(raw_data());
  for_each_offset(*this, [&](int64_t off, int64_t i) {
    switch (dtype_) {
      case DType::kF32: dst[i] = reinterpret_cast<const float*>(src)[off]; break;
      case DType::kF16: dst[i] = f16_to_f32(reinterpret_cast<const uint16_t*>(src)[off]); break;
      case DType::kBF16: dst[i] = bf16_to_f32(reinterpret_cast<const uint16_t*>(src)[off]); break;
      case DType::kI8: dst[i] = reinterpret_cast<const int8_t*>(src)[off]; break;
      case DType::kU8: dst[i] = reinterpret_cast<const uint8_t*>(src)[off]; break;
      case DType::kI32: dst[i] = static_cast<float>(reinterpret_cast<const int32_t*>(src)[off]); break;
      case DType::kI64: dst[i] = static_cast<float>(reinterpret_cast<const int64_t*>(src)[off]); break;
      case DType::kF8E4M3: dst[i] = f8e4m3_to_f32(reinterpret_cast<const uint8_t*>(src)[off]); break;
    }
  });
  return out;
}

void Tensor::fill_zero() {
  TACHYON_CHECK(device().is_cpu() && is_contiguous(), "fill_zero on {}", shape_string());
  std::memset(raw_data(), 0, nbytes());
}

}  // namespace tachyon
