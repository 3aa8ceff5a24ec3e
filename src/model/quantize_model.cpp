#include "model/quantize_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "core/thread_pool.h"
#include "core/timer.h"
#include "kv/block_manager.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "ops/ops.h"
#include "quant/awq.h"
#include "quant/quantize.h"

namespace tachyon {

namespace {

// The seven linear layers of a block, in report order.
enum Module { kQ, kK, kV, kO, kGate, kUp, kDown, kModules };
constexpr const char* kModuleNames[kModules] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};

// Tokens of one forward batch of the calibration pass: whole sequences up to this many tokens
// (bounds the activations held for one layer's forward).
constexpr int64_t kTokensPerBatch = 4096;

// What each linear group reads, over every calibration token (f32).
struct LayerInputs {
  Tensor attn;  // [n, hidden]: input_layernorm output, into q/k/v
  Tensor o;     // [n, q_dim]: attention output, into o_proj
  Tensor mlp;   // [n, hidden]: post_attention_layernorm output, into gate/up
  Tensor down;  // [n, intermediate]: silu(gate) * up, into down_proj
};

// The model's 16-bit forward over the calibration tokens, one layer per call, keeping the
// residual stream of every token between calls. Attention runs through a one-layer paged cache
// that each batch overwrites; sequences never see each other.
class CalibrationForward {
 public:
  static Result<std::unique_ptr<CalibrationForward>> create(const LlamaModel& model,
                                                            std::span<const int32_t> tokens, int sequence_length) {
    const ModelConfig& c = model.config();
    auto f = std::unique_ptr<CalibrationForward>(new CalibrationForward(model));
    f->n_ = static_cast<int64_t>(tokens.size());
    const int block_size = kDefaultBlockSize;
    // Whole sequences into batches of at most kTokensPerBatch tokens (or one sequence).
    int64_t max_batch = 0;
    for (int64_t begin = 0; begin < f->n_;) {
      Batch b;
      b.begin = begin;
      std::vector<std::span<const int32_t>> seqs;
      int64_t end = begin;
      while (end < f->n_ && (end == begin || end - begin + sequence_length <= kTokensPerBatch)) {
        const int64_t len = std::min<int64_t>(sequence_length, f->n_ - end);
        seqs.push_back(tokens.subspan(static_cast<size_t>(end), static_cast<size_t>(len)));
        end += len;
      }
      b.end = end;
      int blocks = 0;
      for (const auto& s : seqs) blocks += static_cast<int>((s.size() + block_size - 1) / block_size);
      BlockManager manager({blocks, block_size, false, {}});
      std::vector<BlockTable> tables(seqs.size(), BlockTable(block_size));
      std::vector<SequenceChunk> chunks;
      for (size_t i = 0; i < seqs.size(); ++i) {
        TACHYON_RETURN_IF_ERROR(manager.grow_to(tables[i], static_cast<int>(seqs[i].size())));
        chunks.push_back(SequenceChunk{&tables[i], 0, seqs[i], LogitsWanted::kNone, {}});
      }
      b.batch = build_forward_batch(chunks);
      b.blocks = blocks;
      max_batch = std::max(max_batch, end - begin);
      f->batches_.push_back(std::move(b));
      begin = end;
    }
    int max_blocks = 0;
    for (const Batch& b : f->batches_) max_blocks = std::max(max_blocks, b.blocks);
    KvCacheConfig kv;
    kv.num_layers = 1;
    kv.num_kv_heads = c.num_kv_heads;
    kv.head_dim = c.head_dim;
    kv.block_size = block_size;
    kv.num_blocks = max_blocks;
    TACHYON_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(kv));
    f->cache_ = std::make_unique<KvCache>(std::move(cache));
    TACHYON_ASSIGN_OR_RETURN(f->x_, Tensor::try_empty({f->n_, c.hidden_size}, DType::kF32));
    Tensor ids = Tensor::empty({f->n_}, DType::kI32);
    std::copy(tokens.begin(), tokens.end(), ids.data<int32_t>());
    ops::embedding(model.weights().embed_tokens, ids, f->x_);
    f->max_batch_ = max_batch;
    return f;
  }

  int64_t tokens() const { return n_; }

