// Opens whatever a user passes as -m: a Hugging Face directory (config.json + safetensors), a
// GGUF file, a llama2.c checkpoint (file, or directory holding one with its tok*.bin), or
// `synthetic:PRESET`. Produces the model (weights as zero-copy views into mapped files where
// the dtype allows), its tokenizer and generation defaults. Every failure is a Status naming
// the file and the field.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/llama_model.h"
#include "tokenizer/tokenizer.h"

namespace tachyon {


struct LoadOptions {
  std::string path;                      // -m
  DType synthetic_dtype = DType::kBF16;  // weights of synthetic models
  uint64_t synthetic_seed = 0;
  // Where the weights go (--device): files are read on the host and copied over once; synthetic
  // weights are made on the device itself. The device's backend must be running.
  Device device = Device::cpu();
};

struct LoadedModel {
  std::string format;                    // "hf", "gguf", "llama2c", "safetensors" or "synthetic"
  std::string path;                      // the file or directory actually read
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null for synthetic models
  std::vector<int32_t> eos_token_ids;    // config + generation_config + tokenizer, merged
  int32_t bos_token_id = -1;
  std::string weight_dtypes;             // e.g. "bf16" or "f32, f16"
  // Per type the container stores (its own names: "Q4_K", "BF16"), how the loaded model holds those
  // tensors: e.g. "Q4_K: 154 tensors, packed as q4_k", "Q5_0: 24 tensors, expanded to f32 at load".
  std::vector<std::string> tensor_types;
  double load_seconds = 0.0;
};

Result<LoadedModel> load_model(const LoadOptions& options);

}  // namespace tachyon
