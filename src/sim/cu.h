#pragma once
// Compute-utilization simulator (spec 06-simulator.md): a discrete-event schedule of one
// worker's steps as a DAG of per-layer compute nodes (forward F_l, backward to activations B_l,
// backward to weights W_l) on one compute resource and reductions R on one network resource.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loco::sim {

struct Profile {
  std::string name;
  int layers = 24;
  double params = 1e9;
  double nonblock_params = 0;
  double step_time_s = 0.1;
  int fragment_layers = 3;
  int64_t inner_steps = 100;
  int64_t tau = 1;
  double bytes_per_value = 4;
  double fp4_bytes_per_value = 0.53125;
  double latency_s = 0;
};

// Profiles from a TOML file (one table each; see configs/sim-profiles.toml), by name.
std::map<std::string, Profile> load_profiles(const std::string& path);
// Applies "KEY=VALUE" (KEY a Profile field) to p; fails on unknown keys or bad values.
void set_profile_key(Profile& p, const std::string& assignment);
void validate_profile(const Profile& p);

enum class Method { DDP, DiLoCo, Streaming, StreamingOverlap, StreamingOverlapFp4 };
Method parse_method(const std::string& name);
std::string method_name(Method m);
const std::vector<Method>& all_methods();

struct Span {
  int lane;        // 0: compute, 1: network
  char kind;       // 'F', 'B', 'W' (compute) or 'R' (reduction)
  int64_t step;    // 1-based
  int layer;       // -1: whole model or non-block fragment
  double start, end;
};

struct CuResult {
  double cu = 0;         // compute time / wall time over whole periods in steady state
  double compute_s = 0;  // in the measured window
  double wall_s = 0;
  std::vector<Span> spans;  // the first `record_steps` steps, if asked
};

// Simulates `method` on profile p with an outgoing link of `bandwidth_bps` bits/s (infinity
// allowed). The measured window is whole periods after the first (a period is 1 step for DDP,
// H steps otherwise), so a DiLoCo round gives exactly H T / (H T + bytes / bandwidth).
CuResult simulate_cu(const Profile& p, Method method, double bandwidth_bps, int record_steps = 0);

// Bytes of one reduction of n values under the method's encoding.
double reduction_bytes(const Profile& p, Method method, double values);

// Smallest bandwidth (bits/s) at which CU >= target, by bisection on a log scale over
// [1e3, 1e16]; infinity if not reached at 1e16.
double bandwidth_for_cu(const Profile& p, Method method, double target);

}  // namespace loco::sim
