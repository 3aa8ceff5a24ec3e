#include "io/hf_dir.h"

#include <algorithm>
#include <filesystem>

#include "io/json_file.h"

namespace tachyon {

namespace {

namespace fs = std::filesystem;

// Reads `dir/name` if it exists: nullopt when absent, an error when present but unreadable.
Result<std::optional<nlohmann::json>> read_optional_json(const fs::path& dir, const std::string& name,
                                                         std::string* path_out) {
  const fs::path p = dir / name;
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::optional<nlohmann::json>();
  *path_out = p.string();
  TACHYON_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(p.string()));
  return std::optional<nlohmann::json>(std::move(j));
}

// Picks the weight file: the standard index, the standard single file, or the only
// *.safetensors / *.safetensors.index.json present.
Result<std::string> find_weights(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors.index.json", ec)) return (dir / "model.safetensors.index.json").string();
  if (fs::exists(dir / "model.safetensors", ec)) return (dir / "model.safetensors").string();
  std::vector<std::string> files, indexes;
  bool pickle = false;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    auto ends_with = [&](const std::string& suffix) {
      return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".safetensors.index.json")) indexes.push_back(entry.path().string());
    if (ends_with(".safetensors")) files.push_back(entry.path().string());
    if (ends_with(".bin") || ends_with(".pt") || ends_with(".pth")) pickle = true;
  }
  if (ec) return make_error(ErrorCode::kIo, "{}: cannot list the directory: {}", dir.string(), ec.message());
  std::sort(files.begin(), files.end());
  if (indexes.size() == 1) return indexes[0];
  if (indexes.size() > 1) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} safetensors index files and none is "
                      "model.safetensors.index.json; cannot tell which to use", dir.string(), indexes.size());
  }
  if (files.size() == 1) return files[0];
  if (files.size() > 1) {
    return make_error(ErrorCode::kCorruptFile, "{}: {} .safetensors files ({}, ...) but no "
                      "model.safetensors.index.json to say which tensor is in which", dir.string(), files.size(),
                      fs::path(files[0]).filename().string());
  }
  if (pickle) {
    return make_error(ErrorCode::kUnsupported, "{}: only PyTorch pickle weights (*.bin/*.pt) found; convert them to "
                      "safetensors", dir.string());
  }
  return make_error(ErrorCode::kNotFound, "{}: no weights (model.safetensors, model.safetensors.index.json or "
                    "*.safetensors)", dir.string());
}

}  // namespace

Result<HfDirectory> HfDirectory::open(const std::string& path) {
  std::error_code ec;
  const fs::path dir(path);
  if (!fs::is_directory(dir, ec)) return make_error(ErrorCode::kNotFound, "{}: not a directory", path);
  HfDirectory hf;
  hf.path_ = path;
  const fs::path config = dir / "config.json";
  if (!fs::exists(config, ec)) {
    return make_error(ErrorCode::kNotFound, "{}: no config.json; a Hugging Face model directory needs one", path);
  }
  TACHYON_ASSIGN_OR_RETURN(hf.config_, read_json_file(config.string()));
  if (!hf.config_.is_object()) {
    return make_error(ErrorCode::kCorruptFile, "{}: expected a JSON object, found a {}", config.string(),
                      hf.config_.type_name());
  }
  TACHYON_ASSIGN_OR_RETURN(hf.generation_config_,
                           read_optional_json(dir, "generation_config.json", &hf.generation_config_path_));
  TACHYON_ASSIGN_OR_RETURN(hf.tokenizer_json_, read_optional_json(dir, "tokenizer.json", &hf.tokenizer_json_path_));
  TACHYON_ASSIGN_OR_RETURN(hf.tokenizer_config_,
                           read_optional_json(dir, "tokenizer_config.json", &hf.tokenizer_config_path_));
  TACHYON_ASSIGN_OR_RETURN(hf.weights_path_, find_weights(dir));
  TACHYON_ASSIGN_OR_RETURN(hf.weights_, SafetensorsWeightSource::open(hf.weights_path_));
  return hf;
}

std::string HfDirectory::config_path() const { return (fs::path(path_) / "config.json").string(); }

}  // namespace tachyon
