#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "core/ggml_blocks.h"

namespace tachyon {
namespace {

constexpr int64_t kInt4Block = 32;  // weights per 16-byte block of kInt4Group

// Checks shape, dtype and device of a weight to quantize; `what` names the format.
Status check_dense(const Tensor& w, const char* what) {
  if (!w.defined()) return make_error(ErrorCode::kInvalidArgument, "{}: the weight is undefined", what);
  if (!w.device().is_cpu()) {
    return make_error(ErrorCode::kUnsupported, "{}: the weight is on {}; quantization runs on the host", what,
                      w.device().to_string());
  }
  if (w.dim() != 2) return make_error(ErrorCode::kInvalidArgument, "{}: the weight is {}, expected [out, in]", what,
                                      w.shape_string());
  if (w.dtype() != DType::kF32 && w.dtype() != DType::kF16 && w.dtype() != DType::kBF16) {
    return make_error(ErrorCode::kInvalidArgument, "{}: the weight is {}, expected f32, f16 or bf16", what,
                      dtype_name(w.dtype()));
  }
  if (w.size(1) > 1 && w.stride(1) != 1) {
    return make_error(ErrorCode::kInvalidArgument, "{}: the weight's columns are not contiguous", what);
  }
  return Status::Ok();
}

// A kInt4Group weight with zeroed codes and unset scales and zeros.
QuantWeight empty_int4(int64_t out, int64_t in, int group) {
  QuantWeight q;
  q.format = QuantFormat::kInt4Group;
  q.out_features = out;
  q.in_features = in;
  q.group_size = group;
  q.packed = Tensor::zeros({out, in / 2}, DType::kU8);
  q.scales = Tensor::empty({out, in / group}, DType::kF32);
  q.zeros = Tensor::empty({out, in / group}, DType::kF32);
  return q;
}

// The smallest f16 value >= x (x >= 0 and finite); Inf when x is beyond f16's range.
float f16_at_least(float x) {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) < x) ++h;  // the next f16 up: for positive values, the next bit pattern
  return f16_to_f32(h);
}

// Where code k of a row goes in the kInt4Group packing: the byte and the shift of its nibble.
inline int64_t int4_byte(int64_t k) { return (k / kInt4Block) * (kInt4Block / 2) + (k % kInt4Block) % (kInt4Block / 2); }
inline int int4_shift(int64_t k) { return (k % kInt4Block) < kInt4Block / 2 ? 0 : 4; }

}  // namespace

void load_row_f32(const Tensor& w, int64_t o, float* row) {
  const int64_t in = w.size(1);
  const char* base = static_cast<const char*>(w.raw_data()) + o * w.stride(0) * static_cast<int64_t>(dtype_size(w.dtype()));
  switch (w.dtype()) {
    case DType::kF32: std::copy_n(reinterpret_cast<const float*>(base), in, row); break;
    case DType::kBF16:
      for (int64_t i = 0; i < in; ++i) row[i] = bf16_to_f32(reinterpret_cast<const uint16_t*>(base)[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < in; ++i) row[i] = f16_to_f32(reinterpret_cast<const uint16_t*>(base)[i]);
      break;
    default: TACHYON_CHECK(false, "load_row_f32: {}", dtype_name(w.dtype()));
  }
}

Int4GroupParams int4_group_params(float lo, float hi, Int4Scales scales) {
  Int4GroupParams p;
  p.scale = (hi - lo) / 15.0f;
  if (scales == Int4Scales::kF16) p.scale = f16_at_least(p.scale);
  p.inv_scale = p.scale > 0.0f ? 1.0f / p.scale : 0.0f;
  p.zero = std::clamp(std::nearbyint(-lo * p.inv_scale), 0.0f, 15.0f);
  return p;
}

namespace {

// Symmetric quantization per output row, shared by int8 and fp8: scale = max|w| / qmax and
// codes encode(w * (1 / scale)) (all zero for an all-zero row, scale 0).
template <typename Code, typename Encode>
Result<QuantWeight> quantize_rows(const Tensor& w_dense, QuantFormat format, DType code_dtype, float qmax,
                                  const char* what, const Encode& encode) {
  TACHYON_RETURN_IF_ERROR(check_dense(w_dense, what));
  const int64_t out = w_dense.size(0), in = w_dense.size(1);
  QuantWeight q;
  q.format = format;
  q.out_features = out;
  q.in_features = in;
  TACHYON_ASSIGN_OR_RETURN(q.packed, Tensor::try_empty({out, in}, code_dtype));
  TACHYON_ASSIGN_OR_RETURN(q.scales, Tensor::try_empty({out}, DType::kF32));
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    load_row_f32(w_dense, o, row.data());
    float max_abs = 0.0f;
    for (float v : row) {
      if (!std::isfinite(v)) return make_error(ErrorCode::kInvalidArgument, "{}: row {} holds {}", what, o, v);
      max_abs = std::max(max_abs, std::fabs(v));
    }
    const float scale = max_abs / qmax;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    Code* dst = static_cast<Code*>(q.packed.raw_data()) + o * in;
    for (int64_t i = 0; i < in; ++i) dst[i] = encode(row[static_cast<size_t>(i)] * inv);
    q.scales.data<float>()[o] = scale;
  }
  return q;
}

}  // namespace

Result<QuantWeight> quantize_int8_channel(const Tensor& w_dense) {
  return quantize_rows<int8_t>(w_dense, QuantFormat::kInt8Channel, DType::kI8, 127.0f, "int8 quantization",
                               [](float v) { return static_cast<int8_t>(std::clamp(std::nearbyint(v), -127.0f, 127.0f)); });
}

Result<QuantWeight> quantize_fp8_channel(const Tensor& w_dense) {
  return quantize_rows<uint8_t>(w_dense, QuantFormat::kFp8Channel, DType::kF8E4M3, kF8E4M3Max, "fp8 quantization",
                                [](float v) { return f32_to_f8e4m3(v); });
}

