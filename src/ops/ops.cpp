// The op interface: argument checks (internal invariants — the model calls these with tensors it
// built, so a mismatch is a bug and aborts with the shapes in the message), then dispatch on the
// tensors' device to a backend. CPU: the SIMD kernels of ops/cpu, or the scalar reference when
// the active ISA is kScalar. Tensors on a device go to that device's registered Backend
// (ops/backend.h), which checks them itself.
#include "ops/ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/backend.h"
#include "ops/errors.h"

#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/quant_linear.h"
#include "ops/cpu/reference.h"
#include "ops/cpu/rows.h"
#include "quant/quantize.h"

namespace tachyon {
namespace {

std::array<std::atomic<ops::Backend*>, 2> g_backends{};

// The backend of `t`'s device, or null when t is on the host. A device without a running
// backend is a caller's bug: abort with the device named.
ops::Backend* device_backend(const char* op, const Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return nullptr;
  ops::Backend* b = ops::backend_for(t.device());
  TACHYON_CHECK(b != nullptr, "{}: a tensor is on {}, and no backend for it is running", op, t.device().to_string());
  return b;
}

// Every tensor of a CPU op lives on the CPU (an op runs where its first tensor is; softmax has
// no device kernel).
void require_cpu(const char* op, const char* name, const Tensor& t) {
  TACHYON_CHECK(t.defined(), "{}: {} is undefined", op, name);
  TACHYON_CHECK(t.device().is_cpu(), "{}: {} is on {}, but this op runs on the CPU (all its tensors on one device)",
                op, name, t.device().to_string());
}

void require_dtype(const char* op, const char* name, const Tensor& t, DType dtype) {
  TACHYON_CHECK(t.dtype() == dtype, "{}: {} is {}, expected {}", op, name, t.shape_string(), dtype_name(dtype));
}

bool is_float_dtype(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

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

void require_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  TACHYON_CHECK(a.shape() == b.shape(), "{}: {} {} and {} {} differ in shape", op, a_name, a.shape_string(), b_name,
                b.shape_string());
}

// A 1-D i32 index tensor of `n` entries, packed.
void require_index(const char* op, const char* name, const Tensor& t, int64_t n) {
  require_cpu(op, name, t);
  require_dtype(op, name, t, DType::kI32);
  TACHYON_CHECK(t.dim() == 1 && t.size(0) == n && (t.stride(0) == 1 || n <= 1), "{}: {} is {}, expected [{}] i32", op,
                name, t.shape_string(), n);
}

// An f32 packed copy of a small parameter vector (norm weight, bias) if it is not one already.
Tensor as_f32_vector(const Tensor& t) {
  if (t.dtype() == DType::kF32 && (t.stride(0) == 1 || t.size(0) <= 1)) return t;
  return t.to_f32();
}

// linear's bias, checked ([out] f32/f16/bf16 on the host) and as packed f32; undefined when null.
Tensor bias_f32(const char* op, const Tensor* bias, int64_t out) {
  if (bias == nullptr) return Tensor();
  require_cpu(op, "bias", *bias);
  require_float(op, "bias", *bias);
  TACHYON_CHECK(bias->dim() == 1 && bias->size(0) == out, "linear: bias is {}, expected [{}]", bias->shape_string(),
                out);
  return as_f32_vector(*bias);
}

bool use_reference(const char* op) {
  if (ops::cpu::active_isa() != ops::cpu::Isa::kScalar) return false;
  ops::cpu::log_path_once("{}: scalar reference", op);
  return true;
}

// One layer of the cache, checked, as the CPU kernels see it.
ops::KvCacheView cache_view(const char* op, const KvLayer& cache) {
  ops::check_kv_layer(op, cache);
  require_cpu(op, "k_cache", cache.k);
  require_cpu(op, "v_cache", cache.v);
  if (cache.k_scales.defined()) {
    require_cpu(op, "k_scales", cache.k_scales);
    require_cpu(op, "v_scales", cache.v_scales);
  }
  return ops::kv_cache_view(cache);
}

}  // namespace

namespace ops {

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
  if (!quantized) return;
  const std::vector<int64_t> scale_shape = {k.size(0), k.size(1), k.size(2), 1};
  for (const Tensor* sc : {&cache.k_scales, &cache.v_scales}) {
    TACHYON_CHECK(sc->shape() == scale_shape && sc->dtype() == DType::kF32 && sc->is_contiguous() &&
                      sc->device() == k.device(),
                  "{}: scales {} {} on {} for cache {} on {} (expected [{}, {}, {}, 1] f32, packed)", op,
                  sc->shape_string(), dtype_name(sc->dtype()), sc->device().to_string(), k.shape_string(),
                  k.device().to_string(), k.size(0), k.size(1), k.size(2));
  }
}

void register_backend(DeviceType type, Backend* backend) { g_backends[static_cast<size_t>(type)].store(backend); }

Backend* backend_for(Device device) { return g_backends[static_cast<size_t>(device.type)].load(); }

Status synchronize(Device device) {
  if (device.is_cpu()) return Status::Ok();
  Backend* b = backend_for(device);
  if (b == nullptr) return make_error(ErrorCode::kUnsupported, "no backend for {} is running", device.to_string());
  return b->synchronize();
}

std::string backend_info() {
  const cpu::Isa active = cpu::active_isa();
  const cpu::Isa detected = cpu::detected_isa();
  std::string line = fmt::format("cpu kernels: {}", cpu::isa_name(active));
  if (active != detected) line += fmt::format(" (forced; CPU supports {})", cpu::isa_name(detected));
  return line;
}

namespace {

// linear with a packed weight on the host: any QuantFormat. Calls of fewer than
// cpu::kQuantGemmMinTokens tokens do not depend on the batch; longer ones multiply the weights
// decoded to f32 panels (exact activations), unless the mode asks for batch-invariant outputs.
void quant_linear(const Tensor& x, const QuantWeight& w, const Tensor* bias, Tensor& y, LinearMode mode) {
  constexpr const char* op = "linear";
  require_cpu(op, "w.packed", w.packed);
  require_rank(op, "x", x, 2);
  require_rank(op, "y", y, 2);
  require_dtype(op, "x", x, DType::kF32);
  require_dtype(op, "y", y, DType::kF32);
  require_last_dim_contiguous(op, "x", x);
  require_last_dim_contiguous(op, "y", y);
  const int64_t n = x.size(0), in = x.size(1), out = w.out_features;
  TACHYON_CHECK(w.in_features == in, "linear: x {} and the {} weight [{}, {}] disagree on in_features",
                x.shape_string(), quant_format_name(w.format), out, w.in_features);
  TACHYON_CHECK(y.size(0) == n && y.size(1) == out, "linear: y is {}, expected [{}, {}]", y.shape_string(), n, out);
  const Tensor bias32 = bias_f32(op, bias, out);
  if (use_reference(op)) {
    cpu::quant_linear_reference(x, w, bias != nullptr ? &bias32 : nullptr, y);
    return;
  }
  cpu::log_path_once("linear: avx2 {}", quant_format_name(w.format));
  cpu::QuantLinearArgs a;
  a.x = x.data<float>();
  a.x_stride = x.stride(0);
  a.w = &w;
  a.bias = bias != nullptr ? bias32.data<float>() : nullptr;
  a.y = y.data<float>();
  a.y_stride = y.stride(0);
  a.n = n;
  a.batch_invariant = mode == LinearMode::kBatchInvariant;
  cpu::quant_linear(a);
}

}  // namespace

void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y, LinearMode mode) {
  constexpr const char* op = "linear";
  if (Backend* b = device_backend(op, x)) return b->linear(x, w, bias, y, mode);
  if (detail::consume_fault(DeviceType::kCpu, Fault::kKernel)) {
    return detail::record_cpu_error(detail::injected_error(Fault::kKernel, op));
  }
  require_cpu(op, "x", x);
  require_cpu(op, "y", y);
  TACHYON_CHECK(w.defined(), "linear: weight is undefined");
  if (w.quant) return quant_linear(x, *w.quant, bias, y, mode);
  const Tensor& wd = w.dense;
  require_cpu(op, "w", wd);
  require_rank(op, "x", x, 2);
  require_rank(op, "y", y, 2);
  require_rank(op, "w", wd, 2);
  require_dtype(op, "x", x, DType::kF32);
  require_dtype(op, "y", y, DType::kF32);
  require_float(op, "w", wd);
  require_last_dim_contiguous(op, "x", x);
  require_last_dim_contiguous(op, "y", y);
  require_last_dim_contiguous(op, "w", wd);
  const int64_t n = x.size(0), in = x.size(1), out = wd.size(0);
  TACHYON_CHECK(wd.size(1) == in, "linear: x {} and w {} disagree on in_features", x.shape_string(), wd.shape_string());
  TACHYON_CHECK(y.size(0) == n && y.size(1) == out, "linear: y is {}, expected [{}, {}]", y.shape_string(), n, out);
  const Tensor bias32 = bias_f32(op, bias, out);
  if (use_reference(op)) {
    reference::linear(x, w, bias != nullptr ? &bias32 : nullptr, y);
    return;
  }
  cpu::LinearArgs a;
  a.x = x.data<float>();
  a.x_stride = x.stride(0);
  a.w = wd.raw_data();
  a.w_dtype = wd.dtype();
  a.w_stride = wd.stride(0);
  a.bias = bias != nullptr ? bias32.data<float>() : nullptr;
  a.y = y.data<float>();
  a.y_stride = y.stride(0);
  a.n = n;
  a.in = in;
  a.out = out;
  if (mode == LinearMode::kBatchInvariant) {
    // Every token through the batch-1 GEMV tile: each output's summation order depends only on
    // the weight's shape. One pass over the weight rows serves all tokens (rows stay in L1).
    a.per_token = true;
    cpu::linear(a, cpu::LinearAlgo::kGemv);
    return;
  }
  cpu::linear(a);
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  constexpr const char* op = "rms_norm";
  if (Backend* b = device_backend(op, x)) return b->rms_norm(x, weight, eps, y);
  require_cpu(op, "x", x);
  require_cpu(op, "y", y);
  require_cpu(op, "weight", weight);
  require_dtype(op, "x", x, DType::kF32);
  require_dtype(op, "y", y, DType::kF32);
  require_float(op, "weight", weight);
  require_same_shape(op, "x", x, "y", y);
  require_last_dim_contiguous(op, "x", x);
  require_last_dim_contiguous(op, "y", y);
  TACHYON_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "rms_norm: weight {} for x {}",
                weight.shape_string(), x.shape_string());
  const Tensor w32 = as_f32_vector(weight);
  if (use_reference(op)) {
    reference::rms_norm(x, w32, eps, y);
    return;
  }
  cpu::rms_norm(x.data<float>(), cpu::row_layout(x), w32.data<float>(), eps, y.data<float>(), cpu::row_layout(y));
}

