#include "quant/observers.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tachyon {

const char* observer_name(ObserverKind kind) {
  switch (kind) {
    case ObserverKind::kMinMax: return "minmax";
    case ObserverKind::kMovingAverage: return "moving-average";
    case ObserverKind::kPercentile: return "percentile";
    case ObserverKind::kEntropy: return "entropy";
  }
  return "?";
}

Result<ObserverKind> parse_observer(const std::string& name) {
  for (ObserverKind k :
       {ObserverKind::kMinMax, ObserverKind::kMovingAverage, ObserverKind::kPercentile, ObserverKind::kEntropy}) {
    if (name == observer_name(k)) return k;
  }
  return make_error(ErrorCode::kInvalidArgument, "observer '{}': expected minmax, moving-average, percentile or entropy",
                    name);
}

ActivationObserver::ActivationObserver(ObserverOptions options) : o_(options) {
  o_.levels = std::max(o_.levels, 2);
  o_.bins = std::max(o_.bins / o_.levels, 2) * o_.levels;  // whole groups of bins per level
  hist_.assign(static_cast<size_t>(o_.bins), 0);
}

void ActivationObserver::observe(std::span<const float> batch) {
  double batch_max = -1.0;
  for (const float x : batch) {
    if (!std::isfinite(x)) {
      ++non_finite_;
      continue;
    }
    batch_max = std::max(batch_max, static_cast<double>(std::fabs(x)));
  }
  if (batch_max < 0.0) return;  // nothing finite
  max_ = std::max(max_, batch_max);
  moving_ = moving_ < 0.0 ? batch_max : (1.0 - o_.averaging) * moving_ + o_.averaging * batch_max;
  if (o_.kind != ObserverKind::kPercentile && o_.kind != ObserverKind::kEntropy) {
    for (const float x : batch) count_ += std::isfinite(x) ? 1 : 0;
    return;
  }
  if (range_ == 0.0) range_ = batch_max > 0.0 ? batch_max * (1.0 + 1e-6) : 1e-30;
  while (batch_max >= range_) {
    // Double the range: bin j of the new histogram holds old bins 2j and 2j + 1.
    const size_t n = hist_.size();
    for (size_t j = 0; j < n / 2; ++j) hist_[j] = hist_[2 * j] + hist_[2 * j + 1];
    std::fill(hist_.begin() + static_cast<std::ptrdiff_t>(n / 2), hist_.end(), 0);
    range_ *= 2.0;
  }
  const double per_bin = static_cast<double>(hist_.size()) / range_;
  for (const float x : batch) {
    if (!std::isfinite(x)) continue;
    const size_t b = std::min(hist_.size() - 1, static_cast<size_t>(std::fabs(x) * per_bin));
    ++hist_[b];
    ++count_;
  }
}

float ActivationObserver::threshold() const {
  if (count_ == 0) return 0.0f;
  switch (o_.kind) {
    case ObserverKind::kMinMax: return static_cast<float>(max_);
    case ObserverKind::kMovingAverage: return static_cast<float>(moving_);
    case ObserverKind::kPercentile: return percentile_threshold();
    case ObserverKind::kEntropy: return entropy_threshold();
  }
  return static_cast<float>(max_);
}

float ActivationObserver::percentile_threshold() const {
  const double want = std::clamp(o_.percentile, 0.0, 100.0) / 100.0 * static_cast<double>(count_);
  const double width = range_ / static_cast<double>(hist_.size());
  int64_t cumulative = 0;
  for (size_t b = 0; b < hist_.size(); ++b) {
    cumulative += hist_[b];
    if (static_cast<double>(cumulative) >= want) {
      return static_cast<float>(std::min((static_cast<double>(b) + 1.0) * width, max_));
    }
  }
  return static_cast<float>(max_);
}

float ActivationObserver::entropy_threshold() const {
  const int n = static_cast<int>(hist_.size());
  const int levels = o_.levels;
  // The last non-empty bin: candidates beyond it all equal "no clipping".
  int last = n - 1;
  while (last > 0 && hist_[static_cast<size_t>(last)] == 0) --last;
  const double width = range_ / static_cast<double>(n);
  if (last + 1 <= levels) return static_cast<float>(max_);  // fewer bins in use than levels: exact
  double best_kl = std::numeric_limits<double>::infinity();
  int best = last + 1;
  std::vector<double> p, q;
  for (int i = levels; i <= last + 1; ++i) {
    // P: bins [0, i), the mass at and beyond bin i folded into bin i - 1.
    p.assign(hist_.begin(), hist_.begin() + i);
    double outliers = 0.0;
    for (int b = i; b < n; ++b) outliers += static_cast<double>(hist_[static_cast<size_t>(b)]);
    p[static_cast<size_t>(i - 1)] += outliers;
    // Q: the bins before folding, in `levels` groups, each group's mass spread evenly over the
    // bins where P is not empty; then Q smoothed so that Q > 0 wherever P > 0 (a clipped
    // group that held nothing but the folded outliers gets a sliver: clipping is penalized, not
    // ruled out).
    q.assign(static_cast<size_t>(i), 0.0);
    for (int g = 0; g < levels; ++g) {
      const int begin = static_cast<int>(static_cast<int64_t>(g) * i / levels);
      const int end = static_cast<int>(static_cast<int64_t>(g + 1) * i / levels);
      double mass = 0.0;
      int nonempty = 0;
      for (int b = begin; b < end; ++b) {
        mass += static_cast<double>(hist_[static_cast<size_t>(b)]);
        nonempty += p[static_cast<size_t>(b)] > 0.0 ? 1 : 0;
      }
      if (nonempty == 0) continue;
      for (int b = begin; b < end; ++b) {
        if (p[static_cast<size_t>(b)] > 0.0) q[static_cast<size_t>(b)] = mass / nonempty;
      }
    }
    const auto normalize = [](std::vector<double>& d) {
      double sum = 0.0;
      for (double v : d) sum += v;
      if (sum > 0.0) {
        for (double& v : d) v /= sum;
      }
    };
    normalize(p);
    normalize(q);
    // TensorRT's smoothing: eps moved onto the zeros from the non-zeros.
    const auto smooth = [](std::vector<double>& d) {
      constexpr double kEps = 1e-4;
      int64_t zeros = 0;
      for (double v : d) zeros += v == 0.0 ? 1 : 0;
      const int64_t nonzeros = static_cast<int64_t>(d.size()) - zeros;
      if (zeros == 0 || nonzeros == 0) return;
      const double take = kEps * static_cast<double>(zeros) / static_cast<double>(nonzeros);
      for (double& v : d) v = v == 0.0 ? kEps : v - take;
    };
    smooth(q);
    double kl = 0.0;
    for (int b = 0; b < i; ++b) {
      const double pb = p[static_cast<size_t>(b)], qb = q[static_cast<size_t>(b)];
      if (pb > 0.0 && qb > 0.0) kl += pb * std::log(pb / qb);
    }
    if (kl < best_kl) {
      best_kl = kl;
      best = i;
    }
  }
  return static_cast<float>(std::min(static_cast<double>(best) * width, max_));
}

float fake_quantize(float x, float scale, float qmax) {
  if (!(scale > 0.0f)) return 0.0f;
  const float q = std::clamp(std::nearbyint(x / scale), -qmax, qmax);
  return q * scale;
}

}  // namespace tachyon
