// Scalar reference kernels. Plain loops, no threads, no intrinsics; sums in double.
#include "ops/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/cpu/quant_linear.h"
#include "ops/cpu/rows.h"

namespace tachyon::ops::reference {
namespace {

// Element i (in elements from `base`) of a float-typed buffer, as f32.
float load_f32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: TACHYON_CHECK(false, "reference: {} is not a float dtype", dtype_name(dtype));
  }
  return 0.0f;
}

void store_f32(void* base, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[i] = value; break;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = f32_to_f16(value); break;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(value); break;
    default: TACHYON_CHECK(false, "reference: {} is not a float dtype", dtype_name(dtype));
  }
}

int32_t load_i32(const Tensor& t, int64_t i) { return t.data<int32_t>()[i * t.stride(0)]; }

// Element offset of [i0, i1, i2] in a rank-3 tensor.
int64_t offset3(const Tensor& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.stride(0) + i1 * t.stride(1) + i2 * t.stride(2);
}

}  // namespace

void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& y) {
  TACHYON_CHECK(!w.quant, "reference linear: quantized weights are not handled here");
  const Tensor& wd = w.dense;
  const int64_t n = x.size(0), in = x.size(1), out = wd.size(0);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        sum += static_cast<double>(xp[t * x.stride(0) + i]) *
               static_cast<double>(load_f32(wd.raw_data(), wd.dtype(), o * wd.stride(0) + i * wd.stride(1)));
      }
      if (bias != nullptr) sum += static_cast<double>(load_f32(bias->raw_data(), bias->dtype(), o * bias->stride(0)));
      yp[t * y.stride(0) + o] = static_cast<float>(sum);
    }
  }
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  const auto xl = cpu::row_layout(x);
  const auto yl = cpu::row_layout(y);
  const int64_t d = xl.cols;
  for (int64_t r = 0; r < xl.rows; ++r) {
    const float* xr = x.data<float>() + xl.offset(r);
    float* yr = y.data<float>() + yl.offset(r);
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps));
    for (int64_t i = 0; i < d; ++i) {
      yr[i] = static_cast<float>(xr[i] * inv * load_f32(weight.raw_data(), weight.dtype(), i * weight.stride(0)));
    }
  }
}

void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  const auto rl = cpu::row_layout(residual);
  const auto xl = cpu::row_layout(x);
  const int64_t d = rl.cols;
  for (int64_t r = 0; r < rl.rows; ++r) {
    float* rr = residual.data<float>() + rl.offset(r);
    const float* xr = x.data<float>() + xl.offset(r);
    for (int64_t i = 0; i < d; ++i) rr[i] = rr[i] + xr[i];  // f32 add: the residual stream is f32
  }
  rms_norm(residual, weight, eps, y);
}

void rope(Tensor& x, const Tensor& positions, const RopeTable& table) {
  const int64_t n = x.size(0), heads = x.size(1);
  const int half = table.rotary_dim / 2;
  float* xp = x.data<float>();
  for (int64_t t = 0; t < n; ++t) {
    const int32_t pos = load_i32(positions, t);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = xp + offset3(x, t, h, 0);
      for (int i = 0; i < half; ++i) {
        float c, s;
        rope_cos_sin(pos, table.inv_freq[static_cast<size_t>(i)], table.attention_scale, &c, &s);
        const int i0 = table.style == RopeStyle::kNeox ? i : 2 * i;
        const int i1 = table.style == RopeStyle::kNeox ? i + half : 2 * i + 1;
        const double a = v[i0], b = v[i1];
        v[i0] = static_cast<float>(a * c - b * s);
        v[i1] = static_cast<float>(a * s + b * c);
      }
    }
  }
}

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  const auto gl = cpu::row_layout(gate);
  const auto ul = cpu::row_layout(up);
  const auto ol = cpu::row_layout(out);
  for (int64_t r = 0; r < gl.rows; ++r) {
    const float* g = gate.data<float>() + gl.offset(r);
    const float* u = up.data<float>() + ul.offset(r);
    float* o = out.data<float>() + ol.offset(r);
    for (int64_t i = 0; i < gl.cols; ++i) {
      const double gv = g[i];
      o[i] = static_cast<float>(gv / (1.0 + std::exp(-gv)) * u[i]);
    }
  }
}

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t n = ids.size(0), d = table.size(1);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = load_i32(ids, t);
    for (int64_t i = 0; i < d; ++i) {
      out.data<float>()[t * out.stride(0) + i] =
          load_f32(table.raw_data(), table.dtype(), id * table.stride(0) + i * table.stride(1));
    }
  }
}

