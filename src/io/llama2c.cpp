#include "io/llama2c.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "io/file_view.h"

namespace tachyon {

namespace {

namespace fs = std::filesystem;

constexpr uint32_t kMagic = 0x616b3432;  // "ak42" written as a little-endian u32
constexpr uint64_t kLegacyHeaderBytes = 7 * 4;
constexpr uint64_t kV1HeaderBytes = 256;

int32_t read_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// One stored float array, in file order. Sizes are in floats, computed in 128 bits so that
// no header value (each below 2^31) can overflow them before they are checked against the file.
struct Array {
  const char* key;
  unsigned __int128 floats;
};

std::string header_string(const int32_t* h) {
  return fmt::format("dim={}, hidden_dim={}, n_layers={}, n_heads={}, n_kv_heads={}, vocab_size={}, seq_len={}", h[0],
                     h[1], h[2], h[3], h[4], h[5], h[6]);
}

}  // namespace

Result<std::shared_ptr<Llama2cCheckpoint>> Llama2cCheckpoint::open(const std::string& path) {
  TACHYON_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  std::shared_ptr<Llama2cCheckpoint> ckpt(new Llama2cCheckpoint());
  ckpt->path_ = path;
  ckpt->file_ = std::move(file);
  Status s = ckpt->parse();
  if (!s.ok()) return s.with_context(path);
  return ckpt;
}

Status Llama2cCheckpoint::parse() {
  const uint64_t size = file_->size();
  const uint8_t* data = file_->data();
  Llama2cConfig& c = config_;
  int32_t h[7];
  uint64_t header_bytes = 0;
  uint32_t magic = 0;
  if (size >= 4) std::memcpy(&magic, data, 4);
  if (magic == kMagic) {
    if (size < 8) return make_error(ErrorCode::kCorruptFile, "file of {} bytes ends inside the llama2.c header", size);
    c.version = read_i32(data + 4);
    if (c.version == 2) {
      return make_error(ErrorCode::kUnsupported,
                        "llama2.c version 2 checkpoints (Q8_0 int8 export) are not supported; export with "
                        "--version 0 or 1 (fp32)");
    }
    if (c.version != 1) {
      return make_error(ErrorCode::kUnsupported, "llama2.c checkpoint version {} is not supported (0 and 1 are)",
                        c.version);
    }
    if (size < kV1HeaderBytes) {
      return make_error(ErrorCode::kCorruptFile, "file of {} bytes is shorter than the {}-byte version 1 header", size,
                        kV1HeaderBytes);
    }
    for (int k = 0; k < 7; ++k) h[k] = read_i32(data + 8 + 4 * k);
    const uint8_t shared = data[36];
    if (shared > 1) {
      return make_error(ErrorCode::kCorruptFile, "shared_classifier byte is {}, expected 0 or 1", shared);
    }
    if (h[5] <= 0) {
      return make_error(ErrorCode::kCorruptFile, "header ({}): vocab_size must be positive in a version 1 file",
                        header_string(h));
    }
    c.shared_classifier = shared == 1;
    header_bytes = kV1HeaderBytes;
  } else {
    if (size < kLegacyHeaderBytes) {
      return make_error(ErrorCode::kCorruptFile, "file of {} bytes is shorter than the {}-byte llama2.c header", size,
                        kLegacyHeaderBytes);
    }
    c.version = 0;
    for (int k = 0; k < 7; ++k) h[k] = read_i32(data + 4 * k);
    // The legacy format flags a separate classifier by a negative vocab_size.
    c.shared_classifier = h[5] > 0;
    header_bytes = kLegacyHeaderBytes;
  }
  const int64_t vocab = h[5] < 0 ? -static_cast<int64_t>(h[5]) : h[5];
  if (h[0] <= 0 || h[1] <= 0 || h[2] <= 0 || h[3] <= 0 || h[4] <= 0 || vocab <= 0 || vocab > INT32_MAX || h[6] <= 0) {
    return make_error(ErrorCode::kCorruptFile, "header ({}): every size must be positive", header_string(h));
  }
  if (h[0] % h[3] != 0) {
    return make_error(ErrorCode::kCorruptFile, "header ({}): dim {} is not a multiple of n_heads {}", header_string(h),
                      h[0], h[3]);
  }
  if (h[3] % h[4] != 0) {
    return make_error(ErrorCode::kCorruptFile, "header ({}): n_heads {} is not a multiple of n_kv_heads {}",
                      header_string(h), h[3], h[4]);
  }
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.vocab_size = static_cast<int>(vocab);
  c.seq_len = h[6];

  using u128 = unsigned __int128;
  const u128 dim = static_cast<u128>(c.dim), hidden = static_cast<u128>(c.hidden_dim);
  const u128 layers = static_cast<u128>(c.n_layers), kv_dim = static_cast<u128>(c.kv_dim());
  const u128 embed = static_cast<u128>(vocab) * dim;
  // run.c skips `seq_len * head_size / 2` floats twice (C evaluates left to right).
  const u128 rope_table = static_cast<u128>(static_cast<uint64_t>(c.seq_len) * static_cast<uint64_t>(c.head_size()) / 2);
  const Array embedding{"embed", embed}, att_norm{"att_norm", layers * dim}, wq{"wq", layers * dim * dim},
      wk{"wk", layers * kv_dim * dim}, wv{"wv", layers * kv_dim * dim}, wo{"wo", layers * dim * dim},
      ffn_norm{"ffn_norm", layers * dim}, w1{"w1", layers * hidden * dim}, w2{"w2", layers * dim * hidden},
      w3{"w3", layers * hidden * dim}, norm{"norm", dim}, rope{"rope", 2 * rope_table}, wcls{"wcls", embed};
  std::vector<Array> order;
  if (c.version == 0) {
    order = {embedding, att_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, norm, rope};
  } else {
    order = {att_norm, ffn_norm, norm, embedding, wq, wk, wv, wo, w1, w2, w3};
  }
  u128 floats = 0;
  for (const auto& a : order) floats += a.floats;
  const u128 expected_shared = header_bytes + 4 * floats;
  const u128 expected_separate = expected_shared + 4 * embed;
  const u128 expected = c.shared_classifier ? expected_shared : expected_separate;
  if (expected != size) {
    const u128 other = c.shared_classifier ? expected_separate : expected_shared;
    const std::string hint =
        other == size ? fmt::format(" (the size fits a checkpoint {} a separate classifier: is the {} wrong?)",
                                    c.shared_classifier ? "with" : "without",
                                    c.version == 0 ? "sign of vocab_size" : "shared_classifier byte")
                      : std::string();
    const std::string expected_text = expected >> 64 ? std::string("more than 2^64") :
                                      fmt::format("{}", static_cast<uint64_t>(expected));
    return make_error(ErrorCode::kCorruptFile,
                      "llama2.c version {} checkpoint ({}, {} classifier) should be {} bytes, the file has {}{}",
                      c.version, header_string(h), c.shared_classifier ? "shared" : "separate", expected_text, size,
                      hint);
  }
  if (!c.shared_classifier) order.push_back(wcls);

  // The whole layout fits the file, so every offset below fits 64 bits.
  std::map<std::string, uint64_t> start;
  uint64_t at = header_bytes;
  for (const auto& a : order) {
    start[a.key] = at;
    at += 4 * static_cast<uint64_t>(a.floats);
  }
  const int64_t d = c.dim, hd = c.hidden_dim, kv = c.kv_dim(), v = c.vocab_size;
  const uint64_t f = 4;  // bytes per float
  add("model.embed_tokens.weight", {v, d}, start["embed"]);
  for (int i = 0; i < c.n_layers; ++i) {
    const auto l = static_cast<uint64_t>(i);
    const std::string p = fmt::format("model.layers.{}.", i);
    const auto ud = static_cast<uint64_t>(d), uh = static_cast<uint64_t>(hd), ukv = static_cast<uint64_t>(kv);
    add(p + "input_layernorm.weight", {d}, start["att_norm"] + l * ud * f);
    add(p + "self_attn.q_proj.weight", {d, d}, start["wq"] + l * ud * ud * f);
    add(p + "self_attn.k_proj.weight", {kv, d}, start["wk"] + l * ukv * ud * f);
    add(p + "self_attn.v_proj.weight", {kv, d}, start["wv"] + l * ukv * ud * f);
    add(p + "self_attn.o_proj.weight", {d, d}, start["wo"] + l * ud * ud * f);
    add(p + "post_attention_layernorm.weight", {d}, start["ffn_norm"] + l * ud * f);
    add(p + "mlp.gate_proj.weight", {hd, d}, start["w1"] + l * uh * ud * f);
    add(p + "mlp.down_proj.weight", {d, hd}, start["w2"] + l * ud * uh * f);
    add(p + "mlp.up_proj.weight", {hd, d}, start["w3"] + l * uh * ud * f);
  }
  add("model.norm.weight", {d}, start["norm"]);
  add("lm_head.weight", {v, d}, c.shared_classifier ? start["embed"] : start["wcls"]);
  return Status::Ok();
}

void Llama2cCheckpoint::add(const std::string& name, std::vector<int64_t> shape, uint64_t byte_offset) {
  TensorMeta meta;
  meta.name = name;
  uint64_t numel = 1;
  for (auto s : shape) numel *= static_cast<uint64_t>(s);
  meta.shape = std::move(shape);
  meta.dtype = DType::kF32;
  meta.stored_type = "F32";
  meta.nbytes = numel * 4;
  index_.emplace(name, metas_.size());
  offsets_.push_back(byte_offset);
  metas_.push_back(std::move(meta));
}

std::vector<std::string> Llama2cCheckpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(metas_.size());
  for (const auto& m : metas_) names.push_back(m.name);
  return names;
}

