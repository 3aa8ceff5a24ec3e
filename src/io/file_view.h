// Helpers shared by the weight readers: tensors over a byte range of a memory-mapped file, and
// overflow-checked size arithmetic for sizes that come from a user's file. Never copies a
// weight unless its address is misaligned for its element type (then says so in the log).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace tachyon {

// A Tensor over bytes [byte_offset, byte_offset + numel * dtype_size) of `file`, which the
// caller has checked lie inside the file. A zero-copy view that keeps the mapping alive when the
// address is aligned for `dtype`; otherwise an aligned host copy (`what` names it in the log).
Result<Tensor> tensor_in_mapping(const std::shared_ptr<MappedFile>& file, uint64_t byte_offset,
                                 const std::vector<int64_t>& shape, DType dtype, const std::string& what);

// a * b, or nullopt on unsigned 64-bit overflow.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// "[2, 3, 4]"
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace tachyon
