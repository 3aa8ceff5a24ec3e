#include "io/model_format.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/hf_dir.h"
#include "io/llama2c.h"
#include "io/safetensors.h"

namespace tachyon {

namespace {
namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

const char* model_format_name(ModelFormat format) {
  switch (format) {
    case ModelFormat::kGguf: return "gguf";
    case ModelFormat::kSafetensors: return "safetensors";
    case ModelFormat::kHfDirectory: return "hf-directory";
    case ModelFormat::kLlama2c: return "llama2.c";
  }
  return "?";
}

Result<ModelFormat> detect_model_format(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) return make_error(ErrorCode::kNotFound, "{}: no such file or directory", path);
  if (fs::is_directory(p, ec)) return ModelFormat::kHfDirectory;
  char magic[4] = {0, 0, 0, 0};
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, "{}: cannot open for reading", path);
  in.read(magic, 4);
  const bool have_magic = in.gcount() == 4;
  if (have_magic && std::memcmp(magic, "GGUF", 4) == 0) return ModelFormat::kGguf;
  if (ends_with(path, ".safetensors") || ends_with(path, ".safetensors.index.json")) return ModelFormat::kSafetensors;
  if (have_magic && std::memcmp(magic, "24ka", 4) == 0) return ModelFormat::kLlama2c;  // 0x616b3432 little-endian
  if (ends_with(path, ".bin")) return ModelFormat::kLlama2c;
  return make_error(ErrorCode::kUnsupported,
                    "{}: not a recognised model (no GGUF magic, not *.safetensors / *.safetensors.index.json, not a "
                    "llama2.c *.bin, not a directory)",
                    path);
}

Result<std::shared_ptr<WeightSource>> open_weight_source(const std::string& path) {
  TACHYON_ASSIGN_OR_RETURN(ModelFormat format, detect_model_format(path));
  switch (format) {
    case ModelFormat::kGguf: {
      TACHYON_ASSIGN_OR_RETURN(auto source, GgufWeightSource::open(path));
      return std::shared_ptr<WeightSource>(std::move(source));
    }
    case ModelFormat::kSafetensors: {
      TACHYON_ASSIGN_OR_RETURN(auto source, SafetensorsWeightSource::open(path));
      return std::shared_ptr<WeightSource>(std::move(source));
    }
    case ModelFormat::kHfDirectory: {
      TACHYON_ASSIGN_OR_RETURN(HfDirectory dir, HfDirectory::open(path));
      return std::shared_ptr<WeightSource>(dir.weights());
    }
    case ModelFormat::kLlama2c: {
      TACHYON_ASSIGN_OR_RETURN(auto source, Llama2cCheckpoint::open(path));
      return std::shared_ptr<WeightSource>(std::move(source));
    }
  }
  return make_error(ErrorCode::kInternal, "{}: unhandled model format", path);
}

}  // namespace tachyon
