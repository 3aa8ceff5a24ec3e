#include "quant/awq.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/quantize.h"

namespace tachyon {

namespace {

void check_weight(const Tensor& w, const char* what) {
  TACHYON_CHECK(w.dim() == 2 && (w.size(1) <= 1 || w.stride(1) == 1) && w.device().is_cpu(), "{}: weight {}", what,
                w.shape_string());
}

}  // namespace

std::vector<float> awq_scales(std::span<const float> mean_abs, float alpha) {
  std::vector<float> s(mean_abs.size());
  float lo = std::numeric_limits<float>::infinity(), hi = 0.0f;
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] = std::max(std::pow(std::max(mean_abs[i], 0.0f), alpha), 1e-4f);
    lo = std::min(lo, s[i]);
    hi = std::max(hi, s[i]);
  }
  const float norm = std::sqrt(lo * hi);
  if (norm > 0.0f && std::isfinite(norm)) {
    for (float& v : s) v /= norm;
  }
  return s;
}

Tensor scale_weight(const Tensor& w, std::span<const float> column_scales, std::span<const float> row_scales) {
  check_weight(w, "scale_weight");
  const int64_t out = w.size(0), in = w.size(1);
  TACHYON_CHECK(column_scales.empty() || static_cast<int64_t>(column_scales.size()) == in,
                "scale_weight: {} column scales for {}", column_scales.size(), w.shape_string());
  TACHYON_CHECK(row_scales.empty() || static_cast<int64_t>(row_scales.size()) == out,
                "scale_weight: {} row scales for {}", row_scales.size(), w.shape_string());
  Tensor r = Tensor::empty({out, in}, DType::kF32);
  parallel_for(out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      float* dst = r.data<float>() + o * in;
      load_row_f32(w, o, dst);
      const float row = row_scales.empty() ? 1.0f : row_scales[static_cast<size_t>(o)];
      for (int64_t i = 0; i < in; ++i) {
        dst[i] = dst[i] * (column_scales.empty() ? 1.0f : column_scales[static_cast<size_t>(i)]) * row;
      }
    }
  });
  return r;
}

Result<Tensor> awq_fake_quantize(const Tensor& w, std::span<const float> s, int group) {
  check_weight(w, "awq_fake_quantize");
  TACHYON_CHECK(static_cast<int64_t>(s.size()) == w.size(1), "awq_fake_quantize: {} for {} scales",
                w.shape_string(), s.size());
  if (group != 32 && group != 64 && group != 128) {
    return make_error(ErrorCode::kInvalidArgument, "AWQ: group size {} (expected 32, 64 or 128)", group);
  }
  const int64_t out = w.size(0), in = w.size(1);
  if (in % group != 0) {
    return make_error(ErrorCode::kInvalidArgument, "AWQ: in_features {} is not a multiple of the group size {}", in,
                      group);
  }
  // quantize_int4_group's rounding (int4_group_params, int4_code) and dequantize()'s
  // (code - zero) * scale on each group of w diag(s), without packing the codes; then / s.
  Tensor d = Tensor::empty({out, in}, DType::kF32);
  std::vector<int64_t> bad_rows(static_cast<size_t>(out), -1);
  parallel_for(out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      float* v = d.data<float>() + o * in;  // the scaled row, then its rounded values in place
      load_row_f32(w, o, v);
      for (int64_t i = 0; i < in; ++i) v[i] *= s[static_cast<size_t>(i)];
      for (int64_t g0 = 0; g0 < in; g0 += group) {
        float lo = 0.0f, hi = 0.0f;
        bool finite = true;
        for (int64_t i = g0; i < g0 + group; ++i) {
          finite = finite && std::isfinite(v[i]);
          lo = std::min(lo, v[i]);
          hi = std::max(hi, v[i]);
        }
        const Int4GroupParams p = int4_group_params(lo, hi, Int4Scales::kF16);
        if (!finite || !std::isfinite(p.scale)) bad_rows[static_cast<size_t>(o)] = o;
        for (int64_t i = g0; i < g0 + group; ++i) v[i] = (int4_code(v[i], p) - p.zero) * p.scale / s[static_cast<size_t>(i)];
      }
    }
  });
  for (int64_t o : bad_rows) {
    if (o >= 0) {
      return make_error(ErrorCode::kInvalidArgument, "AWQ: row {} of the scaled weight is not finite or too wide for "
                        "f16 scales", o);
    }
  }
  return d;
}

