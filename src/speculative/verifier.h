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
  std::vector<int32_t> path;         // [num_accepted] the accepted drafts' indices (0, 1, ... for a chain)
};

// logits: [K + 1, vocab] f32; draft_probs: [K, vocab] the draft's q, or nullptr for one-hot
// guesses (ignored for greedy requests). Errors as Sampler::sample (e.g. no finite logit).
Result<Verification> verify_draft(std::span<const int32_t> draft, const float* draft_probs, const float* logits,
                                  int vocab, Sampler& sampler);

// A token tree of one-hot guesses: parents[i] is the parent of draft[i] (< i; -1: a child of the
// last accepted token). logits: [N + 1, vocab], row 0 after the last accepted token, row 1 + i
// after draft[i] (its ancestors' tokens before it). From the root down, each row's token is
// chosen as plain decoding would choose it (penalties see the path so far):
//   greedy    the row's argmax; the walk moves to the child holding it, and stops where none does;
//   sampling  the children are tried in index order against the row's p: child t is accepted with
//             probability r(t) / sum(r), where r starts at p and loses each rejected child's
//             mass (a one-hot draft's residual); when every child is rejected, the token is drawn
//             from r and the walk stops. Each step is the single-draft rule of
//             rejection_sampler.h with q one-hot, applied again to the residual, so the emitted
//             tokens follow the target's distribution exactly.
// A chain (parents i - 1) follows verify_draft's rule for one-hot drafts.
Result<Verification> verify_draft_tree(std::span<const int32_t> draft, std::span<const int32_t> parents,
                                       const float* logits, int vocab, Sampler& sampler);

// Greedy verification from the rows' choices alone: ids[r] and logprobs[r] are row r's argmax
// and its logprob (what plain greedy decoding emits there; ops::argmax gives both on a device),
// for the N + 1 rows of a chain (parents empty) or a tree. Walks as verify_draft_tree does
// greedily, and gives what it gives for a request without penalties or top logprobs.
Result<Verification> verify_greedy_rows(std::span<const int32_t> draft, std::span<const int32_t> parents,
                                        std::span<const int32_t> ids, std::span<const float> logprobs);

}  // namespace tachyon
