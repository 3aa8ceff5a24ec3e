// Load-time quantization of a model's linear layers (`--quant FORMAT`, `--quant-policy FILE`): every layer's
// q/k/v/o/gate/up/down projection becomes a packed QuantWeight; the embedding and the LM head
// stay in their 16-bit form (they are the layers most sensitive to rounding, and a tied LM head
// is the embedding table itself) unless the head is asked for by name (quantize_lm_head, a
// policy rule for `lm_head`).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "core/status.h"
#include "model/weights.h"
#include "quant/quant_policy.h"
#include "quant/quantize.h"

namespace tachyon {

// In place. On the host: fails (changing nothing) when the weights are fused (qkv_proj /
// gate_up_proj) or already quantized; q4_k / q6_k store a weight whose in_features is not a
// multiple of 256 as q8_0 (and log how many did). On a GPU: per-channel int8, w8a8 and group-wise
// int4 are quantized there, the other formats by the host's quantizer one weight at a time (fused
// projections as one matrix, the separate ones becoming row views of it).
Status quantize_linear_weights(ModelWeights& weights, const QuantSpec& spec);

// In place: each linear layer (and an untied LM head, when a rule names `lm_head` exactly) in the
// format `policy` gives it (quant/quant_policy.h), `fallback` for modules no rule matches
// (nullopt: as stored). Returns the number of modules per format ("int4-g64", "int8", ...).
// Fails, changing nothing, as the uniform form does. On a GPU a fused projection (qkv, gate_up)
// stays fused when every layer gives its parts one format, else all layers run them apart.
Result<std::map<std::string, int>> quantize_linear_weights(ModelWeights& weights, const QuantPolicy& policy,
                                                           const std::optional<QuantSpec>& fallback);

// In place: the LM head in `spec`'s format (`--quant-lm-head`), on the device that holds it
// (int8 and int4 quantized there, other formats through the host). A head tied to the embedding
// gets a packed copy of its own; the embedding table stays as stored. Fails, changing nothing,
// when the head is already quantized or a row holds a non-finite weight.
Status quantize_lm_head(ModelWeights& weights, const QuantSpec& spec);

}  // namespace tachyon
