#include "model/quantize_weights.h"

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/ggml_blocks.h"
#include "core/log.h"
#include "ops/ops.h"

namespace tachyon {
namespace {

// A sparse layer's three expert stacks run as one grouped op, in one format: a policy that gives
// them different ones is refused, naming them.
Status check_expert_formats(const std::vector<LayerWeights>& layers) {
  const auto name = [](const Weight& w) -> std::string {
    return w.quant ? quant_format_name(w.quant->format) : std::string(dtype_name(w.dense.dtype()));
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    const ops::MoeExperts& x = layers[i].experts;
    if (x.num_experts == 0) continue;
    const bool same = name(x.gate) == name(x.up) && name(x.gate) == name(x.down) &&
                      (!x.gate.quant || (x.gate.quant->group_size == x.up.quant->group_size &&
                                         x.gate.quant->group_size == x.down.quant->group_size));
    if (!same) {
      return make_error(ErrorCode::kInvalidArgument,
                        "layer {}: the experts' gate, up and down would be {}, {} and {}; give "
                        "mlp.experts.{{gate,up,down}}_proj one format",
                        i, name(x.gate), name(x.up), name(x.down));
    }
  }
  return Status::Ok();
}

}  // namespace

namespace {

// A dense weight on a device quantized by the host's quantizer (the formats with no device
// quantizer: fp8, ternary, the GGUF blocks): the rows go to the host and the packed tensors come
// back.
Result<Weight> quantize_through_host(const Tensor& d, QuantSpec spec, const char* name, size_t layer) {
  k_quant_fallback(spec, d.size(1));
  Weight host;
  TACHYON_ASSIGN_OR_RETURN(host.dense, copy_to(d, Device::cpu(), "a weight quantized on the host"));
  auto q = quantize_weight(host, spec);
  if (!q.ok()) return make_error(q.status().code(), "layer {} {}: {}", layer, name, q.status().message());
  auto moved = std::make_shared<QuantWeight>(*q->quant);
  const auto back = [&](const Tensor& t, Tensor& dst) -> Status {
    if (!t.defined()) return Status::Ok();
    TACHYON_ASSIGN_OR_RETURN(dst, copy_to(t, d.device(), "a quantized weight"));
    return Status::Ok();
  };
  TACHYON_RETURN_IF_ERROR(back(q->quant->packed, moved->packed));
  TACHYON_RETURN_IF_ERROR(back(q->quant->scales, moved->scales));
  TACHYON_RETURN_IF_ERROR(back(q->quant->zeros, moved->zeros));
  Weight result;
  result.quant = std::move(moved);
  return result;
}

// A dense weight on a device, quantized there (ops::quantize_int8_rows / quantize_int4_groups: the
// same bytes as the host's quantize_int8_channel / quantize_int4_group; w8a8 weights are int8's),
// or through the host for the other formats.
Result<Weight> quantize_on_device(const Weight& w, const QuantSpec& spec, const char* name, size_t layer) {
  if (w.quant || !w.dense.defined() || w.dense.dim() != 2) {
    return make_error(ErrorCode::kInvalidArgument, "layer {} {}: expected a dense [out, in] weight", layer, name);
  }
  const Tensor& d = w.dense;
  if ((spec.format != QuantFormat::kInt8Channel && spec.format != QuantFormat::kW8A8 &&
       spec.format != QuantFormat::kInt4Group) ||
      spec.gguf_q4_0) {
    return quantize_through_host(d, spec, name, layer);
  }
  const int64_t out = d.size(0), in = d.size(1);
  auto q = std::make_shared<QuantWeight>();
  q->format = spec.format;
  q->out_features = out;
  q->in_features = in;
  const char* what = spec.format == QuantFormat::kInt4Group ? "int4" : "int8";
  if (spec.format == QuantFormat::kInt4Group) {
    const int group = spec.group_size;
    if (group != 32 && group != 64 && group != 128) {
      return make_error(ErrorCode::kInvalidArgument, "layer {} {}: int4 group size {} (expected 32, 64 or 128)", layer,
                        name, group);
    }
    if (in % group != 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "layer {} {}: in_features {} is not a multiple of the int4 group size {}", layer, name, in,
                        group);
    }
    q->group_size = group;
    TACHYON_ASSIGN_OR_RETURN(q->packed, empty_on({out, in / 2}, DType::kU8, d.device(), "int4 weight"));
    TACHYON_ASSIGN_OR_RETURN(q->scales, empty_on({out, in / group}, DType::kF32, d.device(), "int4 scales"));
    TACHYON_ASSIGN_OR_RETURN(q->zeros, empty_on({out, in / group}, DType::kF32, d.device(), "int4 zeros"));
    ops::quantize_int4_groups(d, group, spec.int4_scales == Int4Scales::kF16, q->packed, q->scales, q->zeros);
  } else {
    TACHYON_ASSIGN_OR_RETURN(q->packed, empty_on({out, in}, DType::kI8, d.device(), "int8 weight"));
    TACHYON_ASSIGN_OR_RETURN(q->scales, empty_on({out}, DType::kF32, d.device(), "int8 scales"));
    ops::quantize_int8_rows(d, q->packed, q->scales);
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor scales, copy_to(q->scales, Device::cpu(), "quantization scales"));
  for (int64_t e = 0; e < scales.numel(); ++e) {
    if (!std::isfinite(scales.data<float>()[e])) {
      const int64_t row = scales.dim() == 2 ? e / scales.size(1) : e;
      return make_error(ErrorCode::kInvalidArgument,
                        "layer {} {}: {} quantization: row {} holds a non-finite weight{}", layer, name, what, row,
                        spec.format == QuantFormat::kInt4Group ? " or a group too wide for f16 scales" : "");
    }
  }
  Weight result;
  result.quant = std::move(q);
  return result;
}

// Rows [begin, end) of a quantized weight, sharing its memory.
Weight quant_rows(const Weight& w, int64_t begin, int64_t end) { return ops::weight_rows(w, begin, end - begin); }

// On a GPU. Fused projections are quantized as one matrix (scales and zeros are per row or per
// row and group, so this is the same as quantizing the parts); the separate q/k/v and gate/up
// weights become row views of the result, so the 16-bit copies go. Layer by layer: each layer's
// 16-bit weights are dropped from `weights` once its quantized ones replace them (freed where
// nothing else holds them), so the peak is the model plus one layer's packed weights; on an
// error the layers before the failing one stay quantized.
Status quantize_model_on_device(ModelWeights& weights, const QuantSpec& spec) {
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    LayerWeights l = weights.layers[i];
    const auto quantize = [&](Weight& w, const char* name) -> Status {
      if (!w.defined()) return Status::Ok();  // a sparse layer without a shared expert
      TACHYON_ASSIGN_OR_RETURN(w, quantize_on_device(w, spec, name, i));
      return Status::Ok();
    };
    if (l.qkv_proj.defined()) {
      TACHYON_RETURN_IF_ERROR(quantize(l.qkv_proj, "qkv_proj"));
      const int64_t q = l.q_proj.out_features(), k = l.k_proj.out_features(), v = l.v_proj.out_features();
      l.q_proj = quant_rows(l.qkv_proj, 0, q);
      l.k_proj = quant_rows(l.qkv_proj, q, q + k);
      l.v_proj = quant_rows(l.qkv_proj, q + k, q + k + v);
    } else {
      TACHYON_RETURN_IF_ERROR(quantize(l.q_proj, "q_proj"));
      TACHYON_RETURN_IF_ERROR(quantize(l.k_proj, "k_proj"));
      TACHYON_RETURN_IF_ERROR(quantize(l.v_proj, "v_proj"));
    }
    if (l.gate_up_proj.defined()) {
      TACHYON_RETURN_IF_ERROR(quantize(l.gate_up_proj, "gate_up_proj"));
      const int64_t g = l.gate_proj.out_features(), u = l.up_proj.out_features();
      l.gate_proj = quant_rows(l.gate_up_proj, 0, g);
      l.up_proj = quant_rows(l.gate_up_proj, g, g + u);
    } else {
      TACHYON_RETURN_IF_ERROR(quantize(l.gate_proj, "gate_proj"));
      TACHYON_RETURN_IF_ERROR(quantize(l.up_proj, "up_proj"));
    }
    TACHYON_RETURN_IF_ERROR(quantize(l.o_proj, "o_proj"));
    TACHYON_RETURN_IF_ERROR(quantize(l.down_proj, "down_proj"));
    // Experts: each stack as one matrix (its scales are per row, so the same as per expert); the
    // router and the shared expert's gate stay as stored (a few rows that decide the routing).
    TACHYON_RETURN_IF_ERROR(quantize(l.experts.gate, "experts.gate_proj"));
    TACHYON_RETURN_IF_ERROR(quantize(l.experts.up, "experts.up_proj"));
    TACHYON_RETURN_IF_ERROR(quantize(l.experts.down, "experts.down_proj"));
    weights.layers[i] = std::move(l);
  }
  return Status::Ok();
}

}  // namespace

