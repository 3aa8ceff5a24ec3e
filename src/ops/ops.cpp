// The op interface: each op checks its arguments once, with the rules that hold on every device —
// ranks, dtypes, shapes, packing, every tensor of the op on one device, the shapes of its index
// tensors, a packed weight in its quant/quantize.h layout — and then hands them to the backend of
// that device (ops/backend.h): the CPU backend (ops/cpu/backend.cpp, built in) or a registered
// device backend (ops/cuda/backend.cpp). The checks are internal invariants: the model calls these
// with tensors it built, so a mismatch is a bug and aborts with the shapes in the message. A
// backend adds only the checks of what it alone cannot do (capability checks) and, on the host,
// of the index tensors' values. Nothing here runs a kernel or reads a tensor's contents.
#include "ops/ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <initializer_list>

#include "core/ggml_blocks.h"
#include "ops/backend.h"
#include "ops/cpu/backend.h"
#include "quant/quantize.h"

namespace tachyon::ops {
namespace {

// The device backends by DeviceType (the CPU's is built in: cpu::backend()).
std::array<std::atomic<Backend*>, 2> g_backends{};

bool is_float_dtype(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// The backend that runs an op whose first tensor is `t`: that of t's device. A device without a
// running backend is a caller's bug: abort with the device named.
Backend& backend_of(const char* op, const char* name, const Tensor& t) {
  TACHYON_CHECK(t.defined(), "{}: {} is undefined", op, name);
  if (t.device().is_cpu()) return cpu::backend();
  Backend* b = g_backends[static_cast<size_t>(t.device().type)].load(std::memory_order_acquire);
  TACHYON_CHECK(b != nullptr, "{}: a tensor is on {}, and no backend for it is running", op, t.device().to_string());
  return *b;
}

// A tensor argument of an op, by name; null: an optional argument left out.
struct Arg {
  const char* name;
  const Tensor* tensor;
};

// Every tensor of an op lives on the device of its first. Checked before anything else, so that a
// tensor on the wrong device is named as such rather than by its shape.
void require_on(const char* op, Device device, std::initializer_list<Arg> args) {
  for (const Arg& a : args) {
    if (a.tensor == nullptr) continue;
    TACHYON_CHECK(a.tensor->defined(), "{}: {} is undefined", op, a.name);
    TACHYON_CHECK(a.tensor->device() == device,
                  "{}: {} is on {}, but this op runs on {} (all its tensors on one device)", op, a.name,
                  a.tensor->device().to_string(), device.to_string());
  }
}

// The tensors of a linear's weight (dense, or packed with its scales and zeros) on `device`.
void require_weight_on(const char* op, const Weight& w, Device device) {
  TACHYON_CHECK(w.defined(), "{}: weight is undefined", op);
  if (!w.quant) return require_on(op, device, {{"w", &w.dense}});
  const QuantWeight& q = *w.quant;
  require_on(op, device, {{"w.packed", &q.packed}, {"w.scales", q.scales.defined() ? &q.scales : nullptr},
                          {"w.zeros", q.zeros.defined() ? &q.zeros : nullptr}});
}

// A layer of the cache's tensors on `device`.
void require_cache_on(const char* op, const KvLayer& cache, Device device) {
  require_on(op, device, {{"k_cache", &cache.k}, {"v_cache", &cache.v},
                          {"k_scales", cache.k_scales.defined() ? &cache.k_scales : nullptr},
                          {"v_scales", cache.v_scales.defined() ? &cache.v_scales : nullptr},
                          {"hk", cache.hk.defined() ? &cache.hk : nullptr},
                          {"hv", cache.hv.defined() ? &cache.hv : nullptr},
                          {"hk_params", cache.hk_params.defined() ? &cache.hk_params : nullptr},
                          {"hv_params", cache.hv_params.defined() ? &cache.hv_params : nullptr}});
}

void require_dtype(const char* op, const char* name, const Tensor& t, DType dtype) {
  TACHYON_CHECK(t.dtype() == dtype, "{}: {} is {}, expected {}", op, name, t.shape_string(), dtype_name(dtype));
}

void require_float(const char* op, const char* name, const Tensor& t) {
  TACHYON_CHECK(is_float_dtype(t.dtype()), "{}: {} is {}, expected f32/f16/bf16", op, name, t.shape_string());
}

void require_rank(const char* op, const char* name, const Tensor& t, int rank) {
  TACHYON_CHECK(t.dim() == rank, "{}: {} is {}, expected rank {}", op, name, t.shape_string(), rank);
}

// Last dim packed (stride 1); leading dims may be strided views.
void require_last_dim_contiguous(const char* op, const char* name, const Tensor& t) {
  TACHYON_CHECK(t.dim() >= 1 && (t.stride(-1) == 1 || t.size(-1) == 1), "{}: {} {} needs stride 1 in its last dim", op,
                name, t.shape_string());
}

// Tensor::shape() builds a vector: compared size by size instead, on the path of every op.
bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int d = 0; d < a.dim(); ++d) {
    if (a.size(d) != b.size(d)) return false;
  }
  return true;
}

bool has_shape(const Tensor& t, std::initializer_list<int64_t> shape) {
  if (t.dim() != static_cast<int>(shape.size())) return false;
  int d = 0;
  for (const int64_t size : shape) {
    if (t.size(d++) != size) return false;
  }
  return true;
}

void require_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  TACHYON_CHECK(same_shape(a, b), "{}: {} {} and {} {} differ in shape", op, a_name, a.shape_string(), b_name,
                b.shape_string());
}

// An f32 activation with a packed last dim (`rank` dims; 0: any).
void require_activation(const char* op, const char* name, const Tensor& t, int rank = 0) {
  require_dtype(op, name, t, DType::kF32);
  if (rank != 0) require_rank(op, name, t, rank);
  require_last_dim_contiguous(op, name, t);
}

// A 1-D i32 index tensor of `n` entries, packed.
void require_index(const char* op, const char* name, const Tensor& t, int64_t n) {
  require_dtype(op, name, t, DType::kI32);
  TACHYON_CHECK(t.dim() == 1 && t.size(0) == n && (t.stride(0) == 1 || n <= 1), "{}: {} is {}, expected [{}] i32", op,
                name, t.shape_string(), n);
}

