// GGUF v2/v3 reader over a memory map: header, every metadata value type (arrays included),
// tensor infos and alignment. F32/F16/BF16 (and I8/I32/I64) tensors are zero-copy views into
// the mapping; Q8_0/Q4_0/Q4_K/Q6_K are dequantized to f32 on request. The model loader reads
// those types' linear weights as raw blocks (`raw_tensor`) into quant/'s formats instead, packed.
// Every offset, count and shape is validated against the file size before use: a corrupt file
// yields a Status naming the file and the field, never a crash. This file never writes GGUF
// (see gguf_writer.h) and never interprets metadata into a model configuration (model/ does).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ggml_blocks.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace tachyon {

enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
const char* gguf_value_type_name(GgufValueType type);

// GGML tensor types that can appear in a GGUF file (numbering is the file format's). Every
// type listed here has a known block layout, so its byte size can be validated; ids missing
// from this list (including ones ggml has retired) are refused when the file is opened.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21,
  kIQ2_S = 22, kIQ4_XS = 23,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kIQ1_M = 29, kBF16 = 30,
  kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39,
};
const char* ggml_type_name(GgmlType type);
// True when `id` is one of the GgmlType values above.
bool ggml_type_known(uint32_t id);
// Elements per block (1 for plain types, 32 or 256 for block-quantized ones) and bytes per
// block. Only meaningful for known types.
int64_t ggml_block_size(GgmlType type);
uint64_t ggml_type_size(GgmlType type);

// One metadata value. Scalars are widened (signed ints and bool to `i`, unsigned ints to `u`,
// floats to `f`); arrays keep their element type and hold either strings or numbers (nested
// arrays are kept as elements).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType array_type = GgufValueType::kUint8;  // element type when type == kArray
  int64_t i = 0;        // signed ints and bool
  uint64_t u = 0;       // unsigned ints
  double f = 0.0;       // float32/float64
  std::string s;        // string
  std::vector<GgufValue> array;  // when type == kArray

  bool is_integer() const;  // any of the eight integer types (not bool)
  bool is_float() const;    // float32 or float64
  // A short rendering for messages and `tachyon info`: `42`, `"llama"`, `[array of 512 string]`.
  std::string to_string() const;
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
  // Byte offset of the data section in the file (a multiple of `alignment`). It may lie past
  // the end of a file that holds no tensor data (vocabulary-only files).
  uint64_t data_offset() const { return data_offset_; }
  const std::shared_ptr<MappedFile>& mapped_file() const { return file_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensor_infos() const { return tensor_infos_; }

  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Typed getters: NotFound if absent, CorruptFile if present with a type that does not fit
  // (the message names the key, the expected and the stored type).
  Result<std::string> get_string(const std::string& key) const;
  Result<int64_t> get_int(const std::string& key) const;
  Result<double> get_float(const std::string& key) const;  // accepts ints too
  Result<bool> get_bool(const std::string& key) const;
  Result<std::vector<std::string>> get_string_array(const std::string& key) const;
  Result<std::vector<double>> get_float_array(const std::string& key) const;  // ints accepted
  Result<std::vector<int64_t>> get_int_array(const std::string& key) const;
  // Defaults when absent (still an error if present with the wrong type).
  Result<int64_t> get_int_or(const std::string& key, int64_t fallback) const;
  Result<double> get_float_or(const std::string& key, double fallback) const;
  Result<std::string> get_string_or(const std::string& key, const std::string& fallback) const;

  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // F32/F16/BF16/I8/I32/I64: a view into the mapping (zero copy). Q8_0/Q4_0/Q4_K/Q6_K:
  // dequantized f32 copy (core/ggml_blocks.h). Other types: Unsupported, naming the tensor and type.
  Result<Tensor> tensor(const std::string& name) const;
  // The stored bytes of any tensor, quantized or not, as a zero-copy u8 view [nbytes].
  Result<Tensor> raw_tensor(const std::string& name) const;

 private:
  Status parse();
  Result<const GgufValue*> lookup(const std::string& key) const;
  Status wrong_type(const std::string& key, const GgufValue& value, const char* expected) const;

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
