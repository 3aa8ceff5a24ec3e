#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>

#include "core/log.h"
#include "io/file_view.h"

namespace tachyon {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, before parsing.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::optional<DType> dtype_of(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I8") return DType::kI8;
  if (name == "U8") return DType::kU8;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  return std::nullopt;
}

// A short rendering of a JSON value for error messages. Nested values are described, not
// dumped: dumping recurses, and a crafted header can nest a hundred thousand levels deep.
std::string brief(const json& j) {
  const bool flat = !j.is_structured() ||
                    (j.size() <= 8 && std::none_of(j.begin(), j.end(), [](const json& e) { return e.is_structured(); }));
  if (!flat) return fmt::format("a JSON {} of {} entries", j.type_name(), j.size());
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() <= 40 ? s : s.substr(0, 37) + "...";
}

}  // namespace

uint64_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, uint64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},     {"F64", 8},
      {"I64", 8},  {"U64", 8}, {"C64", 8},
  };
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  TACHYON_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  std::shared_ptr<SafetensorsFile> st(new SafetensorsFile());
  st->path_ = path;
  st->file_ = std::move(file);
  Status s;
  try {
    s = st->parse();
  } catch (const std::bad_alloc&) {
    s = make_error(ErrorCode::kOutOfMemory, "out of memory while reading the header");
  } catch (const std::exception& e) {  // a json accessor this parser failed to guard
    s = make_error(ErrorCode::kCorruptFile, "malformed header: {}", e.what());
  }
  if (!s.ok()) return s.with_context(path);
  return st;
}