void softmax(Tensor& x) {
  const auto l = cpu::row_layout(x);
  for (int64_t r = 0; r < l.rows; ++r) {
    float* v = x.data<float>() + l.offset(r);
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < l.cols; ++i) mx = std::max(mx, static_cast<double>(v[i]));
    double sum = 0.0;
    for (int64_t i = 0; i < l.cols; ++i) sum += std::exp(v[i] - mx);
    for (int64_t i = 0; i < l.cols; ++i) v[i] = static_cast<float>(std::exp(v[i] - mx) / sum);
  }
}

void quantize_kv_row(const float* x, int64_t head_dim, DType dtype, void* codes, float* scale) {
  const float q_max = quantized_kv_max(dtype);
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < head_dim; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  const float s = !finite ? std::numeric_limits<float>::quiet_NaN() : amax / q_max;
  *scale = s;
  for (int64_t i = 0; i < head_dim; ++i) {
    const float r = finite && s > 0.0f ? x[i] / s : 0.0f;
    if (dtype == DType::kI8) {
      static_cast<int8_t*>(codes)[i] = static_cast<int8_t>(std::clamp(std::rint(r), -127.0f, 127.0f));
    } else {
      static_cast<uint8_t*>(codes)[i] = f32_to_f8e4m3(r);
    }
  }
}

namespace {

// Element i of a cache pool as f32 (a quantized one's code times its row's scale).
float load_kv(const Tensor& pool, const Tensor& scales, int64_t i) {
  const int64_t head_dim = pool.size(3);
  switch (pool.dtype()) {
    case DType::kI8: return static_cast<float>(pool.data<int8_t>()[i]) * scales.data<float>()[i / head_dim];
    case DType::kF8E4M3:
      return f8e4m3_to_f32(static_cast<const uint8_t*>(pool.raw_data())[i]) * scales.data<float>()[i / head_dim];
    default: return load_f32(pool.raw_data(), pool.dtype(), i);
  }
}

// Element i of (slot, kv head) row `row` of K (which 0) or V (1) through a block table entry:
// the primary pools below num_blocks, the history pools from there on.
float load_cached(const KvLayer& cache, int which, int64_t block, int64_t row_in_block, int64_t i) {
  const int64_t num_blocks = cache.k.size(0);
  const int64_t rows = cache.k.size(1) * cache.k.size(2), head_dim = cache.k.size(3);
  if (block < num_blocks) {
    return load_kv(which == 0 ? cache.k : cache.v, which == 0 ? cache.k_scales : cache.v_scales,
                   (block * rows + row_in_block) * head_dim + i);
  }
  const int bits = kv_history_bits(cache);
  const int64_t row = (block - num_blocks) * rows + row_in_block;
  const Tensor& codes = which == 0 ? cache.hk : cache.hv;
  const Tensor& params = which == 0 ? cache.hk_params : cache.hv_params;
  const int64_t code_bytes = bits == 8 ? head_dim : head_dim / 2;
  const size_t param_bytes = bits == 8 ? sizeof(float) : 2 * sizeof(uint16_t);
  return history_value(static_cast<const uint8_t*>(codes.raw_data()) + row * code_bytes,
                       static_cast<const uint8_t*>(params.raw_data()) + static_cast<size_t>(row) * param_bytes, bits,
                       i);
}

}  // namespace

