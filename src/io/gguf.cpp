// GGUF parsing. Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count,
// kv_count x (string key, u32 value type, value), tensor_count x (string name, u32 n_dims,
// u64 ne[n_dims], u32 ggml type, u64 offset), padding to `general.alignment` (default 32),
// then the data section. A string is a u64 byte length and the bytes; an array is a u32
// element type, a u64 count and the elements.
#include "io/gguf.h"

#include <algorithm>

#include <bit>
#include <cstring>
#include <limits>
#include <new>
#include <optional>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "io/file_view.h"

namespace tachyon {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // the bytes "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
// Arrays of arrays are legal but nothing real nests them deeply; the bound keeps a crafted file
// from recursing the parser off the stack.
constexpr int kMaxArrayDepth = 8;
// Smallest possible encodings, used to reject absurd counts before allocating anything.
constexpr uint64_t kMinMetadataEntryBytes = 8 + 4 + 1;  // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims = 0, type, offset
// Each parsed element costs far more memory than its bytes in the file, so one array's length
// is capped too; the largest real arrays (vocabularies, merges) hold a few hundred thousand.
constexpr uint64_t kMaxArrayElements = uint64_t{1} << 24;

struct GgmlTypeTraits {
  GgmlType type;
  const char* name;
  int64_t block_size;   // elements per block
  uint64_t type_size;   // bytes per block
};

constexpr GgmlTypeTraits kGgmlTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},           {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", 32, 18},       {GgmlType::kQ4_1, "Q4_1", 32, 20},
    {GgmlType::kQ5_0, "Q5_0", 32, 22},       {GgmlType::kQ5_1, "Q5_1", 32, 24},
    {GgmlType::kQ8_0, "Q8_0", 32, 34},       {GgmlType::kQ8_1, "Q8_1", 32, 36},
    {GgmlType::kQ2_K, "Q2_K", 256, 84},      {GgmlType::kQ3_K, "Q3_K", 256, 110},
    {GgmlType::kQ4_K, "Q4_K", 256, 144},     {GgmlType::kQ5_K, "Q5_K", 256, 176},
    {GgmlType::kQ6_K, "Q6_K", 256, 210},     {GgmlType::kQ8_K, "Q8_K", 256, 292},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", 256, 66}, {GgmlType::kIQ2_XS, "IQ2_XS", 256, 74},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", 256, 98}, {GgmlType::kIQ1_S, "IQ1_S", 256, 50},
    {GgmlType::kIQ4_NL, "IQ4_NL", 32, 18},   {GgmlType::kIQ3_S, "IQ3_S", 256, 110},
    {GgmlType::kIQ2_S, "IQ2_S", 256, 82},    {GgmlType::kIQ4_XS, "IQ4_XS", 256, 136},
    {GgmlType::kI8, "I8", 1, 1},             {GgmlType::kI16, "I16", 1, 2},
    {GgmlType::kI32, "I32", 1, 4},           {GgmlType::kI64, "I64", 1, 8},
    {GgmlType::kF64, "F64", 1, 8},           {GgmlType::kIQ1_M, "IQ1_M", 256, 56},
    {GgmlType::kBF16, "BF16", 1, 2},         {GgmlType::kTQ1_0, "TQ1_0", 256, 54},
    {GgmlType::kTQ2_0, "TQ2_0", 256, 66},    {GgmlType::kMXFP4, "MXFP4", 32, 17},
};

