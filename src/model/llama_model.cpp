#include "model/llama_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>

#include "core/device_memory.h"
#include "core/log.h"
#include "ops/backend.h"
#include "ops/errors.h"

namespace tachyon {

namespace {

// Bytes of a layer's weights a token reads, with `experts` experts of a sparse layer (the
// average expert's share of the stacks).
size_t layer_bytes(const LayerWeights& l, double experts) {
  size_t n = l.q_proj.nbytes() + l.k_proj.nbytes() + l.v_proj.nbytes() + l.o_proj.nbytes();
  n += l.gate_proj.nbytes() + l.up_proj.nbytes() + l.down_proj.nbytes();
  n += l.attn_norm.nbytes() + l.ffn_norm.nbytes();
  if (l.is_moe()) {
    const double stacks =
        static_cast<double>(l.experts.gate.nbytes() + l.experts.up.nbytes() + l.experts.down.nbytes());
    n += l.router.nbytes() + l.shared_expert_gate.nbytes() +
         static_cast<size_t>(stacks * experts / l.experts.num_experts);
  }
  return n;
}

}  // namespace

size_t ModelWeights::decode_bytes_per_token(int experts_per_token) const {
  size_t n = lm_head.nbytes() + final_norm.nbytes();
  if (embed_tokens.defined() && embed_tokens.dim() == 2) {
    n += embed_tokens.nbytes() / static_cast<size_t>(embed_tokens.size(0));  // one row
  }
  for (const auto& l : layers) n += layer_bytes(l, experts_per_token);
  return n;
}

size_t ModelWeights::total_bytes() const {
  size_t n = embed_tokens.nbytes() + final_norm.nbytes();
  if (!(lm_head.dense.defined() && lm_head.dense.raw_data() == embed_tokens.raw_data())) n += lm_head.nbytes();
  for (const auto& l : layers) n += layer_bytes(l, l.experts.num_experts);
  return n;
}

// Whether the device kernels read weights of this format as they are packed (a format added to
// QuantFormat later makes the switch incomplete, and stays off devices until it is added here).
static bool device_runs(QuantFormat f) {
  switch (f) {
    case QuantFormat::kInt8Channel:
    case QuantFormat::kW8A8:
    case QuantFormat::kFp8Channel:
    case QuantFormat::kInt4Group:
    case QuantFormat::kTernary:
    case QuantFormat::kGgufQ8_0:
    case QuantFormat::kGgufQ4_K:
    case QuantFormat::kGgufQ6_K:
    case QuantFormat::kGgufQ4_1:
    case QuantFormat::kGgufQ5_0:
    case QuantFormat::kGgufQ5_1:
    case QuantFormat::kGgufQ5_K:
    case QuantFormat::kGgufIq4Nl: return true;
  }
  return false;
}

Result<ModelWeights> copy_weights_to(const ModelWeights& weights, Device device) {
  ModelWeights out;
  auto tensor = [&](const Tensor& t, const char* what) -> Result<Tensor> {
    if (!t.defined()) return Tensor();
    return copy_to(t, device, what);
  };
  auto weight = [&](const Weight& w, const char* what) -> Result<Weight> {
    if (w.quant) {
      // The packed formats the device kernels run (ops/cuda: per-channel int8, w8a8 and fp8,
      // group-wise int4, ternary, the GGUF blocks) move as they are: packed
      // values, scales and zeros (each tensor the format has; the undefined ones stay undefined).
      // A format added to QuantFormat later is refused here until the device has kernels for it.
      const QuantWeight& q = *w.quant;
      if (!device.is_cpu() && !device_runs(q.format)) {
        return make_error(ErrorCode::kUnsupported,
                          "{}: {} weights have no kernels on {} (int8, w8a8, fp8, int4, ternary and the GGUF blocks "
                          "run there)",
                          what, quant_format_name(q.format), device.to_string());
      }
      auto moved = std::make_shared<QuantWeight>(q);
      TACHYON_ASSIGN_OR_RETURN(moved->packed, tensor(q.packed, what));
      TACHYON_ASSIGN_OR_RETURN(moved->scales, tensor(q.scales, what));
      TACHYON_ASSIGN_OR_RETURN(moved->zeros, tensor(q.zeros, what));
      Weight o;
      o.quant = std::move(moved);
      return o;
    }
    Weight o;
    TACHYON_ASSIGN_OR_RETURN(o.dense, tensor(w.dense, what));
    return o;
  };
  TACHYON_ASSIGN_OR_RETURN(out.embed_tokens, tensor(weights.embed_tokens, "embedding"));
  for (const LayerWeights& l : weights.layers) {
    LayerWeights o;
    TACHYON_ASSIGN_OR_RETURN(o.attn_norm, tensor(l.attn_norm, "attn_norm"));
    TACHYON_ASSIGN_OR_RETURN(o.q_proj, weight(l.q_proj, "q_proj"));
    TACHYON_ASSIGN_OR_RETURN(o.k_proj, weight(l.k_proj, "k_proj"));
    TACHYON_ASSIGN_OR_RETURN(o.v_proj, weight(l.v_proj, "v_proj"));
    TACHYON_ASSIGN_OR_RETURN(o.o_proj, weight(l.o_proj, "o_proj"));
    TACHYON_ASSIGN_OR_RETURN(o.q_bias, tensor(l.q_bias, "q_bias"));
    TACHYON_ASSIGN_OR_RETURN(o.k_bias, tensor(l.k_bias, "k_bias"));
    TACHYON_ASSIGN_OR_RETURN(o.v_bias, tensor(l.v_bias, "v_bias"));
    TACHYON_ASSIGN_OR_RETURN(o.o_bias, tensor(l.o_bias, "o_bias"));
    TACHYON_ASSIGN_OR_RETURN(o.q_norm, tensor(l.q_norm, "q_norm"));
    TACHYON_ASSIGN_OR_RETURN(o.k_norm, tensor(l.k_norm, "k_norm"));
    TACHYON_ASSIGN_OR_RETURN(o.ffn_norm, tensor(l.ffn_norm, "ffn_norm"));
    TACHYON_ASSIGN_OR_RETURN(o.gate_proj, weight(l.gate_proj, "gate_proj"));
    TACHYON_ASSIGN_OR_RETURN(o.up_proj, weight(l.up_proj, "up_proj"));
    TACHYON_ASSIGN_OR_RETURN(o.down_proj, weight(l.down_proj, "down_proj"));
    TACHYON_ASSIGN_OR_RETURN(o.router, weight(l.router, "router"));
    TACHYON_ASSIGN_OR_RETURN(o.shared_expert_gate, weight(l.shared_expert_gate, "shared_expert_gate"));
    o.experts.num_experts = l.experts.num_experts;
    o.experts.inter = l.experts.inter;
    TACHYON_ASSIGN_OR_RETURN(o.experts.gate, weight(l.experts.gate, "experts.gate"));
    TACHYON_ASSIGN_OR_RETURN(o.experts.up, weight(l.experts.up, "experts.up"));
    TACHYON_ASSIGN_OR_RETURN(o.experts.down, weight(l.experts.down, "experts.down"));
    out.layers.push_back(std::move(o));
  }
  TACHYON_ASSIGN_OR_RETURN(out.final_norm, tensor(weights.final_norm, "final_norm"));
  const bool tied = weights.lm_head.dense.defined() && weights.embed_tokens.defined() &&
                    weights.lm_head.dense.raw_data() == weights.embed_tokens.raw_data() &&
                    weights.lm_head.dense.shape() == weights.embed_tokens.shape();
  if (tied) {
    out.lm_head.dense = out.embed_tokens;
  } else {
    TACHYON_ASSIGN_OR_RETURN(out.lm_head, weight(weights.lm_head, "lm_head"));
  }
  return out;
}

namespace {

// Rows [0, a) of `dst` = a, then b, then c (all [rows, cols] of one dtype, contiguous), on any device.
Status concat_rows(Tensor& dst, std::initializer_list<const Tensor*> parts) {
  int64_t row = 0;
  for (const Tensor* p : parts) {
    Tensor slot = dst.slice(0, row, row + p->size(0));
    TACHYON_RETURN_IF_ERROR(copy_into(slot, *p));
    row += p->size(0);
  }
  return Status::Ok();
}

// Whether the packed weights `parts` can stack into one: the same format, inputs and group, and
// tensors whose rows have the same shape, dtype and device (every QuantFormat's tensors hold one
// row per output, so stacking rows stacks outputs).
bool stackable(const std::vector<Weight*>& parts) {
  const QuantWeight& a = *(*parts.begin())->quant;
  const auto same_rows = [](const Tensor& x, const Tensor& y) {
    if (x.defined() != y.defined()) return false;
    if (!x.defined()) return true;
    if (x.dim() != y.dim() || x.dtype() != y.dtype() || !(x.device() == y.device()) || !x.is_contiguous() ||
        !y.is_contiguous()) {
      return false;
    }
    for (int64_t d = 1; d < x.dim(); ++d) {
      if (x.size(d) != y.size(d)) return false;
    }
    return true;
  };
  for (Weight* w : parts) {
    if (!w->quant) return false;
    const QuantWeight& b = *w->quant;
    if (b.format != a.format || b.in_features != a.in_features || b.group_size != a.group_size ||
        b.input_scale != a.input_scale ||
        !same_rows(a.packed, b.packed) || !same_rows(a.scales, b.scales) || !same_rows(a.zeros, b.zeros)) {
      return false;
    }
  }
  return true;
}

// Packed weights stacked: each tensor's rows one part after another; the parts become row views
// of the result.
Result<Weight> fuse_packed(const std::vector<Weight*>& parts, const char* what) {
  const QuantWeight& first = *(*parts.begin())->quant;
  auto fused = std::make_shared<QuantWeight>(first);
  fused->out_features = 0;
  for (Weight* w : parts) fused->out_features += w->quant->out_features;
  Tensor QuantWeight::*members[] = {&QuantWeight::packed, &QuantWeight::scales, &QuantWeight::zeros};
  for (Tensor QuantWeight::*m : members) {
    const Tensor& t = first.*m;
    if (!t.defined()) continue;
    std::vector<int64_t> shape = t.shape();
    shape[0] = fused->out_features;
    TACHYON_ASSIGN_OR_RETURN((*fused).*m, empty_on(shape, t.dtype(), t.device(), what));
    int64_t row = 0;
    for (Weight* w : parts) {
      const Tensor& part = (*w->quant).*m;
      Tensor slot = ((*fused).*m).slice(0, row, row + part.size(0));
      TACHYON_RETURN_IF_ERROR(copy_into(slot, part));
      row += part.size(0);
    }
  }
  int64_t row = 0;
  for (Weight* w : parts) {
    auto view = std::make_shared<QuantWeight>(*w->quant);
    const int64_t end = row + view->out_features;
    for (Tensor QuantWeight::*m : members) {
      if (((*fused).*m).defined()) (*view).*m = ((*fused).*m).slice(0, row, end);
    }
    w->quant = std::move(view);  // the separate weight becomes a view; its memory is freed
    row = end;
  }
  Weight out;
  out.quant = std::move(fused);
  return out;
}

Result<Weight> fuse(const std::vector<Weight*>& parts, const char* what) {
  if ((*parts.begin())->quant) return stackable(parts) ? fuse_packed(parts, what) : Result<Weight>(Weight());
  int64_t rows = 0;
  const Tensor first = (*parts.begin())->dense;
  for (Weight* w : parts) {
    if (w->quant || !w->dense.defined() || !w->dense.is_contiguous() || w->dense.dtype() != first.dtype() ||
        w->dense.dim() != 2 || w->dense.size(1) != first.size(1) || !(w->dense.device() == first.device())) {
      return Weight();
    }
    rows += w->dense.size(0);
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor fused, empty_on({rows, first.size(1)}, first.dtype(), first.device(), what));
  int64_t row = 0;
  for (Weight* w : parts) {
    Tensor slot = fused.slice(0, row, row + w->dense.size(0));
    TACHYON_RETURN_IF_ERROR(copy_into(slot, w->dense));
    const int64_t end = row + w->dense.size(0);
    w->dense = fused.slice(0, row, end);  // the separate weight becomes a view; its memory is freed
    row = end;
  }
  Weight out;
  out.dense = std::move(fused);
  return out;
}

// The index tensors of a batch, in the order they are packed into one i32 buffer (the sparse
// budgets last, where the batch has them).
std::vector<const Tensor*> index_tensors(const ForwardBatch& b) {
  const AttentionMetadata& m = b.attention;
  std::vector<const Tensor*> t = {&b.token_ids,      &b.positions,      &b.logits_rows, &m.query_start,
                                  &m.context_lens,   &m.block_tables,   &m.slot_mapping};
  if (m.sparse_budgets.defined()) t.push_back(&m.sparse_budgets);
  return t;
}

Tensor pack(const ForwardBatch& batch) {
  int64_t total = 0;
  for (const Tensor* t : index_tensors(batch)) total += t->numel();
  Tensor packed = Tensor::empty({std::max<int64_t>(total, 1)}, DType::kI32);
  int64_t offset = 0;
  for (const Tensor* t : index_tensors(batch)) {
    const Tensor c = t->contiguous();
    std::copy_n(c.data<int32_t>(), c.numel(), packed.data<int32_t>() + offset);
    offset += c.numel();
  }
  return packed;
}

// The batch's index tensors on `device` (the host values stay in `batch`), packed into one
// buffer so that one copy moves them all.
Result<ForwardBatch> batch_on(const ForwardBatch& batch, Device device) {
  TACHYON_ASSIGN_OR_RETURN(Tensor on_device, copy_to(pack(batch), device, "batch"));
  ForwardBatch d;
  d.attention = batch.attention;
  Tensor* outs[] = {&d.token_ids,          &d.positions,          &d.logits_rows,
                    &d.attention.query_start, &d.attention.context_lens, &d.attention.block_tables,
                    &d.attention.slot_mapping, &d.attention.sparse_budgets};
  int64_t offset = 0;
  const auto parts = index_tensors(batch);
  for (size_t i = 0; i < parts.size(); ++i) {
    *outs[i] = Tensor::from_buffer(on_device.buffer(), static_cast<size_t>(offset) * sizeof(int32_t),
                                   parts[i]->shape(), DType::kI32);
    offset += parts[i]->numel();
  }
  if (batch.attention.tree_masks.defined()) {
    TACHYON_ASSIGN_OR_RETURN(d.attention.tree_masks, copy_to(batch.attention.tree_masks, device, "tree masks"));
  }
  return d;
}

// Rewrites, in place, a batch that batch_on() made from one of the same shapes.
Status upload_into(const ForwardBatch& batch, ForwardBatch& on_device) {
  const Tensor packed = pack(batch);
  Tensor dst = Tensor::from_buffer(on_device.token_ids.buffer(), 0, {packed.numel()}, DType::kI32);
  TACHYON_RETURN_IF_ERROR(copy_into(dst, packed));
  on_device.attention.max_query_len = batch.attention.max_query_len;
  on_device.attention.max_context_len = batch.attention.max_context_len;
  return Status::Ok();
}

}  // namespace

Result<Weight> stack_rows(std::vector<Weight> parts, const char* what) {
  if (parts.empty()) return make_error(ErrorCode::kInvalidArgument, "{}: nothing to stack", what);
  std::vector<Weight*> ptrs;
  for (Weight& p : parts) ptrs.push_back(&p);
  TACHYON_ASSIGN_OR_RETURN(Weight stacked, fuse(ptrs, what));
  if (!stacked.defined()) {
    return make_error(ErrorCode::kUnsupported, "{}: the {} parts differ in format, dtype or shape and cannot stack",
                      what, parts.size());
  }
  return stacked;
}

Status fuse_projections(ModelWeights& weights) {
  for (LayerWeights& l : weights.layers) {
    TACHYON_ASSIGN_OR_RETURN(l.qkv_proj, fuse({&l.q_proj, &l.k_proj, &l.v_proj}, "qkv_proj"));
    if (l.qkv_proj.defined() && l.q_bias.defined()) {
      if (!l.k_bias.defined() || !l.v_bias.defined() || l.q_bias.dtype() != DType::kF32 ||
          l.k_bias.dtype() != DType::kF32 || l.v_bias.dtype() != DType::kF32) {
        return make_error(ErrorCode::kUnsupported, "fusing q/k/v: biases must all be present and f32");
      }
      const int64_t total = l.q_bias.size(0) + l.k_bias.size(0) + l.v_bias.size(0);
      TACHYON_ASSIGN_OR_RETURN(l.qkv_bias, empty_on({total}, DType::kF32, l.q_bias.device(), "qkv_bias"));
      Tensor as_rows = l.qkv_bias.reshape({total, 1});
      TACHYON_RETURN_IF_ERROR(concat_rows(as_rows, {&l.q_bias, &l.k_bias, &l.v_bias}));
    } else if (l.qkv_proj.defined() && (l.k_bias.defined() || l.v_bias.defined())) {
      return make_error(ErrorCode::kUnsupported, "fusing q/k/v: k or v has a bias but q has none");
    }
    TACHYON_ASSIGN_OR_RETURN(l.gate_up_proj, fuse({&l.gate_proj, &l.up_proj}, "gate_up_proj"));
  }
  return Status::Ok();
}

LlamaModel::LlamaModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  rope_ = make_rope_table(config_.rope);
  if (!config_.rope_freq_divisors.empty()) {
    TACHYON_CHECK(config_.rope_freq_divisors.size() == rope_.inv_freq.size(), "rope_freqs has {} entries, expected {}",
                  config_.rope_freq_divisors.size(), rope_.inv_freq.size());
    for (size_t i = 0; i < rope_.inv_freq.size(); ++i) rope_.inv_freq[i] /= config_.rope_freq_divisors[i];
  }
  if (config_.is_moe()) {
    // Routing counters, from zero; a model whose counters cannot be allocated counts nothing.
    Tensor zeros = Tensor::zeros({config_.num_layers, config_.num_experts + 2}, DType::kI64);
    auto counters = copy_to(zeros, device(), "expert counters");
    if (counters.ok()) expert_tokens_ = std::move(counters).value();
  }
  // Once the device holds them (whatever wrote them has finished), nothing writes the weights
  // again: kernels may read them ahead of the work queued before them (Weight::constant).
  if (device().is_cpu() || ops::synchronize(device()).ok()) {
    for (LayerWeights& l : weights_.layers) {
      for (Weight* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj,
                        &l.qkv_proj, &l.gate_up_proj, &l.router, &l.shared_expert_gate, &l.experts.gate,
                        &l.experts.up, &l.experts.down}) {
        w->constant = true;
      }
    }
    weights_.lm_head.constant = true;
  }
}