void quantize_history_row(const float* x, int64_t head_dim, int bits, void* codes, void* params) {
  if (bits == 8) {
    quantize_kv_row(x, head_dim, DType::kI8, codes, static_cast<float*>(params));
    return;
  }
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  bool finite = true;
  for (int64_t i = 0; i < head_dim; ++i) {
    finite = finite && std::isfinite(x[i]);
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  auto* out_params = static_cast<uint16_t*>(params);
  auto* out = static_cast<uint8_t*>(codes);
  if (!finite) {
    out_params[0] = out_params[1] = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
    std::memset(out, 0, static_cast<size_t>(head_dim / 2));
    return;
  }
  constexpr float kF16Max = 65504.0f;
  const uint16_t lo16 = f32_to_f16(std::clamp(lo, -kF16Max, kF16Max));
  const float lo_f = f16_to_f32(lo16);
  const uint16_t s16 = f32_to_f16(std::clamp((hi - lo_f) / 15.0f, 0.0f, kF16Max));
  const float s = f16_to_f32(s16);
  out_params[0] = s16;
  out_params[1] = lo16;
  for (int64_t i = 0; i < head_dim; i += 2) {
    uint8_t pair = 0;
    for (int64_t j = 0; j < 2; ++j) {
      const float c = s > 0.0f ? std::clamp(std::rint((x[i + j] - lo_f) / s), 0.0f, 15.0f) : 0.0f;
      pair |= static_cast<uint8_t>(static_cast<uint32_t>(c) << (4 * j));
    }
    out[i / 2] = pair;
  }
}

std::pair<float, float> int4_history_params(const void* params) {
  const auto* p = static_cast<const uint16_t*>(params);
  return {f16_to_f32(p[0]), f16_to_f32(p[1])};
}

float history_value(const void* codes, const void* params, int bits, int64_t i) {
  if (bits == 8) return static_cast<float>(static_cast<const int8_t*>(codes)[i]) * static_cast<const float*>(params)[0];
  const uint8_t pair = static_cast<const uint8_t*>(codes)[i / 2];
  const float c = static_cast<float>((pair >> (4 * (i % 2))) & 0xf);
  const auto [s, lo] = int4_history_params(params);
  return lo + c * s;
}

void compress_kv_blocks(const Tensor& pairs, KvLayer& cache) {
  const int64_t block_size = cache.k.size(1), kv_heads = cache.k.size(2), head_dim = cache.k.size(3);
  const int bits = kv_history_bits(cache);
  const int64_t code_bytes = bits == 8 ? head_dim : head_dim / 2;
  const int64_t param_bytes = 4;  // a row's one f32 s (int8), or its f16 s and lo (int4)
  const int64_t rows = block_size * kv_heads;  // (slot, head) rows of a block
  std::vector<float> row(static_cast<size_t>(head_dim));
  for (int64_t p = 0; p < pairs.size(0); ++p) {
    const int64_t src = pairs.data<int32_t>()[2 * p], dst = pairs.data<int32_t>()[2 * p + 1];
    TACHYON_CHECK(src >= 0 && src < cache.k.size(0) && dst >= 0 && dst < cache.hk.size(0),
                  "compress_kv_blocks: block {} into history block {} ({} blocks, {} history blocks)", src, dst,
                  cache.k.size(0), cache.hk.size(0));
    for (int which = 0; which < 2; ++which) {
      const Tensor& pool = which == 0 ? cache.k : cache.v;
      const Tensor& scales = which == 0 ? cache.k_scales : cache.v_scales;
      Tensor& codes = which == 0 ? cache.hk : cache.hv;
      Tensor& params = which == 0 ? cache.hk_params : cache.hv_params;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t src_row = src * rows + r, dst_row = dst * rows + r;
        for (int64_t i = 0; i < head_dim; ++i) {
          row[static_cast<size_t>(i)] = load_kv(pool, scales, src_row * head_dim + i);
        }
        quantize_history_row(row.data(), head_dim, bits, static_cast<uint8_t*>(codes.raw_data()) + dst_row * code_bytes,
                             static_cast<uint8_t*>(params.raw_data()) + dst_row * param_bytes);
      }
    }
    if (!cache.kbounds.defined()) continue;
    // Key bounds of history block dst, from its keys as they decode.
    std::vector<float> mn(static_cast<size_t>(head_dim)), mx(static_cast<size_t>(head_dim));
    for (int64_t h = 0; h < kv_heads; ++h) {
      std::fill(mn.begin(), mn.end(), std::numeric_limits<float>::infinity());
      std::fill(mx.begin(), mx.end(), -std::numeric_limits<float>::infinity());
      bool finite = true;
      for (int64_t t = 0; t < block_size; ++t) {
        for (int64_t i = 0; i < head_dim; ++i) {
          const float x = load_cached(cache, 0, cache.k.size(0) + dst, t * kv_heads + h, i);
          finite = finite && std::isfinite(x);
          mn[static_cast<size_t>(i)] = std::min(mn[static_cast<size_t>(i)], x);
          mx[static_cast<size_t>(i)] = std::max(mx[static_cast<size_t>(i)], x);
        }
      }
      if (!finite) mn[0] = std::numeric_limits<float>::quiet_NaN();
      key_bounds_codes(mn.data(), mx.data(), head_dim,
                       static_cast<uint8_t*>(cache.kbounds.raw_data()) + (dst * kv_heads + h) * head_dim,
                       cache.kbound_params.data<float>() + (dst * kv_heads + h) * 2 * key_bound_groups(head_dim));
    }
  }
}

