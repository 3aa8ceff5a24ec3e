// The quantized linear's oracle: the definition of the format (dequantize) followed by the
// definition of linear (the scalar reference). Slow by design: it materialises W in f32 per call.
#include "ops/cpu/quant_linear.h"
#include "ops/cpu/reference.h"
#include "quant/quantize.h"

namespace tachyon::ops::cpu {

void quant_linear_reference(const Tensor& x, const QuantWeight& w, const Tensor* bias, Tensor& y) {
  Weight dense;
  dense.dense = dequantize(w);
  reference::linear(x, dense, bias, y);
}

}  // namespace tachyon::ops::cpu
