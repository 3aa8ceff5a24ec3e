#include "model/model_loader.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <limits>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/ggml_blocks.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "io/gguf.h"
#include "io/hf_dir.h"
#include "io/json_file.h"
#include "io/llama2c.h"
#include "io/model_format.h"
#include "io/quantization_config.h"
#include "model/quantized_checkpoint.h"
#include "model/synthetic.h"
#include "ops/ops.h"
#include "quant/quantize.h"

namespace tachyon {

namespace fs = std::filesystem;

namespace {

// Where each tensor of the model lives in a container's namespace. Experts are stored one
// tensor per expert and projection (`expert` names them: Hugging Face) or stacked, one 3-D tensor
// per projection (`expert` null; the layer roles "gate_exps", "up_exps", "down_exps": GGUF).
struct TensorNames {
  std::string embed, final_norm, lm_head;
  std::string (*layer)(int layer, const char* role);
  const char* layer_count_key;  // the config's name for the number of layers
  std::string (*expert)(int layer, int expert, const char* role) = nullptr;  // role: gate, up, down
};

std::string hf_layer_name(int layer, const char* role) {
  static const std::map<std::string, std::string> kRoles = {
      {"attn_norm", "input_layernorm.weight"},   {"q", "self_attn.q_proj.weight"},
      {"k", "self_attn.k_proj.weight"},          {"v", "self_attn.v_proj.weight"},
      {"o", "self_attn.o_proj.weight"},          {"q_bias", "self_attn.q_proj.bias"},
      {"k_bias", "self_attn.k_proj.bias"},       {"v_bias", "self_attn.v_proj.bias"},
      {"o_bias", "self_attn.o_proj.bias"},       {"q_norm", "self_attn.q_norm.weight"},
      {"k_norm", "self_attn.k_norm.weight"},     {"ffn_norm", "post_attention_layernorm.weight"},
      {"gate", "mlp.gate_proj.weight"},          {"up", "mlp.up_proj.weight"},
      {"down", "mlp.down_proj.weight"},          {"router", "mlp.gate.weight"},
      {"shared_gate", "mlp.shared_expert.gate_proj.weight"},
      {"shared_up", "mlp.shared_expert.up_proj.weight"},
      {"shared_down", "mlp.shared_expert.down_proj.weight"},
      {"shared_expert_gate", "mlp.shared_expert_gate.weight"}};
  return "model.layers." + std::to_string(layer) + "." + kRoles.at(role);
}

std::string hf_expert_name(int layer, int expert, const char* role) {
  return fmt::format("model.layers.{}.mlp.experts.{}.{}_proj.weight", layer, expert, role);
}

// Mixtral: block_sparse_moe.gate, experts' w1 (gate), w3 (up), w2 (down).
std::string mixtral_layer_name(int layer, const char* role) {
  if (std::string_view(role) == "router") return fmt::format("model.layers.{}.block_sparse_moe.gate.weight", layer);
  return hf_layer_name(layer, role);
}

std::string mixtral_expert_name(int layer, int expert, const char* role) {
  const std::string_view r = role;
  return fmt::format("model.layers.{}.block_sparse_moe.experts.{}.{}.weight", layer, expert,
                     r == "gate" ? "w1" : r == "up" ? "w3" : "w2");
}

std::string gguf_layer_name(int layer, const char* role) {
  static const std::map<std::string, std::string> kRoles = {
      {"attn_norm", "attn_norm.weight"}, {"q", "attn_q.weight"},        {"k", "attn_k.weight"},
      {"v", "attn_v.weight"},            {"o", "attn_output.weight"},   {"q_bias", "attn_q.bias"},
      {"k_bias", "attn_k.bias"},         {"v_bias", "attn_v.bias"},     {"o_bias", "attn_output.bias"},
      {"q_norm", "attn_q_norm.weight"},  {"k_norm", "attn_k_norm.weight"}, {"ffn_norm", "ffn_norm.weight"},
      {"gate", "ffn_gate.weight"},       {"up", "ffn_up.weight"},       {"down", "ffn_down.weight"},
      {"router", "ffn_gate_inp.weight"}, {"gate_exps", "ffn_gate_exps.weight"},
      {"up_exps", "ffn_up_exps.weight"}, {"down_exps", "ffn_down_exps.weight"},
      {"shared_gate", "ffn_gate_shexp.weight"}, {"shared_up", "ffn_up_shexp.weight"},
      {"shared_down", "ffn_down_shexp.weight"}, {"shared_expert_gate", "ffn_gate_inp_shexp.weight"}};
  return "blk." + std::to_string(layer) + "." + kRoles.at(role);
}

const TensorNames kHfNames{"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", &hf_layer_name,
                           "num_hidden_layers", &hf_expert_name};
const TensorNames kHfMixtralNames{"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                                  &mixtral_layer_name, "num_hidden_layers", &mixtral_expert_name};
const TensorNames kGgufNames{"token_embd.weight", "output_norm.weight", "output.weight", &gguf_layer_name,
                             "block_count"};

// Index of the first NaN or infinity among `n` floats of `Bits` (f32, f16 or bf16: all exponent
// bits set), or -1. Chunks are tested with integer ops the compiler vectorizes; only a chunk that
// holds one is searched element by element.
template <typename Bits, Bits kExponent>
int64_t first_non_finite(const Bits* x, int64_t n) {
  constexpr int64_t kChunk = 8192;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    Bits hit = 0;
    for (int64_t i = begin; i < end; ++i) hit |= static_cast<Bits>((x[i] & kExponent) == kExponent);
    if (hit == 0) continue;
    for (int64_t i = begin; i < end; ++i) {
      if ((x[i] & kExponent) == kExponent) return i;
    }
  }
  return -1;
}

// NaN, inf or -inf: what the bits of a non-finite float say.
template <typename Bits>
const char* non_finite_name(Bits bits, Bits exponent, Bits sign) {
  if ((bits & ~(exponent | sign)) != 0) return "NaN";
  return (bits & sign) != 0 ? "-inf" : "inf";
}

// kCorruptFile naming the tensor and the element when a weight is NaN or infinite: such a model
// would load and fail only at sampling. One pass over the bytes, split across the threads.
Status check_finite(const Tensor& t, const std::string& what, const std::string& name) {
  const int64_t n = t.numel();
  std::atomic<int64_t> first{std::numeric_limits<int64_t>::max()};
  auto scan = [&](auto tag, auto exponent) {
    using Bits = decltype(tag);
    const Bits* x = static_cast<const Bits*>(t.raw_data());
    parallel_for(n, int64_t{1} << 22, [&](int64_t begin, int64_t end) {
      const int64_t i = first_non_finite<Bits, decltype(exponent)::value>(x + begin, end - begin);
      if (i >= 0) {
        int64_t seen = first.load();
        while (begin + i < seen && !first.compare_exchange_weak(seen, begin + i)) {
        }
      }
    });
    const int64_t at = first.load();
    if (at == std::numeric_limits<int64_t>::max()) return Status::Ok();
    const Bits sign = static_cast<Bits>(Bits{1} << (8 * sizeof(Bits) - 1));
    return make_error(ErrorCode::kCorruptFile, "{}: tensor '{}' element {} is {}; weights must be finite", what, name,
                      at, non_finite_name<Bits>(x[at], decltype(exponent)::value, sign));
  };
  switch (t.dtype()) {
    case DType::kF32: return scan(uint32_t{}, std::integral_constant<uint32_t, 0x7F800000u>{});
    case DType::kF16: return scan(uint16_t{}, std::integral_constant<uint16_t, 0x7C00>{});
    case DType::kBF16: return scan(uint16_t{}, std::integral_constant<uint16_t, 0x7F80>{});
    default: return Status::Ok();
  }
}

// The f16 scales (and mins) of a GGUF block tensor kept packed: each must be finite, as the
// dequantized weights of an expanded tensor are checked to be.
Status check_block_scales(const Tensor& raw, QuantFormat format, const std::string& name) {
  int64_t block_bytes = 0;
  std::vector<int64_t> fields;  // byte offsets of f16 scales inside a block
  switch (format) {
    case QuantFormat::kGgufQ8_0: block_bytes = kQ8_0Bytes; fields = {0}; break;
    case QuantFormat::kGgufQ4_1: block_bytes = kQ4_1Bytes; fields = {0, 2}; break;
    case QuantFormat::kGgufQ5_0: block_bytes = kQ5_0Bytes; fields = {0}; break;
    case QuantFormat::kGgufQ5_1: block_bytes = kQ5_1Bytes; fields = {0, 2}; break;
    case QuantFormat::kGgufIq4Nl: block_bytes = kIq4NlBytes; fields = {0}; break;
    case QuantFormat::kGgufQ4_K: block_bytes = kQ4_KBytes; fields = {0, 2}; break;
    case QuantFormat::kGgufQ5_K: block_bytes = kQ5_KBytes; fields = {0, 2}; break;
    case QuantFormat::kGgufQ6_K: block_bytes = kQ6_KBytes; fields = {kQ6_KD}; break;
    default: block_bytes = kQ4_0Bytes; fields = {0}; break;  // Q4_0, read as int4 groups
  }
  const auto* bytes = static_cast<const uint8_t*>(raw.raw_data());
  const int64_t blocks = static_cast<int64_t>(raw.nbytes()) / block_bytes;
  for (int64_t b = 0; b < blocks; ++b) {
    for (const int64_t f : fields) {
      uint16_t h = 0;
      std::memcpy(&h, bytes + b * block_bytes + f, 2);
      if ((h & 0x7C00) == 0x7C00) {
        return make_error(ErrorCode::kCorruptFile, "tensor '{}': block {} has a {} {}; scales must be finite", name, b,
                          non_finite_name<uint16_t>(h, 0x7C00, 0x8000), f == fields.front() ? "scale" : "min");
      }
    }
  }
  return Status::Ok();
}

// A container's own packed encoding of a linear weight: the packed weight, nullopt to read the
// tensor densely instead, or an error.
// shape: [out, in], or [experts, out, in] for a stack of experts (read as [experts * out, in]).
using PackedLinearReader =
    std::function<Result<std::optional<Weight>>(const std::string& name, const std::vector<int64_t>& shape)>;

class WeightReader {
 public:
  WeightReader(const WeightSource& source, std::string what, CheckpointQuantization quant = {},
               PackedLinearReader packed = nullptr)
      : source_(source), what_(std::move(what)), quant_(std::move(quant)), packed_(std::move(packed)) {}