namespace {

// value(c) of ops.h KvLayer's key bounds: one rounding for the product, one for the sum.
float bound_value(float lo, float step, int c) {
  volatile float product = static_cast<float>(c) * step;  // never fused with the add
  return lo + product;
}

}  // namespace

void key_bounds_codes(const float* mn, const float* mx, int64_t head_dim, uint8_t* codes, float* params) {
  const int64_t groups = key_bound_groups(head_dim);
  bool finite = true;
  for (int64_t d = 0; d < head_dim; ++d) finite = finite && std::isfinite(mn[d]) && std::isfinite(mx[d]);
  std::fill(codes, codes + head_dim, uint8_t{0});
  if (!finite) {
    std::fill(params, params + 2 * groups, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  uint8_t* min_codes = codes;
  uint8_t* max_codes = codes + head_dim / 2;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kKeyBoundGroup, end = std::min(head_dim, begin + kKeyBoundGroup);
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (int64_t d = begin; d < end; ++d) {
      lo = std::min(lo, mn[d]);
      hi = std::max(hi, mx[d]);
    }
    const float step = (hi - lo) / 14.0f;
    params[2 * g] = lo;
    params[2 * g + 1] = step;
    // value(c) never decreases with c, so a guess moved until the condition flips is the answer.
    const auto guess = [&](float x) {
      return step > 0.0f ? static_cast<int>(std::clamp(std::floor((x - lo) / step), 0.0f, 15.0f)) : 0;
    };
    for (int64_t d = begin; d < end; ++d) {
      int lo_code = guess(mn[d]);  // the largest c with value(c) <= mn (value(0) = lo <= mn)
      while (lo_code > 0 && bound_value(lo, step, lo_code) > mn[d]) --lo_code;
      while (lo_code < 15 && bound_value(lo, step, lo_code + 1) <= mn[d]) ++lo_code;
      int hi_code = guess(mx[d]);  // the smallest c with value(c) >= mx
      while (hi_code < 15 && bound_value(lo, step, hi_code) < mx[d]) ++hi_code;
      while (hi_code > 0 && bound_value(lo, step, hi_code - 1) >= mx[d]) --hi_code;
      const int shift = 4 * static_cast<int>(d % 2);
      min_codes[d / 2] |= static_cast<uint8_t>(lo_code << shift);
      max_codes[d / 2] |= static_cast<uint8_t>(hi_code << shift);
    }
  }
}

float key_bound(const float* q, const uint8_t* codes, const float* params, int64_t head_dim) {
  double sum = 0.0;
  for (int64_t d = 0; d < head_dim; ++d) {
    const float lo = params[2 * (d / kKeyBoundGroup)], step = params[2 * (d / kKeyBoundGroup) + 1];
    if (std::isnan(lo) || std::isnan(step)) return std::numeric_limits<float>::quiet_NaN();
    const int shift = 4 * static_cast<int>(d % 2);
    const float a = q[d] * bound_value(lo, step, (codes[d / 2] >> shift) & 0xf);
    const float b = q[d] * bound_value(lo, step, (codes[head_dim / 2 + d / 2] >> shift) & 0xf);
    sum += std::max(a, b);
  }
  return static_cast<float>(sum);
}

void select_kv_blocks(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta, Tensor& tables,
                      Tensor& lens) {
  const int64_t num_blocks = cache.k.size(0), block_size = cache.k.size(1), kv_heads = cache.k.size(2);
  const int64_t head_dim = cache.k.size(3), group = q.size(1) / kv_heads;
  const int64_t cols = meta.block_tables.size(1);
  const int32_t* block_tables = meta.block_tables.data<int32_t>();
  const auto* bounds = static_cast<const uint8_t*>(cache.kbounds.raw_data());
  const float* bound_params = cache.kbound_params.data<float>();
  int32_t* out_tables = tables.data<int32_t>();
  int32_t* out_lens = lens.data<int32_t>();
  std::vector<float> qrows(static_cast<size_t>(group * head_dim));  // the kv head's query heads
  std::vector<std::pair<float, int64_t>> ranked;
  std::vector<char> keep;
  for (int s = 0; s < meta.num_seqs; ++s) {
    const int32_t* table = block_tables + s * cols;
    const int64_t context_len = load_i32(meta.context_lens, s);
    const int64_t entries = (context_len + block_size - 1) / block_size;
    int64_t history = 0;
    while (history < entries && table[history] >= num_blocks) ++history;
    const int64_t sinks = std::min<int64_t>(meta.sparse_sink_blocks, history);
    const int64_t budget = load_i32(meta.sparse_budgets, s);
    const int64_t k = std::max<int64_t>(1, budget / block_size);
    const bool one_query = load_i32(meta.query_start, s + 1) - load_i32(meta.query_start, s) == 1;
    const bool dense = budget <= 0 || k >= history - sinks || !one_query;
    for (int64_t h = 0; h < kv_heads; ++h) {
      int32_t* out = out_tables + (s * kv_heads + h) * cols;
      std::fill(out, out + cols, -1);
      if (dense) {
        std::copy(table, table + entries, out);
        out_lens[s * kv_heads + h] = static_cast<int32_t>(context_len);
        continue;
      }
      const int64_t row = load_i32(meta.query_start, s);
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t d = 0; d < head_dim; ++d) {
          qrows[static_cast<size_t>(g * head_dim + d)] = q.data<float>()[offset3(q, row, h * group + g, d)];
        }
      }
      ranked.clear();
      for (int64_t i = sinks; i < history; ++i) {
        const int64_t hb = table[i] - num_blocks;
        const uint8_t* codes = bounds + (hb * kv_heads + h) * head_dim;
        const float* params = bound_params + (hb * kv_heads + h) * 2 * key_bound_groups(head_dim);
        float score = -std::numeric_limits<float>::infinity();
        for (int64_t g = 0; g < group; ++g) {
          const float b = key_bound(qrows.data() + g * head_dim, codes, params, head_dim);
          score = std::isnan(b) ? std::numeric_limits<float>::infinity() : std::max(score, b);
        }
        ranked.emplace_back(score, i);
      }
      // Highest score first, ties to the earlier entry (NaN already ranks as +inf).
      std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      keep.assign(static_cast<size_t>(entries), 0);
      for (int64_t i = 0; i < sinks; ++i) keep[static_cast<size_t>(i)] = 1;
      for (int64_t i = history; i < entries; ++i) keep[static_cast<size_t>(i)] = 1;
      for (int64_t i = 0; i < k; ++i) keep[static_cast<size_t>(ranked[static_cast<size_t>(i)].second)] = 1;
      int64_t n = 0;
      for (int64_t i = 0; i < entries; ++i) {
        if (keep[static_cast<size_t>(i)]) out[n++] = table[i];
      }
      out_lens[s * kv_heads + h] = static_cast<int32_t>(context_len - (entries - n) * block_size);
    }
  }
}