Result<Tensor> LlamaModel::expert_token_counts() const {
  if (!expert_tokens_.defined()) return Tensor();
  return copy_to(expert_tokens_, Device::cpu(), "expert counters");
}

Status LlamaModel::forward(const ForwardBatch& batch, KvCache& cache, Tensor& logits, const ForwardOptions& options) const {
  if (device().is_cpu()) return forward_on_device(batch, cache, logits, options);
  Tensor on_device, hidden_on_device;
  ForwardOptions device_options = options;
  if (options.hidden != nullptr) device_options.hidden = &hidden_on_device;
  TACHYON_RETURN_IF_ERROR(forward_on_device(batch, cache, on_device, device_options));
  const int64_t n_logits = batch.logits_rows.size(0);
  const auto host_rows = [&](Tensor& t, int64_t cols) {
    if (!t.defined() || !t.device().is_cpu() || t.dtype() != DType::kF32 || t.dim() != 2 || t.size(0) != n_logits ||
        t.size(1) != cols || !t.is_contiguous()) {
      t = Tensor::empty({n_logits, cols}, DType::kF32);
    }
  };
  host_rows(logits, config_.vocab_size);
  if (n_logits > 0) TACHYON_RETURN_IF_ERROR(copy_into(logits, on_device));  // waits for the device
  if (options.hidden != nullptr) {
    host_rows(*options.hidden, config_.hidden_size);
    if (n_logits > 0) TACHYON_RETURN_IF_ERROR(copy_into(*options.hidden, hidden_on_device));
  }
  return ops::synchronize(device());
}

