// QuantWeight: a linear layer's weight kept in a packed low-bit format (packed data + scales +
// zeros + group size + format). `ops::linear` dispatches on `format`; a new format touches
// quant/ and the kernels, never the model. quant/quantize.h defines each layout. GGUF Q4_0 linear
// weights load as kInt4Group (group 32, zero 8: the same nibbles); GGUF Q8_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL, Q4_K, Q5_K and Q6_K keep their own block formats (kGguf*).
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace tachyon {

enum class QuantFormat : uint8_t {
  kGgufQ8_0,    // blocks of 32: int8 codes and one f16 scale per block
  kGgufQ4_K,    // super-blocks of 256: 4-bit codes, 6-bit scales and mins per 32, f16 d and dmin
  kGgufQ6_K,    // super-blocks of 256: 6-bit codes, int8 scales per 16, f16 d
  kGgufQ4_1,    // blocks of 32: 4-bit codes, f16 scale and min
  kGgufQ5_0,    // blocks of 32: 5-bit codes (offset 16), f16 scale
  kGgufQ5_1,    // blocks of 32: 5-bit codes, f16 scale and min
  kGgufQ5_K,    // super-blocks of 256: 5-bit codes, 6-bit scales and mins per 32, f16 d and dmin
  kGgufIq4Nl,   // blocks of 32: 4-bit indexes into a fixed 16-level table, f16 scale
  kW8A8,        // int8 per output channel (kInt8Channel's layout) x int8 activations per token
  kTernary,     // {-1, 0, +1} x a per-group absmean scale, 2 bits per weight
  kFp8Channel,  // fp8 e4m3 per output channel (W8A16 in floating point)
  kInt8Channel, // int8 per output channel, symmetric (W8A16)
  kInt4Group,   // int4 group-wise asymmetric with zero points (RTN or AWQ)
};

const char* quant_format_name(QuantFormat format);

struct QuantWeight {
  QuantFormat format = QuantFormat::kInt8Channel;
  int64_t out_features = 0;
  int64_t in_features = 0;
  int group_size = 0;
  Tensor packed;  // format-specific packed values
  Tensor scales;  // [out, in / group] (or [out] per channel)
  Tensor zeros;   // same shape as scales where the format is asymmetric; else undefined
  // Static activation scale (one per tensor, calibrated offline; quant/observers.h): kW8A8 rounds
  // its input to int8 codes x input_scale and kFp8Channel to fp8 e4m3 codes x input_scale, instead
  // of a per-token absmax (W8A8) or no activation rounding (FP8). 0: dynamic / none.
  float input_scale = 0.0f;
};

// The weight of a linear layer: dense [out_features, in_features] (f32/f16/bf16), or quantized.
struct Weight {
  Tensor dense;
  std::shared_ptr<const QuantWeight> quant;
  // Set on a loaded model's weights once the device holds them (LlamaModel): nothing writes them
  // afterwards, so a kernel may start reading them before the work queued ahead of it ends (CUDA:
  // before pdl_wait). Never set on a Weight that wraps an activation.
  bool constant = false;

  bool defined() const { return dense.defined() || quant != nullptr; }
  int64_t out_features() const { return quant ? quant->out_features : dense.size(0); }
  int64_t in_features() const { return quant ? quant->in_features : dense.size(1); }
  // Bytes read by one pass over the weight (what bounds batch-1 decode).
  size_t nbytes() const;
};

}  // namespace tachyon