// A packed f32 tensor of the given shape (scales, zeros, probabilities).
void require_packed_f32(const char* op, const char* name, const Tensor& t, std::initializer_list<int64_t> shape) {
  TACHYON_CHECK(t.defined() && t.dtype() == DType::kF32 && t.is_contiguous() && has_shape(t, shape),
                "{}: {} is {}, expected [{}] f32, packed", op, name, t.defined() ? t.shape_string() : "undefined",
                fmt::join(shape, ", "));
}

// A packed weight in its quant/quantize.h layout: packed [out, ..] with a packed last dim and, per
// format, its scales and zeros.
void check_quant_weight(const char* op, const QuantWeight& q) {
  const Tensor& p = q.packed;
  const char* format = quant_format_name(q.format);
  require_rank(op, "w.packed", p, 2);
  require_last_dim_contiguous(op, "w.packed", p);
  const int64_t out = q.out_features, in = q.in_features;
  TACHYON_CHECK(p.size(0) == out && in > 0, "{}: {} weight [{}, {}] packed as {}", op, format, out, in,
                p.shape_string());
  if (q.format == QuantFormat::kInt4Group || q.format == QuantFormat::kTernary) {
    const bool int4 = q.format == QuantFormat::kInt4Group;
    const int64_t groups = q.group_size > 0 ? in / q.group_size : 0;
    TACHYON_CHECK(p.dtype() == DType::kU8 && q.group_size > 0 && in % q.group_size == 0 &&
                      p.size(1) * (int4 ? 2 : 4) == in,
                  "{}: {} weight {} (in {}, group {})", op, format, p.shape_string(), in, q.group_size);
    require_packed_f32(op, "w.scales", q.scales, {out, groups});
    if (int4) require_packed_f32(op, "w.zeros", q.zeros, {out, groups});
  } else if (is_gguf_block_format(q.format)) {
    // Q8_0 and Q6_K keep their blocks' d apart, f16 [out, blocks]; the other formats' blocks hold it.
    const bool q8_0 = q.format == QuantFormat::kGgufQ8_0, q6_k = q.format == QuantFormat::kGgufQ6_K;
    const int64_t block = gguf_block_weights(q.format);
    const int64_t blocks = in / block;
    const int64_t packed_cols = q8_0 ? in : q6_k ? blocks * kQ6_KD : gguf_row_bytes(q.format, in);
    TACHYON_CHECK(in % block == 0 && p.dtype() == (q8_0 ? DType::kI8 : DType::kU8) && p.size(1) == packed_cols &&
                      !q.zeros.defined() && q.scales.defined() == (q8_0 || q6_k),
                  "{}: {} weight {} (in {}, expected [{}, {}]) with {}", op, format, p.shape_string(), in, out,
                  packed_cols, q.scales.defined() ? "a scales tensor" : "no scales tensor");
    if (q8_0 || q6_k) {
      TACHYON_CHECK(q.scales.dtype() == DType::kF16 && has_shape(q.scales, {out, blocks}) && q.scales.is_contiguous(),
                    "{}: {} scales {} (expected [{}, {}] f16, packed)", op, format, q.scales.shape_string(), out,
                    blocks);
    }
  } else {  // per output channel: int8 (kInt8Channel, kW8A8) or fp8 codes [out, in], scales [out]
    const DType codes = q.format == QuantFormat::kFp8Channel ? DType::kF8E4M3 : DType::kI8;
    TACHYON_CHECK(p.dtype() == codes && p.size(1) == in, "{}: {} weight {} (in {})", op, format, p.shape_string(),
                  in);
    require_packed_f32(op, "w.scales", q.scales, {out});
  }
}

// linear's x [n, in] (f32) times w into `y_name` [n, out] (f32), plus bias [out].
void check_linear(const char* op, const Tensor& x, const Weight& w, const Tensor* bias, const char* y_name,
                  const Tensor& y) {
  require_activation(op, "x", x, 2);
  require_activation(op, y_name, y, 2);
  const int64_t n = x.size(0), in = x.size(1);
  int64_t out = 0;
  if (w.quant) {
    const QuantWeight& q = *w.quant;
    check_quant_weight(op, q);
    TACHYON_CHECK(q.in_features == in, "{}: x {} and the {} weight [{}, {}] disagree on in_features", op,
                  x.shape_string(), quant_format_name(q.format), q.out_features, q.in_features);
    out = q.out_features;
  } else {
    const Tensor& wd = w.dense;
    require_rank(op, "w", wd, 2);
    require_float(op, "w", wd);
    require_last_dim_contiguous(op, "w", wd);
    TACHYON_CHECK(wd.size(1) == in, "{}: x {} and w {} disagree on in_features", op, x.shape_string(),
                  wd.shape_string());
    out = wd.size(0);
  }
  TACHYON_CHECK(y.size(0) == n && y.size(1) == out, "{}: {} is {}, expected [{}, {}]", op, y_name, y.shape_string(), n,
                out);
  if (bias != nullptr) {
    require_float(op, "bias", *bias);
    TACHYON_CHECK(bias->dim() == 1 && bias->size(0) == out, "{}: bias is {}, expected [{}]", op, bias->shape_string(),
                  out);
  }
}

// rms_norm's x, weight [d] (f32/f16/bf16) and y, and add_rms_norm's residual when given: f32 rows
// of x's shape.
void check_norm(const char* op, const Tensor* residual, const Tensor& x, const Tensor& weight, const Tensor& y) {
  if (residual != nullptr) {
    require_activation(op, "residual", *residual);
    require_same_shape(op, "residual", *residual, "x", x);
  }
  require_activation(op, "x", x);
  require_activation(op, "y", y);
  require_same_shape(op, "x", x, "y", y);
  require_float(op, "weight", weight);
  TACHYON_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "{}: weight {} for x {}", op, weight.shape_string(),
                x.shape_string());
}

