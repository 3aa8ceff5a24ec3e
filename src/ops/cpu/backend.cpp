// The CPU backend (backend.h): unwraps the checked Tensors of each op into the kernels of
// kernels.h and quant_linear.h, or hands them to the scalar reference while the active ISA is
// kScalar. The ops with no separate kernel file (argmax, top_tokens, sample, adjust_logits,
// advance_decode, the quantizers) are plain loops here. Never called with tensors off the host.
#include "ops/cpu/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "ops/errors.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/quant_linear.h"
#include "ops/cpu/reference.h"
#include "ops/cpu/rows.h"
#include "quant/quantize.h"

namespace tachyon::ops::cpu {
namespace {

constinit CpuBackend g_backend;

// The first error an op on this thread raised since the last take_error() (ops/errors.h).
thread_local Status t_error;

void record_error(const Status& status) {
  if (!status.ok() && t_error.ok()) t_error = status;
}

bool use_reference(const char* op) {
  if (active_isa() != Isa::kScalar) return false;
  log_path_once("{}: scalar reference", op);
  return true;
}

// An f32 packed copy of a small parameter vector (norm weight, bias) if it is not one already.
Tensor as_f32_vector(const Tensor& t) {
  if (t.dtype() == DType::kF32 && (t.stride(0) == 1 || t.size(0) <= 1)) return t;
  return t.to_f32();
}

// linear with a packed weight: any QuantFormat. Calls of fewer than kQuantGemmMinTokens tokens
// do not depend on the batch; longer ones multiply the weights decoded to f32 panels (exact
// activations), unless the mode asks for batch-invariant outputs.
void linear_quantized(const Tensor& x, const QuantWeight& w, const Tensor* bias32, Tensor& y, LinearMode mode) {
  if (use_reference("linear")) {
    quant_linear_reference(x, w, bias32, y);
    return;
  }
  log_path_once("linear: avx2 {}", quant_format_name(w.format));
  QuantLinearArgs a;
  a.x = x.data<float>();
  a.x_stride = x.stride(0);
  a.w = &w;
  a.bias = bias32 != nullptr ? bias32->data<float>() : nullptr;
  a.y = y.data<float>();
  a.y_stride = y.stride(0);
  a.n = x.size(0);
  a.batch_invariant = mode == LinearMode::kBatchInvariant;
  quant_linear(a);
}

// Value checks of paged attention's batch, which only the host can read: query rows partition
// [0, n), every context holds its queries, every block a query can see is a block of the cache,
// and each tree mask holds its own query and no later key.
void check_batch_values(const AttentionMetadata& meta, const AttentionParams& params, const KvCacheView& cache,
                        int64_t n) {
  const int num_seqs = meta.num_seqs;
  const int32_t* query_start = meta.query_start.data<int32_t>();
  const int32_t* context_lens = meta.context_lens.data<int32_t>();
  const int32_t* block_tables = meta.block_tables.data<int32_t>();
  const int64_t max_blocks = meta.block_tables.size(1);
  TACHYON_CHECK(num_seqs == 0 || query_start[0] == 0, "paged_attention: query_start[0] = {}", query_start[0]);
  TACHYON_CHECK(query_start[num_seqs] == n, "paged_attention: query_start[{}] = {} but q has {} rows", num_seqs,
                query_start[num_seqs], n);
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t q_len = query_start[s + 1] - query_start[s];
    TACHYON_CHECK(q_len >= 0 && q_len <= context_lens[s], "paged_attention: seq {} has {} queries, context {}", s,
                  q_len, context_lens[s]);
    if (q_len == 0) continue;
    const int64_t blocks = (context_lens[s] + cache.block_size - 1) / cache.block_size;
    TACHYON_CHECK(blocks <= max_blocks, "paged_attention: seq {} needs {} blocks, table holds {}", s, blocks,
                  max_blocks);
    // With a sliding window, blocks wholly before the first query's window are never read (a
    // block manager may have released them).
    const int64_t first_pos = context_lens[s] - q_len;
    const int64_t first_key =
        params.sliding_window > 0 ? std::max<int64_t>(0, first_pos - params.sliding_window + 1) : 0;
    for (int64_t b = first_key / cache.block_size; b < blocks; ++b) {
      const int32_t block = block_tables[s * max_blocks + b];
      TACHYON_CHECK(block >= 0 && block < cache.num_blocks + cache.num_history_blocks,
                    "paged_attention: seq {} block {} -> {} (cache has {}, and {} history blocks)", s, b, block,
                    cache.num_blocks, cache.num_history_blocks);
    }
  }
  if (meta.sparse_tables.defined()) {
    const int32_t* tables = meta.sparse_tables.data<int32_t>();
    const int32_t* lens = meta.sparse_lens.data<int32_t>();
    for (int s = 0; s < num_seqs; ++s) {
      if (query_start[s + 1] == query_start[s]) continue;
      for (int64_t h = 0; h < cache.num_kv_heads; ++h) {
        const int64_t len = lens[s * cache.num_kv_heads + h];
        TACHYON_CHECK(len >= 1 && len <= context_lens[s] && (len + cache.block_size - 1) / cache.block_size <= max_blocks,
                      "paged_attention: seq {} kv head {} keeps {} of {} positions", s, h, len, context_lens[s]);
        for (int64_t b = 0; b < (len + cache.block_size - 1) / cache.block_size; ++b) {
          const int32_t block = tables[(s * cache.num_kv_heads + h) * max_blocks + b];
          TACHYON_CHECK(block >= 0 && block < cache.num_blocks + cache.num_history_blocks,
                        "paged_attention: seq {} kv head {} keeps block {}", s, h, block);
        }
      }
    }
  }
  if (!meta.tree_masks.defined()) return;
  const auto* tree_masks = static_cast<const uint64_t*>(meta.tree_masks.raw_data());
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t q_len = query_start[s + 1] - query_start[s];
    for (int64_t t = 0; t < q_len; ++t) {
      const uint64_t mask = tree_masks[query_start[s] + t];
      if (mask == ~uint64_t{0}) continue;  // causal
      TACHYON_CHECK(q_len <= kMaxTreeTokens, "paged_attention: a tree chunk of {} queries (at most {})", q_len,
                    kMaxTreeTokens);
      TACHYON_CHECK((mask >> t & 1) != 0 && (t == kMaxTreeTokens - 1 || mask >> (t + 1) == 0),
                    "paged_attention: seq {} query {}: tree mask {:#x} must hold the query and no later key", s, t,
                    mask);
    }
  }
}

}  // namespace