void store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, KvLayer& cache) {
  const int64_t n = k.size(0), kv_heads = k.size(1), head_dim = k.size(2);
  const int64_t block_size = cache.k.size(1);
  const DType dtype = cache.k.dtype();
  const bool quantized = is_quantized_kv_dtype(dtype);
  std::vector<float> row(static_cast<size_t>(head_dim));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t slot = load_i32(slot_mapping, t);
    if (slot < 0) continue;  // padding token: nothing stored
    const int64_t block = slot / block_size, offset = slot % block_size;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t row_index = (block * block_size + offset) * kv_heads + h;  // (slot, head)
      for (int which = 0; which < 2; ++which) {
        const Tensor& src = which == 0 ? k : v;
        Tensor& dst = which == 0 ? cache.k : cache.v;
        for (int64_t i = 0; i < head_dim; ++i) row[static_cast<size_t>(i)] = src.data<float>()[offset3(src, t, h, i)];
        if (quantized) {
          Tensor& scales = which == 0 ? cache.k_scales : cache.v_scales;
          quantize_kv_row(row.data(), head_dim, dtype, static_cast<uint8_t*>(dst.raw_data()) + row_index * head_dim,
                          scales.data<float>() + row_index);
        } else {
          for (int64_t i = 0; i < head_dim; ++i) {
            store_f32(dst.raw_data(), dtype, row_index * head_dim + i, row[static_cast<size_t>(i)]);
          }
        }
      }
    }
  }
}


