// SamplingParams: what one request asks of the sampler, in the vocabulary of the OpenAI and vLLM
// APIs. Plain data; validate() is the boundary check that every request passes before a
// Sampler is built from it, so the sampler itself never sees an absurd value.
//
// Semantics (applied in this order by Sampler, see sampler.h):
//   logit_bias          added to the raw logits (OpenAI), bias in [-100, 100]
//   repetition_penalty  HF style over prompt and output tokens: x > 0 ? x / r : x * r; 1 = off
//   frequency_penalty,  OpenAI style over output tokens only:
//   presence_penalty      x -= frequency * count + presence * (count > 0); both in [-2, 2]
//   temperature         logits / T; 0 = greedy (argmax after penalties, ties -> lowest id)
//   top_k               keep the k most likely tokens; 0 or -1 = off
//   top_p               keep the smallest most-likely set whose probability >= top_p; 1 = off
//   min_p               drop tokens whose probability < min_p * (largest probability); 0 = off
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/status.h"

namespace tachyon {

struct SamplingParams {
  float temperature = 1.0f;  // >= 0; 0 = greedy
  int top_k = 0;             // 0 or -1 = off; >= vocabulary size keeps every token
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1]
  float repetition_penalty = 1.0f;  // > 0
  float presence_penalty = 0.0f;    // [-2, 2]
  float frequency_penalty = 0.0f;   // [-2, 2]
  std::optional<uint64_t> seed;     // absent: the Sampler draws one from std::random_device
  int logprobs = 0;  // how many top logprobs to return besides the chosen token's, [0, 20]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias); ids in [0, vocab_size)

  static constexpr int kMaxLogprobs = 20;
  static constexpr float kMaxPenalty = 2.0f;
  static constexpr float kMaxLogitBias = 100.0f;

  bool greedy() const { return temperature == 0.0f; }
  bool top_k_enabled() const { return top_k > 0; }

  // Ok, or kInvalidArgument naming the first bad field, its value and the allowed range.
  Status validate(int vocab_size) const;
};

}  // namespace tachyon
