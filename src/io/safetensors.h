// safetensors reader over a memory map: one file (u64 header length, JSON header of
// {name: {dtype, shape, data_offsets}} plus optional "__metadata__", then the data), or a
// sharded set described by `model.safetensors.index.json` (weight_map: name -> shard file).
// Tensors are zero-copy views into the mapping. Every header field is validated against the
// file before use; a corrupt file yields a Status naming the file and the tensor/field.
// This file never writes safetensors and never renames tensors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/json_file.h"
#include "io/weight_source.h"

namespace tachyon {

// Element size of a safetensors dtype name ("F32", "BF16", "I64", "F8_E4M3", ...), 0 if the
// name is not one the format defines with a whole-byte element.
uint64_t safetensors_dtype_size(const std::string& dtype);

// One .safetensors file. Tensors whose dtype is defined by the format but has no DType here
// (BOOL, F64, I16, U16, U32, U64, F8_*) are listed with `supported = false`; tensor() answers
// Unsupported for them. A dtype name the format does not define makes open() fail.
class SafetensorsFile {
 public:
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::shared_ptr<MappedFile>& mapped_file() const { return file_; }
  // The "__metadata__" object (string -> string); empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Sorted by data offset (the order of the bytes in the file).
  const std::vector<TensorMeta>& tensors() const { return metas_; }
  const TensorMeta* find(const std::string& name) const;
  Result<Tensor> tensor(const std::string& name) const;
  // Byte offset of the data section (8 + header length).
  uint64_t data_offset() const { return data_offset_; }

 private:
  SafetensorsFile() = default;
  Status parse();

  std::string path_;
  std::shared_ptr<MappedFile> file_;
  uint64_t data_offset_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorMeta> metas_;
  std::vector<uint64_t> begins_;  // data_offsets[0] of each tensor, parallel to metas_
  std::map<std::string, size_t> index_;
};

// One .safetensors file, or the shards named by a `*.safetensors.index.json` (each shard
// opened once; a tensor the index names but its shard lacks is an error naming both). Tensor
// names are those of the files (Hugging Face names for HF checkpoints).
class SafetensorsWeightSource : public WeightSource {
 public:
  // `path` ending in ".json" is read as an index; anything else as a single file.
  static Result<std::shared_ptr<SafetensorsWeightSource>> open(const std::string& path);
  static Result<std::shared_ptr<SafetensorsWeightSource>> open_file(const std::string& path);
  static Result<std::shared_ptr<SafetensorsWeightSource>> open_index(const std::string& index_path);

  const std::vector<std::shared_ptr<SafetensorsFile>>& shards() const { return shards_; }
  // The index's "metadata" object (e.g. total_size) when opened from an index, else null.
  const nlohmann::json& index_metadata() const { return index_metadata_; }

  std::vector<std::string> tensor_names() const override;
  const TensorMeta* find(const std::string& name) const override;
  Result<Tensor> tensor(const std::string& name) const override;
  std::string describe() const override;

 private:
  struct Entry {
    const SafetensorsFile* shard;
    const TensorMeta* meta;
  };
  std::string path_;  // the file or the index
  std::vector<std::shared_ptr<SafetensorsFile>> shards_;
  std::vector<std::string> names_;
  std::map<std::string, Entry> entries_;
  nlohmann::json index_metadata_;
};

}  // namespace tachyon