Result<AwqSearchResult> awq_search(const std::vector<Tensor>& weights, std::span<const float> mean_abs,
                                   const AwqOptions& options, const AwqErrorFn& error) {
  if (weights.empty()) return make_error(ErrorCode::kInvalidArgument, "AWQ search: no weights");
  if (options.grid < 1) return make_error(ErrorCode::kInvalidArgument, "AWQ search: grid of {} points", options.grid);
  for (const Tensor& w : weights) {
    if (w.dim() != 2 || w.size(1) != static_cast<int64_t>(mean_abs.size())) {
      return make_error(ErrorCode::kInvalidArgument, "AWQ search: weight {} for {} input channels", w.shape_string(),
                        mean_abs.size());
    }
  }
  for (size_t i = 0; i < mean_abs.size(); ++i) {
    if (!std::isfinite(mean_abs[i])) {
      return make_error(ErrorCode::kInvalidArgument, "AWQ search: mean |x| of input channel {} is {}", i, mean_abs[i]);
    }
  }
  AwqSearchResult best;
  best.error = std::numeric_limits<double>::infinity();
  for (int step = 0; step < options.grid; ++step) {
    const float alpha = static_cast<float>(step) / static_cast<float>(options.grid);
    std::vector<float> s = awq_scales(mean_abs, alpha);
    std::vector<Tensor> candidates;
    for (const Tensor& w : weights) {
      TACHYON_ASSIGN_OR_RETURN(Tensor c, awq_fake_quantize(w, s, options.group_size));
      candidates.push_back(std::move(c));
    }
    TACHYON_ASSIGN_OR_RETURN(double e, error(candidates));
    if (!std::isfinite(e)) e = std::numeric_limits<double>::infinity();
    best.errors.push_back(e);
    if (step == 0) best.rtn_error = e;
    if (e < best.error) {
      best.error = e;
      best.alpha = alpha;
      best.scales = std::move(s);
    }
  }
  if (best.scales.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "AWQ search: the output error is not finite for any alpha");
  }
  return best;
}

std::vector<double> group_gram(const Tensor& x, std::span<const float> column_scales, int group) {
  TACHYON_CHECK(x.dim() == 2 && x.dtype() == DType::kF32 && x.stride(1) == 1 && x.device().is_cpu() && group > 0 &&
                    x.size(1) % group == 0 &&
                    (column_scales.empty() || static_cast<int64_t>(column_scales.size()) == x.size(1)),
                "group_gram: x {} group {} scales {}", x.shape_string(), group, column_scales.size());
  const int64_t n = x.size(0), in = x.size(1), groups = in / group, gg = static_cast<int64_t>(group) * group;
  std::vector<double> gram(static_cast<size_t>(groups * gg), 0.0);
  parallel_for(groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> row(static_cast<size_t>(group));
    for (int64_t g = begin; g < end; ++g) {
      double* G = gram.data() + g * gg;
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = x.data<float>() + t * x.stride(0) + g * group;
        for (int i = 0; i < group; ++i) {
          const float s = column_scales.empty() ? 1.0f : column_scales[static_cast<size_t>(g * group + i)];
          row[static_cast<size_t>(i)] = static_cast<double>(xt[i] / s);
        }
        for (int i = 0; i < group; ++i) {
          const double xi = row[static_cast<size_t>(i)];
          double* Gi = G + static_cast<int64_t>(i) * group;
          for (int j = i; j < group; ++j) Gi[j] += xi * row[static_cast<size_t>(j)];
        }
      }
      for (int i = 0; i < group; ++i) {
        for (int j = 0; j < i; ++j) G[static_cast<int64_t>(i) * group + j] = G[static_cast<int64_t>(j) * group + i];
      }
    }
  });
  return gram;
}

