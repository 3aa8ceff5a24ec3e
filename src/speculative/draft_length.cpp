#include "speculative/draft_length.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/status.h"

namespace tachyon {

DraftLengthController::DraftLengthController(const DraftLengthOptions& options) : options_(options) {
  TACHYON_CHECK(options.k_max >= 0 && options.k_max <= kPositions && options.fixed_k >= 0 && options.ema_weight > 0 &&
                    options.ema_weight <= 1 && options.compute_bound_tokens > 0 && options.probe_interval > 0,
                "draft length controller: bad options");
  rates_.fill(options.initial_acceptance);
}

double DraftLengthController::acceptance(int i) const {
  const int at = std::clamp(i, 0, kPositions - 1);
  // Past the deepest position drafted so far, the deepest one's rate stands in.
  const int last = std::clamp(reached_ - 1, 0, kPositions - 1);
  return rates_[static_cast<size_t>(reached_ == 0 || at < reached_ ? at : last)];
}

double DraftLengthController::gain(int k, int batch_sequences) const {
  double tokens = 1.0, survive = 1.0;  // the target's own token, then each accepted draft position
  for (int i = 0; i < k; ++i) {
    survive *= std::clamp(acceptance(i), 0.0, 1.0);
    tokens += survive;
  }
  const auto pass_cost = [&](int tokens_per_seq) {
    const double batch_tokens = static_cast<double>(std::max(1, batch_sequences)) * tokens_per_seq;
    return std::max(1.0, batch_tokens / options_.compute_bound_tokens);
  };
  // Relative to one plain decode pass of the same batch.
  const double cost = pass_cost(k + 1) / pass_cost(1) + k * options_.proposer_cost;
  return tokens / cost;
}

int DraftLengthController::next_k(int batch_sequences) {
  if (options_.fixed_k > 0) return options_.fixed_k;
  if (off_) {
    if (++steps_since_off_ < options_.probe_interval) return 0;
    steps_since_off_ = 0;
    return std::min(1, options_.k_max);  // probe
  }
  int best_k = 0;
  double best = 1.0;  // plain decoding
  for (int k = 1; k <= options_.k_max; ++k) {
    const double g = gain(k, batch_sequences);
    if (g > best + 1e-9) {
      best = g;
      best_k = k;
    }
  }
  if (best_k == 0) off_ = true;
  return best_k;
}

void DraftLengthController::seed(const DraftLengthController& population) {
  if (updates_ > 0) return;
  rates_ = population.rates_;
  reached_ = population.reached_;
}

void DraftLengthController::update(int proposed, int accepted) {
  if (proposed <= 0) return;
  ++updates_;
  // Positions 0 .. accepted were verified (the first rejection ends the step); all but the last
  // of them accepted unless the whole draft was.
  const int reached = std::min({accepted + 1, proposed, kPositions});
  for (int i = 0; i < reached; ++i) {
    double& rate = rates_[static_cast<size_t>(i)];
    if (i >= reached_) rate = acceptance(i);  // first reached: start from the estimate used so far
    rate = (1.0 - options_.ema_weight) * rate + options_.ema_weight * (i < accepted ? 1.0 : 0.0);
  }
  reached_ = std::max(reached_, reached);
  if (off_ && gain(1, 1) > 1.0) off_ = false;  // a probe went well
}

SpeculationGate::SpeculationGate(const SpeculationGateOptions& options) : options_(options) {
  TACHYON_CHECK(options.min_samples > 0 && options.early_samples > 0 && options.early_loss >= 0 &&
                    options.early_loss <= 1 && options.refresh_interval > 1 &&
                    options.max_refresh_interval >= options.refresh_interval && options.ema_weight > 0 &&
                    options.ema_weight <= 1 && options.min_batch >= 1,
                "speculation gate: bad options");
}

size_t SpeculationGate::class_of(int batch_sequences) {
  return std::min<size_t>(std::bit_width(static_cast<unsigned>(std::max(batch_sequences, 1))), 31);
}

bool SpeculationGate::smaller_class_loses(size_t cls) const {
  for (size_t i = class_of(options_.min_batch); i < cls; ++i) {
    const Class& s = classes_[i];
    if (s.measured && s.count[1] > 0 && rate_of(s, 1) < rate_of(s, 0)) return true;
  }
  return false;
}

bool SpeculationGate::allow(int batch_sequences) {
  if (batch_sequences < options_.min_batch) return true;
  const size_t cls = class_of(batch_sequences);
  Class& c = classes_[cls];
  ++c.steps;
  if (!c.measured) {
    if (c.count[0] == 0 && c.count[1] == 0 && smaller_class_loses(cls)) {
      c.measured = true;  // plain until the first refresh measures speculation here
    } else if (c.count[0] < options_.min_samples) {
      return false;  // plain first
    } else if (c.count[1] < options_.min_samples &&
               !(c.count[1] >= options_.early_samples && rate_of(c, 1) < options_.early_loss * rate_of(c, 0))) {
      return true;
    } else {
      c.measured = true;
    }
    c.interval = options_.refresh_interval;
    c.next_refresh = c.steps + c.interval;
  }
  const bool pays = c.count[1] > 0 && rate_of(c, 1) >= rate_of(c, 0);
  if (c.remeasure > 0) {
    if (--c.remeasure == 0) {
      // The re-measurement is over: the same loser again backs off, a change starts over.
      c.interval = pays == c.remeasured_pays ? std::min<int64_t>(2 * c.interval, options_.max_refresh_interval)
                                             : options_.refresh_interval;
      c.next_refresh = c.steps + c.interval;
    }
    return !c.remeasured_pays;
  }
  if (c.steps >= c.next_refresh) {
    c.remeasured_pays = pays;
    c.remeasure = options_.min_samples - 1;
    if (c.remeasure == 0) c.next_refresh = c.steps + c.interval;
    return !pays;
  }
  return pays;
}

void SpeculationGate::record(int batch_sequences, bool speculated, int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0.0 || batch_sequences < options_.min_batch) return;
  Class& c = classes_[class_of(batch_sequences)];
  const int kind = speculated ? 1 : 0;
  const double keep = c.count[kind] == 0 ? 0.0 : 1.0 - options_.ema_weight;
  c.tokens[kind] = keep * c.tokens[kind] + static_cast<double>(tokens);
  c.seconds[kind] = keep * c.seconds[kind] + seconds;
  ++c.count[kind];
}

double SpeculationGate::rate(int batch_sequences, bool speculated) const {
  return rate_of(classes_[class_of(batch_sequences)], speculated ? 1 : 0);
}

}  // namespace tachyon
