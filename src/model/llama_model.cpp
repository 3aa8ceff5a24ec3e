#include "model/llama_model.h"

#include <cmath>

namespace tachyon {

size_t ModelWeights::decode_bytes_per_token() const {
  size_t n = lm_head.nbytes() + final_norm.nbytes();
  if (embed_tokens.defined() && embed_tokens.dim() == 2) {
    n += embed_tokens.nbytes() / static_cast<size_t>(embed_tokens.size(0));  // one row
  }
  for (const auto& l : layers) {
    n += l.q_proj.nbytes() + l.k_proj.nbytes() + l.v_proj.nbytes() + l.o_proj.nbytes();
    n += l.gate_proj.nbytes() + l.up_proj.nbytes() + l.down_proj.nbytes();
    n += l.attn_norm.nbytes() + l.ffn_norm.nbytes();
  }
  return n;
}

size_t ModelWeights::total_bytes() const {
  size_t n = embed_tokens.nbytes() + final_norm.nbytes();
  if (!(lm_head.dense.defined() && lm_head.dense.raw_data() == embed_tokens.raw_data())) n += lm_head.nbytes();
  for (const auto& l : layers) {
    n += l.q_proj.nbytes() + l.k_proj.nbytes() + l.v_proj.nbytes() + l.o_proj.nbytes();
    n += l.gate_proj.nbytes() + l.up_proj.nbytes() + l.down_proj.nbytes();
    n += l.attn_norm.nbytes() + l.ffn_norm.nbytes();
  }
  return n;
}

LlamaModel::LlamaModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  rope_ = make_rope_table(config_.rope);
  if (!config_.rope_freq_divisors.empty()) {
    TACHYON_CHECK(config_.rope_freq_divisors.size() == rope_.inv_freq.size(), "rope_freqs has {} entries, expected {}",
                  config_.rope_freq_divisors.size(), rope_.inv_freq.size());
    for (size_t i = 0; i < rope_.inv_freq.size(); ++i) rope_.inv_freq[i] /= config_.rope_freq_divisors[i];
  }
}