  // Runs layer `layer` of the model over every token: fills `inputs` and moves the residual
  // stream past the layer.
  Status run_layer(int layer, LayerInputs& inputs) {
    const ModelConfig& c = model_.config();
    const LayerWeights& w = model_.weights().layers[static_cast<size_t>(layer)];
    TACHYON_ASSIGN_OR_RETURN(inputs.attn, Tensor::try_empty({n_, c.hidden_size}, DType::kF32));
    TACHYON_ASSIGN_OR_RETURN(inputs.o, Tensor::try_empty({n_, c.q_dim()}, DType::kF32));
    TACHYON_ASSIGN_OR_RETURN(inputs.mlp, Tensor::try_empty({n_, c.hidden_size}, DType::kF32));
    TACHYON_ASSIGN_OR_RETURN(inputs.down, Tensor::try_empty({n_, c.intermediate_size}, DType::kF32));
    const int64_t m = max_batch_;
    TACHYON_ASSIGN_OR_RETURN(Tensor q_all, Tensor::try_empty({m, c.q_dim()}, DType::kF32));
    TACHYON_ASSIGN_OR_RETURN(Tensor k_all, Tensor::try_empty({m, c.kv_dim()}, DType::kF32));
    TACHYON_ASSIGN_OR_RETURN(Tensor v_all, Tensor::try_empty({m, c.kv_dim()}, DType::kF32));
    TACHYON_ASSIGN_OR_RETURN(Tensor out_all, Tensor::try_empty({m, c.hidden_size}, DType::kF32));
    TACHYON_ASSIGN_OR_RETURN(Tensor gate_all, Tensor::try_empty({m, c.intermediate_size}, DType::kF32));
    TACHYON_ASSIGN_OR_RETURN(Tensor up_all, Tensor::try_empty({m, c.intermediate_size}, DType::kF32));
    Tensor qn_all, kn_all;
    if (c.qk_norm) {
      TACHYON_ASSIGN_OR_RETURN(qn_all, Tensor::try_empty({m * c.num_heads, c.head_dim}, DType::kF32));
      TACHYON_ASSIGN_OR_RETURN(kn_all, Tensor::try_empty({m * c.num_kv_heads, c.head_dim}, DType::kF32));
    }
    AttentionParams params;
    params.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    params.sliding_window = c.sliding_window;
    for (const Batch& b : batches_) {
      const int64_t n = b.end - b.begin;
      Tensor x = x_.slice(0, b.begin, b.end);
      Tensor h = inputs.attn.slice(0, b.begin, b.end);
      Tensor q = q_all.slice(0, 0, n), k = k_all.slice(0, 0, n), v = v_all.slice(0, 0, n);
      Tensor out = out_all.slice(0, 0, n), gate = gate_all.slice(0, 0, n), up = up_all.slice(0, 0, n);
      ops::rms_norm(x, w.attn_norm, c.rms_norm_eps, h);
      ops::linear(h, w.q_proj, w.q_bias.defined() ? &w.q_bias : nullptr, q);
      ops::linear(h, w.k_proj, w.k_bias.defined() ? &w.k_bias : nullptr, k);
      ops::linear(h, w.v_proj, w.v_bias.defined() ? &w.v_bias : nullptr, v);
      Tensor q_heads = q.split_last(c.num_heads), k_heads = k.split_last(c.num_kv_heads);
      Tensor v_heads = v.split_last(c.num_kv_heads);
      if (c.qk_norm) {
        Tensor qn = qn_all.slice(0, 0, n * c.num_heads).reshape({n, c.num_heads, c.head_dim});
        Tensor kn = kn_all.slice(0, 0, n * c.num_kv_heads).reshape({n, c.num_kv_heads, c.head_dim});
        ops::rms_norm(q_heads, w.q_norm, c.rms_norm_eps, qn);
        ops::rms_norm(k_heads, w.k_norm, c.rms_norm_eps, kn);
        q_heads = qn;
        k_heads = kn;
      }
      ops::rope(q_heads, b.batch.positions, rope_);
      ops::rope(k_heads, b.batch.positions, rope_);
      ops::store_kv(k_heads, v_heads, b.batch.attention.slot_mapping, cache_->layer(0));
      Tensor attn = inputs.o.slice(0, b.begin, b.end);
      Tensor attn_heads = attn.reshape({n, c.num_heads, c.head_dim});
      ops::paged_attention(q_heads, cache_->layer(0), b.batch.attention, params, attn_heads);
      ops::linear(attn, w.o_proj, w.o_bias.defined() ? &w.o_bias : nullptr, out);
      Tensor h2 = inputs.mlp.slice(0, b.begin, b.end);
      ops::add_rms_norm(x, out, w.ffn_norm, c.rms_norm_eps, h2);  // x += attention output
      ops::linear(h2, w.gate_proj, nullptr, gate);
      ops::linear(h2, w.up_proj, nullptr, up);
      Tensor act = inputs.down.slice(0, b.begin, b.end);
      ops::silu_mul(gate, up, act);
      ops::linear(act, w.down_proj, nullptr, out);
      float* xp = x.data<float>();
      const float* op = out.data<float>();
      for (int64_t i = 0; i < n * c.hidden_size; ++i) xp[i] += op[i];  // x += MLP output
    }
    return Status::Ok();
  }

 private:
  struct Batch {
    int64_t begin = 0, end = 0;  // token rows
    ForwardBatch batch;
    int blocks = 0;
  };

  explicit CalibrationForward(const LlamaModel& model) : model_(model) {
    const ModelConfig& c = model.config();
    rope_ = make_rope_table(c.rope);
    if (!c.rope_freq_divisors.empty() && c.rope_freq_divisors.size() == rope_.inv_freq.size()) {
      for (size_t i = 0; i < rope_.inv_freq.size(); ++i) rope_.inv_freq[i] /= c.rope_freq_divisors[i];
    }
  }

  const LlamaModel& model_;
  RopeTable rope_;
  int64_t n_ = 0;
  int64_t max_batch_ = 0;
  std::vector<Batch> batches_;
  std::unique_ptr<KvCache> cache_;
  Tensor x_;  // [n, hidden] f32: the residual stream before the next layer
};

// ---- output errors over every calibration token ----
// For a weight error E [out, in] on inputs X [n, in], ||X E^T||^2 is computed directly (n * out
// * in per call) or, when there are more tokens than input channels, as sum_o e_o G e_o^T with
// the Gram matrix G = X^T X [in, in] made once (n * in^2), after which a call costs out * in^2
// whatever the number of tokens. Sums run by rows on the worker threads and are then added in
// row order, however the rows were split.

// sum over rows of sum_i a[r, i] * b[r, i], both [rows, cols] f32 contiguous.
double dot_rows(const Tensor& a, const Tensor& b) {
  const int64_t rows = a.size(0), cols = a.size(1);
  std::vector<double> partial(static_cast<size_t>(rows));
  parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      double s = 0.0;
      for (int64_t i = r * cols; i < (r + 1) * cols; ++i) s += static_cast<double>(a.data<float>()[i]) * b.data<float>()[i];
      partial[static_cast<size_t>(r)] = s;
    }
  });
  double s = 0.0;
  for (double p : partial) s += p;
  return s;
}