CpuBackend& backend() { return g_backend; }

std::string CpuBackend::describe() const {
  const Isa active = active_isa();
  const Isa detected = detected_isa();
  std::string line = fmt::format("cpu kernels: {}", isa_name(active));
  if (active != detected) line += fmt::format(" (forced; CPU supports {})", isa_name(detected));
  return line;
}

void CpuBackend::linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y, LinearMode mode) {
  constexpr const char* op = "linear";
  if (detail::consume_fault(DeviceType::kCpu, Fault::kKernel)) {
    return record_error(detail::injected_error(Fault::kKernel, op));
  }
  const Tensor bias32 = bias != nullptr ? as_f32_vector(*bias) : Tensor();
  const Tensor* b32 = bias != nullptr ? &bias32 : nullptr;
  if (w.quant) return linear_quantized(x, *w.quant, b32, y, mode);
  if (use_reference(op)) {
    reference::linear(x, w, b32, y);
    return;
  }
  const Tensor& wd = w.dense;
  LinearArgs a;
  a.x = x.data<float>();
  a.x_stride = x.stride(0);
  a.w = wd.raw_data();
  a.w_dtype = wd.dtype();
  a.w_stride = wd.stride(0);
  a.bias = b32 != nullptr ? b32->data<float>() : nullptr;
  a.y = y.data<float>();
  a.y_stride = y.stride(0);
  a.n = x.size(0);
  a.in = x.size(1);
  a.out = wd.size(0);
  if (mode == LinearMode::kBatchInvariant) {
    // Every token through the batch-1 GEMV tile: each output's summation order depends only on
    // the weight's shape. One pass over the weight rows serves all tokens (rows stay in L1).
    a.per_token = true;
    cpu::linear(a, LinearAlgo::kGemv);
    return;
  }
  cpu::linear(a);
}

