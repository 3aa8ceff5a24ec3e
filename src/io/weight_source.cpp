#include "io/weight_source.h"

#include <fmt/format.h>

namespace tachyon {

WeightSource::~WeightSource() = default;

Result<std::shared_ptr<GgufWeightSource>> GgufWeightSource::open(const std::string& path) {
  TACHYON_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  return std::make_shared<GgufWeightSource>(std::make_shared<const GgufFile>(std::move(file)));
}

GgufWeightSource::GgufWeightSource(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {
  metas_.reserve(file_->tensor_infos().size());
  for (const auto& info : file_->tensor_infos()) {
    TensorMeta meta;
    meta.name = info.name;
    meta.shape = info.shape;
    meta.stored_type = ggml_type_name(info.type);
    meta.ggml_type = info.type;
    meta.nbytes = info.nbytes;
    switch (info.type) {
      case GgmlType::kF32: case GgmlType::kQ8_0: case GgmlType::kQ4_0: case GgmlType::kQ4_1: case GgmlType::kQ5_0:
      case GgmlType::kQ5_1: case GgmlType::kQ2_K: case GgmlType::kQ3_K: case GgmlType::kQ4_K: case GgmlType::kQ5_K:
      case GgmlType::kQ6_K: case GgmlType::kIQ4_NL:
        meta.dtype = DType::kF32;  // block formats decode to f32 (those without a packed kernel stay dense)
        break;
      case GgmlType::kF16: meta.dtype = DType::kF16; break;
      case GgmlType::kBF16: meta.dtype = DType::kBF16; break;
      case GgmlType::kI8: meta.dtype = DType::kI8; break;
      case GgmlType::kI32: meta.dtype = DType::kI32; break;
      case GgmlType::kI64: meta.dtype = DType::kI64; break;
      default: meta.supported = false; break;
    }
    index_.emplace(meta.name, metas_.size());
    metas_.push_back(std::move(meta));
  }
}

std::vector<std::string> GgufWeightSource::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(metas_.size());
  for (const auto& m : metas_) names.push_back(m.name);
  return names;
}

const TensorMeta* GgufWeightSource::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &metas_[it->second];
}

Result<Tensor> GgufWeightSource::tensor(const std::string& name) const { return file_->tensor(name); }

std::string GgufWeightSource::describe() const {
  return fmt::format("GGUF v{} {} ({} tensors, {} metadata keys)", file_->version(), file_->path(), metas_.size(),
                     file_->metadata().size());
}

}  // namespace tachyon
