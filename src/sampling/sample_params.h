// A request's sampling parameters as one row of ops::sample()'s params (ops/ops.h): the
// temperature, min_p, the uniform draw u as two f32 whose sum is the double, top_k (0 = off) and
// top_p. The engine's device sampling and a draft model's chain on the device both fill rows this
// way; penalties and logit bias are not part of the row (ops::adjust_logits applies them).
#pragma once

#include <algorithm>

#include "ops/ops.h"
#include "sampling/sampling_params.h"

namespace tachyon {

// row[ops::kSampleParams] for a draw with uniform u (ignored by greedy rows).
inline void fill_sample_params(float* row, const SamplingParams& sp, double u) {
  row[0] = sp.temperature;
  row[1] = sp.min_p;
  row[2] = static_cast<float>(u);
  row[3] = static_cast<float>(u - static_cast<double>(row[2]));
  row[4] = sp.top_k_enabled() ? static_cast<float>(sp.top_k) : 0.0f;
  row[5] = sp.top_p;
}

// A row that takes the argmax: temperature 0, nothing else.
inline void fill_greedy_sample_params(float* row) {
  std::fill(row, row + ops::kSampleParams, 0.0f);
  row[5] = 1.0f;  // top_p off
}

}  // namespace tachyon