  // A tensor that must exist with exactly `shape`.
  Result<Tensor> get(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorMeta* meta = source_.find(name);
    if (meta == nullptr) return make_error(ErrorCode::kNotFound, "{}: tensor '{}' is missing", what_, name);
    used_.insert(name);
    if (meta->shape != shape) {
      return make_error(ErrorCode::kCorruptFile, "{}: tensor '{}' has shape {}, expected {}", what_, name,
                        fmt::format("{}", fmt::join(meta->shape, "x")), fmt::format("{}", fmt::join(shape, "x")));
    }
    TACHYON_ASSIGN_OR_RETURN(Tensor t, source_.tensor(name));
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kF16 && t.dtype() != DType::kBF16) {
      return make_error(ErrorCode::kUnsupported, "{}: tensor '{}' has dtype {}; weights must be f32, f16 or bf16",
                        what_, name, dtype_name(t.dtype()));
    }
    TACHYON_RETURN_IF_ERROR(check_finite(t, what_, name));
    dtypes_.insert(dtype_name(t.dtype()));
    const std::string stored = lowercase(meta->stored_type);
    tally(*meta, stored.empty() || stored == dtype_name(t.dtype()) ? "as stored"
                                                                   : fmt::format("expanded to {} at load", dtype_name(t.dtype())));
    return t;
  }
  Result<Weight> linear(const std::string& name, int64_t out, int64_t in) const {
    // A quantized checkpoint stores a module packed (read as such, never expanded) or dense.
    const std::string suffix = ".weight";
    if (quant_.quantized() && name.size() > suffix.size() && name.ends_with(suffix)) {
      auto packed = read_quantized_linear(source_, quant_, name.substr(0, name.size() - suffix.size()), out, in);
      if (!packed.ok()) return packed.status().with_context(what_);
      if (*packed) {
        used_prefixes_.push_back(name.substr(0, name.size() - suffix.size() + 1));  // "<module>."
        dtypes_.insert(quant_.describe());
        if (const TensorMeta* meta = source_.find(name)) tally(*meta, "packed as " + quant_.describe());
        return std::move(**packed);
      }
    }
    return packed_or_dense(name, {out, in});
  }
  // Experts stored as one [experts, out, in] tensor (GGUF), as a weight of experts * out rows.
  Result<Weight> stacked(const std::string& name, int64_t count, int64_t out, int64_t in) const {
    return packed_or_dense(name, {count, out, in});
  }
  // Experts stored one [out, in] tensor each, stacked into new memory.
  Result<Weight> experts(const std::function<std::string(int)>& name, int count, int64_t out, int64_t in) const {
    std::vector<Weight> parts;
    for (int e = 0; e < count; ++e) {
      TACHYON_ASSIGN_OR_RETURN(Weight w, linear(name(e), out, in));
      parts.push_back(std::move(w));
    }
    auto stacked = stack_rows(std::move(parts), "experts");
    if (!stacked.ok()) return stacked.status().with_context(fmt::format("{}: {}", what_, name(0)));
    return stacked;
  }
  // The container's packed encoding where it has one (and the reader knows it), else the
  // tensor read densely: `shape` [out, in] or [experts, out, in] (rows stacked).
  Result<Weight> packed_or_dense(const std::string& name, const std::vector<int64_t>& shape) const {
    if (packed_) {
      auto packed = packed_(name, shape);
      if (!packed.ok()) return packed.status().with_context(what_);
      if (*packed) {
        used_.insert(name);
        const QuantWeight& q = *packed->value().quant;
        dtypes_.insert(q.group_size > 0 ? fmt::format("{}-g{} (packed)", quant_format_name(q.format), q.group_size)
                                        : fmt::format("{} (packed)", quant_format_name(q.format)));
        if (const TensorMeta* meta = source_.find(name)) {
          // A GGUF block format's group is its block; int4 (Q4_0 as int4 g32) names its own.
          tally(*meta, q.format == QuantFormat::kInt4Group
                           ? fmt::format("packed as {} g{}", quant_format_name(q.format), q.group_size)
                           : fmt::format("packed as {}", quant_format_name(q.format)));
        }
        return std::move(**packed);
      }
    }
    TACHYON_ASSIGN_OR_RETURN(Tensor t, get(name, shape));
    Weight w;
    w.dense = shape.size() == 2 ? std::move(t) : t.reshape({shape[0] * shape[1], shape[2]});
    return w;
  }
  // Norm weights and biases: small, converted to f32.
  Result<Tensor> vector(const std::string& name, int64_t n) const {
    TACHYON_ASSIGN_OR_RETURN(Tensor t, get(name, {n}));
    return t.dtype() == DType::kF32 ? t : t.to_f32();
  }
  Result<Tensor> optional_vector(const std::string& name, int64_t n) const {
    if (!source_.has(name)) return Tensor();
    return vector(name, n);
  }
  bool has(const std::string& name) const { return source_.has(name); }
  // The stored shape of a tensor (empty when absent).
  std::vector<int64_t> shape(const std::string& name) const {
    const TensorMeta* meta = source_.find(name);
    return meta != nullptr ? meta->shape : std::vector<int64_t>();
  }
  // A tensor read outside this reader (rope_freqs.weight) counts as used.
  void mark_used(const std::string& name) const { used_.insert(name); }
  // The source's tensors that no read touched, in the source's order.
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const std::string& name : source_.tensor_names()) {
      if (used_.count(name) != 0 || name.ends_with("rotary_emb.inv_freq")) continue;  // inv_freq: recomputed
      if (std::any_of(used_prefixes_.begin(), used_prefixes_.end(),
                      [&](const std::string& p) { return name.starts_with(p); })) {
        continue;
      }
      out.push_back(name);
    }
    return out;
  }
  std::string dtypes() const { return fmt::format("{}", fmt::join(dtypes_, ", ")); }
  // LoadedModel::tensor_types: each stored type with its tensors counted by how they are held.
  std::vector<std::string> tensor_types() const {
    std::vector<std::string> lines;
    for (const auto& [type, ways] : types_) {
      int total = 0;
      std::vector<std::string> parts;
      for (const auto& [how, count] : ways) total += count;
      for (const auto& [how, count] : ways) parts.push_back(ways.size() > 1 ? fmt::format("{} {}", count, how) : how);
      lines.push_back(fmt::format("{}: {} tensor{}, {}", type, total, total == 1 ? "" : "s", fmt::join(parts, ", ")));
    }
    return lines;
  }

 private:
  static std::string lowercase(std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  }
  void tally(const TensorMeta& meta, const std::string& how) const {
    ++types_[meta.stored_type.empty() ? std::string("?") : meta.stored_type][how];
  }

  const WeightSource& source_;
  std::string what_;
  CheckpointQuantization quant_;
  PackedLinearReader packed_;
  mutable std::set<std::string> dtypes_;
  mutable std::set<std::string> used_;                // tensors read
  mutable std::vector<std::string> used_prefixes_;  // "<module>." of packed checkpoint modules (all their tensors)
  mutable std::map<std::string, std::map<std::string, int>> types_;  // stored type -> how held -> tensors
};

