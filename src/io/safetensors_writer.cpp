#include "io/safetensors_writer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

namespace tachyon {

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<const NamedTensor*> order;
  std::set<std::string> names;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty() || !names.insert(t.name).second) {
      return make_error(ErrorCode::kInvalidArgument, "{}: tensor name '{}' is empty or repeated", path, t.name);
    }
    if (!t.tensor.defined() || !t.tensor.device().is_cpu()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}' is undefined or not on the host", path, t.name);
    }
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    const size_t sa = dtype_size(a->tensor.dtype()), sb = dtype_size(b->tensor.dtype());
    return sa != sb ? sa > sb : a->name < b->name;
  });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const NamedTensor* t : order) {
    const uint64_t nbytes = t->tensor.nbytes();
    header[t->name] = {{"dtype", safetensors_dtype_name(t->tensor.dtype())},
                       {"shape", t->tensor.shape()},
                       {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned

  const std::string temporary = path + ".partial";
  {
    std::ofstream f(temporary, std::ios::binary | std::ios::trunc);
    if (!f) return make_error(ErrorCode::kIo, "{}: cannot create the file", temporary);
    const uint64_t length = text.size();
    f.write(reinterpret_cast<const char*>(&length), sizeof(length));
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const NamedTensor* t : order) {
      const Tensor c = t->tensor.is_contiguous() ? t->tensor : t->tensor.contiguous();
      f.write(static_cast<const char*>(c.raw_data()), static_cast<std::streamsize>(c.nbytes()));
    }
    f.flush();
    if (!f) {
      std::remove(temporary.c_str());
      return make_error(ErrorCode::kIo, "{}: writing {} bytes of tensors failed (disk full?)", temporary, offset);
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::remove(temporary.c_str());
    return make_error(ErrorCode::kIo, "{}: cannot rename {} into place: {}", path, temporary, ec.message());
  }
  return Status::Ok();
}

}  // namespace tachyon
