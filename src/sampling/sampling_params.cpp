// SamplingParams::validate: the request boundary for sampling options. Every message names the
// field, the value received and the range allowed, in the terms of the HTTP API.
#include "sampling/sampling_params.h"

#include <cmath>

namespace tachyon {

namespace {

Status check_finite(const char* name, float value) {
  if (!std::isfinite(value)) {
    return make_error(ErrorCode::kInvalidArgument, "{} must be a finite number, got {}", name, value);
  }
  return Status::Ok();
}

}  // namespace

Status SamplingParams::validate(int vocab_size) const {
  if (vocab_size <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "vocab_size must be positive, got {}", vocab_size);
  }
  TACHYON_RETURN_IF_ERROR(check_finite("temperature", temperature));
  TACHYON_RETURN_IF_ERROR(check_finite("top_p", top_p));
  TACHYON_RETURN_IF_ERROR(check_finite("min_p", min_p));
  TACHYON_RETURN_IF_ERROR(check_finite("repetition_penalty", repetition_penalty));
  TACHYON_RETURN_IF_ERROR(check_finite("presence_penalty", presence_penalty));
  TACHYON_RETURN_IF_ERROR(check_finite("frequency_penalty", frequency_penalty));

  if (temperature < 0.0f) {
    return make_error(ErrorCode::kInvalidArgument,
                      "temperature must be >= 0 (0 means greedy), got {}", temperature);
  }
  if (top_k < -1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "top_k must be -1 or 0 (off) or a positive count, got {}", top_k);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "top_p must be in (0, 1], got {}", top_p);
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return make_error(ErrorCode::kInvalidArgument, "min_p must be in [0, 1], got {}", min_p);
  }
  if (!(repetition_penalty > 0.0f)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "repetition_penalty must be > 0 (1 means off), got {}", repetition_penalty);
  }
  if (std::fabs(presence_penalty) > kMaxPenalty) {
    return make_error(ErrorCode::kInvalidArgument, "presence_penalty must be in [-{}, {}], got {}",
                      kMaxPenalty, kMaxPenalty, presence_penalty);
  }
  if (std::fabs(frequency_penalty) > kMaxPenalty) {
    return make_error(ErrorCode::kInvalidArgument, "frequency_penalty must be in [-{}, {}], got {}",
                      kMaxPenalty, kMaxPenalty, frequency_penalty);
  }
  if (logprobs < 0 || logprobs > kMaxLogprobs) {
    return make_error(ErrorCode::kInvalidArgument, "logprobs must be in [0, {}], got {}", kMaxLogprobs,
                      logprobs);
  }
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || token >= vocab_size) {
      return make_error(ErrorCode::kInvalidArgument,
                        "logit_bias token id {} is outside the vocabulary [0, {})", token, vocab_size);
    }
    if (!std::isfinite(bias) || std::fabs(bias) > kMaxLogitBias) {
      return make_error(ErrorCode::kInvalidArgument, "logit_bias for token {} must be in [-{}, {}], got {}",
                        token, kMaxLogitBias, kMaxLogitBias, bias);
    }
  }
  return Status::Ok();
}

}  // namespace tachyon
