// Rng: splitmix64 seeding and the xoshiro256** step. See rng.h for the stream's contract.
#include "sampling/rng.h"

#include <random>

namespace tachyon {

namespace {
inline uint64_t rotate_left(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

uint64_t splitmix64_next(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t random_seed() {
  std::random_device device;
  const uint64_t high = device();
  const uint64_t low = device();
  return (high << 32) ^ low;
}

Rng::Rng(uint64_t seed) {
  // splitmix64 never yields four zero words in a row, so the xoshiro state is never all zero.
  uint64_t s = seed;
  for (uint64_t& word : state_) word = splitmix64_next(s);
}

Rng Rng::from_state(const std::array<uint64_t, 4>& state) {
  Rng rng;
  rng.state_ = state;
  return rng;
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotate_left(state_[1] * 5, 7) * 9;
  const uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotate_left(state_[3], 45);
  return result;
}

double Rng::next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

}  // namespace tachyon