void CpuBackend::add(Tensor& y, const Tensor& x) {
  const int64_t n = y.size(0), d = y.size(1);
  for (int64_t t = 0; t < n; ++t) {
    float* yr = y.data<float>() + t * y.stride(0);
    const float* xr = x.data<float>() + t * x.stride(0);
    for (int64_t i = 0; i < d; ++i) yr[i] += xr[i];
  }
}

// The router is a few dozen values per token: the reference is the kernel.
void CpuBackend::moe_route(const Tensor& logits, bool normalize, Tensor& ids, Tensor& weights) {
  reference::moe_route(logits, normalize, ids, weights);
}

// Tokens grouped by expert (a counting sort of the (token, choice) slots), each expert's rows of
// the stacked weights run once over its group through this backend's linear, then each token's
// results summed in choice order.
void CpuBackend::moe_experts(const Tensor& x, const MoeExperts& experts, const Tensor& ids, const Tensor& weights,
                             Tensor& y, LinearMode mode, Tensor* expert_tokens) {
  const int64_t n = x.size(0), hidden = x.size(1), k = ids.size(1), inter = experts.inter, slots = n * k;
  const int ne = experts.num_experts;
  const int32_t* id = ids.data<int32_t>();
  if (expert_tokens != nullptr) {
    int64_t* c = expert_tokens->data<int64_t>();
    std::vector<bool> chosen(static_cast<size_t>(ne), false);
    for (int64_t s = 0; s < slots; ++s) {
      ++c[id[s]];
      c[ne] += chosen[static_cast<size_t>(id[s])] ? 0 : 1;
      chosen[static_cast<size_t>(id[s])] = true;
    }
    ++c[ne + 1];
  }
  if (use_reference("moe_experts")) {
    reference::moe_experts(x, experts, ids, weights, y);
    return;
  }
  std::vector<int64_t> start(static_cast<size_t>(ne) + 1, 0);
  for (int64_t s = 0; s < slots; ++s) ++start[static_cast<size_t>(id[s]) + 1];
  for (int e = 0; e < ne; ++e) start[static_cast<size_t>(e) + 1] += start[static_cast<size_t>(e)];
  std::vector<int64_t> row_of(static_cast<size_t>(slots));  // slot -> its row in expert order
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t s = 0; s < slots; ++s) row_of[static_cast<size_t>(s)] = next[static_cast<size_t>(id[s])]++;
  }
  Tensor xs = Tensor::empty({slots, hidden}, DType::kF32);
  Tensor gate = Tensor::empty({slots, inter}, DType::kF32), up = Tensor::empty({slots, inter}, DType::kF32);
  Tensor out = Tensor::empty({slots, hidden}, DType::kF32);
  for (int64_t s = 0; s < slots; ++s) {
    std::memcpy(xs.data<float>() + row_of[static_cast<size_t>(s)] * hidden, x.data<float>() + (s / k) * x.stride(0),
                static_cast<size_t>(hidden) * sizeof(float));
  }
  for (int e = 0; e < ne; ++e) {
    const int64_t r0 = start[static_cast<size_t>(e)], r1 = start[static_cast<size_t>(e) + 1];
    if (r0 == r1) continue;
    const Tensor xe = xs.slice(0, r0, r1);
    Tensor ge = gate.slice(0, r0, r1), ue = up.slice(0, r0, r1);
    linear(xe, weight_rows(experts.gate, e * inter, inter), nullptr, ge, mode);
    linear(xe, weight_rows(experts.up, e * inter, inter), nullptr, ue, mode);
  }
  silu_mul(gate, up, gate);
  for (int e = 0; e < ne; ++e) {
    const int64_t r0 = start[static_cast<size_t>(e)], r1 = start[static_cast<size_t>(e) + 1];
    if (r0 == r1) continue;
    Tensor oe = out.slice(0, r0, r1);
    linear(gate.slice(0, r0, r1), weight_rows(experts.down, e * hidden, hidden), nullptr, oe, mode);
  }
  const float* w = weights.data<float>();
  for (int64_t t = 0; t < n; ++t) {
    float* yt = y.data<float>() + t * y.stride(0);
    for (int64_t j = 0; j < k; ++j) {
      const float wj = w[t * k + j];
      const float* o = out.data<float>() + row_of[static_cast<size_t>(t * k + j)] * hidden;
      if (j == 0) {
        for (int64_t i = 0; i < hidden; ++i) yt[i] = wj * o[i];
      } else {
        for (int64_t i = 0; i < hidden; ++i) yt[i] += wj * o[i];
      }
    }
  }
}

