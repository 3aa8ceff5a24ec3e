// Quantizing a whole model with calibration data (what `tachyon quantize` runs): the model's
// 16-bit forward over calibration tokens, one layer at a time, capturing each linear group's
// input (q/k/v after the input norm, o_proj on the attention output, gate/up after the
// post-attention norm, down_proj on the SwiGLU output); then per layer round-to-nearest int4 or
// int8, or AWQ int4 (quant/awq.h), or W8A8 with SmoothQuant (Xiao et al. 2023: per input channel
// s = max|x|^alpha / max|w|^(1 - alpha), weights W diag(s), activations x diag(1/s)), the scales
// folded as follows:
//   q/k/v     1/s into input_layernorm's weight
//   gate/up   1/s into post_attention_layernorm's weight
//   down_proj 1/s into up_proj's rows (silu(gate) * up is linear in up)
//   o_proj    1/s into v_proj's rows (attention output is a convex mix of v). With grouped-query
//             attention a v row feeds every query head of its group, so the channel statistics
//             are averaged over the heads that share a kv head and the same scale repeats across
//             them (common implementations skip o_proj when the shapes differ; this keeps it).
// Later layers see the 16-bit model's activations (as AutoAWQ does). Output errors, in the AWQ
// search and in the report, cover every calibration token (directly, or through the Gram matrix
// X^T X [in, in] when there are more tokens than input channels). Each module's relative output error
// ||X Wq^T - X W^T|| / ||X W^T|| is that of the weight the saved model holds (dequantized as
// quant/quantize.h defines it) on the input it will see; with max_layer_error set, a module above
// it stays 16-bit. For W8A8, and fp8 with static activation scales, the error is measured by
// running the layer (activations rounded per token, or to the static scale, too) and
// rtn_relative_error is plain W8A8's without smoothing (per token). The embedding and LM head stay 16-bit. No clipping search (AutoAWQ's second
// step) is done.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/llama_model.h"
#include "quant/observers.h"
#include "quant/quantize.h"