const GgmlTypeTraits* ggml_traits(uint32_t id) {
  for (const auto& t : kGgmlTypes) {
    if (static_cast<uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

bool value_type_known(uint32_t id) { return id <= static_cast<uint32_t>(GgufValueType::kFloat64); }

uint64_t min_encoded_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16: case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64: case GgufValueType::kInt64: case GgufValueType::kFloat64: return 8;
    case GgufValueType::kString: return 8;
    case GgufValueType::kArray: return 12;
  }
  return 1;
}

// Bounds-checked cursor over the mapped bytes. Error messages carry the byte position but not
// the path: GgufFile::open prefixes the path once.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  template <typename T>
  Status read(T* out, const char* what) {
    if (remaining() < sizeof(T)) {
      return make_error(ErrorCode::kCorruptFile, "truncated at byte {} reading the {} ({} bytes needed, {} left)",
                        pos_, what, sizeof(T), remaining());
    }
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status read_string(std::string* out, const char* what) {
    uint64_t length = 0;
    TACHYON_RETURN_IF_ERROR(read(&length, what));
    if (length > remaining()) {
      return make_error(ErrorCode::kCorruptFile, "{} length {} at byte {} exceeds the {} bytes left in the file", what,
                        length, pos_ - 8, remaining());
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(length));
    pos_ += length;
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

Status read_value(ByteReader& r, GgufValueType type, int depth, GgufValue* out) {
  out->type = type;
  switch (type) {
    case GgufValueType::kUint8: { uint8_t v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "u8 value")); out->u = v; break; }
    case GgufValueType::kInt8: { int8_t v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "i8 value")); out->i = v; break; }
    case GgufValueType::kUint16: { uint16_t v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "u16 value")); out->u = v; break; }
    case GgufValueType::kInt16: { int16_t v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "i16 value")); out->i = v; break; }
    case GgufValueType::kUint32: { uint32_t v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "u32 value")); out->u = v; break; }
    case GgufValueType::kInt32: { int32_t v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "i32 value")); out->i = v; break; }
    case GgufValueType::kUint64: { uint64_t v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "u64 value")); out->u = v; break; }
    case GgufValueType::kInt64: { int64_t v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "i64 value")); out->i = v; break; }
    case GgufValueType::kFloat32: { float v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "f32 value")); out->f = v; break; }
    case GgufValueType::kFloat64: { double v = 0; TACHYON_RETURN_IF_ERROR(r.read(&v, "f64 value")); out->f = v; break; }
    case GgufValueType::kBool: {
      uint8_t v = 0;
      TACHYON_RETURN_IF_ERROR(r.read(&v, "bool value"));
      if (v > 1) {
        return make_error(ErrorCode::kCorruptFile, "bool value {} at byte {} is neither 0 nor 1", v, r.pos() - 1);
      }
      out->i = v;
      break;
    }
    case GgufValueType::kString: return r.read_string(&out->s, "string value");
    case GgufValueType::kArray: {
      uint32_t element_id = 0;
      TACHYON_RETURN_IF_ERROR(r.read(&element_id, "array element type"));
      if (!value_type_known(element_id)) {
        return make_error(ErrorCode::kCorruptFile, "array element type {} at byte {} is not a GGUF value type (0..12)",
                          element_id, r.pos() - 4);
      }
      const auto element_type = static_cast<GgufValueType>(element_id);
      if (element_type == GgufValueType::kArray && depth + 1 >= kMaxArrayDepth) {
        return make_error(ErrorCode::kUnsupported, "arrays nested deeper than {} levels at byte {}", kMaxArrayDepth,
                          r.pos() - 4);
      }
      uint64_t count = 0;
      TACHYON_RETURN_IF_ERROR(r.read(&count, "array length"));
      const uint64_t min_bytes = min_encoded_size(element_type);
      if (count > r.remaining() / min_bytes) {
        return make_error(ErrorCode::kCorruptFile,
                          "array of {} {} elements at byte {} needs at least {} bytes per element but only {} "
                          "bytes are left in the file",
                          count, gguf_value_type_name(element_type), r.pos() - 8, min_bytes, r.remaining());
      }
      if (count > kMaxArrayElements) {
        return make_error(ErrorCode::kUnsupported, "array of {} elements at byte {} exceeds the limit of {}", count,
                          r.pos() - 8, kMaxArrayElements);
      }
      out->array_type = element_type;
      out->array.resize(static_cast<size_t>(count));
      for (uint64_t k = 0; k < count; ++k) {
        Status s = read_value(r, element_type, depth + 1, &out->array[static_cast<size_t>(k)]);
        if (!s.ok()) return s.with_context(fmt::format("array element {} of {}", k, count));
      }
      break;
    }
  }
  return Status::Ok();
}

std::string type_description(const GgufValue& v) {
  if (v.type != GgufValueType::kArray) return gguf_value_type_name(v.type);
  return fmt::format("array of {}", gguf_value_type_name(v.array_type));
}

// Signed view of an integer value; nullopt if it does not fit int64.
std::optional<int64_t> as_int64(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::kInt8: case GgufValueType::kInt16: case GgufValueType::kInt32: case GgufValueType::kInt64:
      return v.i;
    case GgufValueType::kUint8: case GgufValueType::kUint16: case GgufValueType::kUint32: case GgufValueType::kUint64:
      if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(v.u);
    default: return std::nullopt;
  }
}