const TensorMeta* Llama2cCheckpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &metas_[it->second];
}

Result<Tensor> Llama2cCheckpoint::tensor(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}' not found (llama2.c checkpoints hold {} tensors)", path_,
                      name, metas_.size());
  }
  return tensor_in_mapping(file_, offsets_[it->second], metas_[it->second].shape, DType::kF32,
                           fmt::format("tensor '{}'", name));
}

std::string Llama2cCheckpoint::describe() const {
  const Llama2cConfig& c = config_;
  return fmt::format("llama2.c v{} {} (dim {}, hidden {}, {} layers, {} heads, {} kv heads, vocab {}, seq_len {}, {} "
                     "classifier)",
                     c.version, path_, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
                     c.seq_len, c.shared_classifier ? "shared" : "separate");
}

Result<std::string> find_llama2c_tokenizer(const std::string& checkpoint_path, int vocab_size) {
  fs::path dir = fs::path(checkpoint_path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (fs::is_regular_file(dir / "tokenizer.bin", ec)) return (dir / "tokenizer.bin").string();
  if (vocab_size > 0) {
    const fs::path exact = dir / fmt::format("tok{}.bin", vocab_size);
    if (fs::is_regular_file(exact, ec)) return exact.string();
  }
  const std::string own_name = fs::path(checkpoint_path).filename().string();
  std::vector<std::string> candidates;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == own_name || !entry.is_regular_file(ec)) continue;
    if (name.size() >= 7 && name.rfind("tok", 0) == 0 && name.compare(name.size() - 4, 4, ".bin") == 0) {
      candidates.push_back(entry.path().string());
    }
  }
  std::sort(candidates.begin(), candidates.end());
  if (candidates.size() == 1) return candidates[0];
  if (candidates.empty()) {
    return make_error(ErrorCode::kNotFound, "no llama2.c tokenizer (tokenizer.bin or tok*.bin) beside {}",
                      checkpoint_path);
  }
  return make_error(ErrorCode::kInvalidArgument, "{} llama2.c tokenizers beside {} ({}, {}, ...); name one explicitly",
                    candidates.size(), checkpoint_path, fs::path(candidates[0]).filename().string(),
                    fs::path(candidates[1]).filename().string());
}

}  // namespace tachyon