Result<QuantWeight> quantize_int4_group(const Tensor& w_dense, int group) {
  return quantize_int4_group(w_dense, group, Int4Scales::kF32);
}

Result<QuantWeight> quantize_int4_group(const Tensor& w_dense, int group, Int4Scales scales) {
  TACHYON_RETURN_IF_ERROR(check_dense(w_dense, "int4 quantization"));
  if (group != 32 && group != 64 && group != 128) {
    return make_error(ErrorCode::kInvalidArgument, "int4 quantization: group size {} (expected 32, 64 or 128)", group);
  }
  const int64_t out = w_dense.size(0), in = w_dense.size(1);
  if (in % group != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "int4 quantization: in_features {} of weight {} is not a multiple of the group size {}", in,
                      w_dense.shape_string(), group);
  }
  const int64_t groups = in / group;
  QuantWeight q = empty_int4(out, in, group);
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    load_row_f32(w_dense, o, row.data());
    uint8_t* dst = q.packed.data<uint8_t>() + o * (in / 2);
    for (int64_t g = 0; g < groups; ++g) {
      const float* w = row.data() + g * group;
      float lo = 0.0f, hi = 0.0f;  // the range always holds 0: zeros stay in [0, 15]
      for (int i = 0; i < group; ++i) {
        if (!std::isfinite(w[i])) {
          return make_error(ErrorCode::kInvalidArgument, "int4 quantization: row {} holds {}", o, w[i]);
        }
        lo = std::min(lo, w[i]);
        hi = std::max(hi, w[i]);
      }
      const Int4GroupParams p = int4_group_params(lo, hi, scales);
      if (!std::isfinite(p.scale)) {
        return make_error(ErrorCode::kInvalidArgument,
                          "int4 quantization: row {} group {} spans [{}, {}], too wide for f16 scales", o, g, lo, hi);
      }
      q.scales.data<float>()[o * groups + g] = p.scale;
      q.zeros.data<float>()[o * groups + g] = p.zero;
      for (int i = 0; i < group; ++i) {
        const auto v = static_cast<uint8_t>(int4_code(w[i], p));
        const int64_t k = g * group + i;  // column
        const int64_t block = k / kInt4Block, j = k % kInt4Block;
        uint8_t& byte = dst[block * (kInt4Block / 2) + j % (kInt4Block / 2)];
        byte = static_cast<uint8_t>(byte | (j < kInt4Block / 2 ? v : v << 4));
      }
    }
  }
  return q;
}

float quantize_activation_row(const float* x, int64_t n, int8_t* codes) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (!finite || amax == 0.0f) {
    std::memset(codes, 0, static_cast<size_t>(n));
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 127.0f / amax;
  for (int64_t i = 0; i < n; ++i) {
    codes[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
  }
  return amax / 127.0f;
}

float quantize_activation_row_static(const float* x, int64_t n, float scale, int8_t* codes) {
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite = finite && std::isfinite(x[i]);
  if (!finite) {
    std::memset(codes, 0, static_cast<size_t>(n));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < n; ++i) {
    codes[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
  }
  return scale;
}

void round_activation_row_fp8(const float* x, int64_t n, float scale, float* out) {
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < n; ++i) out[i] = f8e4m3_to_f32(f32_to_f8e4m3(x[i] * inv)) * scale;
}

Result<QuantWeight> quantize_ternary(const Tensor& w_dense, int group) {
  TACHYON_RETURN_IF_ERROR(check_dense(w_dense, "ternary quantization"));
  const int64_t out = w_dense.size(0), in = w_dense.size(1);
  if (group != 32 && group != 64 && group != 128 && group != 256) {
    return make_error(ErrorCode::kInvalidArgument, "ternary quantization: group size {} (expected 32, 64, 128 or 256)",
                      group);
  }
  if (in % group != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "ternary quantization: in_features {} is not a multiple of the group size {}", in, group);
  }
  const int64_t groups = in / group;
  QuantWeight q;
  q.format = QuantFormat::kTernary;
  q.out_features = out;
  q.in_features = in;
  q.group_size = group;
  TACHYON_ASSIGN_OR_RETURN(q.packed, Tensor::try_empty({out, in / 4}, DType::kU8));
  TACHYON_ASSIGN_OR_RETURN(q.scales, Tensor::try_empty({out, groups}, DType::kF32));
  std::memset(q.packed.raw_data(), 0, static_cast<size_t>(out * in / 4));
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    load_row_f32(w_dense, o, row.data());
    uint8_t* dst = q.packed.data<uint8_t>() + o * (in / 4);
    for (int64_t g = 0; g < groups; ++g) {
      double sum = 0.0;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        if (!std::isfinite(row[static_cast<size_t>(i)])) {
          return make_error(ErrorCode::kInvalidArgument, "ternary quantization: weight [{}, {}] is not finite", o, i);
        }
        sum += std::fabs(row[static_cast<size_t>(i)]);
      }
      const float scale = static_cast<float>(sum / static_cast<double>(group));
      q.scales.data<float>()[o * groups + g] = scale;
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        const int t = static_cast<int>(std::clamp(std::nearbyint(row[static_cast<size_t>(i)] * inv), -1.0f, 1.0f));
        const int64_t block = i / 32, j = i % 32;
        dst[block * 8 + j % 8] = static_cast<uint8_t>(dst[block * 8 + j % 8] | ((t + 1) << (2 * (j / 8))));
      }
    }
  }
  return q;
}

