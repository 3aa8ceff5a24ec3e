#include "model/quantize_weights.h"

#include <cmath>
#include <memory>
#include <vector>

#include "core/device_memory.h"
#include "ops/ops.h"

namespace tachyon {
namespace {

// A dense weight on a device, quantized there to per-channel int8 (ops::quantize_int8_rows: the
// same bytes as the host's quantize_int8_channel).
Result<Weight> quantize_int8_on_device(const Weight& w, const char* name, size_t layer) {
  if (w.quant || !w.dense.defined() || w.dense.dim() != 2) {
    return make_error(ErrorCode::kInvalidArgument, "layer {} {}: expected a dense [out, in] weight", layer, name);
  }
  const Tensor& d = w.dense;
  auto q = std::make_shared<QuantWeight>();
  q->format = QuantFormat::kInt8Channel;
  q->out_features = d.size(0);
  q->in_features = d.size(1);
  TACHYON_ASSIGN_OR_RETURN(q->packed, empty_on({d.size(0), d.size(1)}, DType::kI8, d.device(), "int8 weight"));
  TACHYON_ASSIGN_OR_RETURN(q->scales, empty_on({d.size(0)}, DType::kF32, d.device(), "int8 scales"));
  ops::quantize_int8_rows(d, q->packed, q->scales);
  TACHYON_ASSIGN_OR_RETURN(Tensor scales, copy_to(q->scales, Device::cpu(), "int8 scales"));
  for (int64_t o = 0; o < scales.numel(); ++o) {
    if (!std::isfinite(scales.data<float>()[o])) {
      return make_error(ErrorCode::kInvalidArgument, "layer {} {}: int8 quantization: row {} holds a non-finite weight",
                        layer, name, o);
    }
  }
  Weight out;
  out.quant = std::move(q);
  return out;
}

// Rows [begin, end) of a per-channel int8 weight, sharing its memory.
Weight int8_rows(const Weight& w, int64_t begin, int64_t end) {
  auto q = std::make_shared<QuantWeight>(*w.quant);
  q->out_features = end - begin;
  q->packed = w.quant->packed.slice(0, begin, end);
  q->scales = w.quant->scales.slice(0, begin, end);
  Weight out;
  out.quant = std::move(q);
  return out;
}

// On a GPU: int8 only (the device has no int4 kernels yet). Fused projections are quantized as
// one matrix (per-channel scales are per row, so this is the same as quantizing the parts); the
// separate q/k/v and gate/up weights become row views of the result, so the 16-bit copies go.
Status quantize_on_device(ModelWeights& weights, const QuantSpec& spec) {
  if (spec.format != QuantFormat::kInt8Channel) {
    return make_error(ErrorCode::kUnsupported, "{} weights run on the CPU only (the model is on {}; int8 runs there)",
                      quant_format_name(spec.format), weights.embed_tokens.device().to_string());
  }
  std::vector<LayerWeights> layers = weights.layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerWeights& l = layers[i];
    const auto quantize = [&](Weight& w, const char* name) -> Status {
      TACHYON_ASSIGN_OR_RETURN(w, quantize_int8_on_device(w, name, i));
      return Status::Ok();
    };
    if (l.qkv_proj.defined()) {
      TACHYON_RETURN_IF_ERROR(quantize(l.qkv_proj, "qkv_proj"));
      const int64_t q = l.q_proj.out_features(), k = l.k_proj.out_features(), v = l.v_proj.out_features();
      l.q_proj = int8_rows(l.qkv_proj, 0, q);
      l.k_proj = int8_rows(l.qkv_proj, q, q + k);
      l.v_proj = int8_rows(l.qkv_proj, q + k, q + k + v);
    } else {
      TACHYON_RETURN_IF_ERROR(quantize(l.q_proj, "q_proj"));
      TACHYON_RETURN_IF_ERROR(quantize(l.k_proj, "k_proj"));
      TACHYON_RETURN_IF_ERROR(quantize(l.v_proj, "v_proj"));
    }
    if (l.gate_up_proj.defined()) {
      TACHYON_RETURN_IF_ERROR(quantize(l.gate_up_proj, "gate_up_proj"));
      const int64_t g = l.gate_proj.out_features(), u = l.up_proj.out_features();
      l.gate_proj = int8_rows(l.gate_up_proj, 0, g);
      l.up_proj = int8_rows(l.gate_up_proj, g, g + u);
    } else {
      TACHYON_RETURN_IF_ERROR(quantize(l.gate_proj, "gate_proj"));
      TACHYON_RETURN_IF_ERROR(quantize(l.up_proj, "up_proj"));
    }
    TACHYON_RETURN_IF_ERROR(quantize(l.o_proj, "o_proj"));
    TACHYON_RETURN_IF_ERROR(quantize(l.down_proj, "down_proj"));
  }
  weights.layers = std::move(layers);
  return Status::Ok();
}

}  // namespace

Status quantize_linear_weights(ModelWeights& weights, const QuantSpec& spec) {
  if (weights.embed_tokens.defined() && !weights.embed_tokens.device().is_cpu()) {
    return quantize_on_device(weights, spec);
  }
  // Quantize everything into a copy first, so that a failure leaves `weights` as it was.
  std::vector<LayerWeights> layers = weights.layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerWeights& l = layers[i];
    if (l.qkv_proj.defined() || l.gate_up_proj.defined()) {
      return make_error(ErrorCode::kUnsupported, "layer {}: fused projections cannot be quantized", i);
    }
    struct Named {
      Weight* weight;
      const char* name;
    };
    for (const Named& p : {Named{&l.q_proj, "q_proj"}, Named{&l.k_proj, "k_proj"}, Named{&l.v_proj, "v_proj"},
                           Named{&l.o_proj, "o_proj"}, Named{&l.gate_proj, "gate_proj"},
                           Named{&l.up_proj, "up_proj"}, Named{&l.down_proj, "down_proj"}}) {
      auto q = quantize_weight(*p.weight, spec);
      if (!q.ok()) {
        return make_error(q.status().code(), "layer {} {}: {}", i, p.name, q.status().message());
      }
      *p.weight = std::move(q).value();
    }
  }
  weights.layers = std::move(layers);
  return Status::Ok();
}

}  // namespace tachyon