Status read_layer(const WeightReader& r, const ModelConfig& c, const TensorNames& names, int l, LayerWeights& lw);
Status read_moe_layer(const WeightReader& r, const ModelConfig& c, const TensorNames& names, int l, LayerWeights& lw);

Result<ModelWeights> read_weights(const WeightReader& r, const ModelConfig& c, const TensorNames& names) {
  ModelWeights w;
  TACHYON_ASSIGN_OR_RETURN(w.embed_tokens, r.get(names.embed, {c.vocab_size, c.hidden_size}));
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    if (Status st = read_layer(r, c, names, l, lw); !st.ok()) {
      if (st.code() != ErrorCode::kNotFound) return st;
      return make_error(ErrorCode::kNotFound, "{} (the config's {} = {} names layers 0 to {})", st.message(),
                        names.layer_count_key, c.num_layers, c.num_layers - 1);
    }
    w.layers.push_back(std::move(lw));
  }
  TACHYON_ASSIGN_OR_RETURN(w.final_norm, r.vector(names.final_norm, c.hidden_size));
  if (c.tie_word_embeddings || !r.has(names.lm_head)) {
    w.lm_head.dense = w.embed_tokens;
  } else {
    TACHYON_ASSIGN_OR_RETURN(w.lm_head, r.linear(names.lm_head, c.vocab_size, c.hidden_size));
  }
  return w;
}