void CpuBackend::add_sigmoid_gated(Tensor& y, const Tensor& x, const Tensor& gate) {
  const int64_t n = y.size(0), d = y.size(1);
  for (int64_t t = 0; t < n; ++t) {
    const float s = 1.0f / (1.0f + std::exp(-gate.data<float>()[t * gate.stride(0)]));
    float* yt = y.data<float>() + t * y.stride(0);
    const float* xt = x.data<float>() + t * x.stride(0);
    for (int64_t i = 0; i < d; ++i) yt[i] += s * xt[i];
  }
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  const Tensor w32 = as_f32_vector(weight);
  if (use_reference("rms_norm")) {
    reference::rms_norm(x, w32, eps, y);
    return;
  }
  cpu::rms_norm(x.data<float>(), row_layout(x), w32.data<float>(), eps, y.data<float>(), row_layout(y));
}

void CpuBackend::add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  const Tensor w32 = as_f32_vector(weight);
  if (use_reference("add_rms_norm")) {
    reference::add_rms_norm(residual, x, w32, eps, y);
    return;
  }
  cpu::add_rms_norm(residual.data<float>(), row_layout(residual), x.data<float>(), row_layout(x), w32.data<float>(),
                    eps, y.data<float>(), row_layout(y));
}

void CpuBackend::rope(Tensor& x, const Tensor& positions, const RopeTable& table) {
  if (use_reference("rope")) {
    reference::rope(x, positions, table);
    return;
  }
  cpu::rope(x.data<float>(), x.size(0), x.size(1), x.stride(0), x.stride(1), positions.data<int32_t>(), table);
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  if (use_reference("silu_mul")) {
    reference::silu_mul(gate, up, out);
    return;
  }
  cpu::silu_mul(gate.data<float>(), row_layout(gate), up.data<float>(), row_layout(up), out.data<float>(),
                row_layout(out));
}

void CpuBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t n = out.size(0), vocab = table.size(0), d = table.size(1);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t t = 0; t < n; ++t) {
    TACHYON_CHECK(id[t] >= 0 && id[t] < vocab, "embedding: ids[{}] = {} outside the vocabulary of {}", t, id[t], vocab);
  }
  if (use_reference("embedding")) {
    reference::embedding(table, ids, out);
    return;
  }
  cpu::embedding(table.raw_data(), table.dtype(), table.stride(0), d, id, n, out.data<float>(), out.stride(0));
}

void CpuBackend::softmax(Tensor& x) {
  if (use_reference("softmax")) {
    reference::softmax(x);
    return;
  }
  cpu::softmax(x.data<float>(), row_layout(x));
}

void CpuBackend::store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvLayer& layer) {
  const KvCacheView cache = kv_cache_view(layer);
  const int64_t n = k.size(0);
  const int32_t* slots = slot_mapping.data<int32_t>();
  const int64_t num_slots = cache.num_blocks * cache.block_size;
  for (int64_t t = 0; t < n; ++t) {
    TACHYON_CHECK(slots[t] < num_slots, "store_kv: slot_mapping[{}] = {} past the cache's {} slots", t, slots[t],
                  num_slots);
  }
  if (use_reference("store_kv")) {
    reference::store_kv(k, v, slot_mapping, layer);
    return;
  }
  cpu::store_kv(k.data<float>(), k.stride(0), k.stride(1), v.data<float>(), v.stride(0), v.stride(1), n, slots, cache);
}

void CpuBackend::compress_kv_blocks(const Tensor& pairs, KvLayer& cache) {
  // Once per block leaving the window: the scalar rows are cheap beside the forward that wrote them.
  reference::compress_kv_blocks(pairs, cache);
}

