// Activation observers (quant/observers.h) on distributions small enough to work out by hand, the
// histogram's range doubling, and the reason entropy calibration exists: on activations with a
// few outliers its static int8 scale gives a linear layer a smaller output error than min-max's.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/observers.h"
#include "test_util.h"

namespace tachyon {
namespace {

ActivationObserver observer(ObserverKind kind, int bins = 2048, int levels = 128) {
  ObserverOptions o;
  o.kind = kind;
  o.bins = bins;
  o.levels = levels;
  o.averaging = 0.1;
  o.percentile = 99.0;
  return ActivationObserver(o);
}

TEST(Observers, MinMaxAndMovingAverageByHand) {
  for (ObserverKind kind : {ObserverKind::kMinMax, ObserverKind::kMovingAverage}) {
    ActivationObserver a = observer(kind);
    EXPECT_EQ(a.threshold(), 0.0f);  // nothing seen
    a.observe(std::vector<float>{1.0f, -4.0f, 2.0f});
    a.observe(std::vector<float>{0.5f, -8.0f, NAN, INFINITY});
    a.observe(std::vector<float>{2.0f, 1.0f});
    EXPECT_EQ(a.count(), 7);
    EXPECT_EQ(a.non_finite(), 2);
    EXPECT_EQ(a.max_seen(), 8.0);
    // moving average, c = 0.1: 4, then 0.9 * 4 + 0.1 * 8 = 4.4, then 0.9 * 4.4 + 0.1 * 2 = 4.16
    EXPECT_FLOAT_EQ(a.threshold(), kind == ObserverKind::kMinMax ? 8.0f : 4.16f);
    EXPECT_FLOAT_EQ(a.scale(127.0f), a.threshold() / 127.0f);
  }
  ActivationObserver empty = observer(ObserverKind::kEntropy);
  empty.observe(std::vector<float>{NAN});
  EXPECT_EQ(empty.threshold(), 0.0f);
}

// 400, 200, 100 and 50 values in the first four of 8 bins and one outlier in the last, 4 levels.
// Clipping after bin 4 folds the outlier into it: P = (400, 200, 100, 51), Q = (400, 200, 100, 50),
// KL 1.3e-5. Keeping the whole range merges bins pairwise: Q = (300, 300, 75, 75, 0, 0, 0, 1), KL
// 0.057; the thresholds between do worse than bin 4 too (0.026 and more). So entropy calibration
// clips at the end of bin 4, and so does the 99th percentile (750 of 751 values below it).
TEST(Observers, EntropyAndPercentileByHand) {
  std::vector<float> v;
  v.insert(v.end(), 400, 0.5f);
  v.insert(v.end(), 200, -1.5f);
  v.insert(v.end(), 100, 2.5f);
  v.insert(v.end(), 50, 3.5f);
  v.push_back(-7.5f);
  for (ObserverKind kind : {ObserverKind::kEntropy, ObserverKind::kPercentile, ObserverKind::kMinMax}) {
    ActivationObserver a = observer(kind, 8, 4);
    a.observe(v);
    const double width = 7.5 / 8;
    EXPECT_EQ(a.histogram().size(), 8u);
    if (kind != ObserverKind::kMinMax) {
      EXPECT_NEAR(a.histogram_range() / 8, width, 1e-5);
      EXPECT_EQ(a.histogram(), (std::vector<int64_t>{400, 200, 100, 50, 0, 0, 0, 1}));
    }
    EXPECT_NEAR(a.threshold(), kind == ObserverKind::kMinMax ? 7.5 : 4 * width, 1e-5) << observer_name(kind);
  }
}

// Values 1..10000 in batches of growing range: the histogram doubles its range as it must and
// keeps every count; the 99th percentile lands within one bin of 9,900.
TEST(Observers, HistogramGrowsAndPercentileHolds) {
  ActivationObserver a = observer(ObserverKind::kPercentile);
  for (int begin = 1; begin <= 10000; begin *= 10) {
    std::vector<float> batch;
    for (int x = begin; x < std::min(begin * 10, 10001); ++x) batch.push_back(static_cast<float>(x % 2 ? x : -x));
    a.observe(batch);
  }
  a.observe(std::vector<float>{10000.0f});
  EXPECT_EQ(a.count(), 10001);
  int64_t total = 0;
  for (int64_t c : a.histogram()) total += c;
  EXPECT_EQ(total, 10001);
  EXPECT_GE(a.histogram_range(), 10000.0);
  const double width = a.histogram_range() / 2048;
  EXPECT_NEAR(a.threshold(), 9900.0, 1.5 * width);
}

// Gaussian activations with a handful of values 60 sigma out: min-max spends int8's codes on them,
// entropy calibration clips them and keeps resolution for the bulk. A random linear layer's output
// on statically quantized inputs, token by token, is closer to the exact one with entropy's scale
// (the few tokens holding an outlier lose, every other token gains); on data without outliers both
// scales sit near the bulk's own range.
TEST(Observers, EntropyBeatsMinMaxOnOutliers) {
  std::mt19937 rng(testing::fresh_seed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int rows = 512, in = 64, out = 32;
  for (const bool outliers : {true, false}) {
    SCOPED_TRACE(outliers ? "outliers" : "no outliers");
    std::vector<float> x(static_cast<size_t>(rows) * in), w(static_cast<size_t>(out) * in);
    for (float& v : x) v = normal(rng);
    for (float& v : w) v = normal(rng) * 0.1f;
    if (outliers) {
      for (int k = 0; k < 6; ++k) x[static_cast<size_t>(rng() % (rows * in))] = (k % 2 ? 60.0f : -60.0f);
    }
    std::vector<float> thresholds;
    for (ObserverKind kind : {ObserverKind::kMinMax, ObserverKind::kPercentile, ObserverKind::kEntropy}) {
      ActivationObserver a = observer(kind);
      for (int r = 0; r < rows; r += 64) {
        a.observe(std::span<const float>(x.data() + static_cast<size_t>(r) * in, static_cast<size_t>(64) * in));
      }
      thresholds.push_back(a.threshold());
    }
    // The mean over tokens (rows) of each token's relative output error.
    const auto output_error = [&](float threshold) {
      const float s = threshold / 127.0f;
      double total = 0.0;
      for (int r = 0; r < rows; ++r) {
        double err = 0.0, ref = 0.0;
        for (int o = 0; o < out; ++o) {
          double exact = 0.0, got = 0.0;
          for (int i = 0; i < in; ++i) {
            const float xv = x[static_cast<size_t>(r) * in + i], wv = w[static_cast<size_t>(o) * in + i];
            exact += static_cast<double>(xv) * wv;
            got += static_cast<double>(fake_quantize(xv, s, 127.0f)) * wv;
          }
          err += (got - exact) * (got - exact);
          ref += exact * exact;
        }
        total += std::sqrt(err / ref);
      }
      return total / rows;
    };
    const double e_minmax = output_error(thresholds[0]), e_pct = output_error(thresholds[1]),
                 e_entropy = output_error(thresholds[2]);
    std::printf("%s: thresholds minmax %.2f, p99 %.2f, entropy %.2f; output error %.5f, %.5f, %.5f\n",
                outliers ? "outliers" : "plain", thresholds[0], thresholds[1], thresholds[2], e_minmax, e_pct,
                e_entropy);
    if (outliers) {
      EXPECT_LT(thresholds[2], 0.5f * thresholds[0]);
      EXPECT_LT(e_entropy, 0.8 * e_minmax);
    } else {
      EXPECT_GT(thresholds[2], 0.5f * thresholds[0]);
      EXPECT_LT(e_entropy, 3.0 * e_minmax);
    }
  }
}

TEST(Observers, NamesRoundTrip) {
  for (ObserverKind k :
       {ObserverKind::kMinMax, ObserverKind::kMovingAverage, ObserverKind::kPercentile, ObserverKind::kEntropy}) {
    auto p = parse_observer(observer_name(k));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, k);
  }
  EXPECT_FALSE(parse_observer("kl").ok());
}

}  // namespace
}  // namespace tachyon