Tensor dequantize(const QuantWeight& q) {
  const int64_t out = q.out_features, in = q.in_features;
  Tensor w = Tensor::empty({out, in}, DType::kF32);
  float* dst = w.data<float>();
  switch (q.format) {
    case QuantFormat::kInt8Channel:
    case QuantFormat::kW8A8:
      for (int64_t o = 0; o < out; ++o) {
        const float scale = q.scales.data<float>()[o];
        for (int64_t i = 0; i < in; ++i) dst[o * in + i] = static_cast<float>(q.packed.data<int8_t>()[o * in + i]) * scale;
      }
      break;
    case QuantFormat::kInt4Group: {
      const int64_t groups = in / q.group_size;
      for (int64_t o = 0; o < out; ++o) {
        const uint8_t* src = q.packed.data<uint8_t>() + o * (in / 2);
        for (int64_t k = 0; k < in; ++k) {
          const int64_t block = k / kInt4Block, j = k % kInt4Block;
          const uint8_t byte = src[block * (kInt4Block / 2) + j % (kInt4Block / 2)];
          const int v = j < kInt4Block / 2 ? (byte & 0x0f) : (byte >> 4);
          const int64_t g = k / q.group_size;
          dst[o * in + k] = (static_cast<float>(v) - q.zeros.data<float>()[o * groups + g]) *
                            q.scales.data<float>()[o * groups + g];
        }
      }
      break;
    }
    case QuantFormat::kGgufQ8_0: {
      const int8_t* codes = q.packed.data<int8_t>();
      const uint16_t* d = q.scales.data<uint16_t>();  // [out, in / 32] f16
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) {
          dst[o * in + i] = f16_to_f32(d[o * (in / 32) + i / 32]) * static_cast<float>(codes[o * in + i]);
        }
      }
      break;
    }
    case QuantFormat::kGgufQ4_K:
      dequantize_q4_k(q.packed.data<uint8_t>(), out * (in / kGgmlBlockK), dst);
      break;
    case QuantFormat::kGgufQ5_K:
      dequantize_q5_k(q.packed.data<uint8_t>(), out * (in / kGgmlBlockK), dst);
      break;
    case QuantFormat::kGgufQ4_1:
      dequantize_q4_1(q.packed.data<uint8_t>(), out * (in / kGgmlBlock32), dst);
      break;
    case QuantFormat::kGgufQ5_0:
      dequantize_q5_0(q.packed.data<uint8_t>(), out * (in / kGgmlBlock32), dst);
      break;
    case QuantFormat::kGgufQ5_1:
      dequantize_q5_1(q.packed.data<uint8_t>(), out * (in / kGgmlBlock32), dst);
      break;
    case QuantFormat::kGgufIq4Nl:
      dequantize_iq4_nl(q.packed.data<uint8_t>(), out * (in / kGgmlBlock32), dst);
      break;
    case QuantFormat::kFp8Channel:
      for (int64_t o = 0; o < out; ++o) {
        const float scale = q.scales.data<float>()[o];
        const uint8_t* src = q.packed.data<uint8_t>() + o * in;
        for (int64_t i = 0; i < in; ++i) dst[o * in + i] = f8e4m3_to_f32(src[i]) * scale;
      }
      break;
    case QuantFormat::kTernary: {
      const int64_t groups = in / q.group_size;
      for (int64_t o = 0; o < out; ++o) {
        const uint8_t* src = q.packed.data<uint8_t>() + o * (in / 4);
        for (int64_t i = 0; i < in; ++i) {
          const int64_t block = i / 32, j = i % 32;
          const int t = ((src[block * 8 + j % 8] >> (2 * (j / 8))) & 3) - 1;
          dst[o * in + i] = static_cast<float>(t) * q.scales.data<float>()[o * groups + i / q.group_size];
        }
      }
      break;
    }
    case QuantFormat::kGgufQ6_K: {
      // Put each block's d back behind it and decode the stored block.
      const int64_t blocks = out * (in / kGgmlBlockK);
      const uint8_t* src = q.packed.data<uint8_t>();
      const uint16_t* d = q.scales.data<uint16_t>();  // [out, in / 256] f16
      uint8_t block[kQ6_KBytes];
      for (int64_t b = 0; b < blocks; ++b) {
        std::memcpy(block, src + b * kQ6_KD, kQ6_KD);
        std::memcpy(block + kQ6_KD, d + b, 2);
        dequantize_q6_k(block, 1, dst + b * kGgmlBlockK);
      }
      break;
    }
  }
  return w;
}

namespace {
std::optional<QuantFormat> gguf_format_named(const std::string& name) {
  for (QuantFormat f : {QuantFormat::kGgufQ8_0, QuantFormat::kGgufQ4_1, QuantFormat::kGgufQ5_0, QuantFormat::kGgufQ5_1,
                        QuantFormat::kGgufIq4Nl, QuantFormat::kGgufQ4_K, QuantFormat::kGgufQ5_K, QuantFormat::kGgufQ6_K}) {
    if (name == quant_format_name(f)) return f;
  }
  return std::nullopt;
}
}  // namespace

Result<QuantSpec> parse_quant_spec(const std::string& name, int group) {
  QuantSpec spec;
  if (name == "int8") {
    spec.format = QuantFormat::kInt8Channel;
    spec.group_size = 0;
  } else if (name == "int4") {
    if (group != 32 && group != 64 && group != 128) {
      return make_error(ErrorCode::kInvalidArgument, "--quant-group {}: expected 32, 64 or 128", group);
    }
    spec.format = QuantFormat::kInt4Group;
    spec.group_size = group;
  } else if (name == "ternary") {
    if (group != 32 && group != 64 && group != 128 && group != 256) {
      return make_error(ErrorCode::kInvalidArgument, "--quant-group {}: expected 32, 64, 128 or 256", group);
    }
    spec.format = QuantFormat::kTernary;
    spec.group_size = group;
  } else if (name == "fp8") {
    spec.format = QuantFormat::kFp8Channel;
    spec.group_size = 0;
  } else if (name == "w8a8") {
    spec.format = QuantFormat::kW8A8;
    spec.group_size = 0;
  } else if (name == "q4_0") {
    spec.format = QuantFormat::kInt4Group;
    spec.group_size = 32;
    spec.gguf_q4_0 = true;
  } else if (std::optional<QuantFormat> gguf = gguf_format_named(name)) {
    spec.format = *gguf;
    spec.group_size = static_cast<int>(gguf_block_weights(*gguf));
  } else {
    return make_error(ErrorCode::kInvalidArgument,
                      "--quant '{}': expected int8, int4, w8a8, fp8, ternary, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, "
                      "q4_k, q5_k or q6_k", name);
  }
  return spec;
}

