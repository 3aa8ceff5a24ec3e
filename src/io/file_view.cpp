#include "io/file_view.h"

#include <cstring>

#include "core/log.h"

namespace tachyon {

Result<Tensor> tensor_in_mapping(const std::shared_ptr<MappedFile>& file, uint64_t byte_offset,
                                 const std::vector<int64_t>& shape, DType dtype, const std::string& what) {
  // The mapping is read-only (PROT_READ); Tensor's API is not const-aware, so views must never
  // be written through. Weights are only ever read.
  uint8_t* data = const_cast<uint8_t*>(file->data()) + byte_offset;
  const size_t align = dtype_size(dtype);
  if (reinterpret_cast<uintptr_t>(data) % align == 0) {
    return Tensor::view_of(data, shape, dtype, file);
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor copy, Tensor::try_empty(shape, dtype));
  std::memcpy(copy.raw_data(), data, copy.nbytes());
  TACHYON_LOG_DEBUG("{}: {} at byte {} is not {}-byte aligned; copied ({} bytes)", file->path(), what, byte_offset,
                    align, copy.nbytes());
  return copy;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

}  // namespace tachyon