namespace tachyon {

enum class QuantMethod : uint8_t { kRtnInt4, kAwqInt4, kInt8, kW8A8, kFp8, kTernary };
// "rtn-int4", "awq-int4", "int8", "w8a8", "fp8", "ternary"
const char* quant_method_name(QuantMethod method);
// The names above; anything else is an error listing them.
Result<QuantMethod> parse_quant_method(const std::string& name);

struct ModuleQuantReport {
  std::string name;                          // "q_proj", "o_proj", "down_proj", ...
  std::string format;                        // "int4", "int8", or the 16-bit dtype it stays in
  bool kept_dense = false;                   // by max_layer_error
  std::optional<float> alpha;                // AWQ: the chosen exponent (shared by the module's group);
                                             // W8A8: SmoothQuant's alpha
  std::optional<double> relative_error;      // over the calibration tokens, of the quantized weight
                                             // (also reported for modules kept dense)
  std::optional<double> rtn_relative_error;  // AWQ: what round-to-nearest int4 gives instead;
                                             // W8A8: what it gives without smoothing
  std::optional<double> clip_ratio;          // AWQ with clipping: the mean range kept per (row, group)
  std::optional<float> input_scale;          // W8A8 / fp8 with an activation observer: the static scale
                                             // (nullopt where the group fell back, act_fallback_ratio)
  std::optional<double> static_error;        // with act_fallback_ratio: the error the static scale gave
};

struct LayerQuantReport {
  int layer = 0;
  std::vector<ModuleQuantReport> modules;  // q, k, v, o, gate, up, down
  double seconds = 0.0;
};

struct QuantizeModelOptions {
  QuantMethod method = QuantMethod::kAwqInt4;
  int group_size = 128;       // int4: 32, 64 or 128; ternary also 256
  int sequence_length = 512;  // calibration tokens per forward sequence (at most the model's context)
  int grid = 20;              // AWQ alphas searched
  bool awq_clip = true;       // AWQ: also search each (row, group)'s clipping range (quant/awq.h)
  double max_layer_error = 0; // > 0: modules whose relative output error exceeds it stay 16-bit
  float smooth_alpha = 0.5f;  // w8a8: SmoothQuant's migration strength (0: none); > 0 needs calibration
  // w8a8 and fp8: static activation scales (QuantWeight::input_scale) calibrated by this observer
  // on each module's input as the quantized model sees it (after SmoothQuant's division), fed one
  // calibration sequence per batch; the scale is the threshold over 127 (int8) or 448 (e4m3).
  // Modules reading one input share its scale. Unset: per-token activations (w8a8) or none (fp8).
  // Needs calibration.
  std::optional<ObserverOptions> act_observer;
  // With act_observer: an input group (q/k/v, o, gate/up, down) where a module's output error with
  // the static scale exceeds this many times its error with per-token (w8a8) or unrounded (fp8)
  // activations keeps those instead (one scale per tensor clips heavy-tailed inputs such as the
  // down projections'). 0: every module static.
  double act_fallback_ratio = 3.0;
  std::function<void(const LayerQuantReport&)> on_layer;  // progress, after each layer
};

struct QuantizedModel {
  ModelWeights weights;
  std::vector<LayerQuantReport> layers;
  int64_t calibration_tokens = 0;
};

// `model` on the host with dense, unfused linear weights. `calibration` token ids (< vocab) are
// cut into sequences of sequence_length; AWQ and max_layer_error need at least 2 of them, RTN
// and int8 run without (then no errors are reported). The result shares the embedding, LM head
// and unchanged tensors with `model`.
Result<QuantizedModel> quantize_model(const LlamaModel& model, std::span<const int32_t> calibration,
                                      const QuantizeModelOptions& options);

// ---- Mixed precision under an error budget (`tachyon quantize --budget E`) ----
// measure_formats runs the calibration forward as quantize_model does and measures, for every
// linear module of every layer, each candidate format's relative output error on the module's
// captured input, ||X Wq^T - X W^T|| / ||X W^T|| (W8A8 with its activations rounded per token, by
// running the layer), and its bytes as the engine holds it in memory (packed codes, scales and
// zeros). Round to nearest only, no AWQ scales or SmoothQuant: a `--quant-policy` rule per module
// then rebuilds exactly the weights measured, on the CPU and on a GPU. choose_formats gives each
// module the candidate with the fewest bytes whose error is at most the budget (ties: the
// candidate listed first), or 16 bits when none fits; a larger budget never chooses more bytes.

// int4 g128, q4_k, int4 g64, q5_k, int4 g32, q6_k, int8, q8_0, w8a8, fp8 (ternary only when asked:
// it suits models trained for it).
std::vector<QuantSpec> default_budget_candidates();

struct MeasuredFormat {
  QuantSpec spec;         // as it applies to the module (a K-quant's block fallback already taken)
  int64_t bytes = 0;
  double error = 0.0;
};

struct ModuleFormats {
  std::string module;     // "model.layers.3.mlp.down_proj"
  int64_t dense_bytes = 0;  // as stored
  std::vector<MeasuredFormat> measured;  // the candidates that apply, in candidate order, no duplicates
};

struct FormatMeasurements {
  std::vector<ModuleFormats> modules;  // layer by layer, q k v o gate up down
  int64_t calibration_tokens = 0;
};

struct MeasureFormatsOptions {
  std::vector<QuantSpec> candidates;  // empty: default_budget_candidates()
  int sequence_length = 512;
  std::function<void(int layer, double seconds)> on_layer;
};

// `model` on the host, dense and unfused; at least 2 calibration tokens.
Result<FormatMeasurements> measure_formats(const LlamaModel& model, std::span<const int32_t> calibration,
                                           const MeasureFormatsOptions& options);

struct ModuleChoice {
  std::string module;
  std::optional<QuantSpec> spec;  // nullopt: 16-bit
  int64_t bytes = 0;
  int64_t dense_bytes = 0;
  double error = 0.0;             // of the choice (0 for 16-bit)
};

struct FormatChoice {
  std::vector<ModuleChoice> modules;
  int64_t bytes = 0;        // the linear modules', as chosen
  int64_t dense_bytes = 0;  // the same modules as stored
  double sum_squared_error = 0.0;
};

FormatChoice choose_formats(const FormatMeasurements& measured, double budget);
// The cheapest candidate everywhere (the budget that fits all): for calibrating the prediction
// of end-to-end error from per-module errors.
FormatChoice cheapest_formats(const FormatMeasurements& measured);
// The choice as `--quant-policy` rules, one per module in model order (`dense` for 16-bit), under
// a comment header naming `what` (the budget and the calibration).
std::string format_policy_text(const FormatChoice& choice, const std::string& what);

}  // namespace tachyon