namespace {

// On the host, each module with the spec `spec_of` gives it (nullopt: left as it is), into a copy
// first so that a failure leaves `weights` as it was. `counts` gets the modules per format name.
Status quantize_on_host(ModelWeights& weights,
                        const std::function<std::optional<QuantSpec>(const std::string&)>& spec_of,
                        bool lm_head, std::map<std::string, int>* counts) {
  std::vector<LayerWeights> layers = weights.layers;
  Weight head = weights.lm_head;
  std::map<std::string, int> fallbacks;  // "q4_k -> q5_0": weights
  auto quantize = [&](Weight& w, const std::string& module) -> Status {
    std::optional<QuantSpec> spec = spec_of(module);
    if (!spec) {
      ++(*counts)[w.quant ? quant_format_name(w.quant->format) : "dense"];
      return Status::Ok();
    }
    const QuantFormat asked = spec->format;
    if (k_quant_fallback(*spec, w.in_features())) {
      ++fallbacks[fmt::format("{} as {}", quant_format_name(asked), quant_format_name(spec->format))];
    }
    auto q = quantize_weight(w, *spec);
    if (!q.ok()) return make_error(q.status().code(), "{}: {}", module, q.status().message());
    w = std::move(q).value();
    const bool grouped =
        (spec->format == QuantFormat::kInt4Group && !spec->gguf_q4_0) || spec->format == QuantFormat::kTernary;
    ++(*counts)[grouped ? fmt::format("{}-g{}", quant_format_name(spec->format), spec->group_size)
                        : std::string(spec->gguf_q4_0 ? "q4_0" : quant_format_name(spec->format))];
    return Status::Ok();
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerWeights& l = layers[i];
    if (l.qkv_proj.defined() || l.gate_up_proj.defined()) {
      return make_error(ErrorCode::kUnsupported, "layer {}: fused projections cannot be quantized", i);
    }
    struct Named {
      Weight* weight;
      const char* name;
    };
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    // A sparse layer's experts are modules "mlp.experts.{gate,up,down}_proj" (each stack one
    // matrix); its router stays as stored, and its gate/up/down_proj are the shared expert's.
    for (const Named& p : {Named{&l.q_proj, "self_attn.q_proj"}, Named{&l.k_proj, "self_attn.k_proj"},
                           Named{&l.v_proj, "self_attn.v_proj"}, Named{&l.o_proj, "self_attn.o_proj"},
                           Named{&l.gate_proj, "mlp.gate_proj"}, Named{&l.up_proj, "mlp.up_proj"},
                           Named{&l.down_proj, "mlp.down_proj"}, Named{&l.experts.gate, "mlp.experts.gate_proj"},
                           Named{&l.experts.up, "mlp.experts.up_proj"},
                           Named{&l.experts.down, "mlp.experts.down_proj"}}) {
      if (p.weight->defined()) TACHYON_RETURN_IF_ERROR(quantize(*p.weight, prefix + p.name));
    }
  }
  if (lm_head) TACHYON_RETURN_IF_ERROR(quantize(head, "lm_head"));
  TACHYON_RETURN_IF_ERROR(check_expert_formats(layers));
  for (const auto& [what, n] : fallbacks) {
    TACHYON_LOG_INFO("{} linear weights with in_features not a multiple of {}: {}", n, kGgmlBlockK, what);
  }
  weights.layers = std::move(layers);
  weights.lm_head = std::move(head);
  return Status::Ok();
}

// What quantize_on_host does, for weights on a device: each module as its spec says (on the
// device for int8/w8a8/int4, through the host for the other formats). A fused projection (qkv,
// gate_up) stays fused when every layer gives its parts one spec; otherwise the parts are
// quantized apart and no layer keeps the fused matrix (the forward takes all layers fused or none).
Status quantize_policy_on_device(ModelWeights& weights,
                                 const std::function<std::optional<QuantSpec>(const std::string&)>& spec_of,
                                 bool lm_head, std::map<std::string, int>* counts) {
  std::vector<LayerWeights> layers = weights.layers;
  const auto same = [](const std::optional<QuantSpec>& a, const std::optional<QuantSpec>& b) {
    if (a.has_value() != b.has_value()) return false;
    return !a || quant_spec_name(*a) == quant_spec_name(*b);  // the name is the format's identity
  };
  const auto module = [](size_t layer, const char* name) {
    return "model.layers." + std::to_string(layer) + "." + name;
  };
  bool keep_qkv = true, keep_gate_up = true;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto q = spec_of(module(i, "self_attn.q_proj"));
    keep_qkv = keep_qkv && layers[i].qkv_proj.defined() && same(q, spec_of(module(i, "self_attn.k_proj"))) &&
               same(q, spec_of(module(i, "self_attn.v_proj")));
    // A sparse layer without a shared expert has no gate/up to fuse.
    keep_gate_up = keep_gate_up && (layers[i].gate_up_proj.defined() || !layers[i].gate_proj.defined()) &&
                   same(spec_of(module(i, "mlp.gate_proj")), spec_of(module(i, "mlp.up_proj")));
  }
  const auto count = [&](const std::optional<QuantSpec>& spec, int64_t in, int n) {
    if (!spec) {
      (*counts)["dense"] += n;
      return;
    }
    QuantSpec s = *spec;
    k_quant_fallback(s, in);
    const bool grouped = (s.format == QuantFormat::kInt4Group && !s.gguf_q4_0) || s.format == QuantFormat::kTernary;
    (*counts)[grouped ? fmt::format("{}-g{}", quant_format_name(s.format), s.group_size)
                      : std::string(s.gguf_q4_0 ? "q4_0" : quant_format_name(s.format))] += n;
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerWeights& l = layers[i];
    const auto quantize = [&](Weight& w, const char* name) -> Status {
      if (!w.defined()) return Status::Ok();  // a sparse layer without a shared expert
      const std::optional<QuantSpec> spec = spec_of(module(i, name));
      count(spec, w.in_features(), 1);
      if (!spec) return Status::Ok();
      TACHYON_ASSIGN_OR_RETURN(w, quantize_on_device(w, *spec, name, i));
      return Status::Ok();
    };
    if (keep_qkv) {
      const std::optional<QuantSpec> spec = spec_of(module(i, "self_attn.q_proj"));
      count(spec, l.qkv_proj.in_features(), 3);
      if (spec) {
        TACHYON_ASSIGN_OR_RETURN(l.qkv_proj, quantize_on_device(l.qkv_proj, *spec, "qkv_proj", i));
        const int64_t q = l.q_proj.out_features(), k = l.k_proj.out_features(), v = l.v_proj.out_features();
        l.q_proj = quant_rows(l.qkv_proj, 0, q);
        l.k_proj = quant_rows(l.qkv_proj, q, q + k);
        l.v_proj = quant_rows(l.qkv_proj, q + k, q + k + v);
      }
    } else {
      l.qkv_proj = Weight();
      TACHYON_RETURN_IF_ERROR(quantize(l.q_proj, "self_attn.q_proj"));
      TACHYON_RETURN_IF_ERROR(quantize(l.k_proj, "self_attn.k_proj"));
      TACHYON_RETURN_IF_ERROR(quantize(l.v_proj, "self_attn.v_proj"));
    }
    if (keep_gate_up && l.gate_up_proj.defined()) {
      const std::optional<QuantSpec> spec = spec_of(module(i, "mlp.gate_proj"));
      count(spec, l.gate_up_proj.in_features(), 2);
      if (spec) {
        TACHYON_ASSIGN_OR_RETURN(l.gate_up_proj, quantize_on_device(l.gate_up_proj, *spec, "gate_up_proj", i));
        const int64_t g = l.gate_proj.out_features(), u = l.up_proj.out_features();
        l.gate_proj = quant_rows(l.gate_up_proj, 0, g);
        l.up_proj = quant_rows(l.gate_up_proj, g, g + u);
      }
    } else {
      l.gate_up_proj = Weight();
      TACHYON_RETURN_IF_ERROR(quantize(l.gate_proj, "mlp.gate_proj"));
      TACHYON_RETURN_IF_ERROR(quantize(l.up_proj, "mlp.up_proj"));
    }
    TACHYON_RETURN_IF_ERROR(quantize(l.o_proj, "self_attn.o_proj"));
    TACHYON_RETURN_IF_ERROR(quantize(l.down_proj, "mlp.down_proj"));
    TACHYON_RETURN_IF_ERROR(quantize(l.experts.gate, "mlp.experts.gate_proj"));
    TACHYON_RETURN_IF_ERROR(quantize(l.experts.up, "mlp.experts.up_proj"));
    TACHYON_RETURN_IF_ERROR(quantize(l.experts.down, "mlp.experts.down_proj"));
  }
  TACHYON_RETURN_IF_ERROR(check_expert_formats(layers));
  Weight head = weights.lm_head;
  if (lm_head) {
    const std::optional<QuantSpec> spec = spec_of("lm_head");
    count(spec, head.in_features(), 1);
    if (spec) {
      TACHYON_ASSIGN_OR_RETURN(head, quantize_on_device(head, *spec, "lm_head", layers.size()));
    }
  }
  weights.layers = std::move(layers);
  weights.lm_head = std::move(head);
  return Status::Ok();
}

}  // namespace