class OutputError {
 public:
  OutputError() = default;
  explicit OutputError(const Tensor& x) {
    const int64_t n = x.size(0), in = x.size(1);
    if (n <= in) {
      x_ = x;
      return;
    }
    Tensor xt = Tensor::empty({in, n}, DType::kF32);  // x transposed: G is one GEMM of x^T with itself
    parallel_for(in, 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t r = 0; r < n; ++r) xt.data<float>()[i * n + r] = x.data<float>()[r * x.stride(0) + i];
      }
    });
    gram_ = Tensor::empty({in, in}, DType::kF32);
    ops::linear(xt, dense(xt), nullptr, gram_);
  }

  // ||X e^T||^2 for e [out, in] f32 contiguous.
  double operator()(const Tensor& e) const {
    if (x_.defined()) {
      Tensor y = Tensor::empty({x_.size(0), e.size(0)}, DType::kF32);
      ops::linear(x_, dense(e), nullptr, y);
      return dot_rows(y, y);
    }
    Tensor z = Tensor::empty({e.size(0), e.size(1)}, DType::kF32);
    ops::linear(e, dense(gram_), nullptr, z);  // E G (G is symmetric)
    return std::max(dot_rows(z, e), 0.0);     // >= 0 in exact arithmetic
  }

 private:
  static Weight dense(const Tensor& t) {
    Weight w;
    w.dense = t;
    return w;
  }
  Tensor x_;     // [n, in] when n <= in
  Tensor gram_;  // [in, in] otherwise
};

// a - b, both [out, in] f32, each column times 1/s (s empty: 1).
Tensor difference(const Tensor& a, const Tensor* b, std::span<const float> s) {
  const int64_t rows = a.size(0), cols = a.size(1);
  Tensor d = Tensor::empty({rows, cols}, DType::kF32);
  parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t i = 0; i < cols; ++i) {
        const float v = a.data<float>()[r * cols + i] - (b != nullptr ? b->data<float>()[r * cols + i] : 0.0f);
        d.data<float>()[r * cols + i] = s.empty() ? v : v / s[static_cast<size_t>(i)];
      }
    }
  });
  return d;
}

// ||X (Wq - W)^T|| / ||X W^T|| with X = X0 diag(1/s) (the input the scaled model sees; `error`
// measures on X0), w [out, in] f32 and its quantized form.
double relative_error(const Tensor& w, const QuantWeight& q, std::span<const float> s, const OutputError& error) {
  const Tensor wq = dequantize(q);
  const double norm = error(difference(w, nullptr, s));
  const double err = error(difference(wq, &w, s));
  return norm > 0.0 ? std::sqrt(err / norm) : (err > 0.0 ? std::numeric_limits<double>::infinity() : 0.0);
}

std::vector<float> mean_abs(const Tensor& x) {
  const int64_t n = x.size(0), d = x.size(1);
  std::vector<double> sum(static_cast<size_t>(d), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x.data<float>() + r * x.stride(0);
    for (int64_t i = 0; i < d; ++i) sum[static_cast<size_t>(i)] += std::fabs(row[i]);
  }
  std::vector<float> mean(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) mean[static_cast<size_t>(i)] = static_cast<float>(sum[static_cast<size_t>(i)] / n);
  return mean;
}

// A norm weight or bias (f32 vector) times 1/s.
Tensor divide_vector(const Tensor& v, std::span<const float> s) {
  Tensor r = v.to_f32();
  for (int64_t i = 0; i < r.numel(); ++i) r.data<float>()[i] /= s[static_cast<size_t>(i)];
  return r;
}

// f32 [out, in] in a 16-bit dtype (or as is for f32): a module kept dense after AWQ scaling.
Tensor cast_from_f32(const Tensor& t, DType dtype) {
  if (dtype == DType::kF32) return t;
  Tensor r = Tensor::empty(t.shape(), dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = t.data<float>()[i];
    r.data<uint16_t>()[i] = dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
  }
  return r;
}

// max_i |x[i, j]| per column j of x [rows, cols] (f32/f16/bf16 on the host).
std::vector<float> max_abs_columns(const Tensor& x) {
  const int64_t rows = x.size(0), cols = x.size(1);
  std::vector<float> m(static_cast<size_t>(cols), 0.0f), row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    load_row_f32(x, r, row.data());
    for (int64_t j = 0; j < cols; ++j) m[static_cast<size_t>(j)] = std::max(m[static_cast<size_t>(j)], std::fabs(row[static_cast<size_t>(j)]));
  }
  return m;
}

// v [q_dim]: each (head, dim) entry replaced by the maximum over the query heads sharing its kv head.
void tie_over_kv_heads(const ModelConfig& c, std::vector<float>& v) {
  const int per_kv = c.num_heads / c.num_kv_heads;
  for (int kv = 0; kv < c.num_kv_heads; ++kv) {
    for (int d = 0; d < c.head_dim; ++d) {
      float m = 0.0f;
      for (int h = kv * per_kv; h < (kv + 1) * per_kv; ++h) m = std::max(m, v[static_cast<size_t>(h * c.head_dim + d)]);
      for (int h = kv * per_kv; h < (kv + 1) * per_kv; ++h) v[static_cast<size_t>(h * c.head_dim + d)] = m;
    }
  }
}

