// Dynamic draft length: how many tokens to propose for one request this step. A step verifies
// K proposals with one target pass; with per-token acceptance rate a (independent positions),
// it yields E(K) = (1 - a^(K+1)) / (1 - a) tokens. It costs one target pass — which grows with
// the batch once the batch's tokens pass the point where the target turns compute-bound — plus
// K proposer steps. The controller keeps an exponential moving average of a per request and
// picks the K in [0, k_max] with the most tokens per unit of cost; K = 0 (speculation off) when
// no K beats plain decoding, probing again with K = 1 every `probe_interval` steps.
#pragma once

#include <cstdint>

namespace tachyon {

struct DraftLengthOptions {
  int k_max = 8;
  int fixed_k = 0;                 // > 0: always this K (`--spec-k N`), no adaptation
  double ema_weight = 0.3;         // weight of the newest step's acceptance rate
  double initial_acceptance = 0.6;
  double proposer_cost = 0.05;     // one proposal step, as a fraction of one target pass
  int compute_bound_tokens = 64;   // batch tokens per target pass beyond which its cost grows
  int probe_interval = 32;         // steps between probes once speculation is off
};

class DraftLengthController {
 public:
  explicit DraftLengthController(const DraftLengthOptions& options = {});

  // K for the next step of this request, given how many sequences the step will run.
  int next_k(int batch_sequences);
  // After verification: `proposed` tokens were offered, `accepted` kept.
  void update(int proposed, int accepted);

  double acceptance() const { return acceptance_; }
  bool speculating() const { return !off_; }
  // Expected tokens per unit cost at K (1.0 = plain decoding), for the batch size.
  double gain(int k, int batch_sequences) const;

 private:
  DraftLengthOptions options_;
  double acceptance_;
  bool off_ = false;
  int steps_since_off_ = 0;
};

}  // namespace tachyon