Status SafetensorsFile::parse() {
  const uint64_t size = file_->size();
  if (size < 8) {
    return make_error(ErrorCode::kCorruptFile, "file of {} bytes is too short for the 8-byte header length", size);
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, file_->data(), 8);
  if (header_length > size - 8) {
    return make_error(ErrorCode::kCorruptFile, "header length {} exceeds the {} bytes after the length field",
                      header_length, size - 8);
  }
  if (header_length > kMaxHeaderBytes) {
    return make_error(ErrorCode::kCorruptFile, "header length {} exceeds the limit of {} bytes", header_length,
                      kMaxHeaderBytes);
  }
  data_offset_ = 8 + header_length;
  const uint64_t data_size = size - data_offset_;
  const std::string_view text(reinterpret_cast<const char*>(file_->data() + 8), header_length);
  TACHYON_ASSIGN_OR_RETURN(json header, parse_json(text, "JSON header"));
  if (!header.is_object()) {
    return make_error(ErrorCode::kCorruptFile, "JSON header is a {}, expected an object", header.type_name());
  }

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return make_error(ErrorCode::kCorruptFile, "__metadata__ is a {}, expected an object", entry.type_name());
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return make_error(ErrorCode::kCorruptFile, "__metadata__ '{}' is {}, expected a string", key, brief(value));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", name);
    if (!entry.is_object()) return make_error(ErrorCode::kCorruptFile, "{} is {}, expected an object", where, brief(entry));
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return make_error(ErrorCode::kCorruptFile, "{}: 'dtype' is missing or not a string", where);
    }
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return make_error(ErrorCode::kCorruptFile, "{}: 'shape' is missing or not an array", where);
    }
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      return make_error(ErrorCode::kCorruptFile, "{}: 'data_offsets' is missing or not an array of two offsets", where);
    }
    TensorMeta meta;
    meta.name = name;
    meta.stored_type = dtype_it->get<std::string>();
    const uint64_t element_size = safetensors_dtype_size(meta.stored_type);
    if (element_size == 0) {
      return make_error(ErrorCode::kUnsupported, "{}: dtype '{}' is unknown", where, meta.stored_type);
    }
    const auto dtype = dtype_of(meta.stored_type);
    meta.supported = dtype.has_value();
    if (dtype) meta.dtype = *dtype;
    uint64_t numel = 1;
    for (size_t d = 0; d < shape_it->size(); ++d) {
      const json& dim = (*shape_it)[d];
      if (!dim.is_number_unsigned()) {
        return make_error(ErrorCode::kCorruptFile, "{}: shape[{}] = {} is not a non-negative integer", where, d,
                          brief(dim));
      }
      const uint64_t v = dim.get<uint64_t>();
      const auto product = checked_mul(numel, v);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || !product ||
          *product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return make_error(ErrorCode::kCorruptFile, "{}: shape {} overflows a 64-bit element count", where,
                          brief(*shape_it));
      }
      numel = *product;
      meta.shape.push_back(static_cast<int64_t>(v));
    }
    if (meta.shape.size() > static_cast<size_t>(kMaxDims)) meta.supported = false;
    const json& first = (*offsets_it)[0];
    const json& second = (*offsets_it)[1];
    if (!first.is_number_unsigned() || !second.is_number_unsigned()) {
      return make_error(ErrorCode::kCorruptFile, "{}: data_offsets {} are not non-negative integers", where,
                        brief(*offsets_it));
    }
    const uint64_t begin = first.get<uint64_t>(), end = second.get<uint64_t>();
    if (begin > end || end > data_size) {
      return make_error(ErrorCode::kCorruptFile, "{}: data_offsets [{}, {}] are not a range inside the {} data bytes",
                        where, begin, end, data_size);
    }
    const auto nbytes = checked_mul(numel, element_size);
    if (!nbytes || *nbytes != end - begin) {
      return make_error(ErrorCode::kCorruptFile, "{} ({} {}): data_offsets [{}, {}] hold {} bytes but the shape needs {}",
                        where, meta.stored_type, shape_to_string(meta.shape), begin, end, end - begin,
                        nbytes ? fmt::format("{}", *nbytes) : std::string("more than 2^64"));
    }
    meta.nbytes = *nbytes;
    metas_.push_back(std::move(meta));
    begins_.push_back(begin);
  }

  // Order by position in the file; tensors must not share bytes.
  std::vector<size_t> order(metas_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return begins_[a] < begins_[b]; });
  std::vector<TensorMeta> metas;
  std::vector<uint64_t> begins;
  for (size_t k : order) {
    metas.push_back(std::move(metas_[k]));
    begins.push_back(begins_[k]);
  }
  metas_ = std::move(metas);
  begins_ = std::move(begins);
  for (size_t k = 1; k < metas_.size(); ++k) {
    if (begins_[k] < begins_[k - 1] + metas_[k - 1].nbytes && metas_[k].nbytes > 0) {
      return make_error(ErrorCode::kCorruptFile, "tensors '{}' and '{}' overlap (bytes {} and {} of the data)",
                        metas_[k - 1].name, metas_[k].name, begins_[k - 1], begins_[k]);
    }
  }
  for (size_t k = 0; k < metas_.size(); ++k) index_.emplace(metas_[k].name, k);
  return Status::Ok();
}

const TensorMeta* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &metas_[it->second];
}

Result<Tensor> SafetensorsFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}' not found ({} tensors in the file)", path_, name,
                      metas_.size());
  }
  const TensorMeta& meta = metas_[it->second];
  if (!meta.supported) {
    return make_error(ErrorCode::kUnsupported,
                      "{}: tensor '{}' has dtype {} and shape {}; supported are F32, F16, BF16, I8, U8, I32, I64 "
                      "with at most {} dimensions",
                      path_, name, meta.stored_type, shape_to_string(meta.shape), kMaxDims);
  }
  return tensor_in_mapping(file_, data_offset_ + begins_[it->second], meta.shape, meta.dtype,
                           fmt::format("tensor '{}'", name));
}

Result<std::shared_ptr<SafetensorsWeightSource>> SafetensorsWeightSource::open(const std::string& path) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return open_index(path);
  return open_file(path);
}

Result<std::shared_ptr<SafetensorsWeightSource>> SafetensorsWeightSource::open_file(const std::string& path) {
  TACHYON_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  auto source = std::make_shared<SafetensorsWeightSource>();
  source->path_ = path;
  for (const auto& meta : file->tensors()) {
    source->names_.push_back(meta.name);
    source->entries_.emplace(meta.name, Entry{file.get(), &meta});
  }
  source->shards_.push_back(std::move(file));
  return source;
}