void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  constexpr const char* op = "add_rms_norm";
  if (Backend* b = device_backend(op, x)) return b->add_rms_norm(residual, x, weight, eps, y);
  require_cpu(op, "residual", residual);
  require_cpu(op, "x", x);
  require_cpu(op, "y", y);
  require_cpu(op, "weight", weight);
  require_dtype(op, "residual", residual, DType::kF32);
  require_dtype(op, "x", x, DType::kF32);
  require_dtype(op, "y", y, DType::kF32);
  require_float(op, "weight", weight);
  require_same_shape(op, "residual", residual, "x", x);
  require_same_shape(op, "residual", residual, "y", y);
  require_last_dim_contiguous(op, "residual", residual);
  require_last_dim_contiguous(op, "x", x);
  require_last_dim_contiguous(op, "y", y);
  TACHYON_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "add_rms_norm: weight {} for x {}",
                weight.shape_string(), x.shape_string());
  const Tensor w32 = as_f32_vector(weight);
  if (use_reference(op)) {
    reference::add_rms_norm(residual, x, w32, eps, y);
    return;
  }
  cpu::add_rms_norm(residual.data<float>(), cpu::row_layout(residual), x.data<float>(), cpu::row_layout(x),
                    w32.data<float>(), eps, y.data<float>(), cpu::row_layout(y));
}

