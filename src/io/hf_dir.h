// A Hugging Face model directory: config.json (required), generation_config.json,
// tokenizer.json and tokenizer_config.json (optional) parsed as JSON, and the weights
// (model.safetensors.index.json, model.safetensors, or a single *.safetensors) opened as a
// SafetensorsWeightSource. It does not interpret config.json into a model configuration
// (model/ does) nor build a tokenizer (tokenizer/ does); it only finds, reads and validates.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "io/safetensors.h"

namespace tachyon {

class HfDirectory {
 public:
  // NotFound when `path` or config.json or any weights are missing; CorruptFile (naming the
  // file and the JSON error position) when a JSON file does not parse or config.json is not an
  // object; Unsupported for PyTorch-pickle-only checkpoints.
  static Result<HfDirectory> open(const std::string& path);

  const std::string& path() const { return path_; }
  const nlohmann::json& config() const { return config_; }
  // Present only when the file exists.
  const std::optional<nlohmann::json>& generation_config() const { return generation_config_; }
  const std::optional<nlohmann::json>& tokenizer_json() const { return tokenizer_json_; }
  const std::optional<nlohmann::json>& tokenizer_config() const { return tokenizer_config_; }

  std::string config_path() const;
  // Empty strings when the file is absent.
  const std::string& generation_config_path() const { return generation_config_path_; }
  const std::string& tokenizer_json_path() const { return tokenizer_json_path_; }
  const std::string& tokenizer_config_path() const { return tokenizer_config_path_; }
  // The weight file opened: the index, or the single .safetensors file.
  const std::string& weights_path() const { return weights_path_; }

  const std::shared_ptr<SafetensorsWeightSource>& weights() const { return weights_; }

 private:
  std::string path_;
  nlohmann::json config_;
  std::optional<nlohmann::json> generation_config_, tokenizer_json_, tokenizer_config_;
  std::string generation_config_path_, tokenizer_json_path_, tokenizer_config_path_, weights_path_;
  std::shared_ptr<SafetensorsWeightSource> weights_;
};

}  // namespace tachyon