std::string quant_spec_name(const QuantSpec& spec) {
  if (spec.format == QuantFormat::kInt4Group) {
    return spec.gguf_q4_0 ? std::string("q4_0") : fmt::format("int4:g{}", spec.group_size);
  }
  if (spec.format == QuantFormat::kTernary) return fmt::format("ternary:g{}", spec.group_size);
  return quant_format_name(spec.format);
}

bool k_quant_fallback(QuantSpec& spec, int64_t in_features) {
  QuantFormat fallback;
  switch (spec.format) {
    case QuantFormat::kGgufQ4_K: fallback = QuantFormat::kGgufQ5_0; break;
    case QuantFormat::kGgufQ5_K: fallback = QuantFormat::kGgufQ5_1; break;
    case QuantFormat::kGgufQ6_K: fallback = QuantFormat::kGgufQ8_0; break;
    default: return false;
  }
  if (in_features % kGgmlBlockK == 0) return false;
  spec.format = fallback;
  spec.group_size = 32;
  return true;
}

Result<Weight> quantize_weight(const Weight& w, const QuantSpec& spec) {
  if (w.quant) {
    return make_error(ErrorCode::kInvalidArgument, "the weight is already quantized ({})",
                      quant_format_name(w.quant->format));
  }
  Result<QuantWeight> q = spec.gguf_q4_0                           ? quantize_gguf_q4_0(w.dense)
                          : spec.format == QuantFormat::kInt4Group ? quantize_int4_group(w.dense, spec.group_size, spec.int4_scales)
                          : spec.format == QuantFormat::kInt8Channel || spec.format == QuantFormat::kW8A8
                              ? quantize_int8_channel(w.dense)
                          : spec.format == QuantFormat::kTernary    ? quantize_ternary(w.dense, spec.group_size)
                          : spec.format == QuantFormat::kFp8Channel ? quantize_fp8_channel(w.dense)
                                                                 : quantize_gguf_blocks(w.dense, spec.format);
  if (!q.ok()) return q.status();
  q->format = spec.format;  // W8A8 holds the int8 per-channel weight
  Weight result;
  result.quant = std::make_shared<const QuantWeight>(std::move(q).value());
  return result;
}

// ---- Checkpoint layouts ----

namespace {

// A 2-d tensor of a checkpoint with exactly [rows, cols] of `dtype`, on the host; a contiguous
// copy when the view is strided (never for safetensors tensors).
Result<Tensor> packed_tensor(const Tensor& t, const char* name, DType dtype, int64_t rows, int64_t cols) {
  if (!t.defined()) return make_error(ErrorCode::kNotFound, "{} is missing", name);
  if (!t.device().is_cpu()) {
    return make_error(ErrorCode::kUnsupported, "{} is on {}; checkpoints are read on the host", name,
                      t.device().to_string());
  }
  if (t.dim() != 2 || t.size(0) != rows || t.size(1) != cols || t.dtype() != dtype) {
    return make_error(ErrorCode::kCorruptFile, "{} is {}, expected [{}, {}] {}", name, t.shape_string(), rows, cols,
                      dtype_name(dtype));
  }
  return t.is_contiguous() ? t : t.contiguous();
}

// Scales [rows, cols] (f32, f16 or bf16; `rows` = 1 may also come as a vector) as f32, each
// finite and >= 0.
Result<std::vector<float>> scales_f32(const Tensor& t, const char* name, int64_t rows, int64_t cols) {
  if (!t.defined()) return make_error(ErrorCode::kNotFound, "{} is missing", name);
  const bool shape_ok = (t.dim() == 2 && t.size(0) == rows && t.size(1) == cols);
  if (!shape_ok || (t.dtype() != DType::kF32 && t.dtype() != DType::kF16 && t.dtype() != DType::kBF16)) {
    return make_error(ErrorCode::kCorruptFile, "{} is {}, expected [{}, {}] f16, bf16 or f32", name, t.shape_string(),
                      rows, cols);
  }
  if (!t.device().is_cpu()) return make_error(ErrorCode::kUnsupported, "{} is not on the host", name);
  const Tensor f = t.to_f32();
  std::vector<float> out(f.data<float>(), f.data<float>() + f.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]) || out[i] < 0.0f) {
      return make_error(ErrorCode::kCorruptFile, "{}[{}, {}] = {}: scales must be finite and >= 0", name,
                        static_cast<int64_t>(i) / cols, static_cast<int64_t>(i) % cols, out[i]);
    }
  }
  return out;
}

// What every int4 checkpoint layout needs of the weight's shape: rows in whole words of 8 codes
// and groups of whole 32-code blocks (what the kernels decode at a time).
Status check_int4_geometry(int64_t out, int64_t in, int group) {
  if (group <= 0 || group % static_cast<int>(kInt4Block) != 0) {
    return make_error(ErrorCode::kUnsupported, "group size {}: int4 weights need a positive multiple of {}", group,
                      kInt4Block);
  }
  if (in % group != 0) {
    return make_error(ErrorCode::kCorruptFile, "in_features {} is not a multiple of the group size {}", in, group);
  }
  if (out % 8 != 0) {
    return make_error(ErrorCode::kUnsupported, "out_features {} is not a multiple of 8 (8 codes per int32)", out);
  }
  return Status::Ok();
}


inline uint32_t nibble(uint32_t word, int i) { return (word >> (4 * i)) & 0xfu; }

}  // namespace

