// The quantized linear's oracle: the definition of the format (dequantize) followed by the
// definition of linear (the scalar reference). Slow by design: it materialises W in f32 per call.
// W8A8 quantizes the activations too, so its oracle is its own definition (quant/quantize.h):
// per token codes and scale (or the weight's static one), exact integer sums, one scaling. An fp8
// weight's static activation scale rounds the activations first.
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
    const float* xr = x.data<float>() + t * x.stride(0);
    const float sx = w.input_scale > 0.0f ? quantize_activation_row_static(xr, in, w.input_scale, qx.data())
                                          : quantize_activation_row(xr, in, qx.data());
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
  if (w.format == QuantFormat::kFp8Channel && w.input_scale > 0.0f) {
    const int64_t n = x.size(0), in = w.in_features;
    Tensor rounded = Tensor::empty({n, in}, DType::kF32);
    for (int64_t t = 0; t < n; ++t) {
      round_activation_row_fp8(x.data<float>() + t * x.stride(0), in, w.input_scale, rounded.data<float>() + t * in);
    }
    reference::linear(rounded, dense, bias, y);
    return;
  }
  reference::linear(x, dense, bias, y);
}

}  // namespace tachyon::ops::cpu
