// Round-to-nearest weight quantization into the packed formats of quant_weight.h, and the
// dequantization that defines what a packed weight means. dequantize() is the definition every
// kernel is checked against (tests compare a kernel with "dequantize, then the reference
// linear"); the kernels must decode the same layout bit for bit.
//
// Layouts (row-major, one output row after another):
// - kInt8Channel: packed [out, in] i8, scales [out] f32; w[o, i] = packed[o, i] * scales[o],
//   scales[o] = max_i |w[o, i]| / 127 (0 for an all-zero row).
// - kInt4Group:  packed [out, in / 2] u8 in blocks of 32 weights = 16 bytes; byte j of a block
//   holds weight j in its low nibble and weight j + 16 in its high nibble (the GGUF Q4_0 order:
//   one load and two nibble masks give 16 consecutive weights each). scales, zeros
//   [out, in / group] f32; w[o, i] = (q - zeros[o, g]) * scales[o, g] with g = i / group.
//   The range of each group is widened to include 0, so zeros are integers in [0, 15] (they fit
//   4 bits, as AutoAWQ's qzeros need) and the error of every weight is at most scales / 2.
#pragma once

#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "quant/quant_weight.h"

namespace tachyon {

// w_dense [out, in] f32/f16/bf16 on the host (any row stride, unit column stride).
Result<QuantWeight> quantize_int8_channel(const Tensor& w_dense);
// group: 32, 64 or 128, dividing in.
Result<QuantWeight> quantize_int4_group(const Tensor& w_dense, int group);

// The weight a packed one stands for: [out, in] f32. Only kInt8Channel and kInt4Group (an
// internal invariant: callers dispatch on the format first).
Tensor dequantize(const QuantWeight& w);

// What load-time quantization turns linear weights into.
struct QuantSpec {
  QuantFormat format = QuantFormat::kInt8Channel;
  int group_size = 128;  // kInt4Group only
};
// "int8" or "int4" (with `group`) -> a spec; anything else is an error naming the choices.
Result<QuantSpec> parse_quant_spec(const std::string& name, int group);

// A dense weight on the host quantized as `spec`; an already quantized weight is an error.
Result<Weight> quantize_weight(const Weight& w, const QuantSpec& spec);

}  // namespace tachyon