Status quantize_linear_weights(ModelWeights& weights, const QuantSpec& spec) {
  if (weights.embed_tokens.defined() && !weights.embed_tokens.device().is_cpu()) {
    return quantize_model_on_device(weights, spec);
  }
  std::map<std::string, int> counts;
  return quantize_on_host(weights, [&spec](const std::string&) { return std::optional<QuantSpec>(spec); },
                          /*lm_head=*/false, &counts);
}

Status quantize_lm_head(ModelWeights& weights, const QuantSpec& spec) {
  const Weight& head = weights.lm_head;
  if (head.quant || !head.dense.defined() || head.dense.dim() != 2) {
    return make_error(ErrorCode::kInvalidArgument, "lm_head: expected a dense [vocab, hidden] weight{}",
                      head.quant ? fmt::format(" (it is already {})", quant_format_name(head.quant->format)) : "");
  }
  if (!head.dense.device().is_cpu()) {
    TACHYON_ASSIGN_OR_RETURN(weights.lm_head, quantize_on_device(head, spec, "lm_head", weights.layers.size()));
    return Status::Ok();
  }
  QuantSpec host_spec = spec;
  k_quant_fallback(host_spec, head.in_features());
  auto q = quantize_weight(head, host_spec);
  if (!q.ok()) return make_error(q.status().code(), "lm_head: {}", q.status().message());
  weights.lm_head = std::move(q).value();
  return Status::Ok();
}

