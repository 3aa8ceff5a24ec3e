// Writes one .safetensors file (u64 header length, JSON header, tensor bytes back to back) from
// host tensors, for checkpoints Tachyon makes (`tachyon quantize`). The file is written beside
// its final name and renamed into place, so a failed write never leaves a half file under the
// name a loader looks for. Reading is io/safetensors.h's business.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace tachyon {

struct NamedTensor {
  std::string name;
  Tensor tensor;  // on the host, any DType, any strides
};

// Tensors are laid out by element size, largest first (then by name), after a header padded to
// a multiple of 8 bytes: every tensor then starts aligned to its element size, so readers map
// them without copies. Names must be unique and non-empty. `metadata` becomes "__metadata__".
Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// The safetensors dtype name of a DType ("F32", "BF16", "I8", ...).
const char* safetensors_dtype_name(DType dtype);

}  // namespace tachyon