// rope's x [n, heads, head_dim] (f32), positions [n] and table.
void check_rope(const char* op, const char* name, const Tensor& x, const Tensor& positions, const RopeTable& table) {
  require_activation(op, name, x, 3);
  require_index(op, "positions", positions, x.size(0));
  TACHYON_CHECK(table.rotary_dim > 0 && table.rotary_dim % 2 == 0 && table.rotary_dim <= x.size(2) &&
                    table.inv_freq.size() == static_cast<size_t>(table.rotary_dim / 2),
                "{}: table with rotary_dim {} ({} frequencies) for {} {}", op, table.rotary_dim, table.inv_freq.size(),
                name, x.shape_string());
}

// store_kv's k and v [n, num_kv_heads, head_dim] (f32) into `cache` at slot_mapping [n].
void check_store_kv(const char* op, const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                    const KvLayer& cache) {
  check_kv_layer(op, cache);
  require_activation(op, "k", k, 3);
  require_activation(op, "v", v);
  require_same_shape(op, "k", k, "v", v);
  TACHYON_CHECK(k.size(1) == cache.k.size(2) && k.size(2) == cache.k.size(3), "{}: k {} for cache {}", op,
                k.shape_string(), cache.k.shape_string());
  require_index(op, "slot_mapping", slot_mapping, k.size(0));
}

// paged_attention's batch description and parameters, for q [n, num_heads, head_dim] over `cache`.
void check_attention_batch(const char* op, const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta,
                           const AttentionParams& params) {
  const int num_seqs = meta.num_seqs;
  TACHYON_CHECK(num_seqs >= 0, "{}: {} sequences", op, num_seqs);
  TACHYON_CHECK(meta.block_size == cache.k.size(1), "{}: metadata block_size {} but cache {}", op, meta.block_size,
                cache.k.shape_string());
  TACHYON_CHECK(params.sliding_window >= 0, "{}: sliding_window {}", op, params.sliding_window);
  require_index(op, "query_start", meta.query_start, num_seqs + 1);
  require_index(op, "context_lens", meta.context_lens, num_seqs);
  require_dtype(op, "block_tables", meta.block_tables, DType::kI32);
  TACHYON_CHECK(
      meta.block_tables.dim() == 2 && meta.block_tables.size(0) == num_seqs && meta.block_tables.is_contiguous(),
      "{}: block_tables {} for {} sequences", op, meta.block_tables.shape_string(), num_seqs);
  if (meta.tree_masks.defined()) {
    require_dtype(op, "tree_masks", meta.tree_masks, DType::kI64);
    TACHYON_CHECK(meta.tree_masks.dim() == 1 && meta.tree_masks.size(0) == q.size(0) && meta.tree_masks.is_contiguous(),
                  "{}: tree_masks {} for {} queries", op, meta.tree_masks.shape_string(), q.size(0));
    TACHYON_CHECK(params.sliding_window == 0, "{}: tree masks with a sliding window", op);
  }
  if (meta.sparse_budgets.defined()) {
    require_index(op, "sparse_budgets", meta.sparse_budgets, num_seqs);
    TACHYON_CHECK(meta.sparse_sink_blocks >= 0, "{}: {} sink blocks", op, meta.sparse_sink_blocks);
  }
  TACHYON_CHECK(meta.sparse_tables.defined() == meta.sparse_lens.defined(),
                "{}: sparse_tables and sparse_lens must be both defined or neither", op);
  if (meta.sparse_tables.defined()) {
    const int64_t kv_heads = cache.k.size(2);
    require_dtype(op, "sparse_tables", meta.sparse_tables, DType::kI32);
    require_dtype(op, "sparse_lens", meta.sparse_lens, DType::kI32);
    TACHYON_CHECK(has_shape(meta.sparse_tables, {num_seqs, kv_heads, meta.block_tables.size(1)}) &&
                      meta.sparse_tables.is_contiguous() && has_shape(meta.sparse_lens, {num_seqs, kv_heads}) &&
                      meta.sparse_lens.is_contiguous(),
                  "{}: sparse_tables {} and sparse_lens {} for {} sequences, {} kv heads, tables of {} columns", op,
                  meta.sparse_tables.shape_string(), meta.sparse_lens.shape_string(), num_seqs, kv_heads,
                  meta.block_tables.size(1));
    TACHYON_CHECK(params.sliding_window == 0, "{}: block-sparse attention with a sliding window of {}", op,
                  params.sliding_window);
  }
}

// linear_fused's fusion: the parts it asks for and the scratch tensors they need. The linear
// reads scratch_x (of x's shape) after a norm, and writes scratch_y [n, out] before an epilogue.
void check_fusion(const char* op, const Tensor& x, const Weight& w, const Tensor* bias, const LinearFusion& f,
                  const Tensor& y) {
  TACHYON_CHECK(!(f.add_to_output && f.swiglu), "{}: add_to_output and swiglu together", op);
  TACHYON_CHECK(f.pending_add == nullptr || f.norm_weight != nullptr, "{}: a pending add without a norm", op);
  TACHYON_CHECK(x.dim() == 2 && y.dim() == 2 && y.size(0) == x.size(0), "{}: x {} y {}", op, x.shape_string(),
                y.shape_string());
  TACHYON_CHECK(f.norm_weight == nullptr || (f.scratch_x != nullptr && same_shape(*f.scratch_x, x)),
                "{}: a norm needs scratch_x of x's shape {} (got {})", op, x.shape_string(),
                f.scratch_x != nullptr ? f.scratch_x->shape_string() : "none");
  const bool epilogue = f.add_to_output || f.swiglu;
  const int64_t out = y.size(1) * (f.swiglu ? 2 : 1);
  TACHYON_CHECK(!epilogue || (f.scratch_y != nullptr && f.scratch_y->dim() == 2 && f.scratch_y->size(0) == x.size(0) &&
                              f.scratch_y->size(1) == out),
                "{}: the epilogue needs scratch_y [{}, {}] (got {})", op, x.size(0), out,
                f.scratch_y != nullptr ? f.scratch_y->shape_string() : "none");
  if (f.pending_add != nullptr) {  // add_rms_norm(x, pending_add) into scratch_x: x is the residual stream
    check_norm(op, &x, *f.pending_add, *f.norm_weight, *f.scratch_x);
  } else if (f.norm_weight != nullptr) {
    check_norm(op, nullptr, x, *f.norm_weight, *f.scratch_x);
  }
  check_linear(op, x, w, bias, epilogue ? "scratch_y" : "y", epilogue ? *f.scratch_y : y);
  if (epilogue) require_activation(op, "y", y, 2);
}

}  // namespace