Result<std::map<std::string, int>> quantize_linear_weights(ModelWeights& weights, const QuantPolicy& policy,
                                                           const std::optional<QuantSpec>& fallback) {
  // A tied LM head is the embedding table itself, which stays as stored.
  const bool tied = weights.lm_head.dense.defined() && weights.embed_tokens.defined() &&
                    weights.lm_head.dense.raw_data() == weights.embed_tokens.raw_data();
  const auto spec_of = [&](const std::string& module) -> std::optional<QuantSpec> {
    // The LM head only by a rule naming it; `*` rules and the fallback are for the layers.
    if (module == "lm_head") {
      for (const QuantPolicyRule& r : policy.rules()) {
        if (r.pattern == "lm_head") return r.spec;
      }
      return std::nullopt;
    }
    return policy.spec_for(module, fallback);
  };
  std::map<std::string, int> counts;
  if (weights.embed_tokens.defined() && !weights.embed_tokens.device().is_cpu()) {
    TACHYON_RETURN_IF_ERROR(quantize_policy_on_device(weights, spec_of, !tied && !weights.lm_head.quant, &counts));
    return counts;
  }
  TACHYON_RETURN_IF_ERROR(quantize_on_host(weights, spec_of, /*lm_head=*/!tied && !weights.lm_head.quant, &counts));
  return counts;
}

}  // namespace tachyon
