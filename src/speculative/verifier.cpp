#include "speculative/verifier.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "speculative/rejection_sampler.h"

namespace tachyon {
namespace {

// The logprob of `token` and the top-N under the Sampler's reporting convention: the softmax of
// the row after penalties and temperature, before truncation, which is what probabilities()
// gives for the same parameters with truncation off.
// The logprob of r.token and the top-N from probabilities under the Sampler's reporting
// convention (see report_logprobs).
void report_from_probabilities(const std::vector<float>& probs, int num_top, SampleResult& r) {
  const auto log_of = [](float p) {
    return p > 0.0f ? std::log(p) : std::numeric_limits<float>::lowest();
  };
  r.logprob = log_of(probs[static_cast<size_t>(r.token)]);
  r.top_logprobs.clear();
  if (num_top <= 0) return;
  std::vector<int32_t> ids(probs.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t n = std::min<size_t>(static_cast<size_t>(num_top), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(), [&](int32_t a, int32_t b) {
    const float pa = probs[static_cast<size_t>(a)], pb = probs[static_cast<size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  });
  for (size_t i = 0; i < n && probs[static_cast<size_t>(ids[i])] > 0.0f; ++i) {
    r.top_logprobs.emplace_back(ids[i], log_of(probs[static_cast<size_t>(ids[i])]));
  }
}

// The logprob of `token` and the top-N under the Sampler's reporting convention: the softmax of
// the row after penalties and temperature, before truncation, which is what probabilities()
// gives for the same parameters with truncation off.
Status report_logprobs(const Sampler& reporter, const float* row, int vocab, const TokenCounts& history,
                       int num_top, SampleResult& r, std::vector<float>& scratch) {
  TACHYON_RETURN_IF_ERROR(reporter.probabilities(row, vocab, history, scratch));
  report_from_probabilities(scratch, num_top, r);
  return Status::Ok();
}

}  // namespace

Result<Verification> verify_draft(std::span<const int32_t> draft, const float* draft_probs, const float* logits,
                                  int vocab, Sampler& sampler) {
  const size_t k = draft.size();
  const size_t v = static_cast<size_t>(vocab);
  Verification out;
  TokenCounts history = sampler.history();  // plus draft[0..i) at row i

  if (sampler.params().greedy()) {
    // Every row's choice as plain decoding would make it; verify_greedy keeps the agreeing prefix.
    std::vector<SampleResult> rows;
    std::vector<int32_t> argmax;
    for (size_t i = 0; i <= k; ++i) {
      TACHYON_ASSIGN_OR_RETURN(SampleResult r, sampler.sample(logits + i * v, vocab, history));
      argmax.push_back(r.token);
      rows.push_back(std::move(r));
      if (i < k && argmax[i] != draft[i]) break;  // later rows cannot be reached
      if (i < k) history.add_output(draft[i]);
    }
    if (argmax.size() < k + 1) argmax.resize(k + 1, -1);
    const VerifyResult vr = verify_greedy(draft, argmax);
    out.num_accepted = vr.num_accepted;
    out.path.resize(static_cast<size_t>(vr.num_accepted));
    std::iota(out.path.begin(), out.path.end(), 0);
    rows.resize(static_cast<size_t>(vr.num_accepted) + 1);
    out.tokens = std::move(rows);
    return out;
  }

  // The target's rows as the walk reaches them (a rejection at i needs none past i), each under
  // the history of the drafts before it.
  std::vector<std::vector<float>> rows;
  std::vector<TokenCounts> histories;  // history at each row, for the logprobs
  rows.reserve(k + 1);
  histories.reserve(k + 1);
  Status row_status;
  const VerifyResult vr = verify_sampled(
      draft, draft_probs,
      [&](size_t i) -> const float* {
        if (i > 0) history.add_output(draft[i - 1]);
        histories.push_back(history);
        std::vector<float>& row = rows.emplace_back();
        if (row_status.ok()) row_status = sampler.probabilities(logits + i * v, vocab, history, row);
        if (!row_status.ok()) row.assign(v, 0.0f), row[0] = 1.0f;  // any law: the error is returned below
        return row.data();
      },
      vocab, sampler.rng());
  TACHYON_RETURN_IF_ERROR(row_status);
  out.num_accepted = vr.num_accepted;
  out.path.resize(static_cast<size_t>(vr.num_accepted));
  std::iota(out.path.begin(), out.path.end(), 0);
  // Logprobs are reported before truncation: without top-k, top-p or min-p that is the row the
  // walk already computed.
  const SamplingParams& sp = sampler.params();
  const bool untruncated = (!sp.top_k_enabled() || sp.top_k >= vocab) && sp.top_p >= 1.0f && sp.min_p <= 0.0f;
  SamplingParams report = sp;
  report.top_k = 0;
  report.top_p = 1.0f;
  report.min_p = 0.0f;
  report.seed = 0;  // never drawn from; a fixed seed spares the random device
  const Sampler reporter(report);
  std::vector<float> scratch;
  for (size_t i = 0; i < vr.tokens.size(); ++i) {
    SampleResult r;
    r.token = vr.tokens[i];
    if (untruncated) {
      report_from_probabilities(rows[i], sp.logprobs, r);
    } else {
      TACHYON_RETURN_IF_ERROR(report_logprobs(reporter, logits + i * v, vocab, histories[i], sp.logprobs, r, scratch));
    }
    out.tokens.push_back(std::move(r));
  }
  return out;
}

Result<Verification> verify_draft_tree(std::span<const int32_t> draft, std::span<const int32_t> parents,
                                       const float* logits, int vocab, Sampler& sampler) {
  const size_t n = draft.size();
  const size_t v = static_cast<size_t>(vocab);
  if (parents.size() != n) {
    return make_error(ErrorCode::kInvalidArgument, "token tree: {} parents for {} drafts", parents.size(), n);
  }
  for (size_t i = 0; i < n; ++i) {
    if (parents[i] < -1 || parents[i] >= static_cast<int32_t>(i) || draft[i] < 0 || draft[i] >= vocab) {
      return make_error(ErrorCode::kInvalidArgument, "token tree: draft {} (token {}) has parent {}", i, draft[i],
                        parents[i]);
    }
  }
  Verification out;
  TokenCounts history = sampler.history();  // plus the accepted path
  const bool greedy = sampler.params().greedy();
  SamplingParams report = sampler.params();
  report.top_k = 0;
  report.top_p = 1.0f;
  report.min_p = 0.0f;
  report.seed = 0;  // never drawn from
  const Sampler reporter(report);
  std::vector<float> p;
  std::vector<double> residual(v);
  int32_t node = -1;  // the walk's position: -1 is the last accepted token (row 0)
  for (;;) {
    const float* row = logits + static_cast<size_t>(node + 1) * v;
    SampleResult r;
    int32_t next = -1;  // the accepted child
    if (greedy) {
      TACHYON_ASSIGN_OR_RETURN(r, sampler.sample(row, vocab, history));
      for (size_t c = static_cast<size_t>(node + 1); c < n && next < 0; ++c) {
        if (parents[c] == node && draft[c] == r.token) next = static_cast<int32_t>(c);
      }
    } else {
      TACHYON_RETURN_IF_ERROR(sampler.probabilities(row, vocab, history, p));
      double total = 0.0;
      for (size_t t = 0; t < v; ++t) total += residual[t] = p[t];
      for (size_t c = static_cast<size_t>(node + 1); c < n && next < 0; ++c) {
        if (parents[c] != node) continue;
        const size_t t = static_cast<size_t>(draft[c]);
        const double u = sampler.rng().next_double();
        if (residual[t] > 0.0 && u * total < residual[t]) {
          next = static_cast<int32_t>(c);
        } else {  // rejected: its mass leaves the residual
          total -= residual[t];
          residual[t] = 0.0;
        }
      }
      if (next >= 0) {
        r.token = draft[static_cast<size_t>(next)];
      } else {
        bool any = false;
        for (double w : residual) any = any || w > 0.0;
        if (!any) {  // rounding emptied the residual: p itself is the law here
          for (size_t t = 0; t < v; ++t) residual[t] = p[t];
        }
        r.token = draw_weighted(residual, sampler.rng().next_double());
      }
      TACHYON_RETURN_IF_ERROR(report_logprobs(reporter, row, vocab, history, sampler.params().logprobs, r, p));
    }
    out.tokens.push_back(std::move(r));
    if (next < 0) break;
    out.path.push_back(next);
    history.add_output(draft[static_cast<size_t>(next)]);
    node = next;
  }
  out.num_accepted = static_cast<int>(out.path.size());
  return out;
}

Result<Verification> verify_greedy_rows(std::span<const int32_t> draft, std::span<const int32_t> parents,
                                        std::span<const int32_t> ids, std::span<const float> logprobs) {
  const size_t n = draft.size();
  if (ids.size() != n + 1 || logprobs.size() != n + 1 || (!parents.empty() && parents.size() != n)) {
    return make_error(ErrorCode::kInvalidArgument, "greedy verification: {} drafts, {} parents, {} ids, {} logprobs",
                      n, parents.size(), ids.size(), logprobs.size());
  }
  const auto parent_of = [&](size_t i) { return parents.empty() ? static_cast<int32_t>(i) - 1 : parents[i]; };
  Verification out;
  int32_t node = -1;  // the walk's position: -1 is the last accepted token (row 0)
  for (;;) {
    const size_t row = static_cast<size_t>(node + 1);
    SampleResult r;
    r.token = ids[row];
    r.logprob = logprobs[row];
    int32_t next = -1;
    for (size_t c = row; c < n && next < 0; ++c) {
      if (parent_of(c) == node && draft[c] == r.token) next = static_cast<int32_t>(c);
    }
    out.tokens.push_back(std::move(r));
    if (next < 0) break;
    out.path.push_back(next);
    node = next;
  }
  out.num_accepted = static_cast<int>(out.path.size());
  return out;
}

}  // namespace tachyon