bool is_kv_cache_dtype(DType dtype) { return is_float_dtype(dtype) || is_quantized_kv_dtype(dtype); }

bool is_quantized_kv_dtype(DType dtype) { return dtype == DType::kI8 || dtype == DType::kF8E4M3; }

float quantized_kv_max(DType dtype) {
  TACHYON_CHECK(is_quantized_kv_dtype(dtype), "quantized_kv_max: {} is not a quantized cache dtype",
                dtype_name(dtype));
  return dtype == DType::kI8 ? 127.0f : kF8E4M3Max;
}

size_t kv_row_bytes(DType dtype, int64_t head_dim) {
  return static_cast<size_t>(head_dim) * dtype_size(dtype) + (is_quantized_kv_dtype(dtype) ? sizeof(float) : 0);
}

void check_kv_layer(const char* op, const KvLayer& cache) {
  const Tensor& k = cache.k;
  const Tensor& v = cache.v;
  TACHYON_CHECK(k.defined() && v.defined(), "{}: the cache's k or v is undefined", op);
  require_rank(op, "k_cache", k, 4);
  require_same_shape(op, "k_cache", k, "v_cache", v);
  TACHYON_CHECK(k.dtype() == v.dtype() && is_kv_cache_dtype(k.dtype()),
                "{}: caches {} {} and {} {} must share one of f32/f16/bf16/i8/f8e4m3", op, k.shape_string(),
                dtype_name(k.dtype()), v.shape_string(), dtype_name(v.dtype()));
  TACHYON_CHECK(k.is_contiguous() && v.is_contiguous(), "{}: caches must be contiguous", op);
  TACHYON_CHECK(k.device() == v.device(), "{}: k cache on {}, v cache on {}", op, k.device().to_string(),
                v.device().to_string());
  const bool quantized = is_quantized_kv_dtype(k.dtype());
  TACHYON_CHECK(cache.k_scales.defined() == quantized && cache.v_scales.defined() == quantized,
                "{}: a {} cache {} scales", op, dtype_name(k.dtype()), quantized ? "needs" : "takes no");
  if (quantized) {
    for (const Tensor* sc : {&cache.k_scales, &cache.v_scales}) {
      TACHYON_CHECK(has_shape(*sc, {k.size(0), k.size(1), k.size(2), 1}) && sc->dtype() == DType::kF32 &&
                        sc->is_contiguous() && sc->device() == k.device(),
                    "{}: scales {} {} on {} for cache {} on {} (expected [{}, {}, {}, 1] f32, packed)", op,
                    sc->shape_string(), dtype_name(sc->dtype()), sc->device().to_string(), k.shape_string(),
                    k.device().to_string(), k.size(0), k.size(1), k.size(2));
    }
  }
  const bool history = cache.hk.defined();
  TACHYON_CHECK(cache.hv.defined() == history && cache.hk_params.defined() == history &&
                    cache.hv_params.defined() == history,
                "{}: history pools hk/hv/hk_params/hv_params must be all defined or none", op);
  if (!history) return;
  const DType hd = cache.hk.dtype();
  TACHYON_CHECK((hd == DType::kI8 || (hd == DType::kU8 && k.size(3) % 2 == 0)) && cache.hv.dtype() == hd,
                "{}: history codes {} / {} (i8, or u8 int4 pairs for an even head_dim; head_dim {})", op,
                dtype_name(hd), dtype_name(cache.hv.dtype()), k.size(3));
  const int64_t nh = cache.hk.size(0);
  const int64_t row = hd == DType::kI8 ? k.size(3) : k.size(3) / 2;
  const int64_t params = hd == DType::kI8 ? 1 : 2;
  for (const Tensor* t : {&cache.hk, &cache.hv}) {
    TACHYON_CHECK(has_shape(*t, {nh, k.size(1), k.size(2), row}) && t->is_contiguous() && t->device() == k.device(),
                  "{}: history pool {} for cache {} (expected [{}, {}, {}, {}], packed, on {})", op, t->shape_string(),
                  k.shape_string(), nh, k.size(1), k.size(2), row, k.device().to_string());
  }
  const DType params_dtype = hd == DType::kI8 ? DType::kF32 : DType::kF16;
  for (const Tensor* t : {&cache.hk_params, &cache.hv_params}) {
    TACHYON_CHECK(has_shape(*t, {nh, k.size(1), k.size(2), params}) && t->dtype() == params_dtype &&
                      t->is_contiguous() && t->device() == k.device(),
                  "{}: history params {} {} (expected [{}, {}, {}, {}] {}, packed, on {})", op, t->shape_string(),
                  dtype_name(t->dtype()), nh, k.size(1), k.size(2), params, dtype_name(params_dtype),
                  k.device().to_string());
  }
  TACHYON_CHECK(cache.kbounds.defined() == cache.kbound_params.defined(),
                "{}: key bounds kbounds/kbound_params must be both defined or neither", op);
  if (!cache.kbounds.defined()) return;
  const int64_t groups = key_bound_groups(k.size(3));
  TACHYON_CHECK(k.size(3) % 2 == 0 && has_shape(cache.kbounds, {nh, k.size(2), 2, k.size(3) / 2}) &&
                    cache.kbounds.dtype() == DType::kU8 && cache.kbounds.is_contiguous() &&
                    cache.kbounds.device() == k.device(),
                "{}: key bounds {} {} (expected [{}, {}, 2, {}] u8, packed, on {})", op, cache.kbounds.shape_string(),
                dtype_name(cache.kbounds.dtype()), nh, k.size(2), k.size(3) / 2, k.device().to_string());
  TACHYON_CHECK(has_shape(cache.kbound_params, {nh, k.size(2), groups, 2}) &&
                    cache.kbound_params.dtype() == DType::kF32 && cache.kbound_params.is_contiguous() &&
                    cache.kbound_params.device() == k.device(),
                "{}: key bound params {} {} (expected [{}, {}, {}, 2] f32, packed, on {})", op,
                cache.kbound_params.shape_string(), dtype_name(cache.kbound_params.dtype()), nh, k.size(2), groups,
                k.device().to_string());
}