Result<AwqClipResult> awq_clip(const Tensor& w, std::span<const double> gram, const AwqClipOptions& options) {
  check_weight(w, "awq_clip");
  const int group = options.group_size;
  if (group != 32 && group != 64 && group != 128) {
    return make_error(ErrorCode::kInvalidArgument, "AWQ clip: group size {} (expected 32, 64 or 128)", group);
  }
  if (options.grid < 1 || !(options.min_ratio > 0.0f && options.min_ratio < 1.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "AWQ clip: grid {} and minimum ratio {}", options.grid,
                      options.min_ratio);
  }
  const int64_t out = w.size(0), in = w.size(1);
  if (in % group != 0) {
    return make_error(ErrorCode::kInvalidArgument, "AWQ clip: in_features {} is not a multiple of the group size {}",
                      in, group);
  }
  const int64_t groups = in / group, gg = static_cast<int64_t>(group) * group;
  if (static_cast<int64_t>(gram.size()) != groups * gg) {
    return make_error(ErrorCode::kInvalidArgument, "AWQ clip: {} Gram entries for {} groups of {}", gram.size(),
                      groups, group);
  }
  AwqClipResult r;
  r.weight = Tensor::empty({out, in}, DType::kF32);
  std::vector<double> ratio_sum(static_cast<size_t>(out), 0.0), err(static_cast<size_t>(out), 0.0),
      err1(static_cast<size_t>(out), 0.0);
  std::vector<int64_t> bad_rows(static_cast<size_t>(out), -1);
  parallel_for(out, 4, [&](int64_t begin, int64_t end) {
    std::vector<double> d(static_cast<size_t>(group)), gd(static_cast<size_t>(group));
    for (int64_t o = begin; o < end; ++o) {
      float* row = r.weight.data<float>() + o * in;
      load_row_f32(w, o, row);
      for (int64_t g = 0; g < groups; ++g) {
        float* v = row + g * group;
        const double* G = gram.data() + g * gg;
        float lo = 0.0f, hi = 0.0f;
        for (int i = 0; i < group; ++i) {
          lo = std::min(lo, v[i]);
          hi = std::max(hi, v[i]);
        }
        if (!std::isfinite(lo) || !std::isfinite(hi)) {
          bad_rows[static_cast<size_t>(o)] = o;
          break;
        }
        double best = std::numeric_limits<double>::infinity(), at_one = 0.0;
        float best_ratio = 1.0f;
        for (int step = 0; step < options.grid; ++step) {
          const float ratio = 1.0f - (1.0f - options.min_ratio) * static_cast<float>(step) / options.grid;
          const float clo = lo * ratio, chi = hi * ratio;
          const Int4GroupParams p = int4_group_params(clo, chi, Int4Scales::kF16);
          if (!std::isfinite(p.scale)) continue;
          for (int i = 0; i < group; ++i) {
            const float c = std::clamp(v[i], clo, chi);
            d[static_cast<size_t>(i)] = static_cast<double>(v[i]) - (int4_code(c, p) - p.zero) * p.scale;
          }
          double e = 0.0;
          for (int i = 0; i < group; ++i) {
            const double* Gi = G + static_cast<int64_t>(i) * group;
            double s = 0.0;
            for (int j = 0; j < group; ++j) s += Gi[j] * d[static_cast<size_t>(j)];
            e += d[static_cast<size_t>(i)] * s;
          }
          if (step == 0) at_one = e;
          if (e < best) {  // ties keep the wider range
            best = e;
            best_ratio = ratio;
          }
        }
        if (!std::isfinite(best)) {
          bad_rows[static_cast<size_t>(o)] = o;
          break;
        }
        const float clo = lo * best_ratio, chi = hi * best_ratio;
        for (int i = 0; i < group; ++i) v[i] = std::clamp(v[i], clo, chi);
        ratio_sum[static_cast<size_t>(o)] += best_ratio;
        err[static_cast<size_t>(o)] += best;
        err1[static_cast<size_t>(o)] += at_one;
      }
    }
  });
  for (int64_t o : bad_rows) {
    if (o >= 0) {
      return make_error(ErrorCode::kInvalidArgument, "AWQ clip: row {} is not finite or too wide for f16 scales", o);
    }
  }
  double ratios = 0.0;
  for (int64_t o = 0; o < out; ++o) {
    ratios += ratio_sum[static_cast<size_t>(o)];
    r.error += err[static_cast<size_t>(o)];
    r.unclipped_error += err1[static_cast<size_t>(o)];
  }
  r.mean_ratio = ratios / static_cast<double>(out * groups);
  return r;
}

}  // namespace tachyon
