// A small GGUF v3 (or v2) writer: metadata of every value type and tensors stored as F32, F16,
// BF16 or a ggml block format (quantized here from f32 with the reference round-to-nearest rules). Used
// by the tests and by tools that write converted or quantized models. It holds the encoded
// tensor bytes in memory until `write`; it never reads GGUF (see gguf.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/gguf.h"

namespace tachyon {

// Metadata value constructors.
GgufValue gguf_u8(uint8_t v);
GgufValue gguf_i8(int8_t v);
GgufValue gguf_u16(uint16_t v);
GgufValue gguf_i16(int16_t v);
GgufValue gguf_u32(uint32_t v);
GgufValue gguf_i32(int32_t v);
GgufValue gguf_u64(uint64_t v);
GgufValue gguf_i64(int64_t v);
GgufValue gguf_f32(float v);
GgufValue gguf_f64(double v);
GgufValue gguf_bool(bool v);
GgufValue gguf_string(std::string v);
// Every element must have type `element_type` (checked when the file is written).
GgufValue gguf_array(GgufValueType element_type, std::vector<GgufValue> elements);
GgufValue gguf_string_array(const std::vector<std::string>& strings);

class GgufWriter {
 public:
  // 2 or 3 (default 3); the two are laid out identically for little-endian files.
  void set_version(uint32_t version) { version_ = version; }
  // Written as `general.alignment` (u32) when not 32. Must be a power of two.
  void set_alignment(uint64_t alignment) { alignment_ = alignment; }

  // Adds a metadata entry; a second add with the same key replaces the first.
  void add(const std::string& key, GgufValue value);

  // `tensor` is any float dtype, shape in PyTorch order (outermost first); it is converted to
  // `type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K;
  // core/ggml_blocks.h encodes the quantized
  // ones). Quantized types need the last dimension to be a multiple of their block (32 or 256). InvalidArgument on a duplicate name or an impossible request.
  Status add_tensor(const std::string& name, const Tensor& tensor, GgmlType type);
  // Stores `bytes` verbatim as a tensor of `type` and `shape` (PyTorch order); the size must
  // match the type's block layout. For hand-made blocks and for copying tensors between files.
  Status add_raw_tensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type,
                        std::vector<uint8_t> bytes);

  // The whole file in memory.
  Result<std::vector<uint8_t>> serialize() const;
  Status write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> shape;  // PyTorch order
    GgmlType type;
    std::vector<uint8_t> bytes;
  };
  Result<std::vector<uint8_t>> header() const;  // everything before the data section, padded

  uint32_t version_ = 3;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tachyon