int kv_history_bits(const KvLayer& cache) {
  if (!cache.hk.defined()) return 0;
  return cache.hk.dtype() == DType::kI8 ? 8 : 4;
}

void register_backend(DeviceType type, Backend* backend) {
  TACHYON_CHECK(type != DeviceType::kCpu, "register_backend: the CPU backend is built in");
  g_backends[static_cast<size_t>(type)].store(backend, std::memory_order_release);
}

Backend* backend_for(Device device) {
  if (device.is_cpu()) return &cpu::backend();
  return g_backends[static_cast<size_t>(device.type)].load(std::memory_order_acquire);
}

Status synchronize(Device device) {
  Backend* b = backend_for(device);
  if (b == nullptr) return make_error(ErrorCode::kUnsupported, "no backend for {} is running", device.to_string());
  return b->synchronize();
}

std::string backend_info() { return cpu::backend().describe(); }

void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y, LinearMode mode) {
  constexpr const char* op = "linear";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"y", &y}, {"bias", bias}});
  require_weight_on(op, w, x.device());
  check_linear(op, x, w, bias, "y", y);
  b.linear(x, w, bias, y, mode);
}

bool linear_fused(Tensor& x, const Weight& w, const Tensor* bias, const LinearFusion& f, Tensor& y, LinearMode mode) {
  constexpr const char* op = "linear_fused";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(),
             {{"y", &y}, {"bias", bias}, {"norm_weight", f.norm_weight}, {"pending_add", f.pending_add},
              {"scratch_x", f.norm_weight != nullptr ? f.scratch_x : nullptr},
              {"scratch_y", f.add_to_output || f.swiglu ? f.scratch_y : nullptr}});
  require_weight_on(op, w, x.device());
  check_fusion(op, x, w, bias, f, y);
  if (b.try_linear_fused(x, w, bias, f, y, mode)) return false;
  // The separate ops on the same backend, the epilogue still fused where the backend can.
  const Tensor* in = &x;
  if (f.norm_weight != nullptr) {
    if (f.pending_add != nullptr) {
      b.add_rms_norm(x, *f.pending_add, *f.norm_weight, f.norm_eps, *f.scratch_x);
    } else {
      b.rms_norm(x, *f.norm_weight, f.norm_eps, *f.scratch_x);
    }
    in = f.scratch_x;
    if (f.add_to_output || f.swiglu) {
      LinearFusion epilogue = f;
      epilogue.norm_weight = nullptr;
      epilogue.pending_add = nullptr;
      if (b.try_linear_fused(*in, w, bias, epilogue, y, mode)) return false;
    }
  }
  if (!f.add_to_output && !f.swiglu) {
    b.linear(*in, w, bias, y, mode);
    return false;
  }
  b.linear(*in, w, bias, *f.scratch_y, mode);
  if (f.swiglu) {
    const int64_t half = y.size(1);
    b.silu_mul(f.scratch_y->slice(1, 0, half), f.scratch_y->slice(1, half, 2 * half), y);
    return false;
  }
  if (f.may_defer_add) return true;
  b.add(y, *f.scratch_y);
  return false;
}

void moe_route(const Tensor& logits, bool normalize, Tensor& ids, Tensor& weights) {
  constexpr const char* op = "moe_route";
  Backend& b = backend_of(op, "logits", logits);
  require_on(op, logits.device(), {{"ids", &ids}, {"weights", &weights}});
  require_activation(op, "logits", logits, 2);
  require_dtype(op, "ids", ids, DType::kI32);
  const int64_t n = logits.size(0), e = logits.size(1);
  TACHYON_CHECK(e >= 1 && e <= kMaxExperts, "{}: logits {} ({} experts, at most {})", op, logits.shape_string(), e,
                kMaxExperts);
  const int64_t max_k = std::min<int64_t>(e, kMaxExpertsPerTok);
  TACHYON_CHECK(ids.dim() == 2 && ids.size(0) == n && ids.size(1) >= 1 && ids.size(1) <= max_k && ids.is_contiguous(),
                "{}: ids {} for logits {} (packed [n, k], 1 <= k <= min(experts, {}))", op, ids.shape_string(),
                logits.shape_string(), kMaxExpertsPerTok);
  require_packed_f32(op, "weights", weights, {n, ids.size(1)});
  b.moe_route(logits, normalize, ids, weights);
}

