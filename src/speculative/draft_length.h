// Dynamic draft length: how many tokens to propose for one request this step. A step verifies
// K proposals with one target pass and yields 1 + (the accepted prefix) tokens. Acceptance is not
// independent from position to position: a draft that got the first tokens right is likely in a
// stretch it can predict (a quotation, boilerplate code) and keeps being right, so the controller
// keeps, per request, the acceptance rate of each draft position among the steps that reached it
// (an exponential moving average per position; positions not reached yet take the rate of the
// last reached one). The expected yield at K is then 1 + sum over j <= K of the product of the
// first j rates. A step costs one target pass — which grows with the batch once the batch's tokens
// pass the point where the target turns compute-bound — plus K proposer steps. The controller
// picks the K in [0, k_max] with the most tokens per unit of cost; K = 0 (speculation off) when
// no K beats plain decoding, probing again with K = 1 every `probe_interval` steps.
//
// A new request need not start from `initial_acceptance`: seed() copies the per-position rates of
// another controller, which the speculative decoder keeps per population of requests (the same
// proposer, the same kind of prompt text, prompts of similar length) and updates from every one
// of their verifications.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tachyon {

struct DraftLengthOptions {
  int k_max = 8;
  int fixed_k = 0;                 // > 0: always this K (`--spec-k N`), no adaptation
  // Weight of the newest step in each position's acceptance rate. Heavier weights make the rates
  // sticky: a rejection at the last position reached lowers every later one's estimate too, so K
  // shrinks below it and it is not reached again to recover (simulated on stretches of 0.95-0.98
  // against 0.3-0.5 acceptance, 0.3 lost up to a third of the best fixed K's yield; 0.1 stays
  // within 3 % of it and at or above the single-rate model everywhere tried).
  double ema_weight = 0.1;
  double initial_acceptance = 0.6;  // every position's rate before the first step
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
  // Starts from `population`'s per-position rates (and the depth they reach) instead of the
  // initial guess; its own options stay. Only before this controller's first update.
  void seed(const DraftLengthController& population);
  // Verifications this controller has learnt from.
  int64_t updates() const { return updates_; }

  // The acceptance rate of draft position `i` (0-based) among the steps that reached it.
  double acceptance(int i = 0) const;
  bool speculating() const { return !off_; }
  // Expected tokens per unit cost at K (1.0 = plain decoding), for the batch size.
  double gain(int k, int batch_sequences) const;

  static constexpr int kPositions = 32;  // SpecDecodeOptions::kLargestK

 private:
  DraftLengthOptions options_;
  std::array<double, kPositions> rates_{};
  int reached_ = 0;  // positions some step has reached; later ones take rates_[reached_ - 1]
  int64_t updates_ = 0;
  bool off_ = false;
  int steps_since_off_ = 0;
};

// Whether speculation pays at a batch size, measured rather than modelled. The controllers above
// price a verify pass from a fixed guess of where the target turns compute-bound; what a step
// really costs also depends on the device (a plain decode step may replay a CUDA graph, a verify
// step runs eagerly with K + 1 rows per sequence, and the draft's own steps cost launches). The
// engine reports every decode-only step: tokens emitted, seconds, and whether it verified drafts.
// Per batch-size class (1, 2-3, 4-7, ...) the gate keeps exponentially weighted sums of tokens and
// of seconds for speculating and for plain steps, and lets a step speculate while the speculating
// rate (tokens over seconds, so that the many one-token verify steps weigh what they cost) is at
// least the plain one. Measuring costs where speculation loses, so:
//  - plain steps are measured first (they cost nothing extra), then speculating ones, and the
//    speculating measurement stops after `early_samples` steps that are clearly slower (below
//    `early_loss` of the plain rate);
//  - a class not measured yet starts plain when a smaller class has been measured losing (a larger
//    batch gains less from speculating), its speculation measured only at its first refresh;
//  - every refresh interval of a class's steps the losing side runs `min_samples` steps again, so
//    that a changed workload is noticed; the interval doubles (up to `max_refresh_interval`) each
//    time the re-measurement confirms the loser, and falls back when it does not.
// Batches below `min_batch` sequences are left to the controllers: one request's acceptance comes
// in bursts (copied spans, then new text) that a per-class rate would lag behind, while its own
// controller follows them step by step.
struct SpeculationGateOptions {
  int min_samples = 8;         // steps of each kind before the rates decide; also a re-measurement's length
  int early_samples = 2;       // speculating steps after which a clear loss ends the measurement
  double early_loss = 0.75;    // "clear": the speculating rate below this share of the plain one
  int refresh_interval = 128;  // steps of a class between re-measurements of the losing side, at first
  int max_refresh_interval = 2048;
  double ema_weight = 0.1;     // weight of the newest step in the sums
  int min_batch = 2;           // smaller batches always may speculate
};

class SpeculationGate {
 public:
  explicit SpeculationGate(const SpeculationGateOptions& options = {});
  // Whether a step of `batch_sequences` sequences may speculate; counts the step.
  bool allow(int batch_sequences);
  // A decode-only step of `batch_sequences` ran: `tokens` emitted in `seconds`, drafts verified
  // or not.
  void record(int batch_sequences, bool speculated, int64_t tokens, double seconds);
  // Measured tokens/s of the class of `batch_sequences`, speculating or not (0: not measured).
  double rate(int batch_sequences, bool speculated) const;

 private:
  struct Class {
    double tokens[2] = {0.0, 0.0};   // [plain, speculating], weighted sums
    double seconds[2] = {0.0, 0.0};
    int count[2] = {0, 0};
    int64_t steps = 0;
    bool measured = false;     // the first measurement of both sides is over (or skipped)
    int remeasure = 0;         // steps of the losing side still to run
    bool remeasured_pays = false;  // what the rates said when the running re-measurement began
    int64_t next_refresh = 0;  // the step count of the next re-measurement
    int64_t interval = 0;      // the current refresh interval (0: not started)
  };
  static double rate_of(const Class& c, int kind) { return c.seconds[kind] > 0.0 ? c.tokens[kind] / c.seconds[kind] : 0.0; }
  static size_t class_of(int batch_sequences);
  // Whether a smaller class (at least min_batch) has been measured with speculation losing.
  bool smaller_class_loses(size_t cls) const;
  SpeculationGateOptions options_;
  std::array<Class, 32> classes_{};
};

}  // namespace tachyon