Status LlamaModel::forward_on_device(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                                     const ForwardOptions& options) const {
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

  const Device dev = device();
  if (!(cache.config().device == dev)) {
    return make_error(ErrorCode::kInvalidArgument, "forward: the model runs on {} but its kv cache is on {}",
                      dev.to_string(), cache.config().device.to_string());
  }
  if (dev.is_cpu()) return run_layers(batch, cache, logits, options.hidden, mode);
  const bool decode = batch.attention.max_query_len == 1 && n == batch.attention.num_seqs && n_logits == n;
  if (decode) return forward_decode_on_device(batch, cache, logits, options);
  TACHYON_ASSIGN_OR_RETURN(ForwardBatch device_batch, batch_on(batch, dev));
  return run_layers(device_batch, cache, logits, options.hidden, mode);
}

// A decode batch on a device (one token and one logits row per sequence) runs with its block
// tables widened to a power-of-two number of columns and max_context_len set to the widened
// capacity, so that every kernel launch depends only on (tokens, columns): the step can be a CUDA
// graph, captured once per shape and replayed with the inputs rewritten in place. Eager decode
// steps take the same widened shape, so a replay equals an eager step bit for bit.
Status LlamaModel::forward_decode_on_device(const ForwardBatch& batch, KvCache& cache, Tensor& logits,
                                            const ForwardOptions& options) const {
  std::lock_guard<std::mutex> lock(graphs_mutex_);
  TACHYON_ASSIGN_OR_RETURN(DecodeGraph * g, decode_graph_for(batch, cache, options));
  TACHYON_RETURN_IF_ERROR(run_decode_graph(*g, cache, options));
  logits = g->logits;
  if (options.hidden != nullptr) *options.hidden = g->hidden;
  return Status::Ok();
}

