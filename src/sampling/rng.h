// Rng: the random stream of one request. xoshiro256** (Blackman and Vigna, 2018) whose 256-bit
// state is expanded from a 64-bit seed by four splitmix64 steps.
//
// The stream for a given seed is defined by this file alone (no std::*_distribution, whose
// output differs between standard libraries), so it is the same on every platform and build; a
// seeded request draws the same tokens wherever its logits and float arithmetic are the same
// (the sampler consumes one next_double() per non-greedy token). Changing the generator, the seeding or next_double() changes every
// seeded output: treat it as a compatibility break and update the golden values in
// tests/sampling/rng_test.cpp.
#pragma once

#include <array>
#include <cstdint>

namespace tachyon {

// One splitmix64 step: advances `state` by the golden-ratio increment and returns its mix.
uint64_t splitmix64_next(uint64_t& state);

// A seed from std::random_device, for requests that did not ask for one.
uint64_t random_seed();

class Rng {
 public:
  explicit Rng(uint64_t seed);
  // A raw xoshiro256** state (not all zero), for known-answer tests against the published
  // reference implementation.
  static Rng from_state(const std::array<uint64_t, 4>& state);

  uint64_t next_u64();
  // Uniform in [0, 1): the top 53 bits of next_u64() scaled by 2^-53. Exactly one next_u64().
  double next_double();

 private:
  Rng() = default;
  std::array<uint64_t, 4> state_{};
};

}  // namespace tachyon