void moe_experts(const Tensor& x, const MoeExperts& experts, const Tensor& ids, const Tensor& weights, Tensor& y,
                 LinearMode mode, Tensor* expert_tokens) {
  constexpr const char* op = "moe_experts";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"ids", &ids}, {"weights", &weights}, {"y", &y}, {"expert_tokens", expert_tokens}});
  const int ne = experts.num_experts;
  const int64_t inter = experts.inter;
  TACHYON_CHECK(ne >= 1 && ne <= kMaxExperts && inter >= 1, "{}: {} experts of {} (at most {})", op, ne, inter,
                kMaxExperts);
  for (const Weight* w : {&experts.gate, &experts.up, &experts.down}) require_weight_on(op, *w, x.device());
  require_activation(op, "x", x, 2);
  require_activation(op, "y", y, 2);
  const int64_t n = x.size(0), hidden = x.size(1);
  TACHYON_CHECK(y.size(0) == n && y.size(1) == hidden && y.raw_data() != x.raw_data(), "{}: y {} for x {}", op,
                y.shape_string(), x.shape_string());
  const auto check_stack = [&](const char* name, const Weight& w, int64_t rows, int64_t cols) {
    TACHYON_CHECK(w.out_features() == rows * ne && w.in_features() == cols,
                  "{}: {} is [{}, {}], expected [{} x {}, {}]", op, name, w.out_features(), w.in_features(), ne, rows,
                  cols);
    if (w.quant) {
      check_quant_weight(op, *w.quant);
    } else {
      require_rank(op, name, w.dense, 2);
      require_float(op, name, w.dense);
      TACHYON_CHECK(w.dense.is_contiguous(), "{}: {} {} must be packed", op, name, w.dense.shape_string());
    }
  };
  check_stack("gate", experts.gate, inter, hidden);
  check_stack("up", experts.up, inter, hidden);
  check_stack("down", experts.down, hidden, inter);
  const bool same_format =
      (experts.gate.quant != nullptr) == (experts.up.quant != nullptr) &&
      (experts.gate.quant != nullptr) == (experts.down.quant != nullptr) &&
      (experts.gate.quant ? experts.gate.quant->format == experts.up.quant->format &&
                                experts.gate.quant->format == experts.down.quant->format
                          : experts.gate.dense.dtype() == experts.up.dense.dtype() &&
                                experts.gate.dense.dtype() == experts.down.dense.dtype());
  TACHYON_CHECK(same_format, "{}: gate, up and down must share one format", op);
  require_dtype(op, "ids", ids, DType::kI32);
  TACHYON_CHECK(ids.dim() == 2 && ids.size(0) == n && ids.size(1) >= 1 && ids.size(1) <= kMaxExpertsPerTok &&
                    ids.is_contiguous(),
                "{}: ids {} for x {}", op, ids.shape_string(), x.shape_string());
  require_packed_f32(op, "weights", weights, {n, ids.size(1)});
  if (ids.device().is_cpu()) {
    const int32_t* id = ids.data<int32_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
      TACHYON_CHECK(id[i] >= 0 && id[i] < ne, "{}: ids[{}] = {} is not an expert of {}", op, i, id[i], ne);
    }
  }
  if (expert_tokens != nullptr) {
    TACHYON_CHECK(expert_tokens->dtype() == DType::kI64 && expert_tokens->is_contiguous() &&
                      expert_tokens->numel() == ne + 2,
                  "{}: expert_tokens {} for {} experts (packed [{}] i64)", op, expert_tokens->shape_string(), ne,
                  ne + 2);
  }
  b.moe_experts(x, experts, ids, weights, y, mode, expert_tokens);
}

void add_sigmoid_gated(Tensor& y, const Tensor& x, const Tensor& gate) {
  constexpr const char* op = "add_sigmoid_gated";
  Backend& b = backend_of(op, "y", y);
  require_on(op, y.device(), {{"x", &x}, {"gate", &gate}});
  require_activation(op, "y", y, 2);
  require_activation(op, "x", x, 2);
  require_activation(op, "gate", gate, 2);
  require_same_shape(op, "y", y, "x", x);
  TACHYON_CHECK(gate.size(0) == y.size(0) && gate.size(1) == 1, "{}: gate {} for y {}", op, gate.shape_string(),
                y.shape_string());
  b.add_sigmoid_gated(y, x, gate);
}

Weight weight_rows(const Weight& w, int64_t row0, int64_t rows) {
  TACHYON_CHECK(w.defined() && row0 >= 0 && rows >= 1 && row0 + rows <= w.out_features(),
                "weight_rows: rows [{}, {}) of a weight of {}", row0, row0 + rows, w.out_features());
  Weight out;
  out.constant = w.constant;
  if (!w.quant) {
    out.dense = w.dense.slice(0, row0, row0 + rows);
    return out;
  }
  auto q = std::make_shared<QuantWeight>(*w.quant);
  q->out_features = rows;
  for (Tensor* t : {&q->packed, &q->scales, &q->zeros}) {
    if (t->defined()) *t = t->slice(0, row0, row0 + rows);
  }
  out.quant = std::move(q);
  return out;
}

void add(Tensor& y, const Tensor& x) {
  constexpr const char* op = "add";
  Backend& b = backend_of(op, "y", y);
  require_on(op, y.device(), {{"x", &x}});
  require_activation(op, "y", y, 2);
  require_activation(op, "x", x);
  require_same_shape(op, "y", y, "x", x);
  b.add(y, x);
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  constexpr const char* op = "rms_norm";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"weight", &weight}, {"y", &y}});
  check_norm(op, nullptr, x, weight, y);
  b.rms_norm(x, weight, eps, y);
}

void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  constexpr const char* op = "add_rms_norm";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"residual", &residual}, {"weight", &weight}, {"y", &y}});
  check_norm(op, &residual, x, weight, y);
  b.add_rms_norm(residual, x, weight, eps, y);
}

void rope(Tensor& x, const Tensor& positions, const RopeTable& table) {
  constexpr const char* op = "rope";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"positions", &positions}});
  check_rope(op, "x", x, positions, table);
  b.rope(x, positions, table);
}

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  constexpr const char* op = "silu_mul";
  Backend& b = backend_of(op, "gate", gate);
  require_on(op, gate.device(), {{"up", &up}, {"out", &out}});
  require_activation(op, "gate", gate);
  require_activation(op, "up", up);
  require_activation(op, "out", out);
  require_same_shape(op, "gate", gate, "up", up);
  require_same_shape(op, "gate", gate, "out", out);
  b.silu_mul(gate, up, out);
}

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  constexpr const char* op = "embedding";
  Backend& b = backend_of(op, "out", out);
  require_on(op, out.device(), {{"table", &table}, {"ids", &ids}});
  require_activation(op, "out", out, 2);
  require_rank(op, "table", table, 2);
  require_float(op, "table", table);
  require_last_dim_contiguous(op, "table", table);
  TACHYON_CHECK(out.size(1) == table.size(1), "embedding: out {} for table {}", out.shape_string(),
                table.shape_string());
  require_index(op, "ids", ids, out.size(0));
  b.embedding(table, ids, out);
}

// No device backend has a softmax kernel: it runs on the host only.
void softmax(Tensor& x) {
  constexpr const char* op = "softmax";
  TACHYON_CHECK(x.defined(), "softmax: x is undefined");
  TACHYON_CHECK(x.device().is_cpu(), "softmax: x is on {}, but softmax runs on the CPU only", x.device().to_string());
  require_activation(op, "x", x);
  cpu::backend().softmax(x);
}