Result<LlamaModel::DecodeGraph*> LlamaModel::decode_graph_for(const ForwardBatch& batch, KvCache& cache,
                                                              const ForwardOptions& options) const {
  const Device dev = device();
  const int64_t n = batch.token_ids.size(0);
  const AttentionMetadata& m = batch.attention;
  int64_t width = 16;
  while (width < m.block_tables.size(1)) width *= 2;
  ForwardBatch padded = batch;
  padded.attention.block_tables = Tensor::empty({m.num_seqs, width}, DType::kI32);
  int32_t* table = padded.attention.block_tables.data<int32_t>();
  std::fill(table, table + padded.attention.block_tables.numel(), -1);
  const Tensor old_tables = m.block_tables.contiguous();
  for (int s = 0; s < m.num_seqs; ++s) {
    std::copy_n(old_tables.data<int32_t>() + s * old_tables.size(1), old_tables.size(1), table + s * width);
  }
  padded.attention.max_context_len = static_cast<int>(width * m.block_size);

  const GraphKey key{cache.id(), n, width, static_cast<int>(options.linear_mode), m.sparse_budgets.defined()};
  ops::Backend* backend = ops::backend_for(dev);
  if (backend->scratch_epoch() != graphs_epoch_) {
    // A workspace that captured graphs write to was replaced (a larger shape grew it): they would
    // touch freed memory. Capture again as shapes come.
    for (auto& [k, g] : graphs_) g.graph.reset();
    graphs_epoch_ = backend->scratch_epoch();
  }
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // Shapes come and go with the batch: keep the memory they hold bounded.
    if (graphs_.size() >= kMaxDecodeGraphs) graphs_.clear();
    DecodeGraph g;
    TACHYON_ASSIGN_OR_RETURN(g.input, batch_on(padded, dev));
    TACHYON_ASSIGN_OR_RETURN(g.logits, empty_on({n, config_.vocab_size}, DType::kF32, dev, "logits"));
    TACHYON_ASSIGN_OR_RETURN(g.hidden, empty_on({n, config_.hidden_size}, DType::kF32, dev, "hidden rows"));
    it = graphs_.emplace(key, std::move(g)).first;
  } else {
    TACHYON_RETURN_IF_ERROR(upload_into(padded, it->second.input));
  }
  return &it->second;
}

