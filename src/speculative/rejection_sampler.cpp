#include "speculative/rejection_sampler.h"

#include <algorithm>

#include "core/status.h"

namespace tachyon {

int32_t draw_weighted(const std::vector<double>& w, double u) {
  double total = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    total += w[i];
    if (w[i] > 0.0) last = static_cast<int32_t>(i);
  }
  TACHYON_CHECK(last >= 0, "rejection sampler: an all-zero distribution");
  const double target = u * total;
  double acc = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    acc += w[i];
    if (w[i] > 0.0 && target < acc) return static_cast<int32_t>(i);
  }
  return last;
}

VerifyResult verify_greedy(std::span<const int32_t> draft, std::span<const int32_t> target_argmax) {
  TACHYON_CHECK(target_argmax.size() == draft.size() + 1, "verify_greedy: {} drafts, {} target rows", draft.size(),
                target_argmax.size());
  VerifyResult r;
  size_t i = 0;
  while (i < draft.size() && draft[i] == target_argmax[i]) r.tokens.push_back(draft[i++]);
  r.num_accepted = static_cast<int>(i);
  r.tokens.push_back(target_argmax[i]);
  return r;
}

VerifyResult verify_sampled(std::span<const int32_t> draft, const float* draft_probs, const float* target_probs,
                            int vocab, Rng& rng) {
  const size_t v = static_cast<size_t>(vocab);
  return verify_sampled(draft, draft_probs, [&](size_t row) { return target_probs + row * v; }, vocab, rng);
}

VerifyResult verify_sampled(std::span<const int32_t> draft, const float* draft_probs,
                            const std::function<const float*(size_t row)>& target_row, int vocab, Rng& rng) {
  VerifyResult r;
  const size_t v = static_cast<size_t>(vocab);
  std::vector<double> residual(v);
  for (size_t i = 0; i < draft.size(); ++i) {
    const int32_t d = draft[i];
    TACHYON_CHECK(d >= 0 && d < vocab, "draft token {} outside the vocabulary", d);
    const float* p = target_row(i);
    const float* q = draft_probs != nullptr ? draft_probs + i * v : nullptr;
    const double pd = p[d];
    const double qd = q != nullptr ? static_cast<double>(q[d]) : 1.0;
    // Accept with min(1, p/q); a draft the proposer could not have produced (q = 0) is rejected.
    const double u = rng.next_double();
    if (qd > 0.0 && u * qd < pd) {
      r.tokens.push_back(d);
      ++r.num_accepted;
      continue;
    }
    // Rejected: draw from max(0, p - q), which is positive somewhere whenever p != q.
    bool any = false;
    for (size_t t = 0; t < v; ++t) {
      const double qt = q != nullptr ? static_cast<double>(q[t]) : (static_cast<int32_t>(t) == d ? 1.0 : 0.0);
      residual[t] = std::max(0.0, static_cast<double>(p[t]) - qt);
      any |= residual[t] > 0.0;
    }
    if (!any) {  // p == q to rounding: the residual is empty; p itself is the right law here
      for (size_t t = 0; t < v; ++t) residual[t] = p[t];
    }
    r.tokens.push_back(draw_weighted(residual, rng.next_double()));
    return r;
  }
  const float* bonus = target_row(draft.size());
  for (size_t t = 0; t < v; ++t) residual[t] = bonus[t];
  r.tokens.push_back(draw_weighted(residual, rng.next_double()));
  return r;
}

}  // namespace tachyon