// ||Q(x diag(1/s)) - x W^T diag(r)|| / ||x W^T diag(r)||: the output error of a layer whose
// activations are rounded too (W8A8 per token or to its static scale, fp8 to its static scale),
// run as the kernels run it, on the input the (smoothed) model gives it, against what the layer
// computes there exactly (r: the next group's 1/s folded into its rows). x [n, in] f32, w
// [out, in] as stored; s, r empty for 1.
double run_relative_error(const Tensor& x, const Tensor& w, const QuantWeight& q, std::span<const float> s,
                           std::span<const float> r) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  Tensor xs = Tensor::empty({n, in}, DType::kF32);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < in; ++i) {
      const float v = x.data<float>()[t * x.stride(0) + i];
      xs.data<float>()[t * in + i] = s.empty() ? v : v / s[static_cast<size_t>(i)];
    }
  }
  Weight dense, packed;
  dense.dense = w;
  packed.quant = std::make_shared<QuantWeight>(q);
  Tensor want = Tensor::empty({n, out}, DType::kF32), got = Tensor::empty({n, out}, DType::kF32);
  ops::linear(x, dense, nullptr, want);
  ops::linear(xs, packed, nullptr, got);
  double err = 0.0, ref = 0.0;
  for (int64_t k = 0; k < n * out; ++k) {
    const double exact = static_cast<double>(want.data<float>()[k]) * (r.empty() ? 1.0f : r[static_cast<size_t>(k % out)]);
    const double d = static_cast<double>(got.data<float>()[k]) - exact;
    err += d * d;
    ref += exact * exact;
  }
  return ref > 0.0 ? std::sqrt(err / ref) : std::sqrt(err);
}

