// The `quantization_config` of a Hugging Face config.json: which packed layout a checkpoint's
// linear layers use, read and checked here (and written back for checkpoints we make). Three
// layouts are understood, each named after the tool that defined it:
//   "awq"                 AutoAWQ GEMM: <module>.qweight / .qzeros / .scales (4-bit, zero points)
//   "gptq"                AutoGPTQ / GPTQModel: <module>.qweight / .qzeros / .scales / .g_idx
//                         (4-bit, desc_act false only)
//   "compressed-tensors"  llm-compressor int8 per channel: <module>.weight i8 + .weight_scale,
//                         with 16-bit activations (W8A16), dynamic per-token int8 ones or static
//                         per-tensor int8 ones (.input_scale) (W8A8); or "float-quantized" fp8
//                         e4m3 weights (.weight F8_E4M3 + .weight_scale), their activations 16-bit,
//                         dynamic fp8 (run 16-bit) or static fp8 per tensor (.input_scale)
// quant/quantize.h defines the bit layouts of those tensors; this file only reads the JSON that
// says which one applies. It never opens tensors and never decides anything about the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tachyon {

enum class CheckpointQuantMethod : uint8_t {
  kNone,         // no quantization_config: every linear weight is dense
  kAwqGemm,      // "awq", version "gemm"
  kGptq,         // "gptq", desc_act false
  kInt8Channel,  // "compressed-tensors", int8 weights per output channel, 16-bit activations
  kW8A8,         // "compressed-tensors", the same weights, activations int8 per token (dynamic) or
                 // per tensor (static_activations)
  kFp8Channel,   // "compressed-tensors" float-quantized: fp8 e4m3 weights per channel or per tensor
  kTernary,      // "tachyon" ternary: {-1, 0, +1} codes 2 bits each, an f32 scale per group (no
                 // ecosystem format holds group-scaled ternary weights; this one is the engine's)
};

// GPTQ's zero points: checkpoint_format "gptq" (v1, also when absent) stores zero - 1.
enum class GptqFormat : uint8_t { kV1, kV2 };

struct CheckpointQuantization {
  CheckpointQuantMethod method = CheckpointQuantMethod::kNone;
  int bits = 16;
  int group_size = 0;                 // int4 methods and ternary
  GptqFormat gptq_format = GptqFormat::kV1;
  // kW8A8 and kFp8Channel: input activations quantized with one static scale per tensor (each
  // module's <module>.input_scale; compressed-tensors input_activations strategy "tensor", dynamic
  // false). kW8A8 without it quantizes them per token when the layer runs; kFp8Channel without it
  // keeps them as they are. `activation_observer` names how the scales were calibrated (written
  // into the config; informational when read).
  bool static_activations = false;
  std::string activation_observer;
  // With static_activations: the packed modules without a static scale (W8A8 per token, fp8 16-bit
  // activations), by full name; written as a config group of their own whose targets name them.
  std::vector<std::string> unscaled_modules;
  // Modules the config lists as left dense (AutoAWQ modules_to_not_convert, compressed-tensors
  // ignore); informational: a module is dense exactly when its tensors are.
  std::vector<std::string> dense_modules;

  bool quantized() const { return method != CheckpointQuantMethod::kNone; }
  // "int4 awq g128", "int4 gptq g128", "int8 per channel", "w8a8" (what logs and `tachyon info`
  // show).
  std::string describe() const;
};

// config.json's "quantization_config" (absent or null: kNone). Unsupported (naming the key and
// its value) for other methods, bits other than 4 (int4 methods) or 8 (int8), act-order GPTQ
// ("act-order GPTQ is not supported"), AWQ without zero points or in another kernel layout;
// CorruptFile for keys of the wrong JSON type.
Result<CheckpointQuantization> read_quantization_config(const nlohmann::json& config, const std::string& path);

// The "quantization_config" object written for `q` (kAwqGemm, kInt8Channel, kW8A8, kFp8Channel or
// kTernary: {"quant_method": "tachyon", "format": "ternary", "bits": 2, "group_size": G,
// "modules_to_not_convert": [...]}).
nlohmann::json quantization_config_json(const CheckpointQuantization& q);

}  // namespace tachyon
