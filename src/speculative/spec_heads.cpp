#include "speculative/spec_heads.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "core/device_memory.h"
#include "io/safetensors.h"

namespace tachyon {
namespace {

Result<int> metadata_int(const std::map<std::string, std::string>& meta, const std::string& key, int lo, int hi) {
  auto it = meta.find(key);
  if (it == meta.end()) return make_error(ErrorCode::kInvalidArgument, "metadata has no \"{}\"", key);
  int value = 0;
  const std::string& s = it->second;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < lo || value > hi) {
    return make_error(ErrorCode::kInvalidArgument, "metadata \"{}\" = \"{}\" is not an integer in [{}, {}]", key, s,
                      lo, hi);
  }
  return value;
}

Result<float> metadata_float(const std::map<std::string, std::string>& meta, const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end()) return make_error(ErrorCode::kInvalidArgument, "metadata has no \"{}\"", key);
  try {
    size_t used = 0;
    const float v = std::stof(it->second, &used);
    if (used == it->second.size() && std::isfinite(v) && v > 0.0f && v < 1.0f) return v;
  } catch (const std::exception&) {
  }
  return make_error(ErrorCode::kInvalidArgument, "metadata \"{}\" = \"{}\" is not a number in (0, 1)", key,
                    it->second);
}

bool all_finite(const Tensor& t) {
  const Tensor f = t.to_f32();
  const float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) {
    if (!std::isfinite(p[i])) return false;
  }
  return true;
}

Status read_heads(const SafetensorsFile& file, const ModelConfig& target, Device device, SpecHeads& out) {
  const auto& meta = file.metadata();
  auto format = meta.find("format");
  if (format == meta.end() || format->second != "tachyon-spec-heads") {
    return make_error(ErrorCode::kInvalidArgument, "not a heads file (metadata \"format\" is {}, not \"tachyon-spec-heads\")",
                      format == meta.end() ? std::string("absent") : "\"" + format->second + "\"");
  }
  auto version = meta.find("version");
  if (version == meta.end() || version->second != "1") {
    return make_error(ErrorCode::kUnsupported, "heads format version {} (this build reads version 1)",
                      version == meta.end() ? std::string("absent") : version->second);
  }
  TACHYON_ASSIGN_OR_RETURN(const int k, metadata_int(meta, "num_heads", 1, SpecHeads::kMaxHeads));
  TACHYON_ASSIGN_OR_RETURN(out.hidden_size, metadata_int(meta, "hidden_size", 1, 1 << 16));
  TACHYON_ASSIGN_OR_RETURN(out.ffn_size, metadata_int(meta, "ffn_size", 1, 1 << 17));
  TACHYON_ASSIGN_OR_RETURN(out.vocab_size, metadata_int(meta, "vocab_size", 1, 1 << 24));
  TACHYON_ASSIGN_OR_RETURN(out.rms_norm_eps, metadata_float(meta, "rms_norm_eps"));
  if (out.hidden_size != target.hidden_size || out.vocab_size != target.vocab_size) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the heads were made for a target of hidden size {} and {} tokens; this target has {} and {}",
                      out.hidden_size, out.vocab_size, target.hidden_size, target.vocab_size);
  }
  const int64_t d = out.hidden_size, m = out.ffn_size;
  std::set<std::string> expected;
  out.heads.resize(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) {
    SpecHead& h = out.heads[static_cast<size_t>(i)];
    const std::pair<Tensor*, std::pair<const char*, std::vector<int64_t>>> parts[] = {
        {&h.in_norm, {"in_norm", {d}}},          {&h.x_proj, {"x_proj", {2 * m, d}}},
        {&h.e_proj, {"e_proj", {2 * m, d}}},     {&h.down_proj, {"down_proj", {d, m}}},
        {&h.out_norm, {"out_norm", {d}}},
    };
    for (const auto& [dst, spec] : parts) {
      const std::string name = fmt::format("heads.{}.{}.weight", i, spec.first);
      expected.insert(name);
      const TensorMeta* tm = file.find(name);
      if (tm == nullptr) return make_error(ErrorCode::kInvalidArgument, "tensor {} is missing", name);
      if (tm->shape != spec.second) {
        return make_error(ErrorCode::kInvalidArgument, "tensor {} has shape [{}], expected [{}]", name,
                          fmt::join(tm->shape, ", "), fmt::join(spec.second, ", "));
      }
      if (tm->dtype != DType::kF32 && tm->dtype != DType::kF16 && tm->dtype != DType::kBF16) {
        return make_error(ErrorCode::kInvalidArgument, "tensor {} is {} (f32, f16 or bf16)", name, tm->stored_type);
      }
      TACHYON_ASSIGN_OR_RETURN(Tensor host, file.tensor(name));
      if (!all_finite(host)) return make_error(ErrorCode::kInvalidArgument, "tensor {} holds a NaN or an infinity", name);
      TACHYON_ASSIGN_OR_RETURN(*dst, copy_to(host.contiguous(), device, name));
    }
  }
  for (const TensorMeta& tm : file.tensors()) {
    if (!expected.count(tm.name)) {
      return make_error(ErrorCode::kInvalidArgument, "unexpected tensor {} (the file has {} heads)", tm.name, k);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<SpecHeads> load_spec_heads(const std::string& path, const ModelConfig& target, Device device) {
  std::error_code ec;
  const std::string file_path =
      std::filesystem::is_directory(path, ec) ? (std::filesystem::path(path) / "heads.safetensors").string() : path;
  SpecHeads out;
  out.path = file_path;
  auto file = SafetensorsFile::open(file_path);
  if (!file.ok()) return file.status().with_context(fmt::format("heads {}", file_path));
  if (Status s = read_heads(**file, target, device, out); !s.ok()) {
    return s.with_context(fmt::format("heads {}", file_path));
  }
  return out;
}

}  // namespace tachyon