void CpuBackend::select_kv_blocks(const Tensor& q, const KvLayer& layer, const AttentionMetadata& meta,
                                  Tensor& tables, Tensor& lens) {
  const KvCacheView cache = kv_cache_view(layer);
  AttentionMetadata plain = meta;
  plain.sparse_tables = Tensor();
  plain.sparse_lens = Tensor();
  check_batch_values(plain, AttentionParams{}, cache, q.size(0));
  // Once per layer and decode step, over the history blocks' 2 x head_dim bound codes: small beside
  // the attention that follows, so the scalar definition serves.
  reference::select_kv_blocks(q, layer, meta, tables, lens);
}

void CpuBackend::paged_attention(const Tensor& q, const KvLayer& layer, const AttentionMetadata& meta,
                                 const AttentionParams& params, Tensor& out) {
  if (detail::consume_fault(DeviceType::kCpu, Fault::kWorkspace)) {
    return record_error(detail::injected_error(Fault::kWorkspace, "attention workspace"));
  }
  const KvCacheView cache = kv_cache_view(layer);
  const int64_t n = q.size(0);
  check_batch_values(meta, params, cache, n);
  if (n == 0) return;
  if (use_reference("paged_attention")) {
    reference::paged_attention(q, layer, meta, params, out);
    return;
  }
  const AttentionBatch batch = attention_batch(meta);
  cpu::paged_attention(q.data<float>(), q.stride(0), q.stride(1), q.size(1), cache, batch, params, out.data<float>(),
                       out.stride(0), out.stride(1));
}

void CpuBackend::argmax(const Tensor& x, Tensor& ids, Tensor* logprobs) {
  const int64_t n = x.size(0), d = x.size(1);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x.data<float>() + r * x.stride(0);
    int64_t best = 0;
    float best_v = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < d; ++j) {
      if (std::isfinite(row[j]) && row[j] > best_v) {  // the first of equal maxima
        best_v = row[j];
        best = j;
      }
    }
    ids.data<int32_t>()[r] = static_cast<int32_t>(best);
    if (logprobs != nullptr) {
      double sum = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        if (std::isfinite(row[j])) sum += std::exp(static_cast<double>(row[j]) - best_v);
      }
      logprobs->data<float>()[r] =
          std::isfinite(best_v) ? static_cast<float>(-std::log(sum)) : -std::numeric_limits<float>::infinity();
    }
  }
}

void CpuBackend::top_tokens(const Tensor& x, Tensor& ids, Tensor& probs) {
  const int64_t n = x.size(0), d = x.size(1), m = ids.size(1);
  std::vector<int32_t> order;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x.data<float>() + r * x.stride(0);
    order.clear();
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < d; ++j) {
      if (!std::isfinite(row[j])) continue;
      order.push_back(static_cast<int32_t>(j));
      top = std::max(top, row[j]);
    }
    double sum = 0.0;
    for (const int32_t j : order) sum += std::exp(static_cast<double>(row[j]) - top);
    const size_t kept = std::min(order.size(), static_cast<size_t>(m));
    std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(kept), order.end(),
                      [row](int32_t a, int32_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
    int32_t* out_ids = ids.data<int32_t>() + r * m;
    float* out_probs = probs.data<float>() + r * m;
    for (int64_t i = 0; i < m; ++i) {
      const bool have = static_cast<size_t>(i) < kept;
      out_ids[i] = have ? order[static_cast<size_t>(i)] : -1;
      out_probs[i] = have ? static_cast<float>(std::exp(static_cast<double>(row[out_ids[i]]) - top) / sum) : 0.0f;
    }
  }
}