void paged_attention(const Tensor& q, const KvLayer& cache, const AttentionMetadata& meta,
                     const AttentionParams& params, Tensor& out) {
  const int64_t num_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = cache.k.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t block_size = meta.block_size;
  const int64_t max_blocks = meta.block_tables.size(1);
  const bool sparse = meta.sparse_tables.defined();
  std::vector<double> scores;
  std::vector<double> acc(static_cast<size_t>(head_dim));
  for (int s = 0; s < meta.num_seqs; ++s) {
    const int64_t q_begin = load_i32(meta.query_start, s), q_end = load_i32(meta.query_start, s + 1);
    const int64_t context_len = load_i32(meta.context_lens, s);
    for (int64_t row = q_begin; row < q_end; ++row) {
      int64_t pos = context_len - (q_end - q_begin) + (row - q_begin);  // absolute position of the query
      int64_t first = params.sliding_window > 0 ? std::max<int64_t>(0, pos - params.sliding_window + 1) : 0;
      // Token trees: of the chunk's own keys, only those whose bit is set.
      int64_t chunk_start = context_len - (q_end - q_begin);
      const uint64_t mask =
          meta.tree_masks.defined() ? static_cast<const uint64_t*>(meta.tree_masks.raw_data())[row] : ~uint64_t{0};
      const auto visible = [&](int64_t j) {
        return mask == ~uint64_t{0} || j < chunk_start || (mask >> (j - chunk_start) & 1) != 0;
      };
      for (int64_t h = 0; h < num_heads; ++h) {
        const int64_t kvh = h / group;
        // Block-sparse: this kv head's kept blocks form the context, the chunk's queries at its end.
        const int32_t* table = sparse ? meta.sparse_tables.data<int32_t>() + (s * num_kv_heads + kvh) * max_blocks
                                      : meta.block_tables.data<int32_t>() + s * max_blocks;
        if (sparse) {
          const int64_t len = meta.sparse_lens.data<int32_t>()[s * num_kv_heads + kvh];
          pos = len - (q_end - row);
          chunk_start = len - (q_end - q_begin);
          first = 0;
        }
        scores.assign(static_cast<size_t>(pos - first + 1), 0.0);
        for (int64_t j = first; j <= pos; ++j) {
          if (!visible(j)) {
            scores[static_cast<size_t>(j - first)] = -std::numeric_limits<double>::infinity();
            continue;
          }
          const int64_t block = table[j / block_size];
          const int64_t row_in_block = (j % block_size) * num_kv_heads + kvh;
          double dot = 0.0;
          for (int64_t i = 0; i < head_dim; ++i) {
            dot += static_cast<double>(q.data<float>()[offset3(q, row, h, i)]) *
                   load_cached(cache, 0, block, row_in_block, i);
          }
          scores[static_cast<size_t>(j - first)] = dot * params.scale;
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double& sc : scores) {
          sc = std::exp(sc - mx);
          sum += sc;
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = first; j <= pos; ++j) {
          if (!visible(j)) continue;
          const int64_t block = table[j / block_size];
          const int64_t row_in_block = (j % block_size) * num_kv_heads + kvh;
          const double p = scores[static_cast<size_t>(j - first)] / sum;
          for (int64_t i = 0; i < head_dim; ++i) {
            acc[static_cast<size_t>(i)] += p * load_cached(cache, 1, block, row_in_block, i);
          }
        }
        for (int64_t i = 0; i < head_dim; ++i) {
          out.data<float>()[offset3(out, row, h, i)] = static_cast<float>(acc[static_cast<size_t>(i)]);
        }
      }
    }
  }
}

