#include "model/model_config.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "io/json_file.h"

namespace tachyon {

using json = nlohmann::json;

bool ModelConfig::is_moe_layer(int layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return decoder_sparse_step <= 1 || (layer + 1) % decoder_sparse_step == 0;
}

namespace {

// Parameters of the model with `experts` experts of each sparse layer counted.
int64_t count_parameters(const ModelConfig& c, int64_t experts) {
  const int64_t h = c.hidden_size;
  int64_t attention = h * c.q_dim() + 2 * h * c.kv_dim() + static_cast<int64_t>(c.q_dim()) * h  // q, k, v, o
                      + 2 * h;                                                                   // norms
  if (c.attention_bias) attention += c.q_dim() + 2 * c.kv_dim();
  if (c.qk_norm) attention += 2 * c.head_dim;
  int64_t n = static_cast<int64_t>(c.vocab_size) * h + h;
  if (!c.tie_word_embeddings) n += static_cast<int64_t>(c.vocab_size) * h;
  for (int l = 0; l < c.num_layers; ++l) {
    n += attention;
    if (!c.is_moe_layer(l)) {
      n += 3 * h * c.intermediate_size;  // gate, up, down
      continue;
    }
    n += static_cast<int64_t>(c.num_experts) * h + experts * 3 * h * c.moe_intermediate_size;  // router, experts
    if (c.shared_expert_intermediate_size > 0) n += 3 * h * c.shared_expert_intermediate_size + h;
  }
  return n;
}

}  // namespace

int64_t ModelConfig::num_parameters() const { return count_parameters(*this, num_experts); }
int64_t ModelConfig::active_parameters() const { return count_parameters(*this, num_experts_per_tok); }

Status ModelConfig::validate(const std::string& source) const {
  auto bad = [&](const char* field, int64_t value, const char* why) {
    return make_error(ErrorCode::kCorruptFile, "{}: {} = {} {}", source, field, value, why);
  };
  constexpr int kMaxDim = 1 << 20;
  if (vocab_size <= 0 || vocab_size > (1 << 24)) return bad("vocab_size", vocab_size, "is out of range");
  if (hidden_size <= 0 || hidden_size > kMaxDim) return bad("hidden_size", hidden_size, "is out of range");
  if (intermediate_size <= 0 || intermediate_size > kMaxDim)
    return bad("intermediate_size", intermediate_size, "is out of range");
  if (num_layers <= 0 || num_layers > 4096) return bad("num_hidden_layers", num_layers, "is out of range");
  if (num_heads <= 0 || num_heads > 4096) return bad("num_attention_heads", num_heads, "is out of range");
  if (num_kv_heads <= 0 || num_kv_heads > num_heads || num_heads % num_kv_heads != 0)
    return bad("num_key_value_heads", num_kv_heads, "must divide num_attention_heads");
  if (head_dim <= 0 || head_dim > 1024 || head_dim % 2 != 0) return bad("head_dim", head_dim, "must be even and in (0, 1024]");
  if (rope.rotary_dim <= 0 || rope.rotary_dim > head_dim || rope.rotary_dim % 2 != 0)
    return bad("rotary_dim", rope.rotary_dim, "must be even and at most head_dim");
  if (max_position_embeddings <= 0) return bad("max_position_embeddings", max_position_embeddings, "must be positive");
  if (sliding_window < 0) return bad("sliding_window", sliding_window, "must not be negative");
  if (!(rms_norm_eps > 0.0f) || !std::isfinite(rms_norm_eps))
    return make_error(ErrorCode::kCorruptFile, "{}: rms_norm_eps = {} must be positive", source, rms_norm_eps);
  if (!(rope.theta > 0.0f) || !std::isfinite(rope.theta))
    return make_error(ErrorCode::kCorruptFile, "{}: rope_theta = {} must be positive", source, rope.theta);
  if (!(rope.factor > 0.0f)) return make_error(ErrorCode::kCorruptFile, "{}: rope scaling factor = {} must be positive", source, rope.factor);
  if (num_experts < 0 || num_experts > ops::kMaxExperts) {
    return bad("num_experts", num_experts, fmt::format("is out of range (at most {})", ops::kMaxExperts).c_str());
  }
  if (num_experts > 0) {
    if (num_experts_per_tok < 1 || num_experts_per_tok > std::min(num_experts, ops::kMaxExpertsPerTok)) {
      return bad("num_experts_per_tok", num_experts_per_tok,
                 fmt::format("must be in [1, {}]", std::min(num_experts, ops::kMaxExpertsPerTok)).c_str());
    }
    if (moe_intermediate_size <= 0 || moe_intermediate_size > kMaxDim) {
      return bad("moe_intermediate_size", moe_intermediate_size, "is out of range");
    }
    if (shared_expert_intermediate_size < 0 || shared_expert_intermediate_size > kMaxDim) {
      return bad("shared_expert_intermediate_size", shared_expert_intermediate_size, "is out of range");
    }
    if (decoder_sparse_step < 0) return bad("decoder_sparse_step", decoder_sparse_step, "must not be negative");
    for (const int l : mlp_only_layers) {
      if (l < 0 || l >= num_layers) return bad("mlp_only_layers", l, "is not a layer");
    }
  }
  return Status::Ok();
}

std::string ModelConfig::summary() const {
  return fmt::format(
      "{}: vocab {}, hidden {}, ffn {}, layers {}, heads {} (kv {}), head_dim {}, rope theta {} {}{}, ctx {}{}{}{}{}{}",
      architecture, vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim,
      rope.theta, rope.style == RopeStyle::kNeox ? "neox" : "interleaved",
      rope.scaling == RopeScaling::kNone     ? ""
      : rope.scaling == RopeScaling::kLinear ? fmt::format(" linear x{}", rope.factor)
      : rope.scaling == RopeScaling::kLlama3 ? fmt::format(" llama3 x{}", rope.factor)
                                             : fmt::format(" yarn x{}", rope.factor),
      max_position_embeddings, attention_bias ? ", qkv bias" : "", qk_norm ? ", qk norm" : "",
      sliding_window ? fmt::format(", sliding window {}", sliding_window) : "",
      tie_word_embeddings ? ", tied embeddings" : "",
      num_experts > 0 ? fmt::format(", {} experts of {} (top {}{}){}", num_experts, moe_intermediate_size,
                                    num_experts_per_tok, norm_topk_prob ? ", renormalised" : "",
                                    shared_expert_intermediate_size > 0
                                        ? fmt::format(" + a shared expert of {}", shared_expert_intermediate_size)
                                        : "")
                      : "");
}

namespace {

// Reads an optional number field; a present field of the wrong type is an error.
template <typename T>
Status read_number(const json& j, const char* key, T& out, const std::string& path, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return make_error(ErrorCode::kCorruptFile, "{}: missing field '{}'", path, key);
    return Status::Ok();
  }
  if (!it->is_number()) {
    return make_error(ErrorCode::kCorruptFile, "{}: field '{}' must be a number, got {}", path, key, json_excerpt(*it));
  }
  const double v = it->get<double>();
  if constexpr (std::is_integral_v<T>) {
    if (v != std::floor(v) || v < -2147483648.0 || v > 2147483647.0)
      return make_error(ErrorCode::kCorruptFile, "{}: field '{}' = {} is not a 32-bit integer", path, key, json_excerpt(*it));
  }
  out = static_cast<T>(v);
  return Status::Ok();
}

// A token id must be a non-negative 32-bit integer; a larger one is refused, never wrapped
// (2^40 must not become token 0). Whether it is inside the vocabulary is validate()'s question.
Status read_token_id(const json& v, const char* key, std::vector<int32_t>& out, const std::string& path) {
  if (!v.is_number_integer()) {
    return make_error(ErrorCode::kCorruptFile, "{}: '{}' holds {}, expected a token id", path, key, json_excerpt(v));
  }
  const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= INT32_MAX : v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
  if (!in_range) {
    return make_error(ErrorCode::kCorruptFile, "{}: '{}' = {} is not a token id (0 to {})", path, key, v.dump(), INT32_MAX);
  }
  out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  return Status::Ok();
}

Status read_token_ids(const json& j, const char* key, std::vector<int32_t>& out, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  out.clear();
  if (it->is_number()) {
    TACHYON_RETURN_IF_ERROR(read_token_id(*it, key, out, path));
  } else if (it->is_array()) {
    for (const auto& v : *it) TACHYON_RETURN_IF_ERROR(read_token_id(v, key, out, path));
  } else {
    return make_error(ErrorCode::kCorruptFile, "{}: '{}' must be an integer or a list, got {}", path, key,
                      json_excerpt(*it));
  }
  return Status::Ok();
}

// rope_scaling (transformers 4.x) or rope_parameters (5.x) -> RopeConfig.
Status read_rope(const json& j, ModelConfig& c, const std::string& path) {
  const json* params = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) params = &*it;
  if (auto it = j.find("rope_scaling"); it != j.end() && it->is_object()) params = &*it;
  TACHYON_RETURN_IF_ERROR(read_number(j, "rope_theta", c.rope.theta, path, false));
  if (params == nullptr) return Status::Ok();
  TACHYON_RETURN_IF_ERROR(read_number(*params, "rope_theta", c.rope.theta, path, false));
  std::string type = "default";
  if (auto it = params->find("rope_type"); it != params->end() && it->is_string()) type = it->get<std::string>();
  else if (auto it2 = params->find("type"); it2 != params->end() && it2->is_string()) type = it2->get<std::string>();
  TACHYON_RETURN_IF_ERROR(read_number(*params, "factor", c.rope.factor, path, false));
  if (type == "default") {
    c.rope.scaling = RopeScaling::kNone;
  } else if (type == "linear") {
    c.rope.scaling = RopeScaling::kLinear;
  } else if (type == "llama3") {
    c.rope.scaling = RopeScaling::kLlama3;
    TACHYON_RETURN_IF_ERROR(read_number(*params, "low_freq_factor", c.rope.low_freq_factor, path, true));
    TACHYON_RETURN_IF_ERROR(read_number(*params, "high_freq_factor", c.rope.high_freq_factor, path, true));
    TACHYON_RETURN_IF_ERROR(
        read_number(*params, "original_max_position_embeddings", c.rope.original_max_position, path, true));
  } else if (type == "yarn") {
    c.rope.scaling = RopeScaling::kYarn;
    c.rope.original_max_position = c.max_position_embeddings;
    TACHYON_RETURN_IF_ERROR(
        read_number(*params, "original_max_position_embeddings", c.rope.original_max_position, path, false));
    TACHYON_RETURN_IF_ERROR(read_number(*params, "beta_fast", c.rope.yarn_beta_fast, path, false));
    TACHYON_RETURN_IF_ERROR(read_number(*params, "beta_slow", c.rope.yarn_beta_slow, path, false));
    TACHYON_RETURN_IF_ERROR(read_number(*params, "attention_factor", c.rope.yarn_attention_factor, path, false));
  } else {
    return make_error(ErrorCode::kUnsupported, "{}: rope scaling type '{}' is not supported (default, linear, llama3, yarn are)",
                      path, type);
  }
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> model_config_from_hf(const json& j, const std::string& path) {
  if (!j.is_object()) return make_error(ErrorCode::kCorruptFile, "{}: top level is not a JSON object", path);
  ModelConfig c;
  std::string model_type;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    c.architecture = (*it)[0].get<std::string>();
  }
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) model_type = it->get<std::string>();
  if (c.architecture.empty()) {
    if (model_type == "llama") c.architecture = "LlamaForCausalLM";
    else if (model_type == "mistral") c.architecture = "MistralForCausalLM";
    else if (model_type == "qwen2") c.architecture = "Qwen2ForCausalLM";
    else if (model_type == "qwen3") c.architecture = "Qwen3ForCausalLM";
    else if (model_type == "qwen2_moe") c.architecture = "Qwen2MoeForCausalLM";
    else if (model_type == "qwen3_moe") c.architecture = "Qwen3MoeForCausalLM";
    else if (model_type == "mixtral") c.architecture = "MixtralForCausalLM";
  }
  const std::string& arch = c.architecture;
  const bool qwen2_moe = arch == "Qwen2MoeForCausalLM", qwen3_moe = arch == "Qwen3MoeForCausalLM",
             mixtral = arch == "MixtralForCausalLM";
  // The MoE families share their dense relatives' attention.
  const bool llama = arch == "LlamaForCausalLM", mistral = arch == "MistralForCausalLM" || mixtral,
             qwen2 = arch == "Qwen2ForCausalLM" || qwen2_moe, qwen3 = arch == "Qwen3ForCausalLM" || qwen3_moe;
  if (!llama && !mistral && !qwen2 && !qwen3) {
    return make_error(ErrorCode::kUnsupported,
                      "{}: architecture '{}' (model_type '{}') is not supported; supported: LlamaForCausalLM, "
                      "MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, "
                      "Qwen3ForCausalLM, Qwen3MoeForCausalLM",
                      path, arch.empty() ? "?" : arch, model_type);
  }
  TACHYON_RETURN_IF_ERROR(read_number(j, "vocab_size", c.vocab_size, path, true));
  TACHYON_RETURN_IF_ERROR(read_number(j, "hidden_size", c.hidden_size, path, true));
  TACHYON_RETURN_IF_ERROR(read_number(j, "intermediate_size", c.intermediate_size, path, true));
  TACHYON_RETURN_IF_ERROR(read_number(j, "num_hidden_layers", c.num_layers, path, true));
  TACHYON_RETURN_IF_ERROR(read_number(j, "num_attention_heads", c.num_heads, path, true));
  c.num_kv_heads = c.num_heads;
  TACHYON_RETURN_IF_ERROR(read_number(j, "num_key_value_heads", c.num_kv_heads, path, false));
  if (c.num_heads > 0) c.head_dim = c.hidden_size / c.num_heads;
  TACHYON_RETURN_IF_ERROR(read_number(j, "head_dim", c.head_dim, path, false));
  TACHYON_RETURN_IF_ERROR(read_number(j, "max_position_embeddings", c.max_position_embeddings, path, false));
  TACHYON_RETURN_IF_ERROR(read_number(j, "rms_norm_eps", c.rms_norm_eps, path, false));
  TACHYON_RETURN_IF_ERROR(read_rope(j, c, path));
  c.rope.rotary_dim = c.head_dim;
  c.rope.style = RopeStyle::kNeox;
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean()) c.tie_word_embeddings = it->get<bool>();
  c.attention_bias = qwen2;
  if (llama || mistral || qwen3) {
    if (auto it = j.find("attention_bias"); it != j.end() && it->is_boolean()) c.attention_bias = it->get<bool>();
  }
  if (qwen2_moe) {  // transformers 5 names Qwen2-MoE's q/k/v biases qkv_bias (on by default)
    if (auto it = j.find("qkv_bias"); it != j.end() && it->is_boolean()) c.attention_bias = it->get<bool>();
  }
  if (qwen2_moe || qwen3_moe || mixtral) {
    // num_experts (transformers 4) or num_local_experts (Mixtral, and Qwen-MoE under transformers 5).
    TACHYON_RETURN_IF_ERROR(read_number(j, "num_local_experts", c.num_experts, path, false));
    TACHYON_RETURN_IF_ERROR(read_number(j, "num_experts", c.num_experts, path, false));
    if (c.num_experts <= 0) {
      return make_error(ErrorCode::kCorruptFile, "{}: {} needs num_experts (or num_local_experts) > 0", path, arch);
    }
    TACHYON_RETURN_IF_ERROR(read_number(j, "num_experts_per_tok", c.num_experts_per_tok, path, true));
    if (mixtral) {  // every layer sparse, experts of intermediate_size, always renormalised
      c.moe_intermediate_size = c.intermediate_size;
      c.norm_topk_prob = true;
    } else {
      TACHYON_RETURN_IF_ERROR(read_number(j, "moe_intermediate_size", c.moe_intermediate_size, path, true));
      c.norm_topk_prob = false;  // the transformers default of both Qwen-MoE configs
      if (auto it = j.find("norm_topk_prob"); it != j.end() && it->is_boolean()) c.norm_topk_prob = it->get<bool>();
      TACHYON_RETURN_IF_ERROR(read_number(j, "decoder_sparse_step", c.decoder_sparse_step, path, false));
      if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
        if (!it->is_array()) {
          return make_error(ErrorCode::kCorruptFile, "{}: 'mlp_only_layers' must be a list, got {}", path,
                            json_excerpt(*it));
        }
        for (const auto& v : *it) {
          if (!v.is_number_integer()) {
            return make_error(ErrorCode::kCorruptFile, "{}: 'mlp_only_layers' holds {}, expected layer numbers", path,
                              json_excerpt(v));
          }
          c.mlp_only_layers.push_back(static_cast<int>(std::clamp<int64_t>(v.get<int64_t>(), -1, INT32_MAX)));
        }
      }
    }
    if (qwen2_moe) {
      TACHYON_RETURN_IF_ERROR(
          read_number(j, "shared_expert_intermediate_size", c.shared_expert_intermediate_size, path, true));
    }
  }
  c.qk_norm = qwen3;
  if (mistral) {
    TACHYON_RETURN_IF_ERROR(read_number(j, "sliding_window", c.sliding_window, path, false));
  } else if (qwen2 || qwen3) {
    // Qwen applies its window only when use_sliding_window is set (and then only to some layers,
    // which this engine does not model: refuse rather than compute something else).
    if (auto it = j.find("use_sliding_window"); it != j.end() && it->is_boolean() && it->get<bool>()) {
      return make_error(ErrorCode::kUnsupported, "{}: use_sliding_window = true is not supported for {}", path, arch);
    }
  }
  TACHYON_RETURN_IF_ERROR(read_token_ids(j, "eos_token_id", c.eos_token_ids, path));
  std::vector<int32_t> bos;
  TACHYON_RETURN_IF_ERROR(read_token_ids(j, "bos_token_id", bos, path));
  if (!bos.empty()) c.bos_token_id = bos[0];
  TACHYON_RETURN_IF_ERROR(c.validate(path));
  return c;
}