Status LlamaModel::forward(const ForwardBatch& batch, KvCache& cache, Tensor& logits, const ForwardOptions& options) const {
  const ops::LinearMode mode = options.linear_mode;
  const ModelConfig& c = config_;
  const int64_t n = batch.token_ids.size(0);
  const int64_t n_logits = batch.logits_rows.size(0);
  if (n <= 0) return make_error(ErrorCode::kInvalidArgument, "forward: empty batch");
  if (batch.positions.size(0) != n || batch.attention.slot_mapping.size(0) != n) {
    return make_error(ErrorCode::kInvalidArgument, "forward: {} tokens but {} positions and {} slots", n,
                      batch.positions.size(0), batch.attention.slot_mapping.size(0));
  }
  const int32_t* ids = batch.token_ids.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= c.vocab_size) {
      return make_error(ErrorCode::kInvalidArgument, "forward: token id {} at row {} is outside the vocabulary [0, {})",
                        ids[i], i, c.vocab_size);
    }
  }
  const int32_t* rows = batch.logits_rows.data<int32_t>();
  for (int64_t i = 0; i < n_logits; ++i) {
    if (rows[i] < 0 || rows[i] >= n) return make_error(ErrorCode::kInvalidArgument, "forward: logits row {} of {}", rows[i], n);
  }

  const int64_t hidden = c.hidden_size;
  Tensor x = Tensor::empty({n, hidden}, DType::kF32);       // residual stream
  Tensor h = Tensor::empty({n, hidden}, DType::kF32);       // normed input of a sublayer
  Tensor q = Tensor::empty({n, c.q_dim()}, DType::kF32);
  Tensor k = Tensor::empty({n, c.kv_dim()}, DType::kF32);
  Tensor v = Tensor::empty({n, c.kv_dim()}, DType::kF32);
  Tensor attn = Tensor::empty({n, c.q_dim()}, DType::kF32);
  Tensor out = Tensor::empty({n, hidden}, DType::kF32);     // sublayer output before the residual add
  Tensor gate = Tensor::empty({n, c.intermediate_size}, DType::kF32);
  Tensor up = Tensor::empty({n, c.intermediate_size}, DType::kF32);
  Tensor q_normed, k_normed;
  if (c.qk_norm) {
    q_normed = Tensor::empty({n * c.num_heads, c.head_dim}, DType::kF32);
    k_normed = Tensor::empty({n * c.num_kv_heads, c.head_dim}, DType::kF32);
  }
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  params.sliding_window = c.sliding_window;

  ops::embedding(weights_.embed_tokens, batch.token_ids, x);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
    // Attention block: x += previous MLP output (fused with the norm), h = norm(x).
    if (layer == 0) {
      ops::rms_norm(x, w.attn_norm, c.rms_norm_eps, h);
    } else {
      ops::add_rms_norm(x, out, w.attn_norm, c.rms_norm_eps, h);
    }
    ops::linear(h, w.q_proj, w.q_bias.defined() ? &w.q_bias : nullptr, q, mode);
    ops::linear(h, w.k_proj, w.k_bias.defined() ? &w.k_bias : nullptr, k, mode);
    ops::linear(h, w.v_proj, w.v_bias.defined() ? &w.v_bias : nullptr, v, mode);
    Tensor q_heads = q.reshape({n, c.num_heads, c.head_dim});
    Tensor k_heads = k.reshape({n, c.num_kv_heads, c.head_dim});
    if (c.qk_norm) {
      ops::rms_norm(q.reshape({n * c.num_heads, c.head_dim}), w.q_norm, c.rms_norm_eps, q_normed);
      ops::rms_norm(k.reshape({n * c.num_kv_heads, c.head_dim}), w.k_norm, c.rms_norm_eps, k_normed);
      q_heads = q_normed.reshape({n, c.num_heads, c.head_dim});
      k_heads = k_normed.reshape({n, c.num_kv_heads, c.head_dim});
    }
    ops::rope(q_heads, batch.positions, rope_);
    ops::rope(k_heads, batch.positions, rope_);
    Tensor v_heads = v.reshape({n, c.num_kv_heads, c.head_dim});
    ops::store_kv(k_heads, v_heads, batch.attention.slot_mapping, cache.k(layer), cache.v(layer));
    Tensor attn_heads = attn.reshape({n, c.num_heads, c.head_dim});
    ops::paged_attention(q_heads, cache.k(layer), cache.v(layer), batch.attention, params, attn_heads);
    ops::linear(attn, w.o_proj, w.o_bias.defined() ? &w.o_bias : nullptr, out, mode);
    // MLP block: x += attention output; h = norm(x).
    ops::add_rms_norm(x, out, w.ffn_norm, c.rms_norm_eps, h);
    ops::linear(h, w.gate_proj, nullptr, gate, mode);
    ops::linear(h, w.up_proj, nullptr, up, mode);
    ops::silu_mul(gate, up, gate);
    ops::linear(gate, w.down_proj, nullptr, out, mode);  // added into x by the next norm
  }

  // Last residual add, final norm and LM head only for the rows whose logits are wanted.
  Tensor selected = Tensor::empty({n_logits, hidden}, DType::kF32);
  for (int64_t i = 0; i < n_logits; ++i) {
    const float* xr = x.data<float>() + static_cast<int64_t>(rows[i]) * hidden;
    const float* orow = out.data<float>() + static_cast<int64_t>(rows[i]) * hidden;
    float* dst = selected.data<float>() + i * hidden;
    for (int64_t j = 0; j < hidden; ++j) dst[j] = xr[j] + orow[j];
  }
  Tensor normed = Tensor::empty({n_logits, hidden}, DType::kF32);
  ops::rms_norm(selected, weights_.final_norm, c.rms_norm_eps, normed);
  if (!logits.defined() || logits.size(0) != n_logits || logits.size(1) != c.vocab_size) {
    logits = Tensor::empty({n_logits, c.vocab_size}, DType::kF32);
  }
  ops::linear(normed, weights_.lm_head, nullptr, logits, mode);
  return Status::Ok();
}

}  // namespace tachyon