void CpuBackend::advance_decode(const Tensor& next_ids, Tensor& token_ids, Tensor& positions, Tensor& context_lens,
                                const Tensor& block_tables, int block_size, Tensor& slot_mapping) {
  const int64_t n = token_ids.size(0), columns = block_tables.size(1);
  for (int64_t s = 0; s < n; ++s) {
    const int32_t p = positions.data<int32_t>()[s] + 1;
    const int64_t column = p / block_size;
    const int32_t block = column < columns ? block_tables.data<int32_t>()[s * columns + column] : -1;
    TACHYON_CHECK(block >= 0, "advance_decode: sequence {} has no block for position {}", s, p);
    token_ids.data<int32_t>()[s] = next_ids.data<int32_t>()[s];
    positions.data<int32_t>()[s] = p;
    context_lens.data<int32_t>()[s] += 1;
    slot_mapping.data<int32_t>()[s] = block * block_size + p % block_size;
  }
}

void CpuBackend::sample(const Tensor& x, const Tensor& params, Tensor& ids, Tensor& logprobs, Tensor* probs) {
  // The plain form of the contract in ops.h: the ranking is a full sort, each filter a loop.
  const int64_t n = x.size(0), d = x.size(1);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> t(static_cast<size_t>(d)), w(static_cast<size_t>(d));
  std::vector<uint8_t> kept(static_cast<size_t>(d));
  std::vector<int64_t> ranked;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x.data<float>() + r * x.stride(0);
    const float* p = params.data<float>() + r * kSampleParams;
    const float temperature = p[0], min_p = p[1], top_p = p[5];
    const double u = static_cast<double>(p[2]) + static_cast<double>(p[3]);
    const int64_t top_k = static_cast<int64_t>(p[4]);
    int64_t best = 0;
    float m = kNegInf;
    for (int64_t j = 0; j < d; ++j) {
      if (std::isfinite(row[j]) && row[j] > m) {
        m = row[j];
        best = j;
      }
    }
    float* q = probs != nullptr ? probs->data<float>() + r * d : nullptr;
    if (q != nullptr) std::fill(q, q + d, 0.0f);
    if (m == kNegInf) {
      ids.data<int32_t>()[r] = 0;
      logprobs.data<float>()[r] = kNegInf;
      continue;
    }
    const float scale = 1.0f / (temperature == 0.0f ? 1.0f : temperature);
    double all = 0.0;
    ranked.clear();
    for (int64_t j = 0; j < d; ++j) {
      const bool finite = std::isfinite(row[j]);
      t[j] = finite ? (row[j] - m) * scale : kNegInf;
      w[j] = finite ? std::exp(t[j]) : 0.0f;
      all += w[j];
      kept[j] = finite;
      if (finite) ranked.push_back(j);
    }
    int64_t token = best;
    if (temperature != 0.0f) {
      const bool use_k = top_k > 0 && top_k < d, use_p = top_p < 1.0f;
      if (use_k || use_p) {
        std::sort(ranked.begin(), ranked.end(), [&](int64_t a, int64_t b) { return t[a] > t[b] || (t[a] == t[b] && a < b); });
        if (use_k && static_cast<int64_t>(ranked.size()) > top_k) {
          for (size_t i = static_cast<size_t>(top_k); i < ranked.size(); ++i) kept[ranked[i]] = 0;
          ranked.resize(static_cast<size_t>(top_k));
        }
        if (use_p) {
          double mass = 0.0;
          for (int64_t j : ranked) mass += w[j];
          const double target = static_cast<double>(top_p) * mass * (1.0 - 1e-6);
          double cumulative = 0.0;
          size_t i = 0;
          while (i < ranked.size() && cumulative < target) cumulative += w[ranked[i++]];
          for (; i < ranked.size(); ++i) kept[ranked[i]] = 0;
        }
      }
      double kept_mass = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        if (kept[j] && w[j] < min_p) kept[j] = 0;
        if (kept[j]) kept_mass += w[j];
      }
      const double target = u * kept_mass;
      double cumulative = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        if (!kept[j]) continue;
        cumulative += w[j];
        if (cumulative > target && w[j] > 0.0f) {
          token = j;
          break;
        }
      }
      if (q != nullptr) {
        const auto inv = static_cast<float>(1.0 / kept_mass);
        for (int64_t j = 0; j < d; ++j) q[j] = kept[j] ? w[j] * inv : 0.0f;
      }
    } else if (q != nullptr) {
      q[best] = 1.0f;
    }
    ids.data<int32_t>()[r] = static_cast<int32_t>(token);
    logprobs.data<float>()[r] = static_cast<float>((row[token] - m) * scale - std::log(all));
  }
}