Result<ModelConfig> model_config_from_gguf(const GgufFile& gguf) {
  const std::string& path = gguf.path();
  TACHYON_ASSIGN_OR_RETURN(std::string arch, gguf.get_string("general.architecture"));
  ModelConfig c;
  c.architecture = arch;
  const bool qwen2moe = arch == "qwen2moe", qwen3moe = arch == "qwen3moe";
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "mistral" && !qwen2moe && !qwen3moe) {
    return make_error(ErrorCode::kUnsupported,
                      "{}: general.architecture '{}' is not supported; supported: llama (with or without experts), "
                      "mistral, qwen2, qwen2moe, qwen3, qwen3moe",
                      path, arch);
  }
  auto get_int = [&](const std::string& key, int& out, bool required) -> Status {
    const std::string full = arch + "." + key;
    if (!gguf.has(full)) {
      if (required) return make_error(ErrorCode::kCorruptFile, "{}: missing metadata '{}'", path, full);
      return Status::Ok();
    }
    TACHYON_ASSIGN_OR_RETURN(int64_t v, gguf.get_int(full));
    if (v < 0 || v > INT32_MAX) return make_error(ErrorCode::kCorruptFile, "{}: '{}' = {} is out of range", path, full, v);
    out = static_cast<int>(v);
    return Status::Ok();
  };
  auto get_float = [&](const std::string& key, float& out) -> Status {
    const std::string full = arch + "." + key;
    if (!gguf.has(full)) return Status::Ok();
    TACHYON_ASSIGN_OR_RETURN(double v, gguf.get_float(full));
    out = static_cast<float>(v);
    return Status::Ok();
  };
  TACHYON_RETURN_IF_ERROR(get_int("embedding_length", c.hidden_size, true));
  TACHYON_RETURN_IF_ERROR(get_int("feed_forward_length", c.intermediate_size, !qwen2moe && !qwen3moe));
  TACHYON_RETURN_IF_ERROR(get_int("block_count", c.num_layers, true));
  TACHYON_RETURN_IF_ERROR(get_int("attention.head_count", c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  TACHYON_RETURN_IF_ERROR(get_int("attention.head_count_kv", c.num_kv_heads, false));
  TACHYON_RETURN_IF_ERROR(get_int("context_length", c.max_position_embeddings, false));
  if (c.num_heads > 0) c.head_dim = c.hidden_size / c.num_heads;
  TACHYON_RETURN_IF_ERROR(get_int("attention.key_length", c.head_dim, false));
  c.rope.rotary_dim = c.head_dim;
  TACHYON_RETURN_IF_ERROR(get_int("rope.dimension_count", c.rope.rotary_dim, false));
  TACHYON_RETURN_IF_ERROR(get_float("attention.layer_norm_rms_epsilon", c.rms_norm_eps));
  TACHYON_RETURN_IF_ERROR(get_float("rope.freq_base", c.rope.theta));
  TACHYON_RETURN_IF_ERROR(get_int("attention.sliding_window", c.sliding_window, false));
  if (gguf.has(arch + ".rope.scaling.type")) {
    TACHYON_ASSIGN_OR_RETURN(std::string type, gguf.get_string(arch + ".rope.scaling.type"));
    TACHYON_RETURN_IF_ERROR(get_float("rope.scaling.factor", c.rope.factor));
    TACHYON_RETURN_IF_ERROR(get_int("rope.scaling.original_context_length", c.rope.original_max_position, false));
    if (type == "none") c.rope.scaling = RopeScaling::kNone;
    else if (type == "linear") c.rope.scaling = RopeScaling::kLinear;
    else if (type == "yarn") c.rope.scaling = RopeScaling::kYarn;
    else return make_error(ErrorCode::kUnsupported, "{}: rope scaling type '{}' is not supported", path, type);
  }
  // llama.cpp's converter permutes q/k rows of `llama` models into adjacent-pair rotation;
  // qwen2/qwen3 keep the half-split (NeoX) layout.
  c.rope.style = (arch == "llama" || arch == "mistral") ? RopeStyle::kInterleaved : RopeStyle::kNeox;
  c.attention_bias = arch == "qwen2" || qwen2moe;
  c.qk_norm = arch == "qwen3" || qwen3moe;
  // Experts (llama.cpp's keys): every layer that has a router (ffn_gate_inp) is sparse; the others
  // (Qwen-MoE's mlp_only_layers) keep a dense MLP of feed_forward_length.
  TACHYON_RETURN_IF_ERROR(get_int("expert_count", c.num_experts, qwen2moe || qwen3moe));
  if (c.num_experts > 0) {
    TACHYON_RETURN_IF_ERROR(get_int("expert_used_count", c.num_experts_per_tok, true));
    c.moe_intermediate_size = c.intermediate_size;  // llama (Mixtral): the experts' own length
    TACHYON_RETURN_IF_ERROR(get_int("expert_feed_forward_length", c.moe_intermediate_size, qwen2moe || qwen3moe));
    if (c.intermediate_size == 0) c.intermediate_size = c.moe_intermediate_size;
    TACHYON_RETURN_IF_ERROR(get_int("expert_shared_feed_forward_length", c.shared_expert_intermediate_size, false));
    if (qwen2moe && c.shared_expert_intermediate_size == 0) {
      return make_error(ErrorCode::kCorruptFile, "{}: missing metadata '{}.expert_shared_feed_forward_length'", path,
                        arch);
    }
    c.norm_topk_prob = !qwen2moe;  // llama.cpp's choice per architecture, unless the file says
    if (gguf.has(arch + ".expert_weights_norm")) {
      TACHYON_ASSIGN_OR_RETURN(c.norm_topk_prob, gguf.get_bool(arch + ".expert_weights_norm"));
    }
    for (int l = 0; l < std::min(c.num_layers, 4096); ++l) {  // validate() bounds num_layers
      if (gguf.find_tensor("blk." + std::to_string(l) + ".ffn_gate_inp.weight") == nullptr) {
        c.mlp_only_layers.push_back(l);
      }
    }
  }
  c.tie_word_embeddings = gguf.find_tensor("output.weight") == nullptr;
  const GgufTensorInfo* embd = gguf.find_tensor("token_embd.weight");
  if (embd == nullptr) return make_error(ErrorCode::kNotFound, "{}: tensor 'token_embd.weight' is missing", path);
  if (embd->shape.size() != 2)
    return make_error(ErrorCode::kCorruptFile, "{}: token_embd.weight has {} dims, expected 2", path, embd->shape.size());
  c.vocab_size = static_cast<int>(embd->shape[0]);
  if (gguf.has("tokenizer.ggml.bos_token_id")) {
    TACHYON_ASSIGN_OR_RETURN(int64_t bos, gguf.get_int("tokenizer.ggml.bos_token_id"));
    if (bos < 0 || bos > INT32_MAX)
      return make_error(ErrorCode::kCorruptFile, "{}: tokenizer.ggml.bos_token_id = {} is not a token id", path, bos);
    c.bos_token_id = static_cast<int32_t>(bos);
  }
  if (gguf.has("tokenizer.ggml.eos_token_id")) {
    TACHYON_ASSIGN_OR_RETURN(int64_t eos, gguf.get_int("tokenizer.ggml.eos_token_id"));
    if (eos < 0 || eos > INT32_MAX)
      return make_error(ErrorCode::kCorruptFile, "{}: tokenizer.ggml.eos_token_id = {} is not a token id", path, eos);
    c.eos_token_ids = {static_cast<int32_t>(eos)};
  }
  TACHYON_RETURN_IF_ERROR(c.validate(path));
  return c;
}

}  // namespace tachyon
