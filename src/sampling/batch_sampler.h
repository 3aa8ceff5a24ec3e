// BatchSampler: the token choice of one engine step, for every sampled row of its batch at once.
//
// The engine hands it the step's rows in logits order, each a request's Sampler (its parameters,
// history and random stream) and how many rows it has: one to sample, or 1 + K for a speculative
// draft of K tokens, which the verifier reads (speculative/). The sampler decides where the rows
// are drawn, owns the logits and every buffer the choice needs, and hands back per row a token and
// its logprob, a host SampleResult, or host logits rows:
//
//   Place place = begin(rows)     where: kHost, kDeviceGreedy or kDeviceSample; on the device the
//                                 rows' parameters, draws and logit edits are uploaded here, before
//                                 the forward, so that the copy does not wait for it
//   forward(..., logits())        the model writes [num rows, vocab] f32 logits, on the host or
//                                 (device places) on the model's device
//   finish(rows)                  draws: on the device ops::argmax, or ops::adjust_logits (penalties,
//                                 logit bias) then ops::sample, and only ids and logprobs come
//                                 back; on the host each row without a draft through its Sampler,
//                                 in parallel (each request's Sampler and stream is its own, so
//                                 results do not depend on the threads)
//   device_ids / host_sample / host_logits   the results, by row
//
// A row may also carry rows that are only read (prompt logprobs: the logits of a prompt chunk's
// positions before the sampled one, or of a whole chunk that ends inside the prompt), which the
// engine reads with host_logits(), and tokens banned from this draw (min_tokens: EOS and stop
// ids), whose logits become -inf before the draw.
//
// Constrained decoding: a row with a grammar (its request's GrammarMatcher) has every sampled row
// masked to the tokens the grammar allows there (ops::mask_logits, on the host or the device) before
// anything reads or draws them: the sampled row at the matcher's state, and a draft's row i at the
// state after the draft's tokens on the path to it (a chain's first i, a tree node's ancestors).
// A draft row after a token the grammar refuses is never read by the verifier (that token's
// probability is 0, so it is rejected) and stays unmasked. finish() computes the masks on the host
// threads while the device still runs the forward, so they cost the step only what they take
// beyond it; row_status() reports a row whose grammar allows no token at all.
//
// Device sampling applies when the model is on a GPU and every row can be drawn there: no top
// logprobs asked, no read-only rows and no banned tokens (the host reads or edits those logits),
// a vocabulary below 2^24 (logit edits carry ids as f32), and draft rows only for plain greedy
// requests (a draft's rows see the drafts before them in their penalties, which only the host
// verifier models). All plain greedy: kDeviceGreedy (argmax); else kDeviceSample.
// Randomness: exactly one draw from a request's stream per non-greedy row without a draft, on
// either path, so that a seeded request draws the same tokens wherever its logits are the same.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "sampling/grammar_matcher.h"
#include "sampling/sampler.h"

namespace tachyon {

// One sequence's rows in a step's logits: num_read_only rows, then (when it samples) the sampled
// row and its draft's.
struct SampleRow {
  Sampler* sampler = nullptr;  // the request's: parameters, history, random stream
  int num_draft = 0;           // K > 0: 1 + K rows that verify a draft of K tokens; 0: one row
  int num_read_only = 0;       // rows before those, read on the host and never drawn
  bool sample = true;          // false: read-only rows alone (a chunk that ends inside the prompt)
  std::span<const int32_t> banned;  // may not be drawn now: -inf before the draw (no draft with it)
  // Constrained decoding: the request's grammar state (null: none) and the draft its rows verify
  // (num_draft tokens, and a tree's parents; empty parents: a chain). Not advanced by the sampler.
  GrammarMatcher* grammar = nullptr;
  std::span<const int32_t> draft;
  std::span<const int32_t> draft_parents;
  int num_rows() const { return num_read_only + (sample ? 1 + num_draft : 0); }
};

class BatchSampler {
 public:
  enum class Place : uint8_t { kHost, kDeviceGreedy, kDeviceSample };

  // `device`: where the model writes its logits (the host for CPU models).
  BatchSampler(Device device, int vocab_size) : device_(device), vocab_size_(vocab_size) {}

  // Where `rows` are drawn this step (see above); for kDeviceSample, takes each non-greedy row's
  // draw from its stream and uploads the rows' parameters and logit edits.
  Result<Place> begin(std::span<const SampleRow> rows);
  // The logits the forward fills: a host tensor for kHost, else one on the device.
  Tensor& logits() { return place_ == Place::kHost ? host_logits_ : device_logits_; }
  // Draws the rows begun (the same `rows`). On the device, waits for the step.
  Status finish(std::span<const SampleRow> rows);

  // Device places: the tokens and logprobs of rows [first, first + n) (a draft's rows: argmax).
  std::span<const int32_t> device_ids(int first, int n) const;
  std::span<const float> device_logprobs(int first, int n) const;
  // kHost: the sample of the `index`th entry of `rows` (which must sample, with no draft), moved out.
  Result<SampleResult> host_sample(size_t index);
  // kHost: logits row `first` (with the rows after it, for a draft or read-only rows).
  const float* host_logits(int first) const;
  // Ok, or why the `index`th entry of `rows` could not be drawn (its grammar allows no token there):
  // its tokens are then not to be used.
  const Status& row_status(size_t index) const { return row_status_[index]; }
  // Seconds spent computing grammar masks, in all; the part of it not hidden behind device forwards
  // shows in the step's time.
  double mask_seconds() const { return mask_seconds_; }
  int64_t mask_steps() const { return mask_steps_; }    // finish() calls that masked any row
  int64_t masked_rows() const { return masked_rows_; }  // rows masked, in all

 private:
  Place place_for(std::span<const SampleRow> rows) const;
  Status stage_device_sample(std::span<const SampleRow> rows);
  // Appends the penalties and logit bias of `sampler`'s request for logits row `row`.
  void add_logit_edits(const Sampler& sampler, int row);
  // The grammar masks of the rows that have one, into host_masks_ (ops::mask_logits' layout); sets
  // row_status_. The number of masks.
  int64_t fill_masks(std::span<const SampleRow> rows);

  Device device_;
  int vocab_size_;
  Place place_ = Place::kHost;
  int64_t num_rows_ = 0;
  Tensor host_logits_;  // [rows, vocab] f32, reused
  std::vector<std::optional<Result<SampleResult>>> host_samples_;
  Tensor device_logits_, device_ids_, device_logprobs_, device_params_;
  Tensor host_ids_, host_logprobs_, host_params_;
  std::vector<float> host_edits_;  // [m, ops::kLogitEditColumns], rebuilt every step
  Tensor device_edits_;            // [capacity, ops::kLogitEditColumns], grown by doubling
  std::vector<Status> row_status_;  // per entry of the rows
  Tensor host_masks_, device_masks_;  // [capacity, ops::token_mask_columns(vocab)] i32
  double mask_seconds_ = 0.0;
  int64_t mask_steps_ = 0;
  int64_t masked_rows_ = 0;
};

}  // namespace tachyon
