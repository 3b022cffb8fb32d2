#pragma once
// A member that misbehaves on purpose, for testing and measuring what a bad member does to a run
// (elastic.fault for an elastic worker; outer.fault for the last outer.faulty_replicas replicas
// of any other run): it corrupts its own contribution to every DiLoCo round (every Streaming
// DiLoCo fragment's sync) before sending it. Its outer gradient is delta = theta - params (theta:
// the outer parameters); it sends theta - f(delta) in place of its parameters, with f:
//   "nan"      the first entry of delta made NaN
//   "inf"      the first entry made +Inf
//   "scale:X"  delta times X (X = -10: a sign-flipped outer gradient ten times too large)
//   "noise"    delta replaced by Gaussian noise of the same norm (drawn from `seed`)
// Every run records the setting in its config.toml; "" (the default) is an honest member.
#include <cstdint>
#include <string>
#include <vector>

namespace loco {

struct Fault {
  enum class Kind { None, Nan, Inf, Scale, Noise } kind = Kind::None;
  double scale = 1;
};

// Fails, naming `key`, for anything but the forms above.
Fault parse_fault(const std::string& text, const std::string& key = "elastic.fault");
// Rewrites `contribution` (this member's parameters) as described above; `seed` draws the noise
// (give each round and member its own).
void apply_fault(const Fault& f, const std::vector<float>& theta, std::vector<float>& contribution, uint64_t seed);

}  // namespace loco
