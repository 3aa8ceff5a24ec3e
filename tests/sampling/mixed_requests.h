// Requests of every sampling kind, for the batch sampler's tests on the host (tests/sampling) and
// on the device (tests/gpu): each with its own seeded stream and the same short history.
#pragma once

#include <cstdint>
#include <vector>

#include "sampling/sampler.h"

namespace tachyon::testing {

// Plain greedy; top-k; penalties and logit bias; greedy with a penalty; top-p with min-p. Seeds
// seed_base + i.
inline std::vector<SamplingParams> mixed_sampling_params(uint64_t seed_base) {
  std::vector<SamplingParams> ps(5);
  ps[0].temperature = 0.0f;
  ps[1].temperature = 0.8f;
  ps[1].top_k = 20;
  ps[2].temperature = 1.0f;
  ps[2].repetition_penalty = 1.3f;
  ps[2].frequency_penalty = 0.5f;
  ps[2].logit_bias = {{7, 5.0f}, {11, -3.0f}};
  ps[3].temperature = 0.0f;
  ps[3].presence_penalty = 1.0f;
  ps[4].temperature = 0.7f;
  ps[4].top_p = 0.9f;
  ps[4].min_p = 0.05f;
  for (size_t i = 0; i < ps.size(); ++i) ps[i].seed = seed_base + i;
  return ps;
}

// One Sampler per parameter set, each having seen the prompt {1, 7, 7, 42, 299} and then 7, 13.
inline std::vector<Sampler> samplers_with_history(const std::vector<SamplingParams>& ps) {
  std::vector<Sampler> s;
  for (const SamplingParams& p : ps) {
    s.emplace_back(p);
    const std::vector<int32_t> prompt = {1, 7, 7, 42, 299};
    s.back().set_prompt(prompt);
    s.back().accept(7);
    s.back().accept(13);
  }
  return s;
}

}  // namespace tachyon::testing
