// Sampler: turns one request's logits at one position into a token, that token's logprob and
// the top-N logprobs. One Sampler per request; it owns the request's RNG (seeded, see rng.h) and
// its TokenCounts (prompt set once, each generated token added by accept()).
//
// Pipeline, in the order vLLM and HF users expect:
//   0. non-finite logits (NaN, +inf, -inf) are excluded, as if -inf; logit_bias is added
//   1. repetition penalty over prompt and output tokens: x > 0 ? x / r : x * r        (HF)
//   2. frequency and presence penalties over output tokens: x -= f * count + p       (OpenAI)
//   3. temperature: x / T, computed as t = (x - max x) * (1 / T) in f32 (so t <= 0 for any T).
//      T == 0 is greedy: the argmax of step 2, ties -> lowest id, no draw.
//   4. top-k, 5. top-p (nucleus), 6. min-p: each applies to the distribution left by the one
//      before it. Tokens are ranked by processed logit, descending, then by id, ascending; top-k
//      and top-p keep a prefix of that ranking, so a tie at a boundary keeps the lower ids.
//      top-p keeps the smallest prefix whose probability reaches top_p (always >= 1 token), with
//      a relative slack of 1e-6 so that a boundary exact in decimal (0.5 + 0.3 for 0.8) is not
//      lost to rounding. min-p drops tokens with p < min_p * p_max.
//   7. one draw u = Rng::next_double(); the token is found by inverse CDF over the kept tokens in
//      increasing id order. A non-greedy sample() consumes exactly one next_u64().
//
// Reported logprobs (SampleResult::logprob and top_logprobs) are the log-softmax of the logits
// after steps 0-3: penalties and temperature applied, truncation (4-6) not. For greedy requests
// the temperature is taken as 1. This is the distribution the request asked to sample from before
// truncation, so every reported value is finite (a truncated token would have -inf, which JSON
// cannot carry) and top_logprobs rank the same tokens top-k would keep. vLLM by default reports
// the raw model distribution instead; the two agree when no penalty is set and T is 1.
//
// Cost: two vectorized passes over the row (sanitize with block maxima; scale, exp and block
// sums), a block search for the draw, plus for truncation a selection over the tokens that survive
// cheap exact thresholds; the full vocabulary is never sorted. Scratch memory is per thread
// (see sampler.cpp), so a Sampler holds no [vocab]-sized buffer of its own.
// Threads: a Sampler is one request's and is not shared; distinct Samplers may sample on
// distinct threads at once.
// Errors (Status, never abort): all logits non-finite, a history or logit_bias id outside the
// vocabulary, or parameters that did not pass SamplingParams::validate().
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"
#include "sampling/rng.h"
#include "sampling/sampling_params.h"
#include "sampling/token_counts.h"

namespace tachyon {

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;  // natural log of the chosen token's probability, see "Reported logprobs"
  // The params.logprobs most likely tokens as (id, logprob), most likely first, ties lowest id
  // first; fewer when fewer tokens have finite logits.
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

class Sampler {
 public:
  // Seeds the RNG from params.seed, or from std::random_device when it is absent. Parameters
  // that fail validation are not an abort: every later sample() returns that error.
  explicit Sampler(SamplingParams params);
  // Validates against the vocabulary, then constructs: the form for the request boundary.
  static Result<Sampler> create(SamplingParams params, int vocab_size);

  // Records the prompt once (repetition penalty only); accept() records each generated token.
  void set_prompt(std::span<const int32_t> prompt_tokens) { history_.add_prompt(prompt_tokens); }
  void accept(int32_t token) { history_.add_output(token); }
  const TokenCounts& history() const { return history_; }

  // logits: [vocab_size] f32, the model's output for the position being sampled.
  Result<SampleResult> sample(const float* logits, int vocab_size) {
    return sample(logits, vocab_size, history_);
  }
  // The same with an explicit history (e.g. a speculative verifier's hypothetical prefix).
  Result<SampleResult> sample(const float* logits, int vocab_size, const TokenCounts& history);

  // The distribution sample() draws from, dense: probs is resized to [vocab_size] and holds the
  // renormalized probability of every kept token and 0 elsewhere (one-hot for greedy).
  // Consumes no randomness.
  Status probabilities(const float* logits, int vocab_size, const TokenCounts& history,
                       std::vector<float>& probs) const;

  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }  // as given, or as drawn; reusing it replays the request
  // The request's stream, for callers that draw more from it (e.g. speculative acceptance tests).
  Rng& rng() { return rng_; }

 private:
  SamplingParams params_;
  Status params_status_;  // validate() of params_, vocabulary-independent part
  uint64_t seed_ = 0;
  Rng rng_;
  TokenCounts history_;
};

}  // namespace tachyon
