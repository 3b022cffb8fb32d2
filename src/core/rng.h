#pragma once
// Deterministic RNG: splitmix64-seeded xoshiro256** with our own normal sampler, so that
// results do not depend on the standard library's distribution implementations.
#include <cstdint>
#include <string>
#include <vector>

namespace loco {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed);
  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Standard normal (Box-Muller, both values used).
  double normal();
  // State as 4 words plus the cached normal, for checkpoints.
  struct State {
    uint64_t s[4];
    double cached;
    bool has_cached;
  };
  State state() const { return {{s_[0], s_[1], s_[2], s_[3]}, cached_, has_cached_}; }
  void set_state(const State& st);

 private:
  uint64_t s_[4];
  double cached_ = 0.0;
  bool has_cached_ = false;
};

// Mixes several integers into one seed (for per-worker, per-step streams).
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c = 0);
// FNV-1a of a name (a tensor's), for seeding one stream per name.
uint64_t name_hash(const std::string& s);
// A permutation of 0..n-1 drawn from `seed` (Fisher-Yates over this Rng): the same everywhere.
std::vector<int> seeded_permutation(int n, uint64_t seed);

}  // namespace loco