Status LlamaModel::run_decode_graph(DecodeGraph& g, KvCache& cache, const ForwardOptions& options) const {
  ops::Backend* backend = ops::backend_for(device());
  if (g.graph && backend->scratch_epoch() == graphs_epoch_) return backend->replay(g.graph);
  // Eager: the result of this step, and the warm-up (workspaces sized, tables uploaded) that
  // makes a capture of the same shape touch no allocation outside the graph.
  TACHYON_RETURN_IF_ERROR(run_layers(g.input, cache, g.logits, &g.hidden, options.linear_mode));
  if (!options.cuda_graphs) return Status::Ok();
  if (backend->scratch_epoch() != graphs_epoch_) {  // the eager step grew a workspace
    for (auto& [k, other] : graphs_) other.graph.reset();
    graphs_epoch_ = backend->scratch_epoch();
  }
  TACHYON_RETURN_IF_ERROR(backend->begin_capture());
  const Status captured = run_layers(g.input, cache, g.logits, &g.hidden, options.linear_mode);
  auto graph = backend->end_capture();
  TACHYON_RETURN_IF_ERROR(captured);
  TACHYON_RETURN_IF_ERROR(graph.status());
  g.graph = std::move(graph).value();
  TACHYON_LOG_INFO("captured a decode graph: {} tokens, block tables of {} columns", g.input.token_ids.size(0),
                   g.input.attention.block_tables.size(1));
  return Status::Ok();
}