// Tensors the checkpoint holds that the model never reads (a config naming fewer layers than
// the file has, stray modules): a warning naming them, as transformers gives. A tied LM head
// stored anyway is expected, not reported.
void warn_unused(const WeightReader& r, const ModelConfig& c, const TensorNames& names, const std::string& what) {
  std::vector<std::string> unused = r.unused();
  if (c.tie_word_embeddings) std::erase(unused, names.lm_head);
  if (unused.empty()) return;
  constexpr size_t kNamed = 8;
  const size_t named = std::min(unused.size(), kNamed);
  TACHYON_LOG_WARN("{}: {} tensor{} not used by the model ({} = {}): {}{}", what, unused.size(),
                   unused.size() == 1 ? " is" : "s are", names.layer_count_key, c.num_layers,
                   fmt::join(unused.begin(), unused.begin() + static_cast<std::ptrdiff_t>(named), ", "),
                   unused.size() > named ? fmt::format(" and {} more", unused.size() - named) : "");
}

Status read_layer(const WeightReader& r, const ModelConfig& c, const TensorNames& names, int l, LayerWeights& lw) {
  {
    auto n = [&](const char* role) { return names.layer(l, role); };
    TACHYON_ASSIGN_OR_RETURN(lw.attn_norm, r.vector(n("attn_norm"), c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.q_proj, r.linear(n("q"), c.q_dim(), c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.k_proj, r.linear(n("k"), c.kv_dim(), c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.v_proj, r.linear(n("v"), c.kv_dim(), c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.o_proj, r.linear(n("o"), c.hidden_size, c.q_dim()));
    if (c.attention_bias) {
      TACHYON_ASSIGN_OR_RETURN(lw.q_bias, r.vector(n("q_bias"), c.q_dim()));
      TACHYON_ASSIGN_OR_RETURN(lw.k_bias, r.vector(n("k_bias"), c.kv_dim()));
      TACHYON_ASSIGN_OR_RETURN(lw.v_bias, r.vector(n("v_bias"), c.kv_dim()));
    }
    TACHYON_ASSIGN_OR_RETURN(lw.o_bias, r.optional_vector(n("o_bias"), c.hidden_size));
    if (c.qk_norm) {
      TACHYON_ASSIGN_OR_RETURN(lw.q_norm, r.vector(n("q_norm"), c.head_dim));
      TACHYON_ASSIGN_OR_RETURN(lw.k_norm, r.vector(n("k_norm"), c.head_dim));
    }
    TACHYON_ASSIGN_OR_RETURN(lw.ffn_norm, r.vector(n("ffn_norm"), c.hidden_size));
    if (c.is_moe_layer(l)) return read_moe_layer(r, c, names, l, lw);
    TACHYON_ASSIGN_OR_RETURN(lw.gate_proj, r.linear(n("gate"), c.intermediate_size, c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.up_proj, r.linear(n("up"), c.intermediate_size, c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.down_proj, r.linear(n("down"), c.hidden_size, c.intermediate_size));
  }
  return Status::Ok();
}

// A sparse layer's router, experts and shared expert.
Status read_moe_layer(const WeightReader& r, const ModelConfig& c, const TensorNames& names, int l, LayerWeights& lw) {
  auto n = [&](const char* role) { return names.layer(l, role); };
  const int ne = c.num_experts;
  const int64_t h = c.hidden_size, inter = c.moe_intermediate_size;
  TACHYON_ASSIGN_OR_RETURN(lw.router, r.linear(n("router"), ne, h));
  lw.experts.num_experts = ne;
  lw.experts.inter = inter;
  if (names.expert != nullptr) {
    const auto per_expert = [&](const char* role) {
      return [&names, l, role](int e) { return names.expert(l, e, role); };
    };
    TACHYON_ASSIGN_OR_RETURN(lw.experts.gate, r.experts(per_expert("gate"), ne, inter, h));
    TACHYON_ASSIGN_OR_RETURN(lw.experts.up, r.experts(per_expert("up"), ne, inter, h));
    TACHYON_ASSIGN_OR_RETURN(lw.experts.down, r.experts(per_expert("down"), ne, h, inter));
  } else {
    TACHYON_ASSIGN_OR_RETURN(lw.experts.gate, r.stacked(n("gate_exps"), ne, inter, h));
    TACHYON_ASSIGN_OR_RETURN(lw.experts.up, r.stacked(n("up_exps"), ne, inter, h));
    TACHYON_ASSIGN_OR_RETURN(lw.experts.down, r.stacked(n("down_exps"), ne, h, inter));
  }
  const auto format = [](const Weight& w) {
    return w.quant ? std::string(quant_format_name(w.quant->format)) : std::string(dtype_name(w.dense.dtype()));
  };
  if (format(lw.experts.gate) != format(lw.experts.up) || format(lw.experts.gate) != format(lw.experts.down)) {
    return make_error(ErrorCode::kUnsupported,
                      "layer {}: the experts' gate, up and down are stored as {}, {} and {}; they must share one "
                      "format",
                      l, format(lw.experts.gate), format(lw.experts.up), format(lw.experts.down));
  }
  if (c.shared_expert_intermediate_size > 0) {
    const int64_t si = c.shared_expert_intermediate_size;
    TACHYON_ASSIGN_OR_RETURN(lw.gate_proj, r.linear(n("shared_gate"), si, h));
    TACHYON_ASSIGN_OR_RETURN(lw.up_proj, r.linear(n("shared_up"), si, h));
    TACHYON_ASSIGN_OR_RETURN(lw.down_proj, r.linear(n("shared_down"), h, si));
    // [1, hidden] (Hugging Face), or [hidden] (GGUF).
    const std::string gate = n("shared_expert_gate");
    if (r.shape(gate).size() == 1) {
      TACHYON_ASSIGN_OR_RETURN(Tensor g, r.get(gate, {h}));
      lw.shared_expert_gate.dense = g.reshape({1, h});
    } else {
      TACHYON_ASSIGN_OR_RETURN(lw.shared_expert_gate, r.linear(gate, 1, h));
    }
  }
  return Status::Ok();
}

void merge_ids(std::vector<int32_t>& into, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (id >= 0 && std::find(into.begin(), into.end(), id) == into.end()) into.push_back(id);
  }
}

// Token ids from generation_config.json: an integer or a list of them. A value that is not a
// non-negative 32-bit integer is an error, never wrapped.
Result<std::vector<int32_t>> json_ids(const nlohmann::json& j, const char* key, const std::string& path) {
  std::vector<int32_t> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  auto add = [&](const nlohmann::json& v) -> Status {
    const bool id = v.is_number_unsigned() ? v.get<uint64_t>() <= INT32_MAX
                                           : v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
    if (!id) {
      return make_error(ErrorCode::kCorruptFile, "{}: '{}' holds {}, expected a token id (0 to {})", path, key,
                        json_excerpt(v), INT32_MAX);
    }
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return Status::Ok();
  };
  if (it->is_array()) {
    for (const auto& v : *it) TACHYON_RETURN_IF_ERROR(add(v));
  } else {
    TACHYON_RETURN_IF_ERROR(add(*it));
  }
  return out;
}

// Ids the config, generation config or tokenizer name that lie outside the vocabulary can
// never be sampled (EOS) or embedded (BOS): each is dropped with a warning naming it.
void drop_ids_outside_vocabulary(LoadedModel& out) {
  const int vocab = out.model->config().vocab_size;
  std::vector<int32_t> kept;
  for (int32_t id : out.eos_token_ids) {
    if (id >= 0 && id < vocab) {
      kept.push_back(id);
    } else {
      TACHYON_LOG_WARN("{}: eos token id {} is outside the vocabulary [0, {}); ignored", out.path, id, vocab);
    }
  }
  out.eos_token_ids = std::move(kept);
  if (out.bos_token_id >= vocab) {
    TACHYON_LOG_WARN("{}: bos token id {} is outside the vocabulary [0, {}); ignored", out.path, out.bos_token_id,
                     vocab);
    out.bos_token_id = -1;
  }
}

Status load_hf(const std::string& path, LoadedModel& out) {
  {
    // The architecture is checked before anything else is opened: an unsupported model is
    // reported as such, not as whatever file it happens to lack.
    const std::string config_path = (fs::path(path) / "config.json").string();
    TACHYON_ASSIGN_OR_RETURN(nlohmann::json config_json, read_json_file(config_path));
    TACHYON_RETURN_IF_ERROR(model_config_from_hf(config_json, config_path).status());
  }
  TACHYON_ASSIGN_OR_RETURN(HfDirectory dir, HfDirectory::open(path));
  TACHYON_ASSIGN_OR_RETURN(ModelConfig config, model_config_from_hf(dir.config(), dir.config_path()));
  if (!dir.weights()) return make_error(ErrorCode::kNotFound, "{}: no *.safetensors weights found", path);
  TACHYON_ASSIGN_OR_RETURN(CheckpointQuantization quant, read_quantization_config(dir.config(), dir.config_path()));
  WeightReader reader(*dir.weights(), dir.weights_path(), std::move(quant));
  const TensorNames& names = config.architecture == "MixtralForCausalLM" ? kHfMixtralNames : kHfNames;
  TACHYON_ASSIGN_OR_RETURN(ModelWeights weights, read_weights(reader, config, names));
  warn_unused(reader, config, names, dir.weights_path());
  if (!config.tie_word_embeddings && !dir.weights()->has(kHfNames.lm_head)) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}' is missing and tie_word_embeddings is false",
                      dir.weights_path(), kHfNames.lm_head);
  }
  out.weight_dtypes = reader.dtypes();
  out.tensor_types = reader.tensor_types();
  if (!dir.tokenizer_json_path().empty()) {
    TACHYON_ASSIGN_OR_RETURN(out.tokenizer,
                             Tokenizer::from_hf_json(dir.tokenizer_json_path(), dir.tokenizer_config_path()));
  }
  out.bos_token_id = config.bos_token_id;
  merge_ids(out.eos_token_ids, config.eos_token_ids);
  if (dir.generation_config()) {
    TACHYON_ASSIGN_OR_RETURN(auto eos, json_ids(*dir.generation_config(), "eos_token_id", dir.generation_config_path()));
    merge_ids(out.eos_token_ids, eos);
    TACHYON_ASSIGN_OR_RETURN(auto bos, json_ids(*dir.generation_config(), "bos_token_id", dir.generation_config_path()));
    if (!bos.empty()) out.bos_token_id = bos[0];
  }
  out.format = "hf";
  out.path = dir.path();
  out.model = std::make_unique<LlamaModel>(std::move(config), std::move(weights));
  return Status::Ok();
}

Status load_gguf(const std::string& path, LoadedModel& out) {
  TACHYON_ASSIGN_OR_RETURN(auto source, GgufWeightSource::open(path));
  const GgufFile& gguf = source->file();
  TACHYON_ASSIGN_OR_RETURN(ModelConfig config, model_config_from_gguf(gguf));
  if (source->has("rope_freqs.weight")) {
    TACHYON_ASSIGN_OR_RETURN(Tensor f, source->tensor("rope_freqs.weight"));
    if (f.dim() != 1 || f.size(0) != config.rope.rotary_dim / 2) {
      return make_error(ErrorCode::kCorruptFile, "{}: rope_freqs.weight has shape {}, expected [{}]", path,
                        f.shape_string(), config.rope.rotary_dim / 2);
    }
    Tensor f32 = f.to_f32();
    config.rope_freq_divisors.assign(f32.data<float>(), f32.data<float>() + f32.numel());
  }
  // Quantized linear weights stay packed: Q4_0 as kInt4Group (group 32: the same nibbles), Q8_0,
  // Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K and Q6_K in their own block formats. Other tensors (the
  // embedding) and Q2_K / Q3_K linears are read densely.
  const PackedLinearReader packed = [&gguf](const std::string& name,
                                            const std::vector<int64_t>& shape) -> Result<std::optional<Weight>> {
    const GgufTensorInfo* info = gguf.find_tensor(name);
    if (info == nullptr || info->shape != shape) {
      return std::optional<Weight>();  // read densely (a wrong shape is reported there)
    }
    const int64_t rows = shape.size() == 3 ? shape[0] * shape[1] : shape[0], cols = shape.back();
    std::optional<QuantFormat> format;
    switch (info->type) {
      case GgmlType::kQ8_0: format = QuantFormat::kGgufQ8_0; break;
      case GgmlType::kQ4_K: format = QuantFormat::kGgufQ4_K; break;
      case GgmlType::kQ6_K: format = QuantFormat::kGgufQ6_K; break;
      case GgmlType::kQ4_1: format = QuantFormat::kGgufQ4_1; break;
      case GgmlType::kQ5_0: format = QuantFormat::kGgufQ5_0; break;
      case GgmlType::kQ5_1: format = QuantFormat::kGgufQ5_1; break;
      case GgmlType::kQ5_K: format = QuantFormat::kGgufQ5_K; break;
      case GgmlType::kIQ4_NL: format = QuantFormat::kGgufIq4Nl; break;
      case GgmlType::kQ4_0: break;
      default: return std::optional<Weight>();
    }
    TACHYON_ASSIGN_OR_RETURN(Tensor raw, gguf.raw_tensor(name));
    TACHYON_RETURN_IF_ERROR(check_block_scales(raw, format.value_or(QuantFormat::kInt4Group), name));
    auto q = format ? unpack_gguf_blocks(*format, raw, rows, cols) : unpack_gguf_q4_0(raw, rows, cols);
    if (!q.ok()) return q.status().with_context(fmt::format("tensor '{}'", name));
    Weight w;
    w.quant = std::make_shared<QuantWeight>(std::move(q).value());
    return std::optional<Weight>(std::move(w));
  };
  WeightReader reader(*source, path, {}, packed);
  if (source->has("rope_freqs.weight")) reader.mark_used("rope_freqs.weight");
  TACHYON_ASSIGN_OR_RETURN(ModelWeights weights, read_weights(reader, config, kGgufNames));
  warn_unused(reader, config, kGgufNames, path);
  out.weight_dtypes = reader.dtypes();
  out.tensor_types = reader.tensor_types();
  if (gguf.has("tokenizer.ggml.model")) {
    TACHYON_ASSIGN_OR_RETURN(out.tokenizer, Tokenizer::from_gguf(gguf));
  }
  out.bos_token_id = config.bos_token_id;
  merge_ids(out.eos_token_ids, config.eos_token_ids);
  out.format = "gguf";
  out.path = path;
  out.model = std::make_unique<LlamaModel>(std::move(config), std::move(weights));
  return Status::Ok();
}

Status load_llama2c(const std::string& path, LoadedModel& out) {
  TACHYON_ASSIGN_OR_RETURN(auto ckpt, Llama2cCheckpoint::open(path));
  const Llama2cConfig& lc = ckpt->config();
  ModelConfig c;
  c.architecture = "llama2.c";
  c.vocab_size = lc.vocab_size;
  c.hidden_size = lc.dim;
  c.intermediate_size = lc.hidden_dim;
  c.num_layers = lc.n_layers;
  c.num_heads = lc.n_heads;
  c.num_kv_heads = lc.n_kv_heads;
  c.head_dim = lc.head_size();
  c.max_position_embeddings = lc.seq_len;
  c.rms_norm_eps = Llama2cConfig::kRmsNormEps;
  c.rope.theta = Llama2cConfig::kRopeTheta;
  c.rope.rotary_dim = c.head_dim;
  c.rope.style = RopeStyle::kInterleaved;  // llama2.c rotates adjacent pairs
  c.tie_word_embeddings = lc.shared_classifier;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  TACHYON_RETURN_IF_ERROR(c.validate(path));
  WeightReader reader(*ckpt, path);
  TACHYON_ASSIGN_OR_RETURN(ModelWeights weights, read_weights(reader, c, kHfNames));
  warn_unused(reader, c, kHfNames, path);
  out.weight_dtypes = reader.dtypes();
  out.tensor_types = reader.tensor_types();
  auto tok_path = find_llama2c_tokenizer(path, c.vocab_size);
  if (tok_path.ok()) {
    TACHYON_ASSIGN_OR_RETURN(out.tokenizer, Tokenizer::from_llama2c(*tok_path, c.vocab_size));
  } else {
    TACHYON_LOG_WARN("{}", tok_path.status().message());
  }
  out.bos_token_id = c.bos_token_id;
  out.eos_token_ids = c.eos_token_ids;
  out.format = "llama2c";
  out.path = path;
  out.model = std::make_unique<LlamaModel>(std::move(c), std::move(weights));
  return Status::Ok();
}

Status load_synthetic(const LoadOptions& options, const std::string& preset, LoadedModel& out) {
  TACHYON_ASSIGN_OR_RETURN(ModelConfig config, synthetic_config(preset));
  SyntheticOptions so;
  so.preset = preset;
  so.weight_dtype = options.synthetic_dtype;
  so.seed = options.synthetic_seed;
  so.device = options.device;
  TACHYON_ASSIGN_OR_RETURN(ModelWeights weights, make_synthetic_weights(config, so));
  TACHYON_RETURN_IF_ERROR(ops::synchronize(options.device));
  out.format = "synthetic";
  out.path = "synthetic:" + preset;
  out.weight_dtypes = dtype_name(options.synthetic_dtype);
  out.bos_token_id = config.bos_token_id;
  out.eos_token_ids = config.eos_token_ids;
  out.model = std::make_unique<LlamaModel>(std::move(config), std::move(weights));
  return Status::Ok();
}

// A directory holding a llama2.c checkpoint (and no config.json): the one *.bin that is not a
// tokenizer.
Result<std::string> llama2c_in_directory(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".bin" && name != "tokenizer.bin" && name.rfind("tok", 0) != 0) {
      found.push_back(e.path().string());
    }
  }
  if (found.size() == 1) return found[0];
  return make_error(ErrorCode::kNotFound, "{}: {} llama2.c checkpoints (*.bin) found, expected one", dir, found.size());
}

