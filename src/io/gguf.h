// GGUF v2/v3 reader over a memory map: header, every metadata value type (arrays included),
// tensor infos and alignment. F32/F16/BF16 tensors are zero-copy views into the mapping;
// Q8_0/Q4_0 are dequantized to f32 on request (native quantized kernels come with quant/).
// Every offset, count and shape is validated against the file size before use: a corrupt file
// yields a Status naming the file and the field, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace tachyon {

enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
const char* gguf_value_type_name(GgufValueType type);

// GGML tensor types that can appear in a GGUF file (numbering is the file format's).
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kBF16 = 30,
};
const char* ggml_type_name(GgmlType type);

// One metadata value. Scalars are widened (ints to int64/uint64, floats to double); arrays keep
// their element type and hold either strings or numbers (nested arrays are kept as elements).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType array_type = GgufValueType::kUint8;  // element type when type == kArray
  int64_t i = 0;        // signed ints and bool
  uint64_t u = 0;       // unsigned ints
  double f = 0.0;       // float32/float64
  std::string s;        // string
  std::vector<GgufValue> array;  // when type == kArray

  bool is_integer() const;
  bool is_float() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch order (outermost first): GGUF's ne[] reversed
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;         // from the start of the data section
  uint64_t nbytes = 0;
};

class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensor_infos() const { return tensor_infos_; }

  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Typed getters: NotFound if absent, InvalidArgument/CorruptFile if the type does not fit.
  Result<std::string> get_string(const std::string& key) const;
  Result<int64_t> get_int(const std::string& key) const;
  Result<double> get_float(const std::string& key) const;  // accepts ints too
  Result<bool> get_bool(const std::string& key) const;
  Result<std::vector<std::string>> get_string_array(const std::string& key) const;
  Result<std::vector<double>> get_float_array(const std::string& key) const;
  Result<std::vector<int64_t>> get_int_array(const std::string& key) const;
  // Defaults when absent (still an error if present with the wrong type).
  Result<int64_t> get_int_or(const std::string& key, int64_t fallback) const;
  Result<double> get_float_or(const std::string& key, double fallback) const;
  Result<std::string> get_string_or(const std::string& key, const std::string& fallback) const;

  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // F32/F16/BF16: a view into the mapping (zero copy). Q8_0/Q4_0: dequantized f32 copy.
  // Other types: Unsupported, naming the tensor and type.
  Result<Tensor> tensor(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensor_infos_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace tachyon
