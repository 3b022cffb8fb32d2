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
// Any of them followed by "@S" (e.g. "scale:-10@40") starts with the syncs after step S: a
// member that goes bad during the run (before that it is honest).
// Every run records the setting in its config.toml; "" (the default) is an honest member.
#include <cstdint>
#include <string>
#include <vector>

namespace loco {

struct Fault {
  enum class Kind { None, Nan, Inf, Scale, Noise } kind = Kind::None;
  double scale = 1;
  int64_t from_step = 0;  // the first step whose syncs are corrupted
};

// Fails, naming `key`, for anything but the forms above.
Fault parse_fault(const std::string& text, const std::string& key = "elastic.fault");
// Rewrites `contribution` (this member's parameters, synchronized after `step`) as described
// above; `seed` draws the noise (give each round and member its own).
void apply_fault(const Fault& f, int64_t step, const std::vector<float>& theta, std::vector<float>& contribution,
                 uint64_t seed);

}  // namespace loco