void contiguous_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                          Tensor& out) {
  const int64_t n = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t context_len = k.size(0), num_kv_heads = k.size(1);
  const int64_t group = num_heads / num_kv_heads;
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (int64_t h = 0; h < num_heads; ++h) {
    const int64_t kvh = h / group;
    // scores[i][j] for query i, key j; masked entries -inf.
    std::vector<double> scores(static_cast<size_t>(n * context_len), neg_inf);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = context_len - n + i;
      for (int64_t j = 0; j < context_len; ++j) {
        const bool causal_ok = j <= pos;
        const bool window_ok = params.sliding_window <= 0 || pos - j < params.sliding_window;
        if (!causal_ok || !window_ok) continue;
        double dot = 0.0;
        for (int64_t d = 0; d < head_dim; ++d) {
          dot +=
              static_cast<double>(qp[(i * num_heads + h) * head_dim + d]) * kp[(j * num_kv_heads + kvh) * head_dim + d];
        }
        scores[static_cast<size_t>(i * context_len + j)] = dot * params.scale;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      double* row = &scores[static_cast<size_t>(i * context_len)];
      double mx = neg_inf;
      for (int64_t j = 0; j < context_len; ++j) mx = std::max(mx, row[j]);
      double sum = 0.0;
      for (int64_t j = 0; j < context_len; ++j) {
        row[j] = row[j] == neg_inf ? 0.0 : std::exp(row[j] - mx);
        sum += row[j];
      }
      for (int64_t d = 0; d < head_dim; ++d) {
        double o = 0.0;
        for (int64_t j = 0; j < context_len; ++j) o += row[j] * vp[(j * num_kv_heads + kvh) * head_dim + d];
        out.data<float>()[(i * num_heads + h) * head_dim + d] = static_cast<float>(o / sum);
      }
    }
  }
}

}  // namespace tachyon::ops::reference

