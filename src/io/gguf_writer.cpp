#include "io/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/dtype.h"
#include "io/file_view.h"

namespace tachyon {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"

template <typename T>
void put(std::vector<uint8_t>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>* out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

void pad_to(std::vector<uint8_t>* out, uint64_t alignment) {
  out->resize((out->size() + alignment - 1) / alignment * alignment, 0);
}

Status put_value(std::vector<uint8_t>* out, const GgufValue& v, const std::string& key) {
  switch (v.type) {
    case GgufValueType::kUint8: put(out, static_cast<uint8_t>(v.u)); break;
    case GgufValueType::kInt8: put(out, static_cast<int8_t>(v.i)); break;
    case GgufValueType::kUint16: put(out, static_cast<uint16_t>(v.u)); break;
    case GgufValueType::kInt16: put(out, static_cast<int16_t>(v.i)); break;
    case GgufValueType::kUint32: put(out, static_cast<uint32_t>(v.u)); break;
    case GgufValueType::kInt32: put(out, static_cast<int32_t>(v.i)); break;
    case GgufValueType::kUint64: put(out, v.u); break;
    case GgufValueType::kInt64: put(out, v.i); break;
    case GgufValueType::kFloat32: put(out, static_cast<float>(v.f)); break;
    case GgufValueType::kFloat64: put(out, v.f); break;
    case GgufValueType::kBool: put(out, static_cast<uint8_t>(v.i != 0)); break;
    case GgufValueType::kString: put_string(out, v.s); break;
    case GgufValueType::kArray:
      put(out, static_cast<uint32_t>(v.array_type));
      put<uint64_t>(out, v.array.size());
      for (size_t k = 0; k < v.array.size(); ++k) {
        if (v.array[k].type != v.array_type) {
          return make_error(ErrorCode::kInvalidArgument, "GGUF metadata '{}': element {} has type {} in an array of {}",
                            key, k, gguf_value_type_name(v.array[k].type), gguf_value_type_name(v.array_type));
        }
        TACHYON_RETURN_IF_ERROR(put_value(out, v.array[k], key));
      }
      break;
    default:
      return make_error(ErrorCode::kInvalidArgument, "GGUF metadata '{}': value type {} is not a GGUF type", key,
                        static_cast<uint32_t>(v.type));
  }
  return Status::Ok();
}

GgufValue scalar(GgufValueType type) {
  GgufValue v;
  v.type = type;
  return v;
}

}  // namespace

GgufValue gguf_u8(uint8_t v) { auto r = scalar(GgufValueType::kUint8); r.u = v; return r; }
GgufValue gguf_i8(int8_t v) { auto r = scalar(GgufValueType::kInt8); r.i = v; return r; }
GgufValue gguf_u16(uint16_t v) { auto r = scalar(GgufValueType::kUint16); r.u = v; return r; }
GgufValue gguf_i16(int16_t v) { auto r = scalar(GgufValueType::kInt16); r.i = v; return r; }
GgufValue gguf_u32(uint32_t v) { auto r = scalar(GgufValueType::kUint32); r.u = v; return r; }
GgufValue gguf_i32(int32_t v) { auto r = scalar(GgufValueType::kInt32); r.i = v; return r; }
GgufValue gguf_u64(uint64_t v) { auto r = scalar(GgufValueType::kUint64); r.u = v; return r; }
GgufValue gguf_i64(int64_t v) { auto r = scalar(GgufValueType::kInt64); r.i = v; return r; }
GgufValue gguf_f32(float v) { auto r = scalar(GgufValueType::kFloat32); r.f = v; return r; }
GgufValue gguf_f64(double v) { auto r = scalar(GgufValueType::kFloat64); r.f = v; return r; }
GgufValue gguf_bool(bool v) { auto r = scalar(GgufValueType::kBool); r.i = v ? 1 : 0; return r; }
GgufValue gguf_string(std::string v) { auto r = scalar(GgufValueType::kString); r.s = std::move(v); return r; }

GgufValue gguf_array(GgufValueType element_type, std::vector<GgufValue> elements) {
  auto r = scalar(GgufValueType::kArray);
  r.array_type = element_type;
  r.array = std::move(elements);
  return r;
}

GgufValue gguf_string_array(const std::vector<std::string>& strings) {
  std::vector<GgufValue> elements;
  elements.reserve(strings.size());
  for (const auto& s : strings) elements.push_back(gguf_string(s));
  return gguf_array(GgufValueType::kString, std::move(elements));
}

void GgufWriter::add(const std::string& key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

Status GgufWriter::add_tensor(const std::string& name, const Tensor& tensor, GgmlType type) {
  if (!tensor.defined()) return make_error(ErrorCode::kInvalidArgument, "GGUF tensor '{}': undefined tensor", name);
  const Tensor values = tensor.to_f32();  // [numel] f32, contiguous
  const float* x = values.data<float>();
  const int64_t n = values.numel();
  std::vector<uint8_t> bytes;
  switch (type) {
    case GgmlType::kF32:
      bytes.resize(static_cast<size_t>(n) * 4);
      std::memcpy(bytes.data(), x, bytes.size());
      break;
    case GgmlType::kF16:
      for (int64_t k = 0; k < n; ++k) put(&bytes, f32_to_f16(x[k]));
      break;
    case GgmlType::kBF16:
      for (int64_t k = 0; k < n; ++k) put(&bytes, f32_to_bf16(x[k]));
      break;
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kIQ4_NL:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: {
      const int64_t block = ggml_block_size(type);
      if (tensor.dim() == 0 || tensor.size(-1) % block != 0) {
        return make_error(ErrorCode::kInvalidArgument, "GGUF tensor '{}' {}: {} needs the last dimension to be a "
                          "multiple of {}", name, tensor.shape_string(), ggml_type_name(type), block);
      }
      switch (type) {
        case GgmlType::kQ8_0: quantize_q8_0(x, n, &bytes); break;
        case GgmlType::kQ4_0: quantize_q4_0(x, n, &bytes); break;
        case GgmlType::kQ4_1: quantize_q4_1(x, n, &bytes); break;
        case GgmlType::kQ5_0: quantize_q5_0(x, n, &bytes); break;
        case GgmlType::kQ5_1: quantize_q5_1(x, n, &bytes); break;
        case GgmlType::kIQ4_NL: quantize_iq4_nl(x, n, &bytes); break;
        case GgmlType::kQ4_K: quantize_q4_k(x, n, &bytes); break;
        case GgmlType::kQ5_K: quantize_q5_k(x, n, &bytes); break;
        default: quantize_q6_k(x, n, &bytes); break;
      }
      break;
    }
    default:
      return make_error(ErrorCode::kUnsupported, "GGUF tensor '{}': writing type {} is not supported", name,
                        ggml_type_name(type));
  }
  return add_raw_tensor(name, tensor.shape(), type, std::move(bytes));
}

Status GgufWriter::add_raw_tensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type,
                                  std::vector<uint8_t> bytes) {
  for (const auto& t : tensors_) {
    if (t.name == name) return make_error(ErrorCode::kInvalidArgument, "GGUF tensor '{}' added twice", name);
  }
  if (!ggml_type_known(static_cast<uint32_t>(type)) || shape.size() > static_cast<size_t>(kMaxDims)) {
    return make_error(ErrorCode::kInvalidArgument, "GGUF tensor '{}': type {} / rank {} cannot be written", name,
                      static_cast<uint32_t>(type), shape.size());
  }
  uint64_t numel = 1;
  for (auto d : shape) {
    if (d <= 0) return make_error(ErrorCode::kInvalidArgument, "GGUF tensor '{}': dimension {}", name, d);
    numel *= static_cast<uint64_t>(d);
  }
  const auto block = static_cast<uint64_t>(ggml_block_size(type));
  const uint64_t row = shape.empty() ? 1 : static_cast<uint64_t>(shape.back());
  const uint64_t expected = numel / block * ggml_type_size(type);
  if (row % block != 0 || bytes.size() != expected) {
    return make_error(ErrorCode::kInvalidArgument, "GGUF tensor '{}' {} {}: got {} bytes, expected {} (row {} % block {})",
                      name, shape_to_string(shape), ggml_type_name(type), bytes.size(), expected, row, block);
  }
  tensors_.push_back({name, shape, type, std::move(bytes)});
  return Status::Ok();
}

Result<std::vector<uint8_t>> GgufWriter::header() const {
  if (alignment_ == 0 || !std::has_single_bit(alignment_)) {
    return make_error(ErrorCode::kInvalidArgument, "GGUF alignment {} is not a power of two", alignment_);
  }
  if (version_ != 2 && version_ != 3) {
    return make_error(ErrorCode::kInvalidArgument, "GGUF writer: version {} (only 2 and 3)", version_);
  }
  auto metadata = metadata_;
  if (alignment_ != 32) {
    bool present = false;
    for (auto& [k, v] : metadata) {
      if (k == "general.alignment") {
        v = gguf_u32(static_cast<uint32_t>(alignment_));
        present = true;
      }
    }
    if (!present) metadata.emplace_back("general.alignment", gguf_u32(static_cast<uint32_t>(alignment_)));
  }
  std::vector<uint8_t> out;
  put(&out, kGgufMagic);
  put(&out, version_);
  put<uint64_t>(&out, tensors_.size());
  put<uint64_t>(&out, metadata.size());
  for (const auto& [key, value] : metadata) {
    put_string(&out, key);
    put(&out, static_cast<uint32_t>(value.type));
    TACHYON_RETURN_IF_ERROR(put_value(&out, value, key));
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(&out, t.name);
    put(&out, static_cast<uint32_t>(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) put(&out, static_cast<uint64_t>(t.shape[d]));
    put(&out, static_cast<uint32_t>(t.type));
    put(&out, offset);
    offset = (offset + t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  pad_to(&out, alignment_);
  return out;
}

Result<std::vector<uint8_t>> GgufWriter::serialize() const {
  TACHYON_ASSIGN_OR_RETURN(std::vector<uint8_t> out, header());
  for (size_t k = 0; k < tensors_.size(); ++k) {
    out.insert(out.end(), tensors_[k].bytes.begin(), tensors_[k].bytes.end());
    if (k + 1 < tensors_.size()) pad_to(&out, alignment_);
  }
  return out;
}

Status GgufWriter::write(const std::string& path) const {
  TACHYON_ASSIGN_OR_RETURN(std::vector<uint8_t> head, header());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return make_error(ErrorCode::kIo, "{}: cannot open for writing", path);
  f.write(reinterpret_cast<const char*>(head.data()), static_cast<std::streamsize>(head.size()));
  const std::vector<char> zeros(alignment_, 0);
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const auto& bytes = tensors_[k].bytes;
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    const uint64_t padding = (alignment_ - bytes.size() % alignment_) % alignment_;
    if (k + 1 < tensors_.size()) f.write(zeros.data(), static_cast<std::streamsize>(padding));
  }
  f.close();
  if (!f) return make_error(ErrorCode::kIo, "{}: write failed", path);
  return Status::Ok();
}

}  // namespace tachyon
