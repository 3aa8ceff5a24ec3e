#include "model/quantize_weights.h"

#include <vector>

namespace tachyon {

Status quantize_linear_weights(ModelWeights& weights, const QuantSpec& spec) {
  if (weights.embed_tokens.defined() && !weights.embed_tokens.device().is_cpu()) {
    return make_error(ErrorCode::kUnsupported, "{} weights run on the CPU only (the model is on {})",
                      quant_format_name(spec.format), weights.embed_tokens.device().to_string());
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
