// Which container a model path is (GGUF file, safetensors file or index, Hugging Face
// directory, llama2.c checkpoint), decided from the file's first bytes and name, and opening
// its weights as a WeightSource. It never guesses silently: an unrecognised path is an error
// naming what was looked at.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "io/weight_source.h"

namespace tachyon {

enum class ModelFormat { kGguf, kSafetensors, kHfDirectory, kLlama2c };
const char* model_format_name(ModelFormat format);

// A directory is a Hugging Face directory; a file starting with "GGUF" is GGUF; a name ending
// in .safetensors or .safetensors.index.json is safetensors; a file starting with the "ak42"
// magic or named *.bin is llama2.c.
Result<ModelFormat> detect_model_format(const std::string& path);

// The weights of `path` in whichever format it is (for a directory: its safetensors).
Result<std::shared_ptr<WeightSource>> open_weight_source(const std::string& path);

}  // namespace tachyon