void rope(Tensor& x, const Tensor& positions, const RopeTable& table) {
  constexpr const char* op = "rope";
  if (Backend* b = device_backend(op, x)) return b->rope(x, positions, table);
  require_cpu(op, "x", x);
  require_dtype(op, "x", x, DType::kF32);
  require_rank(op, "x", x, 3);
  require_last_dim_contiguous(op, "x", x);
  require_index(op, "positions", positions, x.size(0));
  TACHYON_CHECK(table.rotary_dim > 0 && table.rotary_dim % 2 == 0 && table.rotary_dim <= x.size(2) &&
                    table.inv_freq.size() == static_cast<size_t>(table.rotary_dim / 2),
                "rope: table with rotary_dim {} ({} frequencies) for x {}", table.rotary_dim, table.inv_freq.size(),
                x.shape_string());
  if (use_reference(op)) {
    reference::rope(x, positions, table);
    return;
  }
  cpu::rope(x.data<float>(), x.size(0), x.size(1), x.stride(0), x.stride(1), positions.data<int32_t>(), table);
}

bool linear_fused(Tensor& x, const Weight& w, const Tensor* bias, const LinearFusion& f, Tensor& y, LinearMode mode) {
  constexpr const char* op = "linear_fused";
  TACHYON_CHECK(!(f.add_to_output && f.swiglu), "linear_fused: add_to_output and swiglu together");
  TACHYON_CHECK(f.pending_add == nullptr || f.norm_weight != nullptr, "linear_fused: a pending add without a norm");
  TACHYON_CHECK(x.dim() == 2 && y.dim() == 2 && y.size(0) == x.size(0), "linear_fused: x {} y {}", x.shape_string(),
                y.shape_string());
  TACHYON_CHECK(f.norm_weight == nullptr || (f.scratch_x != nullptr && f.scratch_x->shape() == x.shape()),
                "linear_fused: a norm needs scratch_x of x's shape {} (got {})", x.shape_string(),
                f.scratch_x != nullptr ? f.scratch_x->shape_string() : "none");
  const int64_t out = y.size(1) * (f.swiglu ? 2 : 1);
  TACHYON_CHECK(!(f.add_to_output || f.swiglu) ||
                    (f.scratch_y != nullptr && f.scratch_y->dim() == 2 && f.scratch_y->size(0) == x.size(0) &&
                     f.scratch_y->size(1) == out),
                "linear_fused: the epilogue needs scratch_y [{}, {}] (got {})", x.size(0), out,
                f.scratch_y != nullptr ? f.scratch_y->shape_string() : "none");
  Backend* b = device_backend(op, x);
  if (b != nullptr && b->try_linear_fused(x, w, bias, f, y, mode)) return false;
  // The separate ops (each dispatches to x's device), the epilogue still fused where it can be.
  const Tensor* in = &x;
  if (f.norm_weight != nullptr) {
    if (f.pending_add != nullptr) {
      add_rms_norm(x, *f.pending_add, *f.norm_weight, f.norm_eps, *f.scratch_x);
    } else {
      rms_norm(x, *f.norm_weight, f.norm_eps, *f.scratch_x);
    }
    in = f.scratch_x;
    if (b != nullptr && (f.add_to_output || f.swiglu)) {
      LinearFusion epilogue = f;
      epilogue.norm_weight = nullptr;
      epilogue.pending_add = nullptr;
      if (b->try_linear_fused(*in, w, bias, epilogue, y, mode)) return false;
    }
  }
  if (!f.add_to_output && !f.swiglu) {
    linear(*in, w, bias, y, mode);
    return false;
  }
  linear(*in, w, bias, *f.scratch_y, mode);
  if (f.swiglu) {
    silu_mul(f.scratch_y->slice(1, 0, y.size(1)), f.scratch_y->slice(1, y.size(1), out), y);
    return false;
  }
  if (f.may_defer_add) return true;
  add(y, *f.scratch_y);
  return false;
}

