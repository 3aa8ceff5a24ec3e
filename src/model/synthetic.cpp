#include "model/synthetic.h"

#include <cmath>

#include "core/device_memory.h"
#include "ops/ops.h"

namespace tachyon {

namespace {

struct Preset {
  const char* name;
  const char* architecture;
  int vocab, hidden, ffn, layers, heads, kv_heads, head_dim;
  float theta, eps;
  int max_pos;
  bool tied, bias, qk_norm;
  RopeScaling scaling;
  float factor;
  // Mixture of experts (0 experts: dense).
  int experts = 0, top_k = 0, moe_ffn = 0, shared_ffn = 0;
  bool norm_topk = true;
};

// Shapes of the public models these stand in for.
constexpr Preset kPresets[] = {
    {"tiny", "LlamaForCausalLM", 512, 128, 384, 4, 4, 2, 32, 10000.f, 1e-5f, 2048, false, false, false, RopeScaling::kNone, 1.f},
    {"qwen2.5-0.5b", "Qwen2ForCausalLM", 151936, 896, 4864, 24, 14, 2, 64, 1e6f, 1e-6f, 32768, true, true, false, RopeScaling::kNone, 1.f},
    {"qwen2.5-1.5b", "Qwen2ForCausalLM", 151936, 1536, 8960, 28, 12, 2, 128, 1e6f, 1e-6f, 32768, true, true, false, RopeScaling::kNone, 1.f},
    {"qwen2.5-3b", "Qwen2ForCausalLM", 151936, 2048, 11008, 36, 16, 2, 128, 1e6f, 1e-6f, 32768, true, true, false, RopeScaling::kNone, 1.f},
    {"qwen2.5-7b", "Qwen2ForCausalLM", 152064, 3584, 18944, 28, 28, 4, 128, 1e6f, 1e-6f, 32768, false, true, false, RopeScaling::kNone, 1.f},
    {"qwen2.5-14b", "Qwen2ForCausalLM", 152064, 5120, 13824, 48, 40, 8, 128, 1e6f, 1e-6f, 32768, false, true, false, RopeScaling::kNone, 1.f},
    {"qwen2.5-32b", "Qwen2ForCausalLM", 152064, 5120, 27648, 64, 40, 8, 128, 1e6f, 1e-6f, 32768, false, true, false, RopeScaling::kNone, 1.f},
    {"qwen3-0.6b", "Qwen3ForCausalLM", 151936, 1024, 3072, 28, 16, 8, 128, 1e6f, 1e-6f, 40960, true, false, true, RopeScaling::kNone, 1.f},
    {"qwen3-8b", "Qwen3ForCausalLM", 151936, 4096, 12288, 36, 32, 8, 128, 1e6f, 1e-6f, 40960, false, false, true, RopeScaling::kNone, 1.f},
    {"llama2-7b", "LlamaForCausalLM", 32000, 4096, 11008, 32, 32, 32, 128, 1e4f, 1e-5f, 4096, false, false, false, RopeScaling::kNone, 1.f},
    {"llama3-8b", "LlamaForCausalLM", 128256, 4096, 14336, 32, 32, 8, 128, 5e5f, 1e-5f, 8192, false, false, false, RopeScaling::kNone, 1.f},
    {"llama3.1-8b", "LlamaForCausalLM", 128256, 4096, 14336, 32, 32, 8, 128, 5e5f, 1e-5f, 131072, false, false, false, RopeScaling::kLlama3, 8.f},
    {"llama3.2-1b", "LlamaForCausalLM", 128256, 2048, 8192, 16, 32, 8, 64, 5e5f, 1e-5f, 131072, true, false, false, RopeScaling::kLlama3, 32.f},
    // llama3-8b's 32 layers, head_dim and kernels at a width whose weights (25 MB bf16, 7 MB int4)
    // and head stay in L2: a decode step's time is its fixed cost (launches, small kernels).
    {"llama3-8b-narrow", "LlamaForCausalLM", 4096, 256, 256, 32, 2, 1, 128, 5e5f, 1e-5f, 8192, false, false, false, RopeScaling::kNone, 1.f},
    {"mistral-7b", "MistralForCausalLM", 32768, 4096, 14336, 32, 32, 8, 128, 1e6f, 1e-5f, 32768, false, false, false, RopeScaling::kNone, 1.f},
    // Mixtures of experts: experts, top-k, expert ffn, shared expert ffn, renormalised top-k.
    {"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 151936, 2048, 6144, 48, 32, 4, 128, 1e6f, 1e-6f, 40960, false, false, true,
     RopeScaling::kNone, 1.f, 128, 8, 768, 0, true},
    {"qwen1.5-moe-a2.7b", "Qwen2MoeForCausalLM", 151936, 2048, 5632, 24, 16, 16, 128, 1e6f, 1e-6f, 8192, false, true,
     false, RopeScaling::kNone, 1.f, 60, 4, 1408, 5632, false},
    {"mixtral-8x7b", "MixtralForCausalLM", 32000, 4096, 14336, 32, 32, 8, 128, 1e6f, 1e-5f, 32768, false, false, false,
     RopeScaling::kNone, 1.f, 8, 2, 14336, 0, true},
};

}  // namespace

std::vector<std::string> synthetic_presets() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

Result<ModelConfig> synthetic_config(const std::string& preset) {
  for (const auto& p : kPresets) {
    if (preset != p.name) continue;
    ModelConfig c;
    c.architecture = p.architecture;
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.ffn;
    c.num_layers = p.layers;
    c.num_heads = p.heads;
    c.num_kv_heads = p.kv_heads;
    c.head_dim = p.head_dim;
    c.rms_norm_eps = p.eps;
    c.max_position_embeddings = p.max_pos;
    c.tie_word_embeddings = p.tied;
    c.attention_bias = p.bias;
    c.qk_norm = p.qk_norm;
    c.rope.theta = p.theta;
    c.rope.rotary_dim = p.head_dim;
    c.rope.style = RopeStyle::kNeox;
    c.rope.scaling = p.scaling;
    c.rope.factor = p.factor;
    if (p.scaling == RopeScaling::kLlama3) {
      c.rope.low_freq_factor = 1.0f;
      c.rope.high_freq_factor = 4.0f;
      c.rope.original_max_position = 8192;
    }
    c.num_experts = p.experts;
    c.num_experts_per_tok = p.top_k;
    c.moe_intermediate_size = p.moe_ffn;
    c.shared_expert_intermediate_size = p.shared_ffn;
    c.norm_topk_prob = p.norm_topk;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    TACHYON_RETURN_IF_ERROR(c.validate("synthetic:" + preset));
    return c;
  }
  std::string known;
  for (const auto& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.name;
  return make_error(ErrorCode::kNotFound, "synthetic preset '{}' is unknown; presets: {}", preset, known);
}

Result<ModelWeights> make_synthetic_weights(const ModelConfig& c, const SyntheticOptions& options) {
  if (options.weight_dtype != DType::kF32 && options.weight_dtype != DType::kBF16 && options.weight_dtype != DType::kF16) {
    return make_error(ErrorCode::kInvalidArgument, "synthetic weights must be f32, f16 or bf16, not {}",
                      dtype_name(options.weight_dtype));
  }
  uint64_t stream = 0;
  const uint64_t seed = options.seed;
  auto matrix = [&](int64_t out, int64_t in) -> Result<Weight> {
    TACHYON_ASSIGN_OR_RETURN(Tensor t, empty_on({out, in}, options.weight_dtype, options.device, "weight"));
    // Uniform with variance 1/in: each output starts with unit variance for unit-variance inputs.
    ops::fill_uniform(t, seed, ++stream, std::sqrt(3.0f / static_cast<float>(in)), 0.0f);
    Weight w;
    w.dense = std::move(t);
    return w;
  };
  auto vector = [&](int64_t n, float bound, float offset) -> Result<Tensor> {
    TACHYON_ASSIGN_OR_RETURN(Tensor t, empty_on({n}, DType::kF32, options.device, "weight"));
    ops::fill_uniform(t, seed, ++stream, bound, offset);
    return t;
  };
  ModelWeights w;
  TACHYON_ASSIGN_OR_RETURN(w.embed_tokens,
                           empty_on({c.vocab_size, c.hidden_size}, options.weight_dtype, options.device, "embedding"));
  ops::fill_uniform(w.embed_tokens, seed, ++stream, 1.0f, 0.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    TACHYON_ASSIGN_OR_RETURN(lw.attn_norm, vector(c.hidden_size, 0.1f, 1.0f));
    TACHYON_ASSIGN_OR_RETURN(lw.q_proj, matrix(c.q_dim(), c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.k_proj, matrix(c.kv_dim(), c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.v_proj, matrix(c.kv_dim(), c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.o_proj, matrix(c.hidden_size, c.q_dim()));
    if (c.attention_bias) {
      TACHYON_ASSIGN_OR_RETURN(lw.q_bias, vector(c.q_dim(), 0.1f, 0.0f));
      TACHYON_ASSIGN_OR_RETURN(lw.k_bias, vector(c.kv_dim(), 0.1f, 0.0f));
      TACHYON_ASSIGN_OR_RETURN(lw.v_bias, vector(c.kv_dim(), 0.1f, 0.0f));
    }
    if (c.qk_norm) {
      TACHYON_ASSIGN_OR_RETURN(lw.q_norm, vector(c.head_dim, 0.1f, 1.0f));
      TACHYON_ASSIGN_OR_RETURN(lw.k_norm, vector(c.head_dim, 0.1f, 1.0f));
    }
    TACHYON_ASSIGN_OR_RETURN(lw.ffn_norm, vector(c.hidden_size, 0.1f, 1.0f));
    if (c.is_moe_layer(l)) {
      // Random routers spread the tokens about evenly over the experts.
      const int ne = c.num_experts;
      const int64_t inter = c.moe_intermediate_size, h = c.hidden_size;
      TACHYON_ASSIGN_OR_RETURN(lw.router, matrix(ne, h));
      lw.experts.num_experts = ne;
      lw.experts.inter = inter;
      TACHYON_ASSIGN_OR_RETURN(lw.experts.gate, matrix(ne * inter, h));
      TACHYON_ASSIGN_OR_RETURN(lw.experts.up, matrix(ne * inter, h));
      TACHYON_ASSIGN_OR_RETURN(lw.experts.down, matrix(ne * h, inter));
      if (const int64_t si = c.shared_expert_intermediate_size; si > 0) {
        TACHYON_ASSIGN_OR_RETURN(lw.gate_proj, matrix(si, h));
        TACHYON_ASSIGN_OR_RETURN(lw.up_proj, matrix(si, h));
        TACHYON_ASSIGN_OR_RETURN(lw.down_proj, matrix(h, si));
        TACHYON_ASSIGN_OR_RETURN(lw.shared_expert_gate, matrix(1, h));
      }
      w.layers.push_back(std::move(lw));
      continue;
    }
    TACHYON_ASSIGN_OR_RETURN(lw.gate_proj, matrix(c.intermediate_size, c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.up_proj, matrix(c.intermediate_size, c.hidden_size));
    TACHYON_ASSIGN_OR_RETURN(lw.down_proj, matrix(c.hidden_size, c.intermediate_size));
    w.layers.push_back(std::move(lw));
  }
  TACHYON_ASSIGN_OR_RETURN(w.final_norm, vector(c.hidden_size, 0.1f, 1.0f));
  if (c.tie_word_embeddings) {
    w.lm_head.dense = w.embed_tokens;
  } else {
    TACHYON_ASSIGN_OR_RETURN(w.lm_head, matrix(c.vocab_size, c.hidden_size));
  }
  return w;
}

}  // namespace tachyon
