// Verification of one sequence's draft against the target's logits, with the request's sampler:
// the glue between the engine and the rejection sampler (rejection_sampler.h).
//
// The target scored the last accepted token and the K draft tokens in one forward: row i of
// `logits` gives the target's next-token logits after draft[0..i). Each row is processed exactly
// as plain decoding would process it — penalties see the request's history plus the drafts
// before that row — so that:
//   greedy    every emitted token, and its logprob, equals what plain greedy decoding emits;
//   sampling  p (and the draft's q) are Sampler::probabilities of the row, truncation included,
//             and verify_sampled draws from the request's own RNG stream.
// Reported logprobs follow the Sampler's convention (log-softmax after penalties and
// temperature, before truncation).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "sampling/sampler.h"

namespace tachyon {

struct Verification {
  int num_accepted = 0;              // leading draft tokens kept, 0..K
  std::vector<SampleResult> tokens;  // what to emit, in order: the accepted drafts, then the target's token
};

// logits: [K + 1, vocab] f32; draft_probs: [K, vocab] the draft's q, or nullptr for one-hot
// guesses (ignored for greedy requests). Errors as Sampler::sample (e.g. no finite logit).
Result<Verification> verify_draft(std::span<const int32_t> draft, const float* draft_probs, const float* logits,
                                  int vocab, Sampler& sampler);

}  // namespace tachyon