void add(Tensor& y, const Tensor& x) {
  constexpr const char* op = "add";
  if (Backend* b = device_backend(op, y)) return b->add(y, x);
  require_cpu(op, "y", y);
  require_cpu(op, "x", x);
  require_dtype(op, "y", y, DType::kF32);
  require_dtype(op, "x", x, DType::kF32);
  require_rank(op, "y", y, 2);
  require_same_shape(op, "y", y, "x", x);
  require_last_dim_contiguous(op, "y", y);
  require_last_dim_contiguous(op, "x", x);
  const int64_t n = y.size(0), d = y.size(1);
  for (int64_t t = 0; t < n; ++t) {
    float* yr = y.data<float>() + t * y.stride(0);
    const float* xr = x.data<float>() + t * x.stride(0);
    for (int64_t i = 0; i < d; ++i) yr[i] += xr[i];
  }
}

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  constexpr const char* op = "silu_mul";
  if (Backend* b = device_backend(op, gate)) return b->silu_mul(gate, up, out);
  require_cpu(op, "gate", gate);
  require_cpu(op, "up", up);
  require_cpu(op, "out", out);
  require_dtype(op, "gate", gate, DType::kF32);
  require_dtype(op, "up", up, DType::kF32);
  require_dtype(op, "out", out, DType::kF32);
  require_same_shape(op, "gate", gate, "up", up);
  require_same_shape(op, "gate", gate, "out", out);
  require_last_dim_contiguous(op, "gate", gate);
  require_last_dim_contiguous(op, "up", up);
  require_last_dim_contiguous(op, "out", out);
  if (use_reference(op)) {
    reference::silu_mul(gate, up, out);
    return;
  }
  cpu::silu_mul(gate.data<float>(), cpu::row_layout(gate), up.data<float>(), cpu::row_layout(up), out.data<float>(),
                cpu::row_layout(out));
}

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  constexpr const char* op = "embedding";
  if (Backend* b = device_backend(op, out)) return b->embedding(table, ids, out);
  require_cpu(op, "table", table);
  require_cpu(op, "out", out);
  require_rank(op, "table", table, 2);
  require_float(op, "table", table);
  require_last_dim_contiguous(op, "table", table);
  require_rank(op, "out", out, 2);
  require_dtype(op, "out", out, DType::kF32);
  require_last_dim_contiguous(op, "out", out);
  const int64_t n = out.size(0), vocab = table.size(0), d = table.size(1);
  TACHYON_CHECK(out.size(1) == d, "embedding: out {} for table {}", out.shape_string(), table.shape_string());
  require_index(op, "ids", ids, n);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t t = 0; t < n; ++t) {
    TACHYON_CHECK(id[t] >= 0 && id[t] < vocab, "embedding: ids[{}] = {} outside the vocabulary of {}", t, id[t], vocab);
  }
  if (use_reference(op)) {
    reference::embedding(table, ids, out);
    return;
  }
  cpu::embedding(table.raw_data(), table.dtype(), table.stride(0), d, id, n, out.data<float>(), out.stride(0));
}

