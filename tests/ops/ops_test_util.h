// Helpers of the op tests: ISA selection scopes, NaN sentinels, dtype rounding, and an error
// measure that reports where and by how much a fast kernel differs from the reference.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "ops/cpu/isa.h"
#include "test_util.h"

namespace tachyon::testing {

// The SIMD ISAs this CPU can run (the ones whose kernels a test must compare to the reference).
inline std::vector<ops::cpu::Isa> simd_isas() {
  std::vector<ops::cpu::Isa> isas;
  for (auto isa : {ops::cpu::Isa::kAvx2, ops::cpu::Isa::kAvx512}) {
    if (ops::cpu::isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

// Forces an ISA for the scope's lifetime.
class IsaScope {
 public:
  explicit IsaScope(ops::cpu::Isa isa) { ops::cpu::set_isa(isa); }
  ~IsaScope() { ops::cpu::clear_isa_override(); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

// Sets the worker thread count for the scope's lifetime.
class ThreadScope {
 public:
  explicit ThreadScope(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadScope() { set_num_threads(saved_); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

// Every element of a float tensor (any strides) set to NaN: outputs a kernel forgets to write stay NaN.
inline void fill_nan(Tensor& t) {
  TACHYON_CHECK(t.is_contiguous(), "fill_nan on a view");
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = std::nanf("");
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[i] = 0x7e00;
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[i] = 0x7fc0;
      break;
    default: TACHYON_CHECK(false, "fill_nan: {}", dtype_name(t.dtype()));
  }
}

inline Tensor nan_tensor(const std::vector<int64_t>& shape, DType dtype = DType::kF32) {
  Tensor t = Tensor::empty(shape, dtype);
  fill_nan(t);
  return t;
}

// A packed copy of an f32 tensor in `dtype` (round to nearest even).
inline Tensor convert(const Tensor& f32, DType dtype) {
  Tensor src = f32.contiguous();
  Tensor out = Tensor::empty(src.shape(), dtype);
  const float* s = src.data<float>();
  for (int64_t i = 0; i < src.numel(); ++i) {
    switch (dtype) {
      case DType::kF32: out.data<float>()[i] = s[i]; break;
      case DType::kF16: out.data<uint16_t>()[i] = f32_to_f16(s[i]); break;
      case DType::kBF16: out.data<uint16_t>()[i] = f32_to_bf16(s[i]); break;
      default: TACHYON_CHECK(false, "convert to {}", dtype_name(dtype));
    }
  }
  return out;
}

inline Tensor random_i32(const std::vector<int64_t>& shape, std::mt19937& rng, int32_t lo, int32_t hi) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = dist(rng);
  return t;
}

inline Tensor i32_tensor(const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::kI32);
  for (size_t i = 0; i < values.size(); ++i) t.data<int32_t>()[i] = values[i];
  return t;
}

// Compares two float tensors of one shape element by element (any strides, via to_f32). An
// element passes when |a - e| <= tol * (|e| + scale), scale = max(rms(expected), 1e-30): relative
// error for large elements, floored by the output's typical magnitude so that sums which cancel
// to near zero are judged against the size of their terms. NaN in `actual` (a sentinel never
// overwritten) fails unless `expected` is NaN there too.
inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double tol,
                                            const std::string& what) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << what << ": shape " << actual.shape_string() << " vs "
                                         << expected.shape_string();
  }
  const Tensor a = actual.to_f32();
  const Tensor e = expected.to_f32();
  const int64_t n = a.numel();
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = e.data<float>()[i];
    if (std::isfinite(v)) sq += v * v;
  }
  const double scale = std::max(n > 0 ? std::sqrt(sq / static_cast<double>(n)) : 0.0, 1e-30);
  double worst = 0.0;
  int64_t worst_i = -1;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double av = a.data<float>()[i], ev = e.data<float>()[i];
    if (std::isnan(ev) && std::isnan(av)) continue;
    double err;
    if (std::isnan(av) || std::isnan(ev)) {
      err = INFINITY;
    } else if (std::isinf(ev) || std::isinf(av)) {
      err = av == ev ? 0.0 : INFINITY;
    } else {
      err = std::fabs(av - ev) / (std::fabs(ev) + scale);
    }
    if (err > tol) ++bad;
    if (err > worst || worst_i < 0) {
      worst = err;
      worst_i = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << fmt::format(
             "{}: {} of {} elements off; worst at flat index {}: got {} expected {} (error {:.3g} > tol {:.3g}, "
             "scale {:.3g})",
             what, bad, n, worst_i, a.data<float>()[worst_i], e.data<float>()[worst_i], worst, tol, scale);
}

// Bitwise equality of two tensors' contents (packed).
inline ::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    return ::testing::AssertionFailure() << what << ": " << a.shape_string() << " vs " << b.shape_string();
  }
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  const auto* pa = static_cast<const unsigned char*>(ac.raw_data());
  const auto* pb = static_cast<const unsigned char*>(bc.raw_data());
  const size_t es = dtype_size(a.dtype());
  for (size_t i = 0; i < ac.nbytes(); i += es) {
    if (std::memcmp(pa + i, pb + i, es) != 0) {
      return ::testing::AssertionFailure() << what << ": first difference at element " << i / es;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tachyon::testing
