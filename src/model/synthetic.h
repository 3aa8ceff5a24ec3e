// Synthetic models: random weights of a real model's shape (`-m synthetic:qwen2.5-0.5b`), for
// speed work. Deterministic from a seed whatever the thread count (a counter-based generator
// indexed by tensor and element), scaled like a trained model's initialization so activations
// stay finite through every layer. The same seed gives the same weights on the CPU and a GPU.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace tachyon {

struct SyntheticOptions {
  std::string preset;        // "tiny", "qwen2.5-0.5b", "llama3-8b", ...
  DType weight_dtype = DType::kBF16;
  uint64_t seed = 0;
  Device device = Device::cpu();  // made where they run: a GPU's weights never cross the host
};

std::vector<std::string> synthetic_presets();
Result<ModelConfig> synthetic_config(const std::string& preset);
Result<ModelWeights> make_synthetic_weights(const ModelConfig& config, const SyntheticOptions& options);

}  // namespace tachyon
