// Helpers of the CUDA kernel tests: skip without a device, Status assertions, host tensors
// mirrored on the device (views of a mirrored tensor map to device pointers at the same offset),
// and the relative L2 error ||out - ref|| / ||ref||.
#pragma once

#ifdef TACHYON_HAS_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/tensor.h"
#include "ops/cpu/rows.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops_test_util.h"

namespace tachyon::testing {

namespace cu = ::tachyon::ops::cuda;

#define TACHYON_SKIP_WITHOUT_GPU()                                                          \
  do {                                                                                      \
    if (::tachyon::ops::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device here"; \
  } while (0)

// Skips without a device; else starts the CUDA backend on device 0 (the ops:: entry points then
// take device tensors there).
#define TACHYON_START_GPU()                                \
  do {                                                     \
    TACHYON_SKIP_WITHOUT_GPU();                            \
    ASSERT_OK(::tachyon::ops::cuda::start_backend(0));     \
  } while (0)

#define ASSERT_OK(expr)                                          \
  do {                                                           \
    const ::tachyon::Status tachyon_s_ = (expr);                 \
    ASSERT_TRUE(tachyon_s_.ok()) << #expr << ": " << tachyon_s_.to_string(); \
  } while (0)

// A contiguous host tensor and its copy in device memory.
class Mirror {
 public:
  Mirror() = default;
  explicit Mirror(const Tensor& host) : host_(host.contiguous()) {
    auto buffer = cu::DeviceBuffer::allocate(std::max<size_t>(host_.nbytes(), 16), "test tensor");
    if (!buffer.ok()) {
      ADD_FAILURE() << buffer.status().to_string();
      return;
    }
    dev_ = std::move(buffer).value();
    const Status s = cu::copy_to_device(dev_.data(), host_.raw_data(), host_.nbytes());
    if (!s.ok()) ADD_FAILURE() << s.to_string();
  }

  // The device address of `view`: host() itself or a view of it (a view of another tensor, e.g.
  // of the tensor this mirror was copied from, is a test bug and fails here).
  template <typename T>
  T* ptr(const Tensor& view) const {
    if (view.buffer() != host_.buffer()) {
      ADD_FAILURE() << "Mirror::ptr: " << view.shape_string() << " is not a view of this mirror's host tensor";
      return nullptr;
    }
    const ptrdiff_t offset = static_cast<const char*>(view.raw_data()) - static_cast<const char*>(host_.raw_data());
    return reinterpret_cast<T*>(static_cast<char*>(dev_.data()) + offset);
  }
  template <typename T>
  T* ptr() const { return static_cast<T*>(dev_.data()); }

  // Copies the device contents back into the host tensor (and so into its views).
  Status download() { return cu::copy_to_host(host_.raw_data(), dev_.data(), host_.nbytes()); }
  Status upload() { return cu::copy_to_device(dev_.data(), host_.raw_data(), host_.nbytes()); }

  Tensor& host() { return host_; }
  const Tensor& host() const { return host_; }

 private:
  Tensor host_;
  cu::DeviceBuffer dev_;
};

inline cu::Rows rows_of(const Tensor& t) { return ops::cpu::row_layout(t); }

// ||actual - expected|| / ||expected|| over all elements (NaN anywhere gives +inf).
inline double relative_l2(const Tensor& actual, const Tensor& expected) {
  const Tensor a = actual.to_f32(), e = expected.to_f32();
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double av = a.data<float>()[i], ev = e.data<float>()[i];
    if (std::isnan(av) || std::isnan(ev)) return INFINITY;
    num += (av - ev) * (av - ev);
    den += ev * ev;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline ::testing::AssertionResult relative_l2_below(const Tensor& actual, const Tensor& expected, double tol,
                                                    const std::string& what) {
  const double err = relative_l2(actual, expected);
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": relative L2 error " << err << " > " << tol;
}

// Every element NaN (a poisoned region nothing may write).
inline ::testing::AssertionResult all_nan(const Tensor& t, const std::string& what) {
  const Tensor f = t.to_f32();
  for (int64_t i = 0; i < f.numel(); ++i) {
    if (!std::isnan(f.data<float>()[i])) {
      return ::testing::AssertionFailure() << what << ": element " << i << " was written (" << f.data<float>()[i]
                                           << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tachyon::testing

#endif  // TACHYON_HAS_CUDA
