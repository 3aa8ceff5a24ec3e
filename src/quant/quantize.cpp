#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"

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

// Row o of w as f32.
void load_row(const Tensor& w, int64_t o, float* row) {
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
    default: TACHYON_CHECK(false, "load_row: {}", dtype_name(w.dtype()));
  }
}

}  // namespace

Result<QuantWeight> quantize_int8_channel(const Tensor& w_dense) {
  TACHYON_RETURN_IF_ERROR(check_dense(w_dense, "int8 quantization"));
  const int64_t out = w_dense.size(0), in = w_dense.size(1);
  QuantWeight q;
  q.format = QuantFormat::kInt8Channel;
  q.out_features = out;
  q.in_features = in;
  q.packed = Tensor::empty({out, in}, DType::kI8);
  q.scales = Tensor::empty({out}, DType::kF32);
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    load_row(w_dense, o, row.data());
    float max_abs = 0.0f;
    for (float v : row) {
      if (!std::isfinite(v)) {
        return make_error(ErrorCode::kInvalidArgument, "int8 quantization: row {} holds {}", o, v);
      }
      max_abs = std::max(max_abs, std::fabs(v));
    }
    const float scale = max_abs / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    int8_t* dst = q.packed.data<int8_t>() + o * in;
    for (int64_t i = 0; i < in; ++i) {
      dst[i] = static_cast<int8_t>(std::clamp(std::nearbyint(row[static_cast<size_t>(i)] * inv), -127.0f, 127.0f));
    }
    q.scales.data<float>()[o] = scale;
  }
  return q;
}

Result<QuantWeight> quantize_int4_group(const Tensor& w_dense, int group) {
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
  QuantWeight q;
  q.format = QuantFormat::kInt4Group;
  q.out_features = out;
  q.in_features = in;
  q.group_size = group;
  q.packed = Tensor::zeros({out, in / 2}, DType::kU8);
  q.scales = Tensor::empty({out, groups}, DType::kF32);
  q.zeros = Tensor::empty({out, groups}, DType::kF32);
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    load_row(w_dense, o, row.data());
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
      const float scale = (hi - lo) / 15.0f;
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      const float zero = std::clamp(std::nearbyint(-lo * inv), 0.0f, 15.0f);
      q.scales.data<float>()[o * groups + g] = scale;
      q.zeros.data<float>()[o * groups + g] = zero;
      for (int i = 0; i < group; ++i) {
        const auto v = static_cast<uint8_t>(std::clamp(std::nearbyint(w[i] * inv) + zero, 0.0f, 15.0f));
        const int64_t k = g * group + i;  // column
        const int64_t block = k / kInt4Block, j = k % kInt4Block;
        uint8_t& byte = dst[block * (kInt4Block / 2) + j % (kInt4Block / 2)];
        byte = static_cast<uint8_t>(byte | (j < kInt4Block / 2 ? v : v << 4));
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
    default: TACHYON_CHECK(false, "dequantize: no dequantization for {}", quant_format_name(q.format));
  }
  return w;
}

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
  } else {
    return make_error(ErrorCode::kInvalidArgument, "--quant '{}': expected int8 or int4", name);
  }
  return spec;
}

Result<Weight> quantize_weight(const Weight& w, const QuantSpec& spec) {
  if (w.quant) {
    return make_error(ErrorCode::kInvalidArgument, "the weight is already quantized ({})",
                      quant_format_name(w.quant->format));
  }
  Result<QuantWeight> q = spec.format == QuantFormat::kInt4Group ? quantize_int4_group(w.dense, spec.group_size)
                                                                  : quantize_int8_channel(w.dense);
  if (!q.ok()) return q.status();
  Weight result;
  result.quant = std::make_shared<const QuantWeight>(std::move(q).value());
  return result;
}

}  // namespace tachyon