Status LlamaModel::decode_steps(const ForwardBatch& batch, const Tensor& first_ids, KvCache& cache, Tensor& ids,
                                const PickNext& pick, const ForwardOptions& options) const {
  const Device dev = device();
  const int64_t n = batch.token_ids.size(0);
  const bool decode = batch.attention.max_query_len == 1 && n == batch.attention.num_seqs &&
                      batch.logits_rows.size(0) == n && !batch.attention.tree_masks.defined();
  if (!decode || !ids.defined() || ids.dim() != 2 || ids.size(0) < 1 || ids.size(1) != n || !(ids.device() == dev) ||
      ids.dtype() != DType::kI32 || !ids.is_contiguous()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "decode_steps: a decode batch of {} tokens and ids [steps, {}] i32 on {}, not {}", n, n,
                      dev.to_string(), ids.defined() ? ids.shape_string() : std::string("undefined"));
  }
  if (!(first_ids.device() == dev) || first_ids.dtype() != DType::kI32 || first_ids.numel() != n) {
    return make_error(ErrorCode::kInvalidArgument, "decode_steps: first ids {} for {} sequences",
                      first_ids.shape_string(), n);
  }
  if (!(cache.config().device == dev)) {
    return make_error(ErrorCode::kInvalidArgument, "decode_steps: the model runs on {} but its kv cache is on {}",
                      dev.to_string(), cache.config().device.to_string());
  }
  const int64_t steps = ids.size(0);
  if (dev.is_cpu()) {
    ForwardBatch b = batch;  // index tensors copied: the steps move them on in place
    for (Tensor* t : {&b.token_ids, &b.positions, &b.attention.context_lens, &b.attention.slot_mapping}) {
      Tensor copy = Tensor::empty(t->shape(), DType::kI32);
      TACHYON_RETURN_IF_ERROR(copy_into(copy, *t));
      *t = copy;
    }
    b.attention.block_tables = b.attention.block_tables.contiguous();
    TACHYON_RETURN_IF_ERROR(copy_into(b.token_ids, first_ids));
    b.attention.max_context_len = 0;  // the steps' attention needs only the longest context
    const int32_t* ctx = b.attention.context_lens.data<int32_t>();
    for (int64_t s = 0; s < n; ++s) b.attention.max_context_len = std::max(b.attention.max_context_len, ctx[s]);
    Tensor logits;
    for (int64_t s = 0; s < steps; ++s) {
      if (s > 0) {
        ops::advance_decode(ids.select(0, s - 1), b.token_ids, b.positions, b.attention.context_lens,
                            b.attention.block_tables, b.attention.block_size, b.attention.slot_mapping);
        ++b.attention.max_context_len;
      }
      TACHYON_RETURN_IF_ERROR(run_layers(b, cache, logits, nullptr, options.linear_mode));
      Tensor next = ids.select(0, s);
      pick(logits, s, next);
    }
    return ops::take_error(dev);
  }
  std::lock_guard<std::mutex> lock(graphs_mutex_);
  TACHYON_ASSIGN_OR_RETURN(DecodeGraph * g, decode_graph_for(batch, cache, options));
  Tensor& ids_in = g->input.token_ids;
  TACHYON_RETURN_IF_ERROR(copy_into(ids_in, first_ids));
  for (int64_t s = 0; s < steps; ++s) {
    if (s > 0) {
      AttentionMetadata& m = g->input.attention;
      ops::advance_decode(ids.select(0, s - 1), ids_in, g->input.positions, m.context_lens, m.block_tables,
                          m.block_size, m.slot_mapping);
    }
    TACHYON_RETURN_IF_ERROR(run_decode_graph(*g, cache, options));
    Tensor next = ids.select(0, s);
    pick(g->logits, s, next);
  }
  return ops::take_error(dev);  // what the picks raised (the steps' own errors came back above)
}