void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvLayer& cache) {
  constexpr const char* op = "store_kv";
  Backend& b = backend_of(op, "k", k);
  require_on(op, k.device(), {{"v", &v}, {"slot_mapping", &slot_mapping}});
  require_cache_on(op, cache, k.device());
  check_store_kv(op, k, v, slot_mapping, cache);
  b.store_kv(k, v, slot_mapping, cache);
}

void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, const RopeTable& table,
                   const Tensor& slot_mapping, KvLayer& cache) {
  constexpr const char* op = "rope_store_kv";
  Backend& b = backend_of(op, "q", q);
  require_on(op, q.device(), {{"k", &k}, {"v", &v}, {"positions", &positions}, {"slot_mapping", &slot_mapping}});
  require_cache_on(op, cache, q.device());
  check_rope(op, "q", q, positions, table);
  check_rope(op, "k", k, positions, table);
  check_store_kv(op, k, v, slot_mapping, cache);
  b.rope_store_kv(q, k, v, positions, table, slot_mapping, cache);
}

void compress_kv_blocks(const Tensor& pairs, KvLayer& cache) {
  constexpr const char* op = "compress_kv_blocks";
  Backend& b = backend_of(op, "pairs", pairs);
  require_cache_on(op, cache, pairs.device());
  check_kv_layer(op, cache);
  TACHYON_CHECK(cache.hk.defined(), "{}: the cache has no history pools", op);
  require_dtype(op, "pairs", pairs, DType::kI32);
  TACHYON_CHECK(pairs.dim() == 2 && pairs.size(1) == 2 && pairs.is_contiguous(), "{}: pairs {} (expected [m, 2] packed)",
                op, pairs.shape_string());
  if (pairs.size(0) == 0) return;
  b.compress_kv_blocks(pairs, cache);
}

void paged_attention(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta,
                     const AttentionParams& params, Tensor& out) {
  constexpr const char* op = "paged_attention";
  Backend& b = backend_of(op, "q", q);
  require_on(op, q.device(),
             {{"out", &out}, {"query_start", &meta.query_start}, {"context_lens", &meta.context_lens},
              {"block_tables", &meta.block_tables},
              {"tree_masks", meta.tree_masks.defined() ? &meta.tree_masks : nullptr},
              {"sparse_tables", meta.sparse_tables.defined() ? &meta.sparse_tables : nullptr},
              {"sparse_lens", meta.sparse_lens.defined() ? &meta.sparse_lens : nullptr}});
  require_cache_on(op, cache, q.device());
  check_kv_layer(op, cache);
  require_activation(op, "q", q, 3);
  require_activation(op, "out", out);
  require_same_shape(op, "q", q, "out", out);
  const int64_t num_heads = q.size(1), num_kv_heads = cache.k.size(2);
  TACHYON_CHECK(q.size(2) == cache.k.size(3), "paged_attention: q {} for cache {}", q.shape_string(),
                cache.k.shape_string());
  TACHYON_CHECK(num_heads % num_kv_heads == 0, "paged_attention: {} heads not a multiple of {} kv heads", num_heads,
                num_kv_heads);
  check_attention_batch(op, q, cache, meta, params);
  b.paged_attention(q, cache, meta, params, out);
}

void select_kv_blocks(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta, Tensor& tables,
                      Tensor& lens) {
  constexpr const char* op = "select_kv_blocks";
  Backend& b = backend_of(op, "q", q);
  require_on(op, q.device(),
             {{"tables", &tables}, {"lens", &lens}, {"query_start", &meta.query_start},
              {"context_lens", &meta.context_lens}, {"block_tables", &meta.block_tables},
              {"sparse_budgets", meta.sparse_budgets.defined() ? &meta.sparse_budgets : nullptr}});
  require_cache_on(op, cache, q.device());
  check_kv_layer(op, cache);
  TACHYON_CHECK(cache.kbounds.defined(), "{}: the cache keeps no key bounds", op);
  require_activation(op, "q", q, 3);
  TACHYON_CHECK(q.size(2) == cache.k.size(3) && q.size(1) % cache.k.size(2) == 0, "{}: q {} for cache {}", op,
                q.shape_string(), cache.k.shape_string());
  TACHYON_CHECK(meta.sparse_budgets.defined(), "{}: no sparse_budgets", op);
  AttentionMetadata plain = meta;
  plain.sparse_tables = Tensor();
  plain.sparse_lens = Tensor();
  check_attention_batch(op, q, cache, plain, AttentionParams{});
  const int64_t kv_heads = cache.k.size(2);
  require_dtype(op, "tables", tables, DType::kI32);
  require_dtype(op, "lens", lens, DType::kI32);
  TACHYON_CHECK(has_shape(tables, {meta.num_seqs, kv_heads, meta.block_tables.size(1)}) && tables.is_contiguous() &&
                    has_shape(lens, {meta.num_seqs, kv_heads}) && lens.is_contiguous(),
                "{}: tables {} and lens {} for {} sequences, {} kv heads, tables of {} columns", op,
                tables.shape_string(), lens.shape_string(), meta.num_seqs, kv_heads, meta.block_tables.size(1));
  if (meta.num_seqs == 0) return;
  b.select_kv_blocks(q, cache, meta, tables, lens);
}

void argmax(const Tensor& x, Tensor& ids, Tensor* logprobs) {
  constexpr const char* op = "argmax";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"ids", &ids}, {"logprobs", logprobs}});
  require_activation(op, "x", x, 2);
  require_index(op, "ids", ids, x.size(0));
  if (logprobs != nullptr) require_packed_f32(op, "logprobs", *logprobs, {x.size(0)});
  b.argmax(x, ids, logprobs);
}