Result<AwqGemmTensors> pack_awq_gemm(const QuantWeight& w) {
  if (w.format != QuantFormat::kInt4Group) {
    return make_error(ErrorCode::kInvalidArgument, "AutoAWQ packing: the weight is {}, expected int4",
                      quant_format_name(w.format));
  }
  const int64_t out = w.out_features, in = w.in_features, groups = in / w.group_size, cols = out / 8;
  TACHYON_RETURN_IF_ERROR(check_int4_geometry(out, in, w.group_size));
  int position[8];  // nibble of row o % 8 within its word
  for (int i = 0; i < 8; ++i) position[kAwqPackOrder[i]] = i;
  AwqGemmTensors t;
  t.qweight = Tensor::zeros({in, cols}, DType::kI32);
  t.qzeros = Tensor::zeros({groups, cols}, DType::kI32);
  t.scales = Tensor::empty({groups, out}, DType::kF16);
  auto* qweight = t.qweight.data<int32_t>();
  auto* qzeros = t.qzeros.data<int32_t>();
  auto* scales = t.scales.data<uint16_t>();
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* row = w.packed.data<uint8_t>() + o * (in / 2);
    const int shift = 4 * position[o % 8];
    for (int64_t k = 0; k < in; ++k) {
      const uint32_t code = (row[int4_byte(k)] >> int4_shift(k)) & 0xfu;
      qweight[k * cols + o / 8] = static_cast<int32_t>(static_cast<uint32_t>(qweight[k * cols + o / 8]) | code << shift);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float zero = w.zeros.data<float>()[o * groups + g];
      const float scale = w.scales.data<float>()[o * groups + g];
      if (!(zero >= 0.0f && zero <= 15.0f && zero == std::nearbyint(zero))) {
        return make_error(ErrorCode::kInvalidArgument, "AutoAWQ packing: zero point {} of row {} group {} is not an "
                          "integer in [0, 15]", zero, o, g);
      }
      const uint16_t half = f32_to_f16(scale);
      if (f16_to_f32(half) != scale) {
        return make_error(ErrorCode::kInvalidArgument, "AutoAWQ packing: scale {} of row {} group {} is not an f16 "
                          "value (quantize with f16 scales)", scale, o, g);
      }
      scales[g * out + o] = half;
      const auto z = static_cast<uint32_t>(zero);
      qzeros[g * cols + o / 8] = static_cast<int32_t>(static_cast<uint32_t>(qzeros[g * cols + o / 8]) | z << shift);
    }
  }
  return t;
}

Result<QuantWeight> unpack_awq_gemm(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales, int64_t out,
                                    int64_t in, int group) {
  TACHYON_RETURN_IF_ERROR(check_int4_geometry(out, in, group));
  const int64_t groups = in / group, cols = out / 8;
  TACHYON_ASSIGN_OR_RETURN(Tensor qw, packed_tensor(qweight, "qweight", DType::kI32, in, cols));
  TACHYON_ASSIGN_OR_RETURN(Tensor qz, packed_tensor(qzeros, "qzeros", DType::kI32, groups, cols));
  TACHYON_ASSIGN_OR_RETURN(std::vector<float> s, scales_f32(scales, "scales", groups, out));
  QuantWeight q = empty_int4(out, in, group);
  uint8_t* dst = q.packed.data<uint8_t>();
  const auto* words = qw.data<int32_t>();
  for (int64_t c = 0; c < cols; ++c) {  // 8 output rows at a time: their bytes are written in order
    for (int64_t k = 0; k < in; ++k) {
      const auto word = static_cast<uint32_t>(words[k * cols + c]);
      for (int i = 0; i < 8; ++i) {
        const int64_t o = 8 * c + kAwqPackOrder[i];
        dst[o * (in / 2) + int4_byte(k)] |= static_cast<uint8_t>(nibble(word, i) << int4_shift(k));
      }
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c = 0; c < cols; ++c) {
      const auto word = static_cast<uint32_t>(qz.data<int32_t>()[g * cols + c]);
      for (int i = 0; i < 8; ++i) {
        const int64_t o = 8 * c + kAwqPackOrder[i];
        q.zeros.data<float>()[o * groups + g] = static_cast<float>(nibble(word, i));
      }
    }
    for (int64_t o = 0; o < out; ++o) q.scales.data<float>()[o * groups + g] = s[static_cast<size_t>(g * out + o)];
  }
  return q;
}

Result<QuantWeight> unpack_gptq(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales,
                                const Tensor& g_idx, int64_t out, int64_t in, int group, GptqZeros zeros) {
  TACHYON_RETURN_IF_ERROR(check_int4_geometry(out, in, group));
  const int64_t groups = in / group, cols = out / 8;
  if (g_idx.defined()) {
    if (g_idx.dim() != 1 || g_idx.size(0) != in || (g_idx.dtype() != DType::kI32 && g_idx.dtype() != DType::kI64)) {
      return make_error(ErrorCode::kCorruptFile, "g_idx is {}, expected [{}] i32", g_idx.shape_string(), in);
    }
    const Tensor gi = g_idx.contiguous();
    for (int64_t k = 0; k < in; ++k) {
      const int64_t v = gi.dtype() == DType::kI32 ? gi.data<int32_t>()[k] : gi.data<int64_t>()[k];
      if (v != k / group) {
        return make_error(ErrorCode::kUnsupported, "g_idx[{}] = {}, expected {} (input {} in group {} of {}): "
                          "act-order GPTQ is not supported", k, v, k / group, k, k / group, group);
      }
    }
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor qw, packed_tensor(qweight, "qweight", DType::kI32, in / 8, out));
  TACHYON_ASSIGN_OR_RETURN(Tensor qz, packed_tensor(qzeros, "qzeros", DType::kI32, groups, cols));
  TACHYON_ASSIGN_OR_RETURN(std::vector<float> s, scales_f32(scales, "scales", groups, out));
  QuantWeight q = empty_int4(out, in, group);
  const auto* words = qw.data<int32_t>();
  for (int64_t o = 0; o < out; ++o) {
    uint8_t* row = q.packed.data<uint8_t>() + o * (in / 2);
    for (int64_t r = 0; r < in / 8; ++r) {
      const auto word = static_cast<uint32_t>(words[r * out + o]);
      for (int i = 0; i < 8; ++i) {
        const int64_t k = 8 * r + i;
        row[int4_byte(k)] |= static_cast<uint8_t>(nibble(word, i) << int4_shift(k));
      }
    }
  }
  const float offset = zeros == GptqZeros::kStoredMinusOne ? 1.0f : 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c = 0; c < cols; ++c) {
      const auto word = static_cast<uint32_t>(qz.data<int32_t>()[g * cols + c]);
      for (int i = 0; i < 8; ++i) {
        q.zeros.data<float>()[(8 * c + i) * groups + g] = static_cast<float>(nibble(word, i)) + offset;
      }
    }
    for (int64_t o = 0; o < out; ++o) q.scales.data<float>()[o * groups + g] = s[static_cast<size_t>(g * out + o)];
  }
  return q;
}