double as_double(const GgufValue& v) {
  if (v.is_float()) return v.f;
  switch (v.type) {
    case GgufValueType::kUint8: case GgufValueType::kUint16: case GgufValueType::kUint32: case GgufValueType::kUint64:
      return static_cast<double>(v.u);
    default: return static_cast<double>(v.i);
  }
}

}  // namespace

const char* gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "u8";
    case GgufValueType::kInt8: return "i8";
    case GgufValueType::kUint16: return "u16";
    case GgufValueType::kInt16: return "i16";
    case GgufValueType::kUint32: return "u32";
    case GgufValueType::kInt32: return "i32";
    case GgufValueType::kFloat32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "u64";
    case GgufValueType::kInt64: return "i64";
    case GgufValueType::kFloat64: return "f64";
  }
  return "?";
}

const char* ggml_type_name(GgmlType type) {
  const GgmlTypeTraits* t = ggml_traits(static_cast<uint32_t>(type));
  return t ? t->name : "?";
}
bool ggml_type_known(uint32_t id) { return ggml_traits(id) != nullptr; }
int64_t ggml_block_size(GgmlType type) {
  const GgmlTypeTraits* t = ggml_traits(static_cast<uint32_t>(type));
  return t ? t->block_size : 0;
}
uint64_t ggml_type_size(GgmlType type) {
  const GgmlTypeTraits* t = ggml_traits(static_cast<uint32_t>(type));
  return t ? t->type_size : 0;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kUint16: case GgufValueType::kInt16:
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kUint64: case GgufValueType::kInt64:
      return true;
    default: return false;
  }
}
bool GgufValue::is_float() const { return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64; }

std::string GgufValue::to_string() const {
  switch (type) {
    case GgufValueType::kUint8: case GgufValueType::kUint16: case GgufValueType::kUint32: case GgufValueType::kUint64:
      return std::to_string(u);
    case GgufValueType::kInt8: case GgufValueType::kInt16: case GgufValueType::kInt32: case GgufValueType::kInt64:
      return std::to_string(i);
    case GgufValueType::kFloat32: case GgufValueType::kFloat64: return fmt::format("{}", f);
    case GgufValueType::kBool: return i ? "true" : "false";
    case GgufValueType::kString: return s.size() <= 64 ? "\"" + s + "\"" : "\"" + s.substr(0, 61) + "...\"";
    case GgufValueType::kArray:
      return fmt::format("[array of {} {}]", array.size(), gguf_value_type_name(array_type));
  }
  return "?";
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  TACHYON_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  GgufFile gguf;
  gguf.path_ = path;
  gguf.file_ = std::move(file);
  Status s;
  try {
    s = gguf.parse();
  } catch (const std::bad_alloc&) {
    s = make_error(ErrorCode::kOutOfMemory, "out of memory while reading the metadata");
  }
  if (!s.ok()) return s.with_context(path);
  return gguf;
}