namespace tachyon::ops::reference {

void moe_route(const Tensor& logits, bool normalize, Tensor& ids, Tensor& weights) {
  const int64_t n = logits.size(0), e = logits.size(1), k = ids.size(1);
  std::vector<int32_t> order(static_cast<size_t>(e));
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits.data<float>() + t * logits.stride(0);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < e; ++i) {
      if (!std::isnan(x[i])) m = std::max(m, static_cast<double>(x[i]));
    }
    double sum = 0.0;
    for (int64_t i = 0; i < e; ++i) sum += std::exp(static_cast<double>(x[i]) - m);
    for (int64_t i = 0; i < e; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    // Larger logit first, NaN last, the lower id first on ties: a stable sort on "ranks above".
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      if (std::isnan(x[b])) return !std::isnan(x[a]);
      return !std::isnan(x[a]) && x[a] > x[b];
    });
    double chosen = 0.0;
    for (int64_t j = 0; j < k; ++j) chosen += std::exp(static_cast<double>(x[order[static_cast<size_t>(j)]]) - m);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = order[static_cast<size_t>(j)];
      const double p = std::exp(static_cast<double>(x[id]) - m);
      ids.data<int32_t>()[t * k + j] = id;
      weights.data<float>()[t * k + j] = static_cast<float>(p / (normalize ? chosen : sum));
    }
  }
}

void moe_experts(const Tensor& x, const MoeExperts& experts, const Tensor& ids, const Tensor& weights, Tensor& y) {
  const int64_t n = x.size(0), hidden = x.size(1), k = ids.size(1), inter = experts.inter;
  // One expert's rows through the reference linear (packed: dequantize, then the reference).
  const auto expert_linear = [](const Tensor& in, const Weight& w, int64_t row0, int64_t count, Tensor& out) {
    const Weight rows = weight_rows(w, row0, count);
    if (rows.quant) {
      cpu::quant_linear_reference(in, *rows.quant, nullptr, out);
    } else {
      linear(in, rows, nullptr, out);
    }
  };
  Tensor g = Tensor::empty({1, inter}, DType::kF32), u = Tensor::empty({1, inter}, DType::kF32);
  Tensor o = Tensor::empty({1, hidden}, DType::kF32);
  std::vector<double> acc(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < n; ++t) {
    const Tensor xt = x.slice(0, t, t + 1);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids.data<int32_t>()[t * k + j];
      expert_linear(xt, experts.gate, e * inter, inter, g);
      expert_linear(xt, experts.up, e * inter, inter, u);
      silu_mul(g, u, g);
      expert_linear(g, experts.down, e * hidden, hidden, o);
      const double w = weights.data<float>()[t * k + j];
      for (int64_t i = 0; i < hidden; ++i) acc[static_cast<size_t>(i)] += w * o.data<float>()[i];
    }
    float* yt = y.data<float>() + t * y.stride(0);
    for (int64_t i = 0; i < hidden; ++i) yt[i] = static_cast<float>(acc[static_cast<size_t>(i)]);
  }
}

void add_sigmoid_gated(Tensor& y, const Tensor& x, const Tensor& gate) {
  const int64_t n = y.size(0), d = y.size(1);
  for (int64_t t = 0; t < n; ++t) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(gate.data<float>()[t * gate.stride(0)])));
    float* yt = y.data<float>() + t * y.stride(0);
    const float* xt = x.data<float>() + t * x.stride(0);
    for (int64_t i = 0; i < d; ++i) yt[i] = static_cast<float>(yt[i] + s * xt[i]);
  }
}

}  // namespace tachyon::ops::reference