Int8ChannelTensors pack_int8_channel(const QuantWeight& w) {
  TACHYON_CHECK(w.format == QuantFormat::kInt8Channel || w.format == QuantFormat::kW8A8 ||
                    w.format == QuantFormat::kFp8Channel,
                "pack_int8_channel: the weight is {}",
                quant_format_name(w.format));
  Int8ChannelTensors t;
  t.weight = w.packed.is_contiguous() ? w.packed : w.packed.contiguous();
  t.weight_scale = (w.scales.is_contiguous() ? w.scales : w.scales.contiguous()).reshape({w.out_features, 1});
  return t;
}

Result<QuantWeight> unpack_int8_channel(const Tensor& weight, const Tensor& weight_scale, int64_t out, int64_t in) {
  TACHYON_ASSIGN_OR_RETURN(Tensor packed, packed_tensor(weight, "weight", DType::kI8, out, in));
  Tensor scale_2d = weight_scale;
  if (weight_scale.defined() && weight_scale.dim() == 1 && weight_scale.is_contiguous()) {
    scale_2d = weight_scale.reshape({weight_scale.size(0), 1});
  }
  TACHYON_ASSIGN_OR_RETURN(std::vector<float> s, scales_f32(scale_2d, "weight_scale", out, 1));
  QuantWeight q;
  q.format = QuantFormat::kInt8Channel;
  q.out_features = out;
  q.in_features = in;
  q.packed = std::move(packed);  // a view into the checkpoint when it is one
  q.scales = Tensor::empty({out}, DType::kF32);
  std::copy(s.begin(), s.end(), q.scales.data<float>());
  return q;
}

Result<QuantWeight> unpack_fp8_channel(const Tensor& weight, const Tensor& weight_scale, int64_t out, int64_t in) {
  TACHYON_ASSIGN_OR_RETURN(Tensor packed, packed_tensor(weight, "weight", DType::kF8E4M3, out, in));
  if (!weight_scale.defined()) return make_error(ErrorCode::kNotFound, "weight_scale is missing");
  const bool per_tensor = weight_scale.numel() == 1 && out != 1;
  Tensor scale_2d = weight_scale.contiguous().reshape({per_tensor ? 1 : weight_scale.numel(), 1});
  TACHYON_ASSIGN_OR_RETURN(std::vector<float> s, scales_f32(scale_2d, "weight_scale", per_tensor ? 1 : out, 1));
  QuantWeight q;
  q.format = QuantFormat::kFp8Channel;
  q.out_features = out;
  q.in_features = in;
  q.packed = std::move(packed);  // a view into the checkpoint when it is one
  q.scales = Tensor::empty({out}, DType::kF32);
  for (int64_t o = 0; o < out; ++o) q.scales.data<float>()[o] = s[per_tensor ? 0 : static_cast<size_t>(o)];
  return q;
}

Result<QuantWeight> unpack_ternary(const Tensor& weight_packed, const Tensor& weight_scale, int64_t out, int64_t in,
                                   int group) {
  if (group != 32 && group != 64 && group != 128 && group != 256) {
    return make_error(ErrorCode::kInvalidArgument, "ternary: group size {} (expected 32, 64, 128 or 256)", group);
  }
  if (out <= 0 || in <= 0 || in % group != 0) {
    return make_error(ErrorCode::kInvalidArgument, "ternary: a [{}, {}] weight (in a multiple of the group {})", out,
                      in, group);
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor packed, packed_tensor(weight_packed, "weight_packed", DType::kU8, out, in / 4));
  const auto* codes = packed.data<uint8_t>();
  for (int64_t i = 0; i < packed.numel(); ++i) {
    const uint8_t b = codes[i];
    for (int f = 0; f < 4; ++f) {
      if (((b >> (2 * f)) & 3u) == 3u) {
        return make_error(ErrorCode::kCorruptFile, "weight_packed[{}, {}] = {:#04x}: a 2-bit field holds 3 (ternary "
                          "codes are 0, 1, 2)", i / (in / 4), i % (in / 4), b);
      }
    }
  }
  TACHYON_ASSIGN_OR_RETURN(std::vector<float> s, scales_f32(weight_scale, "weight_scale", out, in / group));
  QuantWeight q;
  q.format = QuantFormat::kTernary;
  q.out_features = out;
  q.in_features = in;
  q.group_size = group;
  q.packed = std::move(packed);  // a view into the checkpoint when it is one
  q.scales = Tensor::empty({out, in / group}, DType::kF32);
  std::copy(s.begin(), s.end(), q.scales.data<float>());
  return q;
}