Result<std::shared_ptr<SafetensorsWeightSource>> SafetensorsWeightSource::open_index(const std::string& index_path) {
  TACHYON_ASSIGN_OR_RETURN(json index, read_json_file(index_path));
  if (!index.is_object()) {
    return make_error(ErrorCode::kCorruptFile, "{}: expected a JSON object, found a {}", index_path, index.type_name());
  }
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return make_error(ErrorCode::kCorruptFile, "{}: 'weight_map' is missing or not an object", index_path);
  }
  if (map_it->empty()) return make_error(ErrorCode::kCorruptFile, "{}: 'weight_map' is empty", index_path);
  auto source = std::make_shared<SafetensorsWeightSource>();
  source->path_ = index_path;
  if (const auto meta_it = index.find("metadata"); meta_it != index.end()) source->index_metadata_ = *meta_it;

  const fs::path dir = fs::path(index_path).parent_path();
  std::map<std::string, size_t> shard_of_file;  // shard file name -> index in shards_
  for (const auto& [name, value] : map_it->items()) {
    if (!value.is_string() || value.get<std::string>().empty()) {
      return make_error(ErrorCode::kCorruptFile, "{}: weight_map['{}'] is {}, expected a shard file name", index_path,
                        name, brief(value));
    }
    const std::string shard_name = value.get<std::string>();
    if (fs::path(shard_name).is_absolute()) {
      return make_error(ErrorCode::kCorruptFile, "{}: weight_map['{}'] = '{}' is an absolute path; shards are named "
                        "relative to the index", index_path, name, shard_name);
    }
    auto it = shard_of_file.find(shard_name);
    if (it == shard_of_file.end()) {
      auto shard = SafetensorsFile::open((dir / shard_name).string());
      if (!shard.ok()) {
        return shard.status().with_context(fmt::format("{}: shard '{}' (for tensor '{}')", index_path, shard_name, name));
      }
      it = shard_of_file.emplace(shard_name, source->shards_.size()).first;
      source->shards_.push_back(std::move(shard).value());
    }
    const SafetensorsFile* shard = source->shards_[it->second].get();
    const TensorMeta* meta = shard->find(name);
    if (meta == nullptr) {
      return make_error(ErrorCode::kCorruptFile, "{}: tensor '{}' is mapped to shard '{}', but {} does not contain it",
                        index_path, name, shard_name, shard->path());
    }
    source->entries_.emplace(name, Entry{shard, meta});
  }
  // Names in file order (shards by name, tensors by offset) so that a loader reads sequentially.
  std::sort(source->shards_.begin(), source->shards_.end(),
            [](const auto& a, const auto& b) { return a->path() < b->path(); });
  size_t unlisted = 0;
  for (const auto& shard : source->shards_) {
    for (const auto& meta : shard->tensors()) {
      auto it = source->entries_.find(meta.name);
      if (it != source->entries_.end() && it->second.shard == shard.get()) {
        source->names_.push_back(meta.name);
      } else {
        ++unlisted;
      }
    }
  }
  if (unlisted > 0) {
    TACHYON_LOG_DEBUG("{}: {} tensors in the shards are not in the weight_map and are ignored", index_path, unlisted);
  }
  return source;
}

std::vector<std::string> SafetensorsWeightSource::tensor_names() const { return names_; }

const TensorMeta* SafetensorsWeightSource::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.meta;
}

Result<Tensor> SafetensorsWeightSource::tensor(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}' not found ({} tensors)", path_, name, entries_.size());
  }
  return it->second.shard->tensor(name);
}

std::string SafetensorsWeightSource::describe() const {
  return fmt::format("safetensors {} ({} tensors in {} file{})", path_, names_.size(), shards_.size(),
                     shards_.size() == 1 ? "" : "s");
}

}  // namespace tachyon
