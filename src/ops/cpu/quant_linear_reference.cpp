// The quantized linear's oracle: the definition of the format (dequantize) followed by the
// definition of linear (the scalar reference). Slow by design: it materialises W in f32 per call.
// W8A8 quantizes the activations too, so its oracle is its own definition (quant/quantize.h):
// per token codes and scale, exact integer sums, one scaling.
#include <cmath>
#include <vector>

#include "ops/cpu/quant_linear.h"
#include "ops/cpu/reference.h"
#include "quant/quantize.h"

namespace tachyon::ops::cpu {
namespace {

void w8a8_reference(const Tensor& x, const QuantWeight& w, const Tensor* bias, Tensor& y) {
  const int64_t n = x.size(0), in = w.in_features, out = w.out_features;
  const int8_t* codes = w.packed.data<int8_t>();  // [out, in]
  const float* scales = w.scales.data<float>();   // [out]
  std::vector<int8_t> qx(static_cast<size_t>(in));
  for (int64_t t = 0; t < n; ++t) {
    const float sx = quantize_activation_row(x.data<float>() + t * x.stride(0), in, qx.data());
    for (int64_t o = 0; o < out; ++o) {
      int32_t acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += static_cast<int32_t>(qx[static_cast<size_t>(i)]) * codes[o * in + i];
      const float s = sx * scales[o];
      y.data<float>()[t * y.stride(0) + o] =
          bias != nullptr ? std::fma(static_cast<float>(acc), s, bias->data<float>()[o]) : static_cast<float>(acc) * s;
    }
  }
}

}  // namespace

void quant_linear_reference(const Tensor& x, const QuantWeight& w, const Tensor* bias, Tensor& y) {
  if (w.format == QuantFormat::kW8A8) return w8a8_reference(x, w, bias, y);
  Weight dense;
  dense.dense = dequantize(w);
  reference::linear(x, dense, bias, y);
}

}  // namespace tachyon::ops::cpu