void softmax(Tensor& x) {
  constexpr const char* op = "softmax";
  require_cpu(op, "x", x);
  require_dtype(op, "x", x, DType::kF32);
  require_last_dim_contiguous(op, "x", x);
  if (use_reference(op)) {
    reference::softmax(x);
    return;
  }
  cpu::softmax(x.data<float>(), cpu::row_layout(x));
}

void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvLayer& kv) {
  constexpr const char* op = "store_kv";
  if (Backend* b = device_backend(op, k)) return b->store_kv(k, v, slot_mapping, kv);
  require_cpu(op, "k", k);
  require_cpu(op, "v", v);
  const KvCacheView cache = cache_view(op, kv);
  require_rank(op, "k", k, 3);
  require_dtype(op, "k", k, DType::kF32);
  require_dtype(op, "v", v, DType::kF32);
  require_same_shape(op, "k", k, "v", v);
  require_last_dim_contiguous(op, "k", k);
  require_last_dim_contiguous(op, "v", v);
  TACHYON_CHECK(k.size(1) == cache.num_kv_heads && k.size(2) == cache.head_dim, "store_kv: k {} for cache {}",
                k.shape_string(), kv.k.shape_string());
  const int64_t n = k.size(0);
  require_index(op, "slot_mapping", slot_mapping, n);
  const int32_t* slots = slot_mapping.data<int32_t>();
  const int64_t num_slots = cache.num_blocks * cache.block_size;
  for (int64_t t = 0; t < n; ++t) {
    TACHYON_CHECK(slots[t] < num_slots, "store_kv: slot_mapping[{}] = {} past the cache's {} slots", t, slots[t],
                  num_slots);
  }
  if (use_reference(op)) {
    reference::store_kv(k, v, slot_mapping, kv);
    return;
  }
  cpu::store_kv(k.data<float>(), k.stride(0), k.stride(1), v.data<float>(), v.stride(0), v.stride(1), n, slots, cache);
}

