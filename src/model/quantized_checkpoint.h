// Quantized Hugging Face checkpoints at the level of the model: one linear layer stored packed
// (AutoAWQ GEMM, GPTQ, compressed-tensors int8 / w8a8 / fp8, the engine's ternary) read straight into a QuantWeight, and a model
// whose linear weights are QuantWeights (or dense, module by module) saved as such a directory.
// The bit layouts are quant/quantize.h's, the config JSON io/quantization_config.h's and the
// file format io/safetensors*.h's; this file only maps modules to tensor names. Packed weights
// are never expanded to dense floats on the way in or out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "io/quantization_config.h"
#include "io/weight_source.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace tachyon {

// The linear layer `module` ("model.layers.0.self_attn.q_proj", weight [out, in]) of a
// checkpoint quantized as `q`: the packed weight when the checkpoint stores the module packed
// (<module>.qweight for AWQ/GPTQ, an i8 <module>.weight for int8), nullopt when it stores it
// dense (<module>.weight in f32/f16/bf16, a module left 16-bit). Errors name the module and the
// tensor: missing scales or zeros, wrong shapes or dtypes, a group size that does not divide in.
Result<std::optional<Weight>> read_quantized_linear(const WeightSource& source, const CheckpointQuantization& q,
                                                    const std::string& module, int64_t out, int64_t in);

struct SaveCheckpointOptions {
  std::string source_dir;  // the HF directory the model was loaded from: config.json and tokenizer files
  std::string out_dir;     // created when absent; never the source directory
  // kAwqGemm (int4 modules, AutoAWQ layout), kInt8Channel (int8 modules) or kW8A8 (w8a8 modules:
  // the int8 layout, int8 activations in the config), kFp8Channel (fp8 e4m3 modules) or kTernary
  // (ternary modules, the engine's own layout). Modules left dense
  // are written as <module>.weight and listed in the config (modules_to_not_convert / ignore).
  CheckpointQuantMethod method = CheckpointQuantMethod::kAwqGemm;
  // W8A8 / fp8 modules with static activation scales (QuantWeight::input_scale, all of them or
  // none) are written with <module>.input_scale; this names their observer in the config.
  std::string activation_observer;
};

struct SavedCheckpoint {
  std::string weights_path;  // out_dir/model.safetensors
  uint64_t weights_bytes = 0;
  CheckpointQuantization quantization;  // as written into config.json
};

// Writes out_dir/config.json (the source's plus quantization_config), copies the tokenizer and
// generation files, and writes out_dir/model.safetensors: the embedding, LM head (unless tied)
// and dense modules in their own dtypes, norms and biases in f32, packed modules in the
// method's layout. Int4 weights must have f16 scales (Int4Scales::kF16).
Result<SavedCheckpoint> save_quantized_checkpoint(const SaveCheckpointOptions& options, const ModelConfig& config,
                                                  const ModelWeights& weights);

}  // namespace tachyon