Status LlamaModel::run_layers(const ForwardBatch& batch, KvCache& cache, Tensor& logits, Tensor* hidden_rows,
                              ops::LinearMode mode) const {
  const ModelConfig& c = config_;
  const ForwardBatch* b = &batch;
  const Device dev = device();
  const int64_t n = batch.token_ids.size(0);
  const int64_t n_logits = batch.logits_rows.size(0);
  Status alloc_status;
  auto scratch = [&](std::vector<int64_t> shape) -> Tensor {
    auto t = empty_on(shape, DType::kF32, dev, "activations");
    if (!t.ok()) {
      if (alloc_status.ok()) alloc_status = t.status();
      return Tensor();
    }
    return std::move(t).value();
  };
  const int64_t hidden = c.hidden_size;
  Tensor x = scratch({n, hidden});       // residual stream
  Tensor h = scratch({n, hidden});       // normed input of a sublayer
  const bool fused_qkv = std::all_of(weights_.layers.begin(), weights_.layers.end(),
                                     [](const LayerWeights& l) { return l.qkv_proj.defined(); });
  const bool fused_gate_up = std::all_of(weights_.layers.begin(), weights_.layers.end(), [](const LayerWeights& l) {
    return l.gate_up_proj.defined() || (l.is_moe() && !l.down_proj.defined());
  });
  Tensor q, k, v, qkv, gate, up, gate_up;
  if (fused_qkv) {
    qkv = scratch({n, c.q_dim() + 2 * c.kv_dim()});
  } else {
    q = scratch({n, c.q_dim()});
    k = scratch({n, c.kv_dim()});
    v = scratch({n, c.kv_dim()});
  }
  Tensor attn = scratch({n, c.q_dim()});
  Tensor out = scratch({n, hidden});     // sublayer output before the residual add
  const bool any_dense = std::any_of(weights_.layers.begin(), weights_.layers.end(),
                                     [](const LayerWeights& l) { return !l.is_moe(); });
  if (any_dense && fused_gate_up) {
    gate_up = scratch({n, 2 * c.intermediate_size});
  } else if (any_dense) {
    gate = scratch({n, c.intermediate_size});
    up = scratch({n, c.intermediate_size});
  }
  // Sparse layers: router logits, the chosen experts and their weights; the shared expert's
  // gate/up rows, output and gate.
  Tensor router_logits, expert_ids, expert_weights, shared_gate_up, shared_out, shared_gate;
  if (c.is_moe()) {
    router_logits = scratch({n, c.num_experts});
    expert_weights = scratch({n, c.num_experts_per_tok});
    auto ids = empty_on({n, c.num_experts_per_tok}, DType::kI32, dev, "expert ids");
    if (ids.ok()) expert_ids = std::move(ids).value();
    else if (alloc_status.ok()) alloc_status = ids.status();
    if (c.shared_expert_intermediate_size > 0) {
      shared_gate_up = scratch({n, 2 * c.shared_expert_intermediate_size});
      shared_out = scratch({n, hidden});
      shared_gate = scratch({n, 1});
    }
  }
  Tensor q_normed, k_normed;
  if (c.qk_norm) {
    q_normed = scratch({n * c.num_heads, c.head_dim});
    k_normed = scratch({n * c.num_kv_heads, c.head_dim});
  }
  // The final hidden rows, the LM head's input: the caller's tensor when it wants them.
  Tensor normed;
  if (hidden_rows == nullptr) {
    normed = scratch({n_logits, hidden});
  } else {
    Tensor& t = *hidden_rows;
    if (!t.defined() || !(t.device() == dev) || t.dtype() != DType::kF32 || t.dim() != 2 || t.size(0) != n_logits ||
        t.size(1) != hidden || !t.is_contiguous()) {
      t = scratch({n_logits, hidden});
    }
    normed = t;
  }
  TACHYON_RETURN_IF_ERROR(alloc_status);
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // The model's own window, or the cache's when it drops history (the narrower of the two).
  params.sliding_window = c.sliding_window;
  if (const int w = cache.config().tiers.attention_window(); w > 0) {
    params.sliding_window = params.sliding_window > 0 ? std::min(params.sliding_window, w) : w;
  }

  // Block-sparse decode: each layer picks its blocks from its queries, then attends to them. A
  // model with its own sliding window attends densely (its window is already the bound).
  const bool sparse = b->attention.sparse_budgets.defined() && params.sliding_window == 0;
  AttentionMetadata sparse_meta;
  if (sparse) {
    sparse_meta = b->attention;
    const int64_t seqs = b->attention.num_seqs, cols = b->attention.block_tables.size(1);
    auto tables = empty_on({seqs, c.num_kv_heads, cols}, DType::kI32, dev, "sparse block tables");
    auto lens = empty_on({seqs, c.num_kv_heads}, DType::kI32, dev, "sparse block tables");
    TACHYON_RETURN_IF_ERROR(tables.status());
    TACHYON_RETURN_IF_ERROR(lens.status());
    sparse_meta.sparse_tables = std::move(tables).value();
    sparse_meta.sparse_lens = std::move(lens).value();
  }

  ops::embedding(weights_.embed_tokens, b->token_ids, x);
  // Each sublayer reads norm(x) and adds its output into x. linear_fused lets a backend run the
  // norm inside the first linear's kernel and the add inside the last one's; where it cannot add
  // there, the output waits in `out` (pending) and the next norm adds it (add_rms_norm).
  ops::LinearFusion residual;  // x += the linear's result, or deferred into `out`
  residual.add_to_output = true;
  residual.may_defer_add = true;
  residual.scratch_y = &out;
  bool pending = false;
  const auto norm_into_h = [&](const Tensor& weight) {
    if (pending) {
      ops::add_rms_norm(x, out, weight, c.rms_norm_eps, h);
    } else {
      ops::rms_norm(x, weight, c.rms_norm_eps, h);
    }
    pending = false;
  };
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
    Tensor q_heads, k_heads, v_heads;
    if (fused_qkv) {  // one matrix; q, k, v are column ranges of its output
      ops::LinearFusion attn_in;  // attn_norm(x)
      attn_in.norm_weight = &w.attn_norm;
      attn_in.norm_eps = c.rms_norm_eps;
      attn_in.pending_add = pending ? &out : nullptr;
      attn_in.scratch_x = &h;
      (void)ops::linear_fused(x, w.qkv_proj, w.qkv_bias.defined() ? &w.qkv_bias : nullptr, attn_in, qkv, mode);
      pending = false;
      q_heads = qkv.slice(1, 0, c.q_dim()).split_last(c.num_heads);
      k_heads = qkv.slice(1, c.q_dim(), c.q_dim() + c.kv_dim()).split_last(c.num_kv_heads);
      v_heads = qkv.slice(1, c.q_dim() + c.kv_dim(), c.q_dim() + 2 * c.kv_dim()).split_last(c.num_kv_heads);
    } else {
      norm_into_h(w.attn_norm);
      ops::linear(h, w.q_proj, w.q_bias.defined() ? &w.q_bias : nullptr, q, mode);
      ops::linear(h, w.k_proj, w.k_bias.defined() ? &w.k_bias : nullptr, k, mode);
      ops::linear(h, w.v_proj, w.v_bias.defined() ? &w.v_bias : nullptr, v, mode);
      q_heads = q.split_last(c.num_heads);
      k_heads = k.split_last(c.num_kv_heads);
      v_heads = v.split_last(c.num_kv_heads);
    }
    if (c.qk_norm) {
      Tensor qn = q_normed.reshape({n, c.num_heads, c.head_dim});
      Tensor kn = k_normed.reshape({n, c.num_kv_heads, c.head_dim});
      ops::rms_norm(q_heads, w.q_norm, c.rms_norm_eps, qn);
      ops::rms_norm(k_heads, w.k_norm, c.rms_norm_eps, kn);
      q_heads = qn;
      k_heads = kn;
    }
    ops::rope_store_kv(q_heads, k_heads, v_heads, b->positions, rope_, b->attention.slot_mapping, cache.layer(layer));
    Tensor attn_heads = attn.reshape({n, c.num_heads, c.head_dim});
    if (sparse) {
      ops::select_kv_blocks(q_heads, cache.layer(layer), b->attention, sparse_meta.sparse_tables,
                            sparse_meta.sparse_lens);
      ops::paged_attention(q_heads, cache.layer(layer), sparse_meta, params, attn_heads);
    } else {
      ops::paged_attention(q_heads, cache.layer(layer), b->attention, params, attn_heads);
    }
    pending = ops::linear_fused(attn, w.o_proj, w.o_bias.defined() ? &w.o_bias : nullptr, residual, x, mode);
    // MLP block: x += down(silu(gate) * up) of ffn_norm(x); a sparse layer's experts instead.
    if (w.is_moe()) {
      norm_into_h(w.ffn_norm);
      ops::linear(h, w.router, nullptr, router_logits, mode);
      ops::moe_route(router_logits, c.norm_topk_prob, expert_ids, expert_weights);
      Tensor counters = expert_tokens_.defined() ? expert_tokens_.select(0, layer) : Tensor();
      ops::moe_experts(h, w.experts, expert_ids, expert_weights, out, mode, counters.defined() ? &counters : nullptr);
      if (w.down_proj.defined()) {  // the shared expert, scaled by sigmoid of its gate
        const int64_t si = w.down_proj.in_features();
        Tensor g = shared_gate_up.slice(1, 0, si);
        if (w.gate_up_proj.defined()) {
          ops::LinearFusion swiglu;
          swiglu.swiglu = true;
          swiglu.scratch_y = &shared_gate_up;
          (void)ops::linear_fused(h, w.gate_up_proj, nullptr, swiglu, g, mode);
        } else {
          Tensor u = shared_gate_up.slice(1, si, 2 * si);
          ops::linear(h, w.gate_proj, nullptr, g, mode);
          ops::linear(h, w.up_proj, nullptr, u, mode);
          ops::silu_mul(g, u, g);
        }
        ops::linear(g, w.down_proj, nullptr, shared_out, mode);
        ops::linear(h, w.shared_expert_gate, nullptr, shared_gate, mode);
        ops::add_sigmoid_gated(out, shared_out, shared_gate);
      }
      pending = true;  // the next norm adds `out` into x
    } else if (fused_gate_up) {  // one matrix; gate and up are halves of its output
      ops::LinearFusion mlp_in;
      mlp_in.norm_weight = &w.ffn_norm;
      mlp_in.norm_eps = c.rms_norm_eps;
      mlp_in.pending_add = pending ? &out : nullptr;
      mlp_in.swiglu = true;
      mlp_in.scratch_x = &h;
      mlp_in.scratch_y = &gate_up;
      Tensor g = gate_up.slice(1, 0, c.intermediate_size);  // the activation, over the gate half
      (void)ops::linear_fused(x, w.gate_up_proj, nullptr, mlp_in, g, mode);
      pending = ops::linear_fused(g, w.down_proj, nullptr, residual, x, mode);
    } else {
      norm_into_h(w.ffn_norm);
      ops::linear(h, w.gate_proj, nullptr, gate, mode);
      ops::linear(h, w.up_proj, nullptr, up, mode);
      ops::silu_mul(gate, up, gate);
      pending = ops::linear_fused(gate, w.down_proj, nullptr, residual, x, mode);
    }
  }

  // Final norm (every row: cheap), then the LM head over the wanted rows only.
  norm_into_h(weights_.final_norm);
  if (n_logits > 0) ops::embedding(h, b->logits_rows, normed);  // gathers the rows
  if (!logits.defined() || !(logits.device() == dev) || logits.dtype() != DType::kF32 || logits.dim() != 2 ||
      logits.size(0) != n_logits || logits.size(1) != c.vocab_size) {
    TACHYON_ASSIGN_OR_RETURN(logits, empty_on({n_logits, c.vocab_size}, DType::kF32, dev, "logits"));
  }
  if (n_logits > 0) ops::linear(normed, weights_.lm_head, nullptr, logits, mode);
  // What the ops raised while running (ops/errors.h): a workspace that could not be allocated, a
  // launch that failed. The logits are then not to be read.
  return ops::take_error(dev);
}

}  // namespace tachyon