Result<QuantWeight> unpack_gguf_q4_0(const Tensor& blocks, int64_t out, int64_t in) {
  constexpr int64_t kBlock = 32, kBlockBytes = 18;
  if (out <= 0 || in <= 0 || in % kBlock != 0) {
    return make_error(ErrorCode::kInvalidArgument, "gguf q4_0: a [{}, {}] weight (in must be a positive multiple of 32)",
                      out, in);
  }
  const int64_t groups = in / kBlock;
  const int64_t want = out * groups * kBlockBytes;
  if (!blocks.defined() || blocks.dtype() != DType::kU8 || blocks.dim() != 1 || blocks.numel() != want ||
      !blocks.is_contiguous()) {
    return make_error(ErrorCode::kCorruptFile, "gguf q4_0: {} bytes ({}) for a [{}, {}] weight, expected {} u8",
                      blocks.defined() ? blocks.nbytes() : 0, blocks.defined() ? blocks.shape_string() : "undefined",
                      out, in, want);
  }
  QuantWeight q;
  q.format = QuantFormat::kInt4Group;
  q.out_features = out;
  q.in_features = in;
  q.group_size = static_cast<int>(kBlock);
  TACHYON_ASSIGN_OR_RETURN(q.packed, Tensor::try_empty({out, in / 2}, DType::kU8));
  TACHYON_ASSIGN_OR_RETURN(q.scales, Tensor::try_empty({out, groups}, DType::kF32));
  TACHYON_ASSIGN_OR_RETURN(q.zeros, Tensor::try_empty({out, groups}, DType::kF32));
  const auto* src = static_cast<const uint8_t*>(blocks.raw_data());
  auto* codes = q.packed.data<uint8_t>();
  float* scales = q.scales.data<float>();
  float* zeros = q.zeros.data<float>();
  for (int64_t b = 0; b < out * groups; ++b) {
    const uint8_t* block = src + b * kBlockBytes;
    uint16_t d_bits;
    std::memcpy(&d_bits, block, 2);
    const float d = f16_to_f32(d_bits);
    if (!std::isfinite(d)) {
      return make_error(ErrorCode::kCorruptFile, "gguf q4_0: block {} of row {} has a non-finite scale", b % groups,
                        b / groups);
    }
    scales[b] = d;
    zeros[b] = 8.0f;
    std::memcpy(codes + b * (kBlock / 2), block + 2, kBlock / 2);
  }
  return q;
}

namespace {

// A block format as GGUF stores it: weights and bytes per block, and the offsets of its f16
// fields (d, and dmin or m where it has one; -1 where not).
struct GgufBlockLayout {
  int64_t weights, bytes;
  int f16_a, f16_b;
};

GgufBlockLayout gguf_layout(QuantFormat format) {
  switch (format) {
    case QuantFormat::kGgufQ8_0: return {kGgmlBlock32, kQ8_0Bytes, 0, -1};
    case QuantFormat::kGgufQ4_1: return {kGgmlBlock32, kQ4_1Bytes, 0, 2};
    case QuantFormat::kGgufQ5_0: return {kGgmlBlock32, kQ5_0Bytes, 0, -1};
    case QuantFormat::kGgufQ5_1: return {kGgmlBlock32, kQ5_1Bytes, 0, 2};
    case QuantFormat::kGgufIq4Nl: return {kGgmlBlock32, kIq4NlBytes, 0, -1};
    case QuantFormat::kGgufQ4_K: return {kGgmlBlockK, kQ4_KBytes, 0, 2};
    case QuantFormat::kGgufQ5_K: return {kGgmlBlockK, kQ5_KBytes, 0, 2};
    case QuantFormat::kGgufQ6_K: return {kGgmlBlockK, kQ6_KBytes, static_cast<int>(kQ6_KD), -1};
    default: TACHYON_CHECK(false, "{} is not a GGUF block format", quant_format_name(format));
  }
  return {};
}

}  // namespace

bool is_gguf_block_format(QuantFormat format) {
  switch (format) {
    case QuantFormat::kGgufQ8_0:
    case QuantFormat::kGgufQ4_1:
    case QuantFormat::kGgufQ5_0:
    case QuantFormat::kGgufQ5_1:
    case QuantFormat::kGgufIq4Nl:
    case QuantFormat::kGgufQ4_K:
    case QuantFormat::kGgufQ5_K:
    case QuantFormat::kGgufQ6_K: return true;
    default: return false;
  }
}

int64_t gguf_row_bytes(QuantFormat format, int64_t in) {
  const GgufBlockLayout l = gguf_layout(format);
  return in / l.weights * l.bytes;
}

int64_t gguf_block_weights(QuantFormat format) { return gguf_layout(format).weights; }