Status GgufFile::parse() {
  const uint64_t file_size = file_->size();
  ByteReader r(file_->data(), file_size);
  if (file_size < 4) {
    return make_error(ErrorCode::kCorruptFile, "file of {} bytes is too short to be GGUF (no magic)", file_size);
  }
  uint32_t magic = 0;
  TACHYON_RETURN_IF_ERROR(r.read(&magic, "magic"));
  if (magic != kGgufMagic) {
    const uint8_t* b = file_->data();
    return make_error(ErrorCode::kCorruptFile, "bad magic {:02x} {:02x} {:02x} {:02x}, expected 47 47 55 46 (\"GGUF\")",
                      b[0], b[1], b[2], b[3]);
  }
  TACHYON_RETURN_IF_ERROR(r.read(&version_, "version"));
  if (version_ == 1) {
    return make_error(ErrorCode::kUnsupported,
                      "GGUF version 1 is not supported (only versions 2 and 3); convert the model again with a "
                      "current llama.cpp");
  }
  if (version_ == 0x02000000u || version_ == 0x03000000u) {
    return make_error(ErrorCode::kUnsupported, "big-endian GGUF (version field {:#010x}) is not supported", version_);
  }
  if (version_ != 2 && version_ != 3) {
    return make_error(ErrorCode::kUnsupported, "GGUF version {} is not supported (only versions 2 and 3)", version_);
  }
  uint64_t tensor_count = 0, kv_count = 0;
  TACHYON_RETURN_IF_ERROR(r.read(&tensor_count, "tensor count"));
  TACHYON_RETURN_IF_ERROR(r.read(&kv_count, "metadata count"));
  if (kv_count > r.remaining() / kMinMetadataEntryBytes) {
    return make_error(ErrorCode::kCorruptFile, "metadata count {} cannot fit in the {} bytes left in the file", kv_count,
                      r.remaining());
  }
  if (tensor_count > r.remaining() / kMinTensorInfoBytes) {
    return make_error(ErrorCode::kCorruptFile, "tensor count {} cannot fit in the {} bytes left in the file",
                      tensor_count, r.remaining());
  }

  for (uint64_t k = 0; k < kv_count; ++k) {
    std::string key;
    Status s = r.read_string(&key, "metadata key");
    if (!s.ok()) return s.with_context(fmt::format("metadata entry {} of {}", k, kv_count));
    uint32_t type_id = 0;
    s = r.read(&type_id, "metadata value type");
    if (!s.ok()) return s.with_context(fmt::format("metadata key '{}'", key));
    if (!value_type_known(type_id)) {
      return make_error(ErrorCode::kCorruptFile, "metadata key '{}': value type {} is not a GGUF value type (0..12)",
                        key, type_id);
    }
    GgufValue value;
    s = read_value(r, static_cast<GgufValueType>(type_id), 0, &value);
    if (!s.ok()) return s.with_context(fmt::format("metadata key '{}'", key));
    if (!metadata_.emplace(key, std::move(value)).second) {
      return make_error(ErrorCode::kCorruptFile, "metadata key '{}' appears twice", key);
    }
  }

  if (const GgufValue* a = find("general.alignment")) {
    const auto v = as_int64(*a);
    if (!v) {
      return make_error(ErrorCode::kCorruptFile, "metadata key 'general.alignment' has type {}, expected an integer",
                        type_description(*a));
    }
    // Anything above 1 GiB is nonsense and would make the padding arithmetic meaningless.
    if (*v <= 0 || !std::has_single_bit(static_cast<uint64_t>(*v)) || *v > (int64_t{1} << 30)) {
      return make_error(ErrorCode::kCorruptFile, "general.alignment = {} is not a power of two in [1, 2^30]", *v);
    }
    alignment_ = static_cast<uint64_t>(*v);
  } else {
    alignment_ = kDefaultAlignment;
  }

  if (tensor_count > r.remaining() / kMinTensorInfoBytes) {
    return make_error(ErrorCode::kCorruptFile, "tensor count {} cannot fit in the {} bytes left after the metadata",
                      tensor_count, r.remaining());
  }
  tensor_infos_.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t k = 0; k < tensor_count; ++k) {
    GgufTensorInfo info;
    Status s = r.read_string(&info.name, "tensor name");
    if (!s.ok()) return s.with_context(fmt::format("tensor info {} of {}", k, tensor_count));
    const std::string where = fmt::format("tensor '{}'", info.name);
    uint32_t n_dims = 0;
    s = r.read(&n_dims, "n_dims");
    if (!s.ok()) return s.with_context(where);
    if (n_dims > static_cast<uint32_t>(kMaxDims)) {
      return make_error(ErrorCode::kCorruptFile, "{}: n_dims {} is more than {}", where, n_dims, kMaxDims);
    }
    uint64_t ne[kMaxDims] = {1, 1, 1, 1};
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      s = r.read(&ne[d], "dimension");
      if (!s.ok()) return s.with_context(where);
      if (ne[d] == 0 || ne[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return make_error(ErrorCode::kCorruptFile, "{}: ne[{}] = {} is not a positive 63-bit size", where, d, ne[d]);
      }
      const auto product = checked_mul(numel, ne[d]);
      if (!product || *product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return make_error(ErrorCode::kCorruptFile, "{}: element count overflows 64 bits at ne[{}] = {}", where, d, ne[d]);
      }
      numel = *product;
    }
    for (uint32_t d = n_dims; d-- > 0;) info.shape.push_back(static_cast<int64_t>(ne[d]));
    uint32_t type_id = 0;
    s = r.read(&type_id, "ggml type");
    if (!s.ok()) return s.with_context(where);
    const GgmlTypeTraits* traits = ggml_traits(type_id);
    if (traits == nullptr) {
      return make_error(ErrorCode::kUnsupported, "{}: ggml type id {} is unknown", where, type_id);
    }
    info.type = traits->type;
    s = r.read(&info.offset, "data offset");
    if (!s.ok()) return s.with_context(where);
    if (ne[0] % static_cast<uint64_t>(traits->block_size) != 0) {
      return make_error(ErrorCode::kCorruptFile, "{}: row of {} elements is not a multiple of the {} block size {}",
                        where, ne[0], traits->name, traits->block_size);
    }
    const auto nbytes = checked_mul(numel / static_cast<uint64_t>(traits->block_size), traits->type_size);
    if (!nbytes) return make_error(ErrorCode::kCorruptFile, "{}: byte size overflows 64 bits", where);
    info.nbytes = *nbytes;
    if (!tensor_index_.emplace(info.name, tensor_infos_.size()).second) {
      return make_error(ErrorCode::kCorruptFile, "tensor name '{}' appears twice", info.name);
    }
    tensor_infos_.push_back(std::move(info));
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  data_offset_ = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (const auto& info : tensor_infos_) {
    if (info.offset % alignment_ != 0) {
      return make_error(ErrorCode::kCorruptFile, "tensor '{}': data offset {} is not a multiple of the alignment {}",
                        info.name, info.offset, alignment_);
    }
    const auto begin = checked_add(data_offset_, info.offset);
    const auto end = begin ? checked_add(*begin, info.nbytes) : std::nullopt;
    if (!end || *end > file_size) {
      return make_error(ErrorCode::kCorruptFile,
                        "tensor '{}' ({} {}): data at offset {} + {} bytes (from the data section at byte {}) runs "
                        "past the end of the file ({} bytes)",
                        info.name, shape_to_string(info.shape), ggml_type_name(info.type), info.offset, info.nbytes,
                        data_offset_, file_size);
    }
  }
  // No two tensors may share bytes: a retyped or mis-sized tensor running into its neighbour
  // would load as garbage, not fail.
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensor_infos_.size());
  for (const auto& info : tensor_infos_) {
    if (info.nbytes > 0) by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& a = *by_offset[i - 1];
    const GgufTensorInfo& b = *by_offset[i];
    if (a.offset + a.nbytes > b.offset) {  // both ends were checked against the file size above
      return make_error(ErrorCode::kCorruptFile,
                        "tensors '{}' ({} {}, data offset {} + {} bytes) and '{}' (data offset {}) overlap", a.name,
                        shape_to_string(a.shape), ggml_type_name(a.type), a.offset, a.nbytes, b.name, b.offset);
    }
  }
  return Status::Ok();
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

