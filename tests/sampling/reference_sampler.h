// A scalar reference for the sampling pipeline of src/sampling/sampler.h, written the plain way:
// dense penalty arrays built from token lists, double-precision softmax, a full sort for the
// ranking, cumulative sums in rank order. Slow by design; the tests compare Sampler against it.
// The ranking key t = (x - max) * (1 / T) is computed in float exactly as documented, so ties and their
// order are the same on both sides.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "sampling/sampling_params.h"

namespace tachyon::reference {

struct Distribution {
  int32_t argmax = -1;          // lowest id with the largest penalized logit
  std::vector<double> logprob;  // [vocab] reported logprobs (after penalties and temperature)
  std::vector<double> prob;     // [vocab] the final distribution sample() draws from
};

// Steps 0-2 over dense arrays. prompt and output are token lists in order (repeats allowed).
inline std::vector<float> penalized_logits(const SamplingParams& params, const std::vector<float>& logits,
                                           const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& output) {
  const size_t vocab = logits.size();
  std::vector<float> x(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    x[i] = std::isfinite(logits[i]) ? logits[i] : -std::numeric_limits<float>::infinity();
  }
  for (const auto& [token, bias] : params.logit_bias) x[static_cast<size_t>(token)] += bias;
  std::vector<bool> seen(vocab, false);
  std::vector<int32_t> count(vocab, 0);
  for (int32_t token : prompt) seen[static_cast<size_t>(token)] = true;
  for (int32_t token : output) {
    seen[static_cast<size_t>(token)] = true;
    ++count[static_cast<size_t>(token)];
  }
  for (size_t i = 0; i < vocab; ++i) {
    if (seen[i]) {
      const float r = params.repetition_penalty;
      x[i] = x[i] > 0.0f ? x[i] / r : x[i] * r;
    }
    if (count[i] > 0) {
      x[i] -= params.frequency_penalty * static_cast<float>(count[i]) + params.presence_penalty;
    }
  }
  return x;
}

inline Distribution distribution(const SamplingParams& params, const std::vector<float>& logits,
                                 const std::vector<int32_t>& prompt = {},
                                 const std::vector<int32_t>& output = {}) {
  const std::vector<float> x = penalized_logits(params, logits, prompt, output);
  const size_t vocab = x.size();
  Distribution d;
  float max_logit = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < vocab; ++i) {
    if (x[i] > max_logit) {
      max_logit = x[i];
      d.argmax = static_cast<int32_t>(i);
    }
  }
  const float temperature = params.temperature == 0.0f ? 1.0f : params.temperature;
  std::vector<float> t(vocab);
  const float scale = 1.0f / temperature;
  for (size_t i = 0; i < vocab; ++i) t[i] = (x[i] - max_logit) * scale;
  double mass = 0.0;
  for (size_t i = 0; i < vocab; ++i) mass += std::exp(static_cast<double>(t[i]));
  d.logprob.resize(vocab);
  for (size_t i = 0; i < vocab; ++i) d.logprob[i] = static_cast<double>(t[i]) - std::log(mass);

  d.prob.assign(vocab, 0.0);
  if (params.temperature == 0.0f) {
    d.prob[static_cast<size_t>(d.argmax)] = 1.0;
    return d;
  }
  const auto weight = [&](int32_t i) { return std::exp(static_cast<double>(t[static_cast<size_t>(i)])); };
  std::vector<int32_t> ranked;
  for (size_t i = 0; i < vocab; ++i) {
    if (std::isfinite(t[i])) ranked.push_back(static_cast<int32_t>(i));
  }
  std::sort(ranked.begin(), ranked.end(), [&](int32_t a, int32_t b) {
    const float ta = t[static_cast<size_t>(a)], tb = t[static_cast<size_t>(b)];
    return ta > tb || (ta == tb && a < b);
  });
  size_t keep = ranked.size();
  if (params.top_k > 0) keep = std::min(keep, static_cast<size_t>(params.top_k));
  if (params.top_p < 1.0f) {
    double kept_mass = 0.0;
    for (size_t r = 0; r < keep; ++r) kept_mass += weight(ranked[r]);
    double cumulative = 0.0;
    for (size_t r = 0; r < keep; ++r) {
      cumulative += weight(ranked[r]) / kept_mass;
      if (cumulative >= params.top_p * (1.0 - 1e-6)) {
        keep = r + 1;
        break;
      }
    }
  }
  ranked.resize(keep);
  // p / p_max = e^t, as the argmax has t = 0.
  if (params.min_p > 0.0f) std::erase_if(ranked, [&](int32_t i) { return weight(i) < params.min_p; });
  double kept_mass = 0.0;
  for (int32_t i : ranked) kept_mass += weight(i);
  for (int32_t i : ranked) d.prob[static_cast<size_t>(i)] = weight(i) / kept_mass;
  return d;
}

// Inverse CDF in increasing id order: the token sample() must pick for the uniform u.
inline int32_t inverse_cdf(const std::vector<double>& prob, double u) {
  double cumulative = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < prob.size(); ++i) {
    if (prob[i] <= 0.0) continue;
    cumulative += prob[i];
    last = static_cast<int32_t>(i);
    if (cumulative > u) return last;
  }
  return last;
}

}  // namespace tachyon::reference