Result<std::string> gguf_in_directory(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".gguf") found.push_back(e.path().string());
  }
  if (found.size() == 1) return found[0];
  return make_error(ErrorCode::kNotFound, "{}: {} *.gguf files found", dir, found.size());
}

}  // namespace

Result<LoadedModel> load_model(const LoadOptions& options) {
  Timer timer;
  LoadedModel out;
  const std::string& path = options.path;
  Status status;
  if (path.rfind("synthetic:", 0) == 0) {
    status = load_synthetic(options, path.substr(10), out);
  } else if (fs::is_directory(path)) {
    if (fs::exists(fs::path(path) / "config.json")) {
      status = load_hf(path, out);
    } else if (auto gguf = gguf_in_directory(path); gguf.ok()) {
      status = load_gguf(*gguf, out);
    } else if (auto bin = llama2c_in_directory(path); bin.ok()) {
      status = load_llama2c(*bin, out);
    } else {
      status = make_error(ErrorCode::kNotFound,
                          "{}: no model found (expected config.json + *.safetensors, one *.gguf, or a llama2.c *.bin)",
                          path);
    }
  } else {
    TACHYON_ASSIGN_OR_RETURN(ModelFormat format, detect_model_format(path));
    switch (format) {
      case ModelFormat::kGguf: status = load_gguf(path, out); break;
      case ModelFormat::kLlama2c: status = load_llama2c(path, out); break;
      case ModelFormat::kHfDirectory: status = load_hf(path, out); break;
      case ModelFormat::kSafetensors: {
        // A bare safetensors file or index: its directory must hold config.json.
        const std::string dir = fs::path(path).parent_path().string();
        status = load_hf(dir.empty() ? "." : dir, out);
        break;
      }
    }
  }
  TACHYON_RETURN_IF_ERROR(status);
  if (!(out.model->device() == options.device)) {
    auto weights = copy_weights_to(out.model->weights(), options.device);
    if (!weights.ok()) {
      return make_error(weights.status().code(), "{}: moving the weights to {}: {}", out.path,
                        options.device.to_string(), weights.status().message());
    }
    ModelConfig config = out.model->config();
    out.model = std::make_unique<LlamaModel>(std::move(config), std::move(weights).value());
  }
  if (!options.device.is_cpu()) {
    // One matrix for q/k/v and one for gate/up: fewer launches and one pass over each input.
    ModelWeights weights = out.model->weights();
    TACHYON_RETURN_IF_ERROR(fuse_projections(weights));
    TACHYON_RETURN_IF_ERROR(ops::synchronize(options.device));
    ModelConfig config = out.model->config();
    out.model = std::make_unique<LlamaModel>(std::move(config), std::move(weights));
  }
  if (out.tokenizer) {
    if (out.bos_token_id < 0) out.bos_token_id = out.tokenizer->bos_id();
    merge_ids(out.eos_token_ids, out.tokenizer->eos_ids());
  }
  drop_ids_outside_vocabulary(out);
  out.load_seconds = timer.seconds();
  TACHYON_LOG_INFO("loaded {} ({}) in {:.2f} s: {}; weights {} on {}", out.path, out.format, out.load_seconds,
                   out.model->config().summary(), out.weight_dtypes, options.device.to_string());
  return out;
}

}  // namespace tachyon