Result<const GgufValue*> GgufFile::lookup(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error(ErrorCode::kNotFound, "{}: metadata key '{}' not found", path_, key);
  return v;
}

Status GgufFile::wrong_type(const std::string& key, const GgufValue& value, const char* expected) const {
  return make_error(ErrorCode::kCorruptFile, "{}: metadata key '{}' has type {}, expected {}", path_, key,
                    type_description(value), expected);
}

Result<std::string> GgufFile::get_string(const std::string& key) const {
  TACHYON_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (v->type != GgufValueType::kString) return wrong_type(key, *v, "string");
  return v->s;
}

Result<int64_t> GgufFile::get_int(const std::string& key) const {
  TACHYON_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (!v->is_integer()) return wrong_type(key, *v, "an integer");
  const auto i = as_int64(*v);
  if (!i) return make_error(ErrorCode::kCorruptFile, "{}: metadata key '{}' = {} does not fit int64", path_, key, v->u);
  return *i;
}

Result<double> GgufFile::get_float(const std::string& key) const {
  TACHYON_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (!v->is_float() && !v->is_integer()) return wrong_type(key, *v, "a number");
  return as_double(*v);
}

Result<bool> GgufFile::get_bool(const std::string& key) const {
  TACHYON_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (v->type != GgufValueType::kBool) return wrong_type(key, *v, "bool");
  return v->i != 0;
}