void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, const RopeTable& table,
                   const Tensor& slot_mapping, KvLayer& cache) {
  if (Backend* b = device_backend("rope_store_kv", q)) return b->rope_store_kv(q, k, v, positions, table, slot_mapping, cache);
  rope(q, positions, table);
  rope(k, positions, table);
  store_kv(k, v, slot_mapping, cache);
}

void paged_attention(const Tensor& q, const KvLayer& kv, const AttentionMetadata& meta, const AttentionParams& params,
                     Tensor& out) {
  constexpr const char* op = "paged_attention";
  if (Backend* b = device_backend(op, q)) return b->paged_attention(q, kv, meta, params, out);
  if (detail::consume_fault(DeviceType::kCpu, Fault::kWorkspace)) {
    return detail::record_cpu_error(detail::injected_error(Fault::kWorkspace, "attention workspace"));
  }
  require_cpu(op, "q", q);
  require_cpu(op, "out", out);
  const KvCacheView cache = cache_view(op, kv);
  require_rank(op, "q", q, 3);
  require_dtype(op, "q", q, DType::kF32);
  require_dtype(op, "out", out, DType::kF32);
  require_same_shape(op, "q", q, "out", out);
  require_last_dim_contiguous(op, "q", q);
  require_last_dim_contiguous(op, "out", out);
  const int64_t n = q.size(0), num_heads = q.size(1);
  TACHYON_CHECK(q.size(2) == cache.head_dim, "paged_attention: q {} for cache {}", q.shape_string(),
                kv.k.shape_string());
  TACHYON_CHECK(num_heads % cache.num_kv_heads == 0, "paged_attention: {} heads not a multiple of {} kv heads",
                num_heads, cache.num_kv_heads);
  TACHYON_CHECK(meta.block_size == cache.block_size, "paged_attention: metadata block_size {} but cache {}",
                meta.block_size, kv.k.shape_string());
  TACHYON_CHECK(params.sliding_window >= 0, "paged_attention: sliding_window {}", params.sliding_window);

  // The batch's plan: query rows partition [0, n); every context holds its queries; every block a
  // query can see is a real block of the cache.
  const int num_seqs = meta.num_seqs;
  require_index(op, "query_start", meta.query_start, num_seqs + 1);
  require_index(op, "context_lens", meta.context_lens, num_seqs);
  require_cpu(op, "block_tables", meta.block_tables);
  require_dtype(op, "block_tables", meta.block_tables, DType::kI32);
  TACHYON_CHECK(
      meta.block_tables.dim() == 2 && meta.block_tables.size(0) == num_seqs && meta.block_tables.is_contiguous(),
      "paged_attention: block_tables {} for {} sequences", meta.block_tables.shape_string(), num_seqs);
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
      TACHYON_CHECK(block >= 0 && block < cache.num_blocks, "paged_attention: seq {} block {} -> {} (cache has {})", s,
                    b, block, cache.num_blocks);
    }
  }
  const uint64_t* tree_masks = nullptr;
  if (meta.tree_masks.defined()) {
    require_cpu(op, "tree_masks", meta.tree_masks);
    require_dtype(op, "tree_masks", meta.tree_masks, DType::kI64);
    TACHYON_CHECK(meta.tree_masks.dim() == 1 && meta.tree_masks.size(0) == n && meta.tree_masks.is_contiguous(),
                  "paged_attention: tree_masks {} for {} queries", meta.tree_masks.shape_string(), n);
    TACHYON_CHECK(params.sliding_window == 0, "paged_attention: tree masks with a sliding window");
    tree_masks = static_cast<const uint64_t*>(meta.tree_masks.raw_data());
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
  if (n == 0) return;
  if (use_reference(op)) {
    reference::paged_attention(q, kv, meta, params, out);
    return;
  }
  AttentionBatch batch;
  batch.num_seqs = num_seqs;
  batch.query_start = query_start;
  batch.context_lens = context_lens;
  batch.block_tables = block_tables;
  batch.max_blocks_per_seq = max_blocks;
  batch.max_query_len = meta.max_query_len;
  batch.max_context_len = meta.max_context_len;
  batch.tree_masks = tree_masks;
  cpu::paged_attention(q.data<float>(), q.stride(0), q.stride(1), num_heads, cache, batch, params, out.data<float>(),
                       out.stride(0), out.stride(1));
}