void CpuBackend::adjust_logits(Tensor& x, const Tensor& edits) {
  for (int64_t e = 0; e < edits.size(0); ++e) {
    const float* p = edits.data<float>() + e * kLogitEditColumns;
    const auto row = static_cast<int64_t>(p[0]), token = static_cast<int64_t>(p[1]);
    TACHYON_CHECK(row >= 0 && row < x.size(0) && token >= 0 && token < x.size(1),
                  "adjust_logits: edit {} names ({}, {}) outside x {}", e, p[0], p[1], x.shape_string());
    float& v = x.data<float>()[row * x.stride(0) + token];
    float y = v + p[2];
    y = y > 0.0f ? y / p[3] : y * p[3];
    v = y - p[4];
  }
}

void CpuBackend::mask_logits(Tensor& x, const Tensor& masks) {
  const int64_t d = x.size(1), columns = masks.size(1);
  for (int64_t m = 0; m < masks.size(0); ++m) {
    const int32_t* mask = masks.data<int32_t>() + m * columns;
    const int64_t row = mask[0];
    TACHYON_CHECK(row >= 0 && row < x.size(0), "mask_logits: mask {} names row {} of x {}", m, row, x.shape_string());
    float* v = x.data<float>() + row * x.stride(0);
    for (int64_t t = 0; t < d; ++t) {
      const bool allowed = (static_cast<uint32_t>(mask[1 + t / 32]) >> (t % 32)) & 1u;
      if (!allowed) v[t] = -std::numeric_limits<float>::infinity();
    }
  }
}

void CpuBackend::quantize_int8_rows(const Tensor& w, Tensor& packed, Tensor& scales) {
  const int64_t out = w.size(0), in = w.size(1);
  const Tensor wf = w.to_f32();
  for (int64_t o = 0; o < out; ++o) {
    const float* row = wf.data<float>() + o * in;
    float max_abs = 0.0f;
    for (int64_t i = 0; i < in; ++i) max_abs = std::max(max_abs, std::fabs(row[i]));
    const float scale = max_abs / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t i = 0; i < in; ++i) {
      packed.data<int8_t>()[o * in + i] = static_cast<int8_t>(std::clamp(std::nearbyint(row[i] * inv), -127.0f, 127.0f));
    }
    scales.data<float>()[o] = scale;
  }
}

void CpuBackend::quantize_int4_groups(const Tensor& w, int group, bool f16_scales, Tensor& packed, Tensor& scales,
                                      Tensor& zeros) {
  // The host's quantizer is the definition; the op copies its result into the caller's tensors.
  // On the host a non-finite weight (or a group too wide for f16 scales) is an error.
  Result<QuantWeight> q = quantize_int4_group(w, group, f16_scales ? Int4Scales::kF16 : Int4Scales::kF32);
  TACHYON_CHECK(q.ok(), "quantize_int4_groups: {}", q.status().message());
  std::copy_n(q->packed.data<uint8_t>(), q->packed.numel(), packed.data<uint8_t>());
  std::copy_n(q->scales.data<float>(), q->scales.numel(), scales.data<float>());
  std::copy_n(q->zeros.data<float>(), q->zeros.numel(), zeros.data<float>());
}

void CpuBackend::fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float bound, float offset) {
  cpu::fill_uniform(t.raw_data(), t.dtype(), t.numel(), seed, stream, bound, offset);
}

Status CpuBackend::take_error() { return std::exchange(t_error, Status::Ok()); }

Status CpuBackend::begin_capture() {
  return make_error(ErrorCode::kUnsupported, "the CPU backend records no graphs: its ops run as they are called");
}

Result<std::shared_ptr<void>> CpuBackend::end_capture() {
  return make_error(ErrorCode::kUnsupported, "the CPU backend records no graphs: its ops run as they are called");
}

Status CpuBackend::replay(const std::shared_ptr<void>&) {
  return make_error(ErrorCode::kUnsupported, "the CPU backend records no graphs: its ops run as they are called");
}

}  // namespace tachyon::ops::cpu
