// Activation observers: what a static activation scale is calibrated with. Each sees the
// activations a layer reads over the calibration batches and picks a clipping threshold T (an
// absolute value); the scale of a symmetric format with largest code `qmax` (127 for int8, 448 for
// fp8 e4m3) is T / qmax, and values beyond T are clipped.
// - kMinMax: the largest |x| seen.
// - kMovingAverage: the batches' largest |x|, averaged exponentially (T <- (1 - c) T + c max|x|,
//   the first batch's max to start; c = `averaging`), as PyTorch's MovingAverageMinMaxObserver.
// - kPercentile: the `percentile`-th percentile of |x| over everything seen, read from the
//   histogram (the upper edge of the bin where the cumulative count reaches it).
// - kEntropy: the threshold whose clipped, `levels`-level quantized distribution is closest to the
//   observed one in KL divergence (TensorRT's entropy calibration): for every candidate T = the
//   upper edge of bin i (i >= levels), P is the histogram of |x| up to bin i with everything
//   beyond folded into bin i, Q the same bins merged into `levels` equal groups and each group's
//   count spread evenly over its non-empty bins; T minimizes KL(P || Q).
// The histogram has `bins` equal bins over [0, R); when a batch holds a value >= R, R doubles
// (adjacent bins merged pairwise) until it holds it, so one pass over the batches suffices.
// Non-finite values are skipped (and counted).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace tachyon {

enum class ObserverKind : uint8_t { kMinMax, kMovingAverage, kPercentile, kEntropy };
// "minmax", "moving-average", "percentile", "entropy"
const char* observer_name(ObserverKind kind);
Result<ObserverKind> parse_observer(const std::string& name);

struct ObserverOptions {
  ObserverKind kind = ObserverKind::kMinMax;
  double percentile = 99.99;  // kPercentile, in (0, 100]
  double averaging = 0.01;    // kMovingAverage, in (0, 1]
  int bins = 2048;            // kPercentile, kEntropy: histogram bins (a multiple of `levels`, >= 2 levels)
  int levels = 128;           // kEntropy: quantization levels of |x| (128 for int8's 0..127)
};

class ActivationObserver {
 public:
  explicit ActivationObserver(ObserverOptions options = {});

  // One calibration batch: any number of activations of one module's input.
  void observe(std::span<const float> batch);

  // The clipping threshold; 0 before any finite value was seen.
  float threshold() const;
  // threshold() / qmax: the static scale (0 when nothing was seen).
  float scale(float qmax) const { return threshold() / qmax; }

  double max_seen() const { return max_; }
  int64_t count() const { return count_; }
  int64_t non_finite() const { return non_finite_; }
  const std::vector<int64_t>& histogram() const { return hist_; }
  double histogram_range() const { return range_; }

 private:
  float entropy_threshold() const;
  float percentile_threshold() const;

  ObserverOptions o_;
  double max_ = 0.0;
  double moving_ = -1.0;  // kMovingAverage; < 0 before the first batch
  std::vector<int64_t> hist_;
  double range_ = 0.0;  // the histogram covers [0, range_)
  int64_t count_ = 0;
  int64_t non_finite_ = 0;
};

// Symmetric fake quantization with scale s and codes in [-qmax, qmax] (rounded to nearest, ties to
// even): the reference for what a static scale costs, clip(round(x / s)) * s.
float fake_quantize(float x, float scale, float qmax);

}  // namespace tachyon