// One block's quantization: its weights (src) and the inputs captured for it (null without
// calibration).
Status quantize_layer(const QuantizeModelOptions& o, const ModelConfig& c, const LayerWeights& src,
                      const LayerInputs* inputs, LayerWeights& dst, LayerQuantReport& report) {
  const Weight* source[kModules] = {&src.q_proj, &src.k_proj, &src.v_proj, &src.o_proj,
                                    &src.gate_proj, &src.up_proj, &src.down_proj};
  Weight* target[kModules] = {&dst.q_proj, &dst.k_proj, &dst.v_proj, &dst.o_proj,
                              &dst.gate_proj, &dst.up_proj, &dst.down_proj};
  // Output errors of each group's input over every calibration token.
  OutputError error_attn, error_o, error_mlp, error_down;
  if (inputs != nullptr) {
    error_attn = OutputError(inputs->attn);
    error_o = OutputError(inputs->o);
    error_mlp = OutputError(inputs->mlp);
    error_down = OutputError(inputs->down);
  }
  const OutputError* error_of[kModules] = {&error_attn, &error_attn, &error_attn, &error_o,
                                           &error_mlp,  &error_mlp,  &error_down};

  std::vector<float> column_scales[kModules];  // AWQ s of the module's input (empty: 1)
  std::vector<float> row_scales[kModules];     // 1/s of the next group folded into rows (empty: 1)
  std::optional<float> alpha[kModules];
  Tensor scaled[kModules];                     // the weight the model will hold, before rounding
  for (int m = 0; m < kModules; ++m) scaled[m] = source[m]->dense;

  if (o.method == QuantMethod::kAwqInt4) {
    struct Group {
      std::vector<int> modules;
      const Tensor* input;  // every calibration token
      bool tie_kv_heads;    // o_proj under GQA: one scale per v channel
    };
    const Group groups[] = {{{kQ, kK, kV}, &inputs->attn, false},
                            {{kO}, &inputs->o, true},
                            {{kGate, kUp}, &inputs->mlp, false},
                            {{kDown}, &inputs->down, false}};
    for (const Group& g : groups) {
      std::vector<float> mean = mean_abs(*g.input);
      if (g.tie_kv_heads) {
        const int per_kv = c.num_heads / c.num_kv_heads;
        for (int kv = 0; kv < c.num_kv_heads; ++kv) {
          for (int d = 0; d < c.head_dim; ++d) {
            double s = 0.0;
            for (int h = kv * per_kv; h < (kv + 1) * per_kv; ++h) s += mean[static_cast<size_t>(h * c.head_dim + d)];
            for (int h = kv * per_kv; h < (kv + 1) * per_kv; ++h) {
              mean[static_cast<size_t>(h * c.head_dim + d)] = static_cast<float>(s / per_kv);
            }
          }
        }
      }
      const OutputError& output_error = *error_of[g.modules[0]];
      std::vector<Tensor> weights;
      for (int m : g.modules) weights.push_back(source[m]->dense.to_f32());
      const AwqErrorFn error = [&](const std::vector<Tensor>& candidates) -> Result<double> {
        double e = 0.0;
        for (size_t i = 0; i < candidates.size(); ++i) e += output_error(difference(candidates[i], &weights[i], {}));
        return e;
      };
      TACHYON_ASSIGN_OR_RETURN(AwqSearchResult found,
                               awq_search(weights, mean, AwqOptions{o.group_size, o.grid}, error));
      for (int m : g.modules) {
        column_scales[m] = found.scales;
        alpha[m] = found.alpha;
      }
    }
  } else if (o.method == QuantMethod::kW8A8 && inputs != nullptr && o.smooth_alpha > 0.0f) {
    // SmoothQuant: s_j = max|x_j|^alpha / max|w_j|^(1 - alpha), over the calibration tokens and
    // the rows of every weight reading x, moves the activations' outlier channels into the
    // weights, whose per-row int8 scales absorb them better than per-token ones. o_proj's
    // statistics are maxima over the query heads that share a kv head (one v row feeds them all).
    struct Group {
      std::vector<int> modules;
      const Tensor* input;
      bool tie_kv_heads;
    };
    const Group groups[] = {{{kQ, kK, kV}, &inputs->attn, false},
                            {{kO}, &inputs->o, true},
                            {{kGate, kUp}, &inputs->mlp, false},
                            {{kDown}, &inputs->down, false}};
    for (const Group& g : groups) {
      std::vector<float> x_max = max_abs_columns(*g.input), w_max(x_max.size(), 0.0f);
      for (int m : g.modules) {
        const std::vector<float> wm = max_abs_columns(source[m]->dense);
        for (size_t j = 0; j < w_max.size(); ++j) w_max[j] = std::max(w_max[j], wm[j]);
      }
      if (g.tie_kv_heads) {
        tie_over_kv_heads(c, x_max);
        tie_over_kv_heads(c, w_max);
      }
      std::vector<float> scales(x_max.size(), 1.0f);
      for (size_t j = 0; j < scales.size(); ++j) {
        if (x_max[j] > 0.0f && w_max[j] > 0.0f) {
          const double v = std::pow(x_max[j], o.smooth_alpha) / std::pow(w_max[j], 1.0 - o.smooth_alpha);
          scales[j] = static_cast<float>(std::clamp(v, 1e-5, 1e5));
        }
      }
      for (int m : g.modules) {
        column_scales[m] = scales;
        alpha[m] = o.smooth_alpha;
      }
    }
  }
  if (!column_scales[kQ].empty()) {
    // Folds: 1/s of q/k/v and gate/up into the norms, of o_proj into v's rows, of down_proj into up's rows.
    dst.attn_norm = divide_vector(src.attn_norm, column_scales[kQ]);
    dst.ffn_norm = divide_vector(src.ffn_norm, column_scales[kGate]);
    const int per_kv = c.num_heads / c.num_kv_heads;
    row_scales[kV].resize(static_cast<size_t>(c.kv_dim()));
    for (int kv = 0; kv < c.num_kv_heads; ++kv) {
      for (int d = 0; d < c.head_dim; ++d) {
        row_scales[kV][static_cast<size_t>(kv * c.head_dim + d)] =
            1.0f / column_scales[kO][static_cast<size_t>(kv * per_kv * c.head_dim + d)];
      }
    }
    if (src.v_bias.defined()) {
      std::vector<float> s(row_scales[kV].size());
      for (size_t i = 0; i < s.size(); ++i) s[i] = 1.0f / row_scales[kV][i];
      dst.v_bias = divide_vector(src.v_bias, s);
    }
    row_scales[kUp].resize(column_scales[kDown].size());
    for (size_t i = 0; i < row_scales[kUp].size(); ++i) row_scales[kUp][i] = 1.0f / column_scales[kDown][i];
    for (int m = 0; m < kModules; ++m) scaled[m] = scale_weight(source[m]->dense, column_scales[m], row_scales[m]);
  }
  // What the model computes with the scales folded in: the reference of each module's error, and
  // what a module kept 16-bit holds (clipping only changes what is rounded).
  Tensor folded[kModules];
  for (int m = 0; m < kModules; ++m) folded[m] = scaled[m];
  std::optional<double> clip_ratio[kModules];
  if (o.method == QuantMethod::kAwqInt4 && o.awq_clip && inputs != nullptr) {
    // Each module's (row, group) ranges searched on its input as the scaled weight sees it (x / s;
    // one Gram matrix per input, shared by q/k/v and by gate/up).
    const Tensor* input_of[kModules] = {&inputs->attn, &inputs->attn, &inputs->attn, &inputs->o,
                                        &inputs->mlp,  &inputs->mlp,  &inputs->down};
    std::vector<double> gram;
    const Tensor* gram_input = nullptr;
    for (int m = 0; m < kModules; ++m) {
      if (input_of[m] != gram_input) {
        gram = group_gram(*input_of[m], column_scales[m], o.group_size);
        gram_input = input_of[m];
      }
      const Tensor w = scaled[m].dtype() == DType::kF32 ? scaled[m] : scaled[m].to_f32();
      auto clipped = awq_clip(w, gram, AwqClipOptions{o.group_size, 20, 0.5f});
      if (!clipped.ok()) return clipped.status().with_context(fmt::format("layer {} {}", report.layer, kModuleNames[m]));
      scaled[m] = std::move(clipped->weight);
      clip_ratio[m] = clipped->mean_ratio;
    }
  }

  QuantSpec spec;
  spec.format = o.method == QuantMethod::kInt8   ? QuantFormat::kInt8Channel
                : o.method == QuantMethod::kW8A8 ? QuantFormat::kW8A8
                : o.method == QuantMethod::kFp8  ? QuantFormat::kFp8Channel
                : o.method == QuantMethod::kTernary ? QuantFormat::kTernary
                                                    : QuantFormat::kInt4Group;
  spec.group_size = o.group_size;
  spec.int4_scales = Int4Scales::kF16;
  // Static activation scales: each input as the quantized model reads it (divided by
  // SmoothQuant's s), one observer per distinct input, fed one calibration sequence at a time.
  // Then per input group (q/k/v, o, gate/up, down): where one scale per tensor costs more than
  // act_fallback_ratio times the output error of activations per token (w8a8) or unrounded (fp8)
  // on some module, the whole group keeps those (a group shares one input, so fused matrices stay
  // fused).
  float input_scale[kModules] = {};
  std::optional<double> static_error[kModules];
  const Tensor* input_of[kModules] = {};
  if (inputs != nullptr) {
    const Tensor* in_of[kModules] = {&inputs->attn, &inputs->attn, &inputs->attn, &inputs->o,
                                     &inputs->mlp,  &inputs->mlp,  &inputs->down};
    std::copy(in_of, in_of + kModules, input_of);
  }
  if (o.act_observer && inputs != nullptr && (o.method == QuantMethod::kW8A8 || o.method == QuantMethod::kFp8)) {
    const float qmax = o.method == QuantMethod::kW8A8 ? 127.0f : kF8E4M3Max;
    const int64_t length = std::max(1, std::min(o.sequence_length, c.max_position_embeddings));
    for (int m = 0; m < kModules; ++m) {
      if (m > 0 && input_of[m] == input_of[m - 1] && column_scales[m] == column_scales[m - 1]) {
        input_scale[m] = input_scale[m - 1];
        continue;
      }
      const Tensor& x = *input_of[m];
      const int64_t n = x.size(0), in = x.size(1);
      const std::vector<float>& s = column_scales[m];
      ActivationObserver observer(*o.act_observer);
      std::vector<float> batch;
      for (int64_t t0 = 0; t0 < n; t0 += length) {
        const int64_t t1 = std::min(n, t0 + length);
        batch.resize(static_cast<size_t>((t1 - t0) * in));
        for (int64_t t = t0; t < t1; ++t) {
          const float* row = x.data<float>() + t * x.stride(0);
          float* dst = batch.data() + (t - t0) * in;
          for (int64_t i = 0; i < in; ++i) dst[i] = s.empty() ? row[i] : row[i] / s[static_cast<size_t>(i)];
        }
        observer.observe(batch);
      }
      input_scale[m] = observer.scale(qmax);  // 0 (nothing nonzero seen): per token / none
    }
    if (o.act_fallback_ratio > 0.0) {
      bool fall_back[kModules] = {};
      for (int m = 0; m < kModules; ++m) {
        if (input_scale[m] <= 0.0f) continue;
        Weight dense;
        dense.dense = scaled[m];
        auto q = quantize_weight(dense, spec);
        if (!q.ok()) return q.status().with_context(fmt::format("layer {} {}", report.layer, kModuleNames[m]));
        QuantWeight with_scale = *q->quant;
        with_scale.input_scale = input_scale[m];
        static_error[m] =
            run_relative_error(*input_of[m], source[m]->dense, with_scale, column_scales[m], row_scales[m]);
        const double unscaled =
            run_relative_error(*input_of[m], source[m]->dense, *q->quant, column_scales[m], row_scales[m]);
        fall_back[m] = *static_error[m] > o.act_fallback_ratio * unscaled;
      }
      for (int m = 0; m < kModules; ++m) {
        bool group = false;
        for (int k = 0; k < kModules; ++k) group = group || (input_of[k] == input_of[m] && fall_back[k]);
        if (group) input_scale[m] = 0.0f;
      }
    }
  }
  for (int m = 0; m < kModules; ++m) {
    ModuleQuantReport r;
    r.name = kModuleNames[m];
    r.alpha = alpha[m];
    r.clip_ratio = clip_ratio[m];
    Weight dense;
    dense.dense = scaled[m];
    auto q = quantize_weight(dense, spec);
    if (!q.ok()) return q.status().with_context(fmt::format("layer {} {}", report.layer, r.name));
    Weight chosen = std::move(q).value();
    r.format = quant_format_name(spec.format);
    if (input_scale[m] > 0.0f && chosen.quant) {
      auto with_scale = std::make_shared<QuantWeight>(*chosen.quant);
      with_scale->input_scale = input_scale[m];
      chosen.quant = std::move(with_scale);
      r.input_scale = input_scale[m];
    }
    r.static_error = static_error[m];
    if (inputs != nullptr && (spec.format == QuantFormat::kW8A8 || input_scale[m] > 0.0f)) {
      // The activations are rounded too: measured by running the layer, against plain W8A8.
      const Tensor* x = input_of[m];
      r.relative_error = run_relative_error(*x, source[m]->dense, *chosen.quant, column_scales[m], row_scales[m]);
      if (!column_scales[m].empty()) {
        auto plain = quantize_weight(*source[m], spec);
        if (!plain.ok()) return plain.status().with_context(fmt::format("layer {} {}", report.layer, r.name));
        r.rtn_relative_error = run_relative_error(*x, source[m]->dense, *plain->quant, {}, {});
      }
    } else if (inputs != nullptr) {
      const Tensor w = folded[m].dtype() == DType::kF32 ? folded[m] : folded[m].to_f32();
      r.relative_error = relative_error(w, *chosen.quant, column_scales[m], *error_of[m]);
      if (o.method == QuantMethod::kAwqInt4) {
        auto rtn = quantize_weight(*source[m], spec);
        if (!rtn.ok()) return rtn.status().with_context(fmt::format("layer {} {}", report.layer, r.name));
        r.rtn_relative_error = relative_error(source[m]->dense.to_f32(), *rtn->quant, {}, *error_of[m]);
      }
    }
    if (o.max_layer_error > 0.0 && r.relative_error && *r.relative_error > o.max_layer_error) {
      // Stays 16-bit: the (scaled) weight in the dtype the module came in (every method: W8A8's
      // error, measured above with its activations rounded, is checked like the others).
      chosen = Weight();
      chosen.dense = !column_scales[m].empty() || !row_scales[m].empty()
                         ? cast_from_f32(folded[m], source[m]->dense.dtype())
                         : source[m]->dense;
      r.kept_dense = true;
      r.format = dtype_name(chosen.dense.dtype());
    }
    *target[m] = std::move(chosen);
    report.modules.push_back(std::move(r));
  }
  return Status::Ok();
}

}  // namespace