void top_tokens(const Tensor& x, Tensor& ids, Tensor& probs) {
  constexpr const char* op = "top_tokens";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"ids", &ids}, {"probs", &probs}});
  require_activation(op, "x", x, 2);
  require_dtype(op, "ids", ids, DType::kI32);
  require_dtype(op, "probs", probs, DType::kF32);
  TACHYON_CHECK(ids.dim() == 2 && ids.size(0) == x.size(0) && ids.size(1) >= 1 && ids.size(1) <= kMaxTopTokens &&
                    ids.is_contiguous() && same_shape(probs, ids) && probs.is_contiguous(),
                "top_tokens: x {} ids {} probs {} (m in [1, {}])", x.shape_string(), ids.shape_string(),
                probs.shape_string(), kMaxTopTokens);
  b.top_tokens(x, ids, probs);
}

void advance_decode(const Tensor& next_ids, Tensor& token_ids, Tensor& positions, Tensor& context_lens,
                    const Tensor& block_tables, int block_size, Tensor& slot_mapping) {
  constexpr const char* op = "advance_decode";
  Backend& b = backend_of(op, "token_ids", token_ids);
  require_on(op, token_ids.device(),
             {{"next_ids", &next_ids}, {"positions", &positions}, {"context_lens", &context_lens},
              {"block_tables", &block_tables}, {"slot_mapping", &slot_mapping}});
  const int64_t n = token_ids.size(0);
  require_index(op, "next_ids", next_ids, n);
  require_index(op, "token_ids", token_ids, n);
  require_index(op, "positions", positions, n);
  require_index(op, "context_lens", context_lens, n);
  require_index(op, "slot_mapping", slot_mapping, n);
  require_dtype(op, "block_tables", block_tables, DType::kI32);
  TACHYON_CHECK(block_tables.dim() == 2 && block_tables.size(0) == n && block_tables.is_contiguous() && block_size >= 1,
                "advance_decode: block tables {} for {} sequences, block size {}", block_tables.shape_string(), n,
                block_size);
  b.advance_decode(next_ids, token_ids, positions, context_lens, block_tables, block_size, slot_mapping);
}

void sample(const Tensor& x, const Tensor& params, Tensor& ids, Tensor& logprobs, Tensor* probs) {
  constexpr const char* op = "sample";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"params", &params}, {"ids", &ids}, {"logprobs", &logprobs}, {"probs", probs}});
  const int64_t n = x.size(0);
  require_activation(op, "x", x, 2);
  require_index(op, "ids", ids, n);
  require_packed_f32(op, "params", params, {n, kSampleParams});
  require_packed_f32(op, "logprobs", logprobs, {n});
  if (probs != nullptr) require_packed_f32(op, "probs", *probs, {n, x.size(1)});
  b.sample(x, params, ids, logprobs, probs);
}

void adjust_logits(Tensor& x, const Tensor& edits) {
  constexpr const char* op = "adjust_logits";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"edits", &edits}});
  require_activation(op, "x", x, 2);
  require_dtype(op, "edits", edits, DType::kF32);
  TACHYON_CHECK(edits.dim() == 2 && edits.size(1) == kLogitEditColumns && edits.is_contiguous(),
                "adjust_logits: edits {} must be [m, {}] and contiguous", edits.shape_string(), kLogitEditColumns);
  b.adjust_logits(x, edits);
}

void mask_logits(Tensor& x, const Tensor& masks) {
  constexpr const char* op = "mask_logits";
  Backend& b = backend_of(op, "x", x);
  require_on(op, x.device(), {{"masks", &masks}});
  require_activation(op, "x", x, 2);
  require_dtype(op, "masks", masks, DType::kI32);
  TACHYON_CHECK(masks.dim() == 2 && masks.size(1) == token_mask_columns(x.size(1)) && masks.is_contiguous(),
                "mask_logits: masks {} must be [m, {}] and contiguous for x {}", masks.shape_string(),
                token_mask_columns(x.size(1)), x.shape_string());
  b.mask_logits(x, masks);
}

void quantize_int8_rows(const Tensor& w, Tensor& packed, Tensor& scales) {
  constexpr const char* op = "quantize_int8_rows";
  Backend& b = backend_of(op, "w", w);
  require_on(op, w.device(), {{"packed", &packed}, {"scales", &scales}});
  require_rank(op, "w", w, 2);
  require_float(op, "w", w);
  require_last_dim_contiguous(op, "w", w);
  TACHYON_CHECK(packed.dtype() == DType::kI8 && same_shape(packed, w) && packed.is_contiguous(),
                "quantize_int8_rows: w {} packed {} (expected i8 of w's shape, packed)", w.shape_string(),
                packed.shape_string());
  require_packed_f32(op, "scales", scales, {w.size(0)});
  b.quantize_int8_rows(w, packed, scales);
}

void quantize_int4_groups(const Tensor& w, int group, bool f16_scales, Tensor& packed, Tensor& scales, Tensor& zeros) {
  constexpr const char* op = "quantize_int4_groups";
  Backend& b = backend_of(op, "w", w);
  require_on(op, w.device(), {{"packed", &packed}, {"scales", &scales}, {"zeros", &zeros}});
  require_rank(op, "w", w, 2);
  require_float(op, "w", w);
  require_last_dim_contiguous(op, "w", w);
  const int64_t out = w.size(0), in = w.size(1);
  TACHYON_CHECK((group == 32 || group == 64 || group == 128) && in % group == 0,
                "quantize_int4_groups: group {} for w {} (32, 64 or 128, dividing in)", group, w.shape_string());
  TACHYON_CHECK(packed.dtype() == DType::kU8 && has_shape(packed, {out, in / 2}) && packed.is_contiguous(),
                "quantize_int4_groups: w {} packed {} (expected [{}, {}] u8, packed)", w.shape_string(),
                packed.shape_string(), out, in / 2);
  require_packed_f32(op, "scales", scales, {out, in / group});
  require_packed_f32(op, "zeros", zeros, {out, in / group});
  b.quantize_int4_groups(w, group, f16_scales, packed, scales, zeros);
}

void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float bound, float offset) {
  constexpr const char* op = "fill_uniform";
  Backend& b = backend_of(op, "t", t);
  require_float(op, "t", t);
  TACHYON_CHECK(t.is_contiguous(), "fill_uniform: {} must be contiguous", t.shape_string());
  b.fill_uniform(t, seed, stream, bound, offset);
}

}  // namespace tachyon::ops
