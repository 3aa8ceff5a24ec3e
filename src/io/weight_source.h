// WeightSource: the one interface every weight container (GGUF, safetensors, llama2.c) offers,
// so the model loader never depends on a file format. A source lists tensor names with their
// shape and type, and hands out Tensors that keep the underlying mapping alive. A source never
// renames tensors to another convention except where its header says so (llama2.c), and never
// interprets them into a model.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/gguf.h"

namespace tachyon {

struct TensorMeta {
  std::string name;
  std::vector<int64_t> shape;         // PyTorch order (outermost first)
  DType dtype = DType::kF32;          // element type of the Tensor that tensor() returns
  std::string stored_type;            // the container's own type name: "F16", "Q8_0", "BF16"
  std::optional<GgmlType> ggml_type;  // set for GGUF tensors
  uint64_t nbytes = 0;                // bytes stored in the file
  bool supported = true;              // false: tensor() answers kUnsupported (e.g. GGUF Q4_K)
};

class WeightSource {
 public:
  virtual ~WeightSource();
  // In the container's own order.
  virtual std::vector<std::string> tensor_names() const = 0;
  // nullptr when absent.
  virtual const TensorMeta* find(const std::string& name) const = 0;
  // A view into the mapping where the stored type is a DType, a dequantized copy for GGUF
  // Q8_0/Q4_0. NotFound (naming the tensor and the source) when absent.
  virtual Result<Tensor> tensor(const std::string& name) const = 0;
  // One line for logs and `tachyon info`: format, path(s), tensor count.
  virtual std::string describe() const = 0;
  bool has(const std::string& name) const { return find(name) != nullptr; }
};

// A GGUF file as a WeightSource. Tensor names are GGUF's own (`blk.0.attn_q.weight`).
class GgufWeightSource : public WeightSource {
 public:
  static Result<std::shared_ptr<GgufWeightSource>> open(const std::string& path);
  explicit GgufWeightSource(std::shared_ptr<const GgufFile> file);

  const GgufFile& file() const { return *file_; }
  std::shared_ptr<const GgufFile> shared_file() const { return file_; }

  std::vector<std::string> tensor_names() const override;
  const TensorMeta* find(const std::string& name) const override;
  Result<Tensor> tensor(const std::string& name) const override;
  std::string describe() const override;

 private:
  std::shared_ptr<const GgufFile> file_;
  std::vector<TensorMeta> metas_;
  std::map<std::string, size_t> index_;
};

}  // namespace tachyon
