#pragma once
// Compute-utilization simulator (docs/simulator.md): a discrete-event schedule of one
// worker's steps as a DAG of per-layer compute nodes (forward F_l, backward to activations B_l,
// backward to weights W_l) on one compute resource and reductions R on one network resource,
// under loco's convention or the paper's (below).
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
  int replicas = 2;         // M (loco convention)
  int codec_block = 128;    // values per shared scale of the fp4 codec (loco convention)
  double latency_s = 0;     // one-way latency per message (loco convention)
};

// How a reduction is costed and scheduled (docs/simulator.md):
//  - Loco: what loco sends and when. fp32 through an M-worker ring all-reduce (the bytes of
//    ring_all_reduce_floats_sent, 2 (M-1) dependent messages); fp4 E3M0 in blocks of
//    codec_block, combined as outer.reduce = auto does (encoded_sync_bytes; all-gather: M-1
//    messages, reduce-scatter: 2 rounds). DDP reduces the whole gradient after the backward,
//    DiLoCo all parameters after the step, streaming a fragment after its sync step.
//  - Paper: the Streaming DiLoCo paper's model as docs/simulator.md states it: per-layer reductions for
//    every method, each right after its layer's W (DiLoCo's at step kH, overlapping the rest of
//    that backward); bf16 payloads (2 bytes per value) except fp4 (0.5); cost = payload /
//    bandwidth, no latency.
enum class Convention { Loco, Paper };
Convention parse_convention(const std::string& name);  // "loco" or "paper"

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
CuResult simulate_cu(const Profile& p, Method method, double bandwidth_bps, int record_steps = 0,
                     Convention convention = Convention::Loco);

// Bytes one worker sends for one reduction of n values, and the latency it pays on top.
double reduction_bytes(const Profile& p, Method method, double values, Convention convention = Convention::Loco);
// `values` and the link's rate matter for the ring all-reduce (ring_all_reduce_latency).
double reduction_latency(const Profile& p, Method method, double values, double bandwidth_bps,
                         Convention convention = Convention::Loco);

// Smallest bandwidth (bits/s) at which CU >= target, by bisection on a log scale over
// [1e3, 1e16]; infinity if not reached at 1e16.
double bandwidth_for_cu(const Profile& p, Method method, double target, Convention convention = Convention::Loco);

}  // namespace loco::sim