Result<QuantWeight> unpack_gguf_blocks(QuantFormat format, const Tensor& blocks, int64_t out, int64_t in) {
  TACHYON_CHECK(is_gguf_block_format(format), "unpack_gguf_blocks: {} is not a GGUF block format",
                quant_format_name(format));
  const char* name = quant_format_name(format);
  const GgufBlockLayout layout = gguf_layout(format);
  const int64_t block = layout.weights;
  if (out <= 0 || in <= 0 || in % block != 0) {
    return make_error(ErrorCode::kInvalidArgument, "gguf {}: a [{}, {}] weight (in must be a positive multiple of {})",
                      name, out, in, block);
  }
  const int64_t want = out * gguf_row_bytes(format, in);
  if (!blocks.defined() || blocks.dtype() != DType::kU8 || blocks.dim() != 1 || blocks.numel() != want ||
      !blocks.is_contiguous()) {
    return make_error(ErrorCode::kCorruptFile, "gguf {}: {} bytes ({}) for a [{}, {}] weight, expected {} u8", name,
                      blocks.defined() ? blocks.nbytes() : 0, blocks.defined() ? blocks.shape_string() : "undefined",
                      out, in, want);
  }
  const int64_t per_row = in / block, n_blocks = out * per_row;
  const auto* src = static_cast<const uint8_t*>(blocks.raw_data());
  auto finite_f16 = [&](const uint8_t* p, int64_t b, const char* what) -> Status {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    if (std::isfinite(f16_to_f32(bits))) return Status::Ok();
    return make_error(ErrorCode::kCorruptFile, "gguf {}: block {} of row {} has a non-finite {}", name, b % per_row,
                      b / per_row, what);
  };
  QuantWeight q;
  q.format = format;
  q.out_features = out;
  q.in_features = in;
  q.group_size = static_cast<int>(block);
  switch (format) {
    case QuantFormat::kGgufQ8_0: {
      TACHYON_ASSIGN_OR_RETURN(q.packed, Tensor::try_empty({out, in}, DType::kI8));
      TACHYON_ASSIGN_OR_RETURN(q.scales, Tensor::try_empty({out, per_row}, DType::kF16));
      auto* codes = static_cast<uint8_t*>(q.packed.raw_data());
      auto* d = static_cast<uint8_t*>(q.scales.raw_data());
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* blk = src + b * kQ8_0Bytes;
        TACHYON_RETURN_IF_ERROR(finite_f16(blk, b, "scale"));
        std::memcpy(d + b * 2, blk, 2);
        std::memcpy(codes + b * kGgmlBlock32, blk + 2, kGgmlBlock32);
      }
      break;
    }
    case QuantFormat::kGgufQ6_K: {
      TACHYON_ASSIGN_OR_RETURN(q.packed, Tensor::try_empty({out, per_row * kQ6_KD}, DType::kU8));
      TACHYON_ASSIGN_OR_RETURN(q.scales, Tensor::try_empty({out, per_row}, DType::kF16));
      auto* dst = static_cast<uint8_t*>(q.packed.raw_data());
      auto* d = static_cast<uint8_t*>(q.scales.raw_data());
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* blk = src + b * kQ6_KBytes;
        TACHYON_RETURN_IF_ERROR(finite_f16(blk + kQ6_KD, b, "d"));
        std::memcpy(dst + b * kQ6_KD, blk, kQ6_KD);
        std::memcpy(d + b * 2, blk + kQ6_KD, 2);
      }
      break;
    }
    default: {
      // The blocks as stored (Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K).
      const char* second = format == QuantFormat::kGgufQ4_K || format == QuantFormat::kGgufQ5_K ? "dmin" : "m";
      TACHYON_ASSIGN_OR_RETURN(q.packed, Tensor::try_empty({out, per_row * layout.bytes}, DType::kU8));
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* blk = src + b * layout.bytes;
        TACHYON_RETURN_IF_ERROR(finite_f16(blk + layout.f16_a, b, "d"));
        if (layout.f16_b >= 0) TACHYON_RETURN_IF_ERROR(finite_f16(blk + layout.f16_b, b, second));
      }
      std::memcpy(q.packed.raw_data(), src, static_cast<size_t>(want));
      break;
    }
  }
  return q;
}
Result<QuantWeight> quantize_gguf_q4_0(const Tensor& w_dense) {
  TACHYON_RETURN_IF_ERROR(check_dense(w_dense, "q4_0 quantization"));
  const int64_t out = w_dense.size(0), in = w_dense.size(1);
  if (in % kGgmlBlock32 != 0) {
    return make_error(ErrorCode::kInvalidArgument, "q4_0 quantization: in_features {} is not a multiple of 32", in);
  }
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(out * (in / kGgmlBlock32) * kQ4_0Bytes));
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    load_row_f32(w_dense, o, row.data());
    for (int64_t i = 0; i < in; ++i) {
      if (!std::isfinite(row[i]) || std::fabs(row[i]) > 60000.0f) {
        return make_error(ErrorCode::kInvalidArgument, "q4_0 quantization: weight [{}, {}] = {} cannot be encoded", o,
                          i, row[i]);
      }
    }
    quantize_q4_0(row.data(), in, &bytes);
  }
  Tensor blocks = Tensor::empty({static_cast<int64_t>(bytes.size())}, DType::kU8);
  std::memcpy(blocks.raw_data(), bytes.data(), bytes.size());
  return unpack_gguf_q4_0(blocks, out, in);
}

Result<QuantWeight> quantize_gguf_blocks(const Tensor& w_dense, QuantFormat format) {
  TACHYON_CHECK(is_gguf_block_format(format), "quantize_gguf_blocks: {} is not a GGUF block format",
                quant_format_name(format));
  const char* name = quant_format_name(format);
  TACHYON_RETURN_IF_ERROR(check_dense(w_dense, name));
  const int64_t out = w_dense.size(0), in = w_dense.size(1);
  const int64_t block = gguf_layout(format).weights;
  if (in % block != 0) {
    return make_error(ErrorCode::kInvalidArgument, "{} quantization: in_features {} is not a multiple of {}", name, in,
                      block);
  }
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(out * gguf_row_bytes(format, in)));
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    load_row_f32(w_dense, o, row.data());
    for (int64_t i = 0; i < in; ++i) {
      // Block scales are f16: a value past its range (or not finite) has no encoding.
      if (!std::isfinite(row[i]) || std::fabs(row[i]) > 60000.0f) {
        return make_error(ErrorCode::kInvalidArgument, "{} quantization: weight [{}, {}] = {} cannot be encoded", name,
                          o, i, row[i]);
      }
    }
    switch (format) {
      case QuantFormat::kGgufQ8_0: quantize_q8_0(row.data(), in, &bytes); break;
      case QuantFormat::kGgufQ4_K: quantize_q4_k(row.data(), in, &bytes); break;
      case QuantFormat::kGgufQ6_K: quantize_q6_k(row.data(), in, &bytes); break;
      case QuantFormat::kGgufQ4_1: quantize_q4_1(row.data(), in, &bytes); break;
      case QuantFormat::kGgufQ5_0: quantize_q5_0(row.data(), in, &bytes); break;
      case QuantFormat::kGgufQ5_1: quantize_q5_1(row.data(), in, &bytes); break;
      case QuantFormat::kGgufQ5_K: quantize_q5_k(row.data(), in, &bytes); break;
      case QuantFormat::kGgufIq4Nl: quantize_iq4_nl(row.data(), in, &bytes); break;
      default: TACHYON_CHECK(false, "quantize_gguf_blocks: {}", name);
    }
  }
  Tensor blocks = Tensor::empty({static_cast<int64_t>(bytes.size())}, DType::kU8);
  std::memcpy(blocks.raw_data(), bytes.data(), bytes.size());
  return unpack_gguf_blocks(format, blocks, out, in);
}

}  // namespace tachyon
