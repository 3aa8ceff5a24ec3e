// Verification of speculative proposals, lossless: what is emitted has exactly the distribution
// (or, greedily, exactly the tokens) the target model alone would have produced.
//
// A proposer drafted tokens d[0..K) from distributions q[0..K); the target scored the same
// positions in one forward, giving p[0..K] (one more row: the position after the last draft).
//   greedy     accept d[i] while d[i] == argmax p[i]; then emit argmax p[j] at the first
//              mismatch j (or the bonus argmax p[K] when all were accepted).
//   sampling   accept d[i] with probability min(1, p[i][d] / q[i][d]); at the first rejection
//              emit a draw from the residual max(0, p[i] - q[i]) renormalized; when all K are
//              accepted emit a draw from p[K] (Leviathan et al. 2023, Chen et al. 2023).
// p and q must be the distributions the request samples from after every processor
// (penalties, temperature, top-k/top-p/min-p), applied alike to both: Sampler::probabilities.
// A proposer without distributions (n-gram lookup) is a draft whose q is one-hot on d[i]; then
// the acceptance probability is p[i][d] and the residual is p[i] without d.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "sampling/rng.h"

namespace tachyon {

struct VerifyResult {
  int num_accepted = 0;         // leading draft tokens kept, 0..K
  std::vector<int32_t> tokens;  // the accepted drafts, then one token from the target: K' + 1
};

// target_argmax: [K + 1] the target's greedy choice at each scored position.
VerifyResult verify_greedy(std::span<const int32_t> draft, std::span<const int32_t> target_argmax);

// target_probs [K + 1, vocab] and draft_probs [K, vocab] (row-major; nullptr: one-hot drafts).
// Draws one uniform per examined draft token, and one more for the emitted token.
VerifyResult verify_sampled(std::span<const int32_t> draft, const float* draft_probs, const float* target_probs,
                            int vocab, Rng& rng);
// The same with the target's rows computed on demand: target_row(i) ([vocab] p[i]) is asked for
// rows 0, 1, ... in order, each once, and only as far as the walk goes (a rejection at i needs no
// row past i); the pointer must stay valid until the next call.
VerifyResult verify_sampled(std::span<const int32_t> draft, const float* draft_probs,
                            const std::function<const float*(size_t row)>& target_row, int vocab, Rng& rng);

// A draw from the weights w (not normalized; at least one positive) by inverse CDF in id order,
// u in [0, 1). Returns the last positive id if rounding leaves u beyond the total.
int32_t draw_weighted(const std::vector<double>& w, double u);

}  // namespace tachyon