void argmax(const Tensor& x, Tensor& ids, Tensor* logprobs) {
  constexpr const char* op = "argmax";
  if (Backend* b = device_backend(op, x)) return b->argmax(x, ids, logprobs);
  require_cpu(op, "x", x);
  require_rank(op, "x", x, 2);
  require_dtype(op, "x", x, DType::kF32);
  require_last_dim_contiguous(op, "x", x);
  require_index(op, "ids", ids, x.size(0));
  if (logprobs != nullptr) {
    require_cpu(op, "logprobs", *logprobs);
    require_dtype(op, "logprobs", *logprobs, DType::kF32);
    TACHYON_CHECK(logprobs->dim() == 1 && logprobs->size(0) == x.size(0) && logprobs->is_contiguous(),
                  "argmax: logprobs {} for x {}", logprobs->shape_string(), x.shape_string());
  }
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

void top_tokens(const Tensor& x, Tensor& ids, Tensor& probs) {
  constexpr const char* op = "top_tokens";
  if (Backend* b = device_backend(op, x)) return b->top_tokens(x, ids, probs);
  require_cpu(op, "x", x);
  require_rank(op, "x", x, 2);
  require_dtype(op, "x", x, DType::kF32);
  require_last_dim_contiguous(op, "x", x);
  require_cpu(op, "ids", ids);
  require_cpu(op, "probs", probs);
  require_dtype(op, "ids", ids, DType::kI32);
  require_dtype(op, "probs", probs, DType::kF32);
  const int64_t n = x.size(0), d = x.size(1);
  TACHYON_CHECK(ids.dim() == 2 && ids.size(0) == n && ids.size(1) >= 1 && ids.size(1) <= kMaxTopTokens &&
                    ids.is_contiguous() && probs.shape() == ids.shape() && probs.is_contiguous(),
                "top_tokens: x {} ids {} probs {} (m in [1, {}])", x.shape_string(), ids.shape_string(),
                probs.shape_string(), kMaxTopTokens);
  const int64_t m = ids.size(1);
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

void advance_decode(const Tensor& next_ids, Tensor& token_ids, Tensor& positions, Tensor& context_lens,
                    const Tensor& block_tables, int block_size, Tensor& slot_mapping) {
  constexpr const char* op = "advance_decode";
  if (Backend* b = device_backend(op, token_ids)) {
    return b->advance_decode(next_ids, token_ids, positions, context_lens, block_tables, block_size, slot_mapping);
  }
  const int64_t n = token_ids.size(0);
  require_index(op, "next_ids", next_ids, n);
  require_index(op, "token_ids", token_ids, n);
  require_index(op, "positions", positions, n);
  require_index(op, "context_lens", context_lens, n);
  require_index(op, "slot_mapping", slot_mapping, n);
  require_cpu(op, "block_tables", block_tables);
  require_dtype(op, "block_tables", block_tables, DType::kI32);
  TACHYON_CHECK(block_tables.dim() == 2 && block_tables.size(0) == n && block_tables.is_contiguous() && block_size >= 1,
                "advance_decode: block tables {} for {} sequences, block size {}", block_tables.shape_string(), n,
                block_size);
  const int64_t columns = block_tables.size(1);
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

void sample(const Tensor& x, const Tensor& params, Tensor& ids, Tensor& logprobs, Tensor* probs) {
  constexpr const char* op = "sample";
  if (Backend* b = device_backend(op, x)) return b->sample(x, params, ids, logprobs, probs);
  require_cpu(op, "x", x);
  require_rank(op, "x", x, 2);
  require_dtype(op, "x", x, DType::kF32);
  require_last_dim_contiguous(op, "x", x);
  require_index(op, "ids", ids, x.size(0));
  require_cpu(op, "params", params);
  require_dtype(op, "params", params, DType::kF32);
  TACHYON_CHECK(params.dim() == 2 && params.size(0) == x.size(0) && params.size(1) == kSampleParams &&
                    params.is_contiguous(),
                "sample: params {} for x {}", params.shape_string(), x.shape_string());
  require_cpu(op, "logprobs", logprobs);
  require_dtype(op, "logprobs", logprobs, DType::kF32);
  TACHYON_CHECK(logprobs.dim() == 1 && logprobs.size(0) == x.size(0) && logprobs.is_contiguous(),
                "sample: logprobs {} for x {}", logprobs.shape_string(), x.shape_string());
  if (probs != nullptr) {
    require_cpu(op, "probs", *probs);
    TACHYON_CHECK(probs->shape() == x.shape() && probs->dtype() == DType::kF32 && probs->is_contiguous(),
                  "sample: probs {} for x {}", probs->shape_string(), x.shape_string());
  }
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

void adjust_logits(Tensor& x, const Tensor& edits) {
  constexpr const char* op = "adjust_logits";
  if (Backend* b = device_backend(op, x)) return b->adjust_logits(x, edits);
  require_cpu(op, "x", x);
  require_rank(op, "x", x, 2);
  require_dtype(op, "x", x, DType::kF32);
  require_last_dim_contiguous(op, "x", x);
  require_cpu(op, "edits", edits);
  require_dtype(op, "edits", edits, DType::kF32);
  TACHYON_CHECK(edits.dim() == 2 && edits.size(1) == kLogitEditColumns && edits.is_contiguous(),
                "adjust_logits: edits {} must be [m, {}] and contiguous", edits.shape_string(), kLogitEditColumns);
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

void quantize_int8_rows(const Tensor& w, Tensor& packed, Tensor& scales) {
  constexpr const char* op = "quantize_int8_rows";
  if (Backend* b = device_backend(op, w)) return b->quantize_int8_rows(w, packed, scales);
  require_cpu(op, "w", w);
  require_rank(op, "w", w, 2);
  require_float(op, "w", w);
  require_last_dim_contiguous(op, "w", w);
  require_cpu(op, "packed", packed);
  require_cpu(op, "scales", scales);
  TACHYON_CHECK(packed.dtype() == DType::kI8 && packed.shape() == w.shape() && packed.is_contiguous() &&
                    scales.dtype() == DType::kF32 && scales.dim() == 1 && scales.size(0) == w.size(0) &&
                    scales.is_contiguous(),
                "quantize_int8_rows: w {} packed {} {} scales {} {}", w.shape_string(), packed.shape_string(),
                dtype_name(packed.dtype()), scales.shape_string(), dtype_name(scales.dtype()));
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

void quantize_int4_groups(const Tensor& w, int group, bool f16_scales, Tensor& packed, Tensor& scales, Tensor& zeros) {
  constexpr const char* op = "quantize_int4_groups";
  if (Backend* b = device_backend(op, w)) return b->quantize_int4_groups(w, group, f16_scales, packed, scales, zeros);
  require_cpu(op, "packed", packed);
  require_cpu(op, "scales", scales);
  require_cpu(op, "zeros", zeros);
  // The host's quantizer is the definition; the op copies its result into the caller's tensors.
  Result<QuantWeight> q = quantize_int4_group(w, group, f16_scales ? Int4Scales::kF16 : Int4Scales::kF32);
  TACHYON_CHECK(q.ok(), "quantize_int4_groups: {}", q.status().message());
  TACHYON_CHECK(packed.dtype() == DType::kU8 && packed.shape() == q->packed.shape() && packed.is_contiguous() &&
                    scales.dtype() == DType::kF32 && scales.shape() == q->scales.shape() && scales.is_contiguous() &&
                    zeros.dtype() == DType::kF32 && zeros.shape() == q->zeros.shape() && zeros.is_contiguous(),
                "quantize_int4_groups: w {} packed {} {} scales {} zeros {}", w.shape_string(), packed.shape_string(),
                dtype_name(packed.dtype()), scales.shape_string(), zeros.shape_string());
  std::copy_n(q->packed.data<uint8_t>(), q->packed.numel(), packed.data<uint8_t>());
  std::copy_n(q->scales.data<float>(), q->scales.numel(), scales.data<float>());
  std::copy_n(q->zeros.data<float>(), q->zeros.numel(), zeros.data<float>());
}

void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float bound, float offset) {
  constexpr const char* op = "fill_uniform";
  if (Backend* b = device_backend(op, t)) return b->fill_uniform(t, seed, stream, bound, offset);
  require_cpu(op, "t", t);
  require_float(op, "t", t);
  TACHYON_CHECK(t.is_contiguous(), "fill_uniform: {} must be contiguous", t.shape_string());
  cpu::fill_uniform(t.raw_data(), t.dtype(), t.numel(), seed, stream, bound, offset);
}

}  // namespace ops
}  // namespace tachyon
