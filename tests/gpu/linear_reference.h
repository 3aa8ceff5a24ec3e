// The oracle of the CUDA linear tests: y = x · w^T + bias in double precision on the weight a
// packed format stands for, and a check of a device result against it per element, relative to
// the size of the sum's terms (sum |w x| + |bias|); and one linear() call run for such a check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/tensor.h"
#include "gpu_test_util.h"

namespace tachyon::testing {

// y[t, o] = sum_i w[o, i] x[t, i] + bias[o] in double, and the size of its terms.
struct Reference {
  std::vector<double> y, scale;  // [n, out]
};

inline Reference reference(const Tensor& w, const Tensor& x, const Tensor& bias) {
  const Tensor wc = w.contiguous(), xc = x.contiguous();
  const Tensor b = bias.defined() ? bias.to_f32() : Tensor();
  const int64_t n = xc.size(0), in = xc.size(1), out = wc.size(0);
  Reference r;
  r.y.resize(static_cast<size_t>(n * out));
  r.scale.resize(r.y.size());
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = xc.data<float>() + t * in;
    for (int64_t o = 0; o < out; ++o) {
      const float* wo = wc.data<float>() + o * in;
      double sum = 0.0, size = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        const double p = static_cast<double>(wo[i]) * static_cast<double>(xt[i]);
        sum += p;
        size += std::fabs(p);
      }
      if (b.defined()) {
        sum += b.data<float>()[o];
        size += std::fabs(b.data<float>()[o]);
      }
      r.y[t * out + o] = sum;
      r.scale[t * out + o] = size;
    }
  }
  return r;
}

inline ::testing::AssertionResult within(const Tensor& y, const Reference& ref, double tol, const std::string& what) {
  const Tensor yc = y.contiguous();
  double worst = 0.0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < yc.numel(); ++i) {
    const double got = yc.data<float>()[i];
    const double err = std::isfinite(got) ? std::fabs(got - ref.y[i]) / std::max(ref.scale[i], 1e-30) : INFINITY;
    if (err > worst || worst_i < 0) {
      worst = err;
      worst_i = i;
    }
  }
  if (worst <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << fmt::format(
             "{}: element {} is {} against {} (error {:.3g} of sum |w x| = {:.4g}, tolerance {:.3g})", what, worst_i,
             yc.data<float>()[worst_i], ref.y[worst_i], worst, ref.scale[worst_i], tol);
}

struct RunOptions {  // one linear() call of the tests: tokens, algorithm, bias, row padding
  int64_t n = 1;
  cu::LinearAlgo algo = cu::LinearAlgo::kAuto;
  bool bias = false;
  DType bias_dtype = DType::kF32;
  int64_t x_pad = 0, y_pad = 0;
};

struct LinearRun {
  Tensor x, bias;  // host: x [n, in] f32 (a view), bias [out] (or undefined)
  Tensor y;        // the device's result [n, out]
};

// One linear() on a device weight W (w.args(): its LinearArgs; w.q: its QuantWeight) with fresh
// x (rows x_pad longer: a strided view), bias and y whose row padding starts NaN and must stay so.
template <typename W>
::testing::AssertionResult run_linear(cu::LinearContext& ctx, const W& w, const RunOptions& o,
                                      std::mt19937& rng, LinearRun* run) {
  const int64_t in = w.q.in_features, out = w.q.out_features;
  Mirror dx(testing::random_tensor({o.n, in + o.x_pad}, rng));
  Tensor x = dx.host().slice(1, 0, in);
  Tensor bias;
  if (o.bias) bias = testing::convert(testing::random_tensor({out}, rng), o.bias_dtype);
  Mirror db = o.bias ? Mirror(bias) : Mirror();
  Mirror dy(testing::nan_tensor({o.n, out + o.y_pad}));
  cu::LinearArgs a = w.args();
  a.x = dx.ptr<float>(x);
  a.x_stride = x.stride(0);
  a.bias = o.bias ? db.ptr<void>() : nullptr;
  a.bias_dtype = o.bias_dtype;
  a.y = dy.ptr<float>();
  a.y_stride = out + o.y_pad;
  a.n = o.n;
  Status s = cu::linear(ctx, a, nullptr, o.algo);
  if (s.ok()) s = cu::synchronize(nullptr);
  if (s.ok()) s = dy.download();
  if (!s.ok()) return ::testing::AssertionFailure() << s.to_string();
  if (o.y_pad > 0) {
    auto pad = testing::all_nan(dy.host().slice(1, out, out + o.y_pad), "y padding");
    if (!pad) return pad;
  }
  run->x = x;
  run->bias = bias;
  run->y = dy.host().slice(1, 0, out).contiguous();
  return ::testing::AssertionSuccess();
}

}  // namespace tachyon::testing