const char* quant_method_name(QuantMethod method) {
  switch (method) {
    case QuantMethod::kRtnInt4: return "rtn-int4";
    case QuantMethod::kAwqInt4: return "awq-int4";
    case QuantMethod::kInt8: return "int8";
    case QuantMethod::kW8A8: return "w8a8";
    case QuantMethod::kFp8: return "fp8";
    case QuantMethod::kTernary: return "ternary";
  }
  return "?";
}

Result<QuantMethod> parse_quant_method(const std::string& name) {
  for (QuantMethod m : {QuantMethod::kRtnInt4, QuantMethod::kAwqInt4, QuantMethod::kInt8, QuantMethod::kW8A8,
                        QuantMethod::kFp8, QuantMethod::kTernary}) {
    if (name == quant_method_name(m)) return m;
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "method '{}': expected rtn-int4, awq-int4, int8, w8a8, fp8 or ternary", name);
}

namespace {

// What quantize_model and measure_formats both need: calibration ids inside the vocabulary, and
// linear weights dense and unfused.
Status check_quantizable(const LlamaModel& model, std::span<const int32_t> calibration) {
  const int32_t vocab = model.config().vocab_size;
  for (size_t i = 0; i < calibration.size(); ++i) {
    if (calibration[i] < 0 || calibration[i] >= vocab) {
      return make_error(ErrorCode::kInvalidArgument, "calibration token {} at {} is outside the vocabulary [0, {})",
                        calibration[i], i, vocab);
    }
  }
  const ModelWeights& weights = model.weights();
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& w = weights.layers[l];
    for (const Weight* m : {&w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.gate_proj, &w.up_proj, &w.down_proj}) {
      if (m->quant || !m->dense.defined() || w.qkv_proj.defined() || w.gate_up_proj.defined()) {
        return make_error(ErrorCode::kInvalidArgument, "layer {}: the linear weights must be dense and unfused "
                          "(a model already quantized cannot be quantized again)", l);
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<QuantizedModel> quantize_model(const LlamaModel& model, std::span<const int32_t> calibration,
                                      const QuantizeModelOptions& options) {
  const ModelConfig& c = model.config();
  const ModelWeights& weights = model.weights();
  if (!model.device().is_cpu()) {
    return make_error(ErrorCode::kUnsupported, "quantization runs on the host; the model is on {}",
                      model.device().to_string());
  }
  if ((options.method == QuantMethod::kRtnInt4 || options.method == QuantMethod::kAwqInt4) && options.group_size != 32 && options.group_size != 64 &&
      options.group_size != 128) {
    return make_error(ErrorCode::kInvalidArgument, "group size {}: expected 32, 64 or 128", options.group_size);
  }
  if (options.method == QuantMethod::kTernary && options.group_size != 32 && options.group_size != 64 &&
      options.group_size != 128 && options.group_size != 256) {
    return make_error(ErrorCode::kInvalidArgument, "group size {}: ternary takes 32, 64, 128 or 256",
                      options.group_size);
  }
  if (options.sequence_length < 1 || options.grid < 1) {
    return make_error(ErrorCode::kInvalidArgument, "sequence length {}, grid {}: both must be positive",
                      options.sequence_length, options.grid);
  }
  const bool smooth = options.method == QuantMethod::kW8A8 && options.smooth_alpha > 0.0f;
  if (options.act_observer && options.method != QuantMethod::kW8A8 && options.method != QuantMethod::kFp8) {
    return make_error(ErrorCode::kInvalidArgument, "static activation scales are for w8a8 and fp8 (method {})",
                      quant_method_name(options.method));
  }
  const bool needs_calibration = options.method == QuantMethod::kAwqInt4 || smooth || options.max_layer_error > 0.0 ||
                                 options.act_observer.has_value();
  if (needs_calibration && calibration.size() < 2) {
    return make_error(ErrorCode::kInvalidArgument, "{} needs calibration text: got {} tokens",
                      options.method == QuantMethod::kAwqInt4 ? "awq-int4"
                      : smooth                                ? "w8a8 with SmoothQuant (alpha > 0)"
                      : options.act_observer                  ? "static activation scales (an activation observer)"
                                                              : "--max-layer-error",
                      calibration.size());
  }
  if (!(options.smooth_alpha >= 0.0f && options.smooth_alpha <= 1.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "SmoothQuant alpha {}: expected 0..1", options.smooth_alpha);
  }
  TACHYON_RETURN_IF_ERROR(check_quantizable(model, calibration));

  QuantizedModel result;
  result.weights = weights;
  result.calibration_tokens = static_cast<int64_t>(calibration.size());
  std::unique_ptr<CalibrationForward> forward;
  if (!calibration.empty()) {
    const int length = std::min(options.sequence_length, c.max_position_embeddings);
    TACHYON_ASSIGN_OR_RETURN(forward, CalibrationForward::create(model, calibration, length));
  }
  for (int l = 0; l < c.num_layers; ++l) {
    Timer timer;
    LayerInputs inputs;
    if (forward) TACHYON_RETURN_IF_ERROR(forward->run_layer(l, inputs));
    LayerQuantReport report;
    report.layer = l;
    LayerWeights& dst = result.weights.layers[static_cast<size_t>(l)];
    TACHYON_RETURN_IF_ERROR(quantize_layer(options, c, weights.layers[static_cast<size_t>(l)],
                                           forward ? &inputs : nullptr, dst, report));
    report.seconds = timer.seconds();
    if (options.on_layer) options.on_layer(report);
    result.layers.push_back(std::move(report));
  }
  return result;
}

std::vector<QuantSpec> default_budget_candidates() {
  std::vector<QuantSpec> out;
  for (const char* name : {"int4:g128", "q4_k", "int4:g64", "q5_k", "int4:g32", "q6_k", "int8", "q8_0", "w8a8", "fp8"}) {
    const std::string n = name;
    const size_t colon = n.find(":g");
    auto spec = colon == std::string::npos ? parse_quant_spec(n, 128)
                                           : parse_quant_spec(n.substr(0, colon), std::stoi(n.substr(colon + 2)));
    out.push_back(*spec);  // the names above are valid
  }
  return out;
}

Result<FormatMeasurements> measure_formats(const LlamaModel& model, std::span<const int32_t> calibration,
                                           const MeasureFormatsOptions& options) {
  const ModelConfig& c = model.config();
  const ModelWeights& weights = model.weights();
  if (!model.device().is_cpu()) {
    return make_error(ErrorCode::kUnsupported, "measuring formats runs on the host; the model is on {}",
                      model.device().to_string());
  }
  if (calibration.size() < 2) {
    return make_error(ErrorCode::kInvalidArgument, "an error budget needs calibration text: got {} tokens",
                      calibration.size());
  }
  if (options.sequence_length < 1) {
    return make_error(ErrorCode::kInvalidArgument, "sequence length {}: must be positive", options.sequence_length);
  }
  TACHYON_RETURN_IF_ERROR(check_quantizable(model, calibration));
  const std::vector<QuantSpec> candidates =
      options.candidates.empty() ? default_budget_candidates() : options.candidates;
  FormatMeasurements result;
  result.calibration_tokens = static_cast<int64_t>(calibration.size());
  const int length = std::min(options.sequence_length, c.max_position_embeddings);
  TACHYON_ASSIGN_OR_RETURN(std::unique_ptr<CalibrationForward> forward,
                           CalibrationForward::create(model, calibration, length));
  for (int l = 0; l < c.num_layers; ++l) {
    Timer timer;
    LayerInputs inputs;
    TACHYON_RETURN_IF_ERROR(forward->run_layer(l, inputs));
    const LayerWeights& src = weights.layers[static_cast<size_t>(l)];
    const Weight* source[kModules] = {&src.q_proj, &src.k_proj, &src.v_proj, &src.o_proj,
                                      &src.gate_proj, &src.up_proj, &src.down_proj};
    const Tensor* input_of[kModules] = {&inputs.attn, &inputs.attn, &inputs.attn, &inputs.o,
                                        &inputs.mlp,  &inputs.mlp,  &inputs.down};
    const OutputError error_attn(inputs.attn), error_o(inputs.o), error_mlp(inputs.mlp), error_down(inputs.down);
    const OutputError* error_of[kModules] = {&error_attn, &error_attn, &error_attn, &error_o,
                                             &error_mlp,  &error_mlp,  &error_down};
    for (int m = 0; m < kModules; ++m) {
      ModuleFormats mf;
      mf.module = fmt::format("model.layers.{}.{}.{}", l, m <= kO ? "self_attn" : "mlp", kModuleNames[m]);
      mf.dense_bytes = static_cast<int64_t>(source[m]->nbytes());
      const Tensor w = source[m]->dense.to_f32();
      const int64_t in = w.size(1);
      for (QuantSpec spec : candidates) {
        k_quant_fallback(spec, in);
        if (spec.group_size > 0 && in % spec.group_size != 0) continue;  // the format does not fit this width
        if (std::any_of(mf.measured.begin(), mf.measured.end(),
                        [&](const MeasuredFormat& f) { return quant_spec_name(f.spec) == quant_spec_name(spec); })) {
          continue;  // a K-quant's fallback that is also a candidate of its own
        }
        auto q = quantize_weight(*source[m], spec);
        if (!q.ok()) return q.status().with_context(fmt::format("{} as {}", mf.module, quant_spec_name(spec)));
        MeasuredFormat f;
        f.spec = spec;
        f.bytes = static_cast<int64_t>(q->nbytes());
        f.error = spec.format == QuantFormat::kW8A8
                      ? run_relative_error(*input_of[m], source[m]->dense, *q->quant, {}, {})
                      : relative_error(w, *q->quant, {}, *error_of[m]);
        mf.measured.push_back(f);
      }
      result.modules.push_back(std::move(mf));
    }
    if (options.on_layer) options.on_layer(l, timer.seconds());
  }
  return result;
}

namespace {

// The cheapest measured format of `m` whose error is at most `budget` (nullptr: none).
const MeasuredFormat* cheapest_within(const ModuleFormats& m, double budget) {
  const MeasuredFormat* best = nullptr;
  for (const MeasuredFormat& f : m.measured) {
    if (!(f.error <= budget) || f.bytes >= m.dense_bytes) continue;
    if (best == nullptr || f.bytes < best->bytes) best = &f;  // ties: the earlier candidate
  }
  return best;
}

FormatChoice choose_with(const FormatMeasurements& measured, double budget) {
  FormatChoice choice;
  for (const ModuleFormats& m : measured.modules) {
    ModuleChoice c;
    c.module = m.module;
    c.dense_bytes = m.dense_bytes;
    if (const MeasuredFormat* f = cheapest_within(m, budget)) {
      c.spec = f->spec;
      c.bytes = f->bytes;
      c.error = f->error;
    } else {
      c.bytes = m.dense_bytes;
    }
    choice.bytes += c.bytes;
    choice.dense_bytes += c.dense_bytes;
    choice.sum_squared_error += c.error * c.error;
    choice.modules.push_back(std::move(c));
  }
  return choice;
}

}  // namespace

FormatChoice choose_formats(const FormatMeasurements& measured, double budget) { return choose_with(measured, budget); }

FormatChoice cheapest_formats(const FormatMeasurements& measured) {
  return choose_with(measured, std::numeric_limits<double>::infinity());
}

std::string format_policy_text(const FormatChoice& choice, const std::string& what) {
  std::string text = "# tachyon quantize --budget: one rule per linear module, the cheapest format whose\n"
                     "# measured relative output error fits (" + what + ")\n";
  text += fmt::format("# linear weights: {} bytes as chosen, {} as stored ({:.1f} % fewer)\n", choice.bytes,
                      choice.dense_bytes,
                      choice.dense_bytes > 0 ? 100.0 * (1.0 - static_cast<double>(choice.bytes) / choice.dense_bytes) : 0.0);
  for (const ModuleChoice& m : choice.modules) {
    text += fmt::format("{:<40} {:<10} # error {:.5f}\n", m.module, m.spec ? quant_spec_name(*m.spec) : std::string("dense"),
                        m.error);
  }
  return text;
}

}  // namespace tachyon