Result<std::vector<std::string>> GgufFile::get_string_array(const std::string& key) const {
  TACHYON_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (v->type != GgufValueType::kArray || v->array_type != GgufValueType::kString) {
    return wrong_type(key, *v, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (const auto& e : v->array) out.push_back(e.s);
  return out;
}

Result<std::vector<double>> GgufFile::get_float_array(const std::string& key) const {
  TACHYON_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  GgufValue element;
  element.type = v->array_type;
  if (v->type != GgufValueType::kArray || !(element.is_float() || element.is_integer())) {
    return wrong_type(key, *v, "array of numbers");
  }
  std::vector<double> out;
  out.reserve(v->array.size());
  for (const auto& e : v->array) out.push_back(as_double(e));
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(const std::string& key) const {
  TACHYON_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  GgufValue element;
  element.type = v->array_type;
  if (v->type != GgufValueType::kArray || !element.is_integer()) return wrong_type(key, *v, "array of integers");
  std::vector<int64_t> out;
  out.reserve(v->array.size());
  for (size_t k = 0; k < v->array.size(); ++k) {
    const auto i = as_int64(v->array[k]);
    if (!i) {
      return make_error(ErrorCode::kCorruptFile, "{}: metadata key '{}': element {} = {} does not fit int64", path_,
                        key, k, v->array[k].u);
    }
    out.push_back(*i);
  }
  return out;
}

Result<int64_t> GgufFile::get_int_or(const std::string& key, int64_t fallback) const {
  if (!has(key)) return fallback;
  return get_int(key);
}
Result<double> GgufFile::get_float_or(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  return get_float(key);
}
Result<std::string> GgufFile::get_string_or(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  return get_string(key);
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensor_infos_[it->second];
}

Result<Tensor> GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo* info = find_tensor(name);
  if (info == nullptr) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}' not found ({} tensors in the file)", path_, name,
                      tensor_infos_.size());
  }
  const uint64_t byte_offset = data_offset_ + info->offset;
  const std::string what = fmt::format("tensor '{}'", name);
  auto view = [&](DType dtype) { return tensor_in_mapping(file_, byte_offset, info->shape, dtype, what); };
  switch (info->type) {
    case GgmlType::kF32: return view(DType::kF32);
    case GgmlType::kF16: return view(DType::kF16);
    case GgmlType::kBF16: return view(DType::kBF16);
    case GgmlType::kI8: return view(DType::kI8);
    case GgmlType::kI32: return view(DType::kI32);
    case GgmlType::kI64: return view(DType::kI64);
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kIQ4_NL:
    case GgmlType::kQ6_K: {
      auto out = Tensor::try_empty(info->shape, DType::kF32);
      if (!out.ok()) return out.status().with_context(fmt::format("{}: dequantizing {}", path_, what));
      const uint8_t* blocks = file_->data() + byte_offset;
      float* dst = out->data<float>();  // [numel] f32
      const GgmlType type = info->type;
      const uint64_t block_bytes = ggml_type_size(type);
      const int64_t block_weights = ggml_block_size(type);
      const int64_t n_blocks = out->numel() / block_weights;
      parallel_for(n_blocks, 2048 * 32 / block_weights, [&](int64_t begin, int64_t end) {
        const uint8_t* src = blocks + static_cast<uint64_t>(begin) * block_bytes;
        float* y = dst + begin * block_weights;
        switch (type) {
          case GgmlType::kQ8_0: dequantize_q8_0(src, end - begin, y); break;
          case GgmlType::kQ4_0: dequantize_q4_0(src, end - begin, y); break;
          case GgmlType::kQ4_1: dequantize_q4_1(src, end - begin, y); break;
          case GgmlType::kQ5_0: dequantize_q5_0(src, end - begin, y); break;
          case GgmlType::kQ5_1: dequantize_q5_1(src, end - begin, y); break;
          case GgmlType::kQ2_K: dequantize_q2_k(src, end - begin, y); break;
          case GgmlType::kQ3_K: dequantize_q3_k(src, end - begin, y); break;
          case GgmlType::kQ4_K: dequantize_q4_k(src, end - begin, y); break;
          case GgmlType::kQ5_K: dequantize_q5_k(src, end - begin, y); break;
          case GgmlType::kIQ4_NL: dequantize_iq4_nl(src, end - begin, y); break;
          default: dequantize_q6_k(src, end - begin, y); break;
        }
      });
      return std::move(out).value();
    }
    default:
      return make_error(ErrorCode::kUnsupported,
                        "{}: {} has ggml type {}, which is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, "
                        "Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, I8, I32, I64 are)",
                        path_, what, ggml_type_name(info->type));
  }
}

Result<Tensor> GgufFile::raw_tensor(const std::string& name) const {
  const GgufTensorInfo* info = find_tensor(name);
  if (info == nullptr) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}' not found ({} tensors in the file)", path_, name,
                      tensor_infos_.size());
  }
  return tensor_in_mapping(file_, data_offset_ + info->offset, {static_cast<int64_t>(info->nbytes)}, DType::kU8,
                           fmt::format("tensor '{}'", name));
}

}  // namespace tachyon
