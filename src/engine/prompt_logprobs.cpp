#include "engine/prompt_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tachyon {

PromptLogprob prompt_logprob(const float* logits, int vocab_size, int32_t token, int top_n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const auto value = [logits](int32_t i) { return std::isfinite(logits[i]) ? logits[i] : kNegInf; };
  // log Z = max + log(sum e^(x - max)), in double: the sum runs over the whole vocabulary.
  float max_logit = kNegInf;
  for (int32_t i = 0; i < vocab_size; ++i) max_logit = std::max(max_logit, value(i));
  double sum = 0.0;
  if (max_logit != kNegInf) {
    for (int32_t i = 0; i < vocab_size; ++i) sum += std::exp(static_cast<double>(value(i)) - max_logit);
  }
  const double log_z = max_logit == kNegInf ? 0.0 : static_cast<double>(max_logit) + std::log(sum);
  const auto logprob = [&](int32_t i) {
    const float x = value(i);
    return x == kNegInf ? kNegInf : static_cast<float>(static_cast<double>(x) - log_z);
  };
  // Ranked by logit, larger first, then by id, lower first.
  const auto before = [&](int32_t a, int32_t b) { return value(a) > value(b) || (value(a) == value(b) && a < b); };

  PromptLogprob out;
  out.token = token;
  out.logprob = logprob(token);
  int64_t ahead = 0;
  for (int32_t i = 0; i < vocab_size; ++i) ahead += before(i, token) ? 1 : 0;
  out.rank = ahead + 1;

  // The top_n best by insertion into a short sorted list: one pass, top_n <= kMaxLogprobs.
  std::vector<int32_t> best;
  best.reserve(static_cast<size_t>(top_n) + 1);
  for (int32_t i = 0; i < vocab_size && top_n > 0; ++i) {
    if (value(i) == kNegInf) continue;
    if (static_cast<int>(best.size()) == top_n && !before(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, before), i);
    if (static_cast<int>(best.size()) > top_n) best.pop_back();
  }
  out.top.reserve(best.size());
  for (const int32_t i : best) out.top.emplace_back(i, logprob(i));
  return out;
}

}  // namespace tachyon
