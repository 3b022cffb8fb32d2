#include "sim/cu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <toml++/toml.h>

#include "algo/streaming.h"
#include "comm/codec.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace loco::sim {
namespace {

// The numeric fields of Profile, by name, for the profile file and --set.
template <class F>
void for_each_field(Profile& p, F&& f) {
  f("layers", p.layers);
  f("params", p.params);
  f("nonblock_params", p.nonblock_params);
  f("step_time_s", p.step_time_s);
  f("fragment_layers", p.fragment_layers);
  f("inner_steps", p.inner_steps);
  f("tau", p.tau);
  f("replicas", p.replicas);
  f("codec_block", p.codec_block);
  f("latency_s", p.latency_s);
}

template <class T>
void assign(T& out, double v, const std::string& what) {
  if constexpr (std::is_integral_v<T>) {
    // Within T's range before converting (out of it the conversion is undefined).
    if (v != std::floor(v) || std::abs(v) > 1e15 || v < double(std::numeric_limits<T>::min()) ||
        v > double(std::numeric_limits<T>::max()))
      fail(what + ": expected an integer of at most " +
           std::to_string(std::min<int64_t>(int64_t(1e15), int64_t(std::numeric_limits<T>::max()))));
    out = T(v);
  } else {
    out = v;
  }
}

}  // namespace

// The upper bounds keep a simulation finite in time and memory (it schedules 5 H steps of every
// layer, about 40 times per CU level) and its byte counts within int64: far above any model a
// profile describes (the largest shipped: 126 layers, 6.7e11 parameters, H = 100).
void validate_profile(const Profile& p) {
  const std::string n = "profile " + p.name + ": ";
  check(p.layers >= 1 && p.layers <= 10000, n + "layers must be in [1, 10000]");
  check(std::isfinite(p.params) && p.params > 0 && p.params <= 1e15 && p.nonblock_params >= 0 &&
            p.nonblock_params < p.params,
        n + "need 0 < params <= 1e15 and 0 <= nonblock_params < params");
  check(std::isfinite(p.step_time_s) && p.step_time_s > 0 && p.step_time_s <= 1e6,
        n + "step_time_s must be in (0, 1e6]");
  check(p.fragment_layers >= 1, n + "fragment_layers must be >= 1");
  check(p.inner_steps >= 1 && p.inner_steps <= 10000, n + "inner_steps must be in [1, 10000]");
  check(p.tau >= 0, n + "tau must be >= 0");
  check(p.replicas >= 2 && p.replicas <= 1000000, n + "replicas must be in [2, 1000000]");
  check(p.codec_block >= 1 && p.codec_block <= 1000000, n + "codec_block must be in [1, 1000000]");
  check(std::isfinite(p.latency_s) && p.latency_s >= 0 && p.latency_s <= 1000, n + "latency_s must be in [0, 1000]");
  check(p.tau < p.inner_steps, n + "tau must be smaller than inner_steps");
  check(p.inner_steps * p.layers <= 1000000,
        n + "inner_steps x layers must be at most 1e6 (the schedule is simulated step by step and layer by layer)");
}

Convention parse_convention(const std::string& name) {
  if (name == "loco") return Convention::Loco;
  if (name == "paper") return Convention::Paper;
  fail("--convention must be loco or paper, got \"" + name + "\"");
}

void set_profile_key(Profile& p, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos) fail("--set " + assignment + ": expected KEY=VALUE");
  const std::string key = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(value, &used);
    if (used != value.size()) throw std::invalid_argument(value);
  } catch (const std::exception&) {
    fail("--set " + key + ": \"" + value + "\" is not a number");
  }
  bool found = false;
  for_each_field(p, [&](const char* name, auto& field) {
    if (key == name) {
      assign(field, v, "--set " + key);
      found = true;
    }
  });
  if (!found) fail("--set: unknown profile key \"" + key + "\"");
}

std::map<std::string, Profile> load_profiles(const std::string& path) {
  toml::table file;
  try {
    file = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    fail(path + ": " + std::string(e.description()));
  }
  std::map<std::string, Profile> out;
  for (const auto& [name, node] : file) {
    const auto* table = node.as_table();
    if (!table) fail(path + ": " + std::string(name.str()) + " is not a table");
    Profile p;
    p.name = std::string(name.str());
    for (const auto& [key_node, value] : *table) {
      const std::string key(key_node.str());
      const std::string where = path + ": " + p.name + "." + key;
      const auto number = value.value<double>();
      if (!number) fail(where + ": expected a number");
      bool found = false;
      for_each_field(p, [&](const char* field_name, auto& field) {
        if (key == field_name) {
          assign(field, *number, where);
          found = true;
        }
      });
      if (!found) fail(where + ": unknown key");
    }
    validate_profile(p);
    out[p.name] = p;
  }
  return out;
}

const std::vector<Method>& all_methods() {
  static const std::vector<Method> m = {Method::DDP, Method::DiLoCo, Method::Streaming, Method::StreamingOverlap,
                                        Method::StreamingOverlapFp4};
  return m;
}

std::string method_name(Method m) {
  switch (m) {
    case Method::DDP: return "ddp";
    case Method::DiLoCo: return "diloco";
    case Method::Streaming: return "streaming";
    case Method::StreamingOverlap: return "streaming-overlap";
    case Method::StreamingOverlapFp4: return "streaming-overlap-fp4";
  }
  return "";
}

Method parse_method(const std::string& name) {
  for (Method m : all_methods())
    if (method_name(m) == name) return m;
  fail("unknown method \"" + name + "\" (ddp, diloco, streaming, streaming-overlap, streaming-overlap-fp4)");
}

double reduction_bytes(const Profile& p, Method method, double values, Convention convention) {
  const bool fp4 = method == Method::StreamingOverlapFp4;
  if (convention == Convention::Paper) return values * (fp4 ? 0.5 : 2.0);
  const int64_t n = int64_t(values);
  if (!fp4) return 4.0 * double(ring_all_reduce_floats_sent(n, p.replicas, 0));
  const auto codec = make_codec({"fp4-e3m0", "nearest", p.codec_block, 0.1});
  return double(encoded_sync_bytes(*codec, choose_encoded_reduce("auto", p.replicas), n, p.replicas, 0));
}

double reduction_latency(const Profile& p, Method method, double values, double bandwidth_bps,
                         Convention convention) {
  if (convention == Convention::Paper) return 0;
  const int M = p.replicas;
  if (method != Method::StreamingOverlapFp4)  // ring all-reduce, forwarded piece by piece
    return ring_all_reduce_latency(int64_t(values), M, bandwidth_bps / 8, p.latency_s);
  return choose_encoded_reduce("auto", M) == EncodedReduce::AllGather ? (M - 1) * p.latency_s  // ring all-gather
                                                                      : 2.0 * p.latency_s;      // two direct rounds
}

CuResult simulate_cu(const Profile& p, Method method, double bandwidth_bps, int record_steps, Convention convention) {
  validate_profile(p);
  check(bandwidth_bps > 0, "bandwidth must be > 0");
  const int L = p.layers;
  const bool ddp = method == Method::DDP, diloco = method == Method::DiLoCo;
  const int64_t H = p.inner_steps, period = ddp ? 1 : H;
  const int64_t warm = 2 * period, steps = warm + (ddp ? 20 : 3) * period;
  const int64_t tau = (method == Method::StreamingOverlap || method == Method::StreamingOverlapFp4) ? p.tau : 0;
  // F, B and W of a layer cost the same; the first layer has no B (nothing to send back to).
  const double unit = p.step_time_s / (3.0 * L - 1);
  const double block_values = (p.params - p.nonblock_params) / L;
  const std::vector<FragmentPlan> plan =
      (ddp || diloco) ? std::vector<FragmentPlan>{} : plan_fragments(L, p.fragment_layers, "strided", H);

  CuResult res;
  auto record = [&](int lane, char kind, int64_t step, int layer, double start, double end) {
    if (step > warm && step <= warm + record_steps) res.spans.push_back({lane, kind, step, layer, start, end});
  };
  // gate[s % window][l]: earliest start of F_l at step s (reductions it waits for).
  const int64_t window = tau + 2;
  std::vector<std::vector<double>> gate(size_t(window), std::vector<double>(size_t(L), 0.0));
  double compute_free = 0, network_free = 0, idle = 0;  // idle: compute waiting on reductions, after warm-up
  const bool paper = convention == Convention::Paper;
  auto reduce = [&](double ready, double values, int64_t step, int layer) {
    const double start = std::max(network_free, ready);
    const double transfer =
        std::isinf(bandwidth_bps) ? 0.0 : 8.0 * reduction_bytes(p, method, values, convention) / bandwidth_bps;
    network_free = start + reduction_latency(p, method, values, bandwidth_bps, convention) + transfer;
    record(1, 'R', step, layer, start, network_free);
    return network_free;
  };
  auto block = [&](int64_t step, int layer, double until) {
    double& g = gate[size_t(step % window)][size_t(layer)];
    g = std::max(g, until);
  };
  std::vector<double> w_end(static_cast<size_t>(L));
  for (int64_t s = 1; s <= steps; ++s) {
    auto& g = gate[size_t(s % window)];
    for (int l = 0; l < L; ++l) {
      const double start = std::max(compute_free, g[size_t(l)]);
      if (s > warm) idle += start - compute_free;
      compute_free = start + unit;
      record(0, 'F', s, l, start, compute_free);
    }
    std::fill(g.begin(), g.end(), 0.0);
    for (int l = L - 1; l >= 0; --l) {
      record(0, 'W', s, l, compute_free, compute_free + unit);
      compute_free += unit;
      w_end[size_t(l)] = compute_free;
      if (l > 0) {
        record(0, 'B', s, l, compute_free, compute_free + unit);
        compute_free += unit;
      }
    }
    // The paper reduces layer by layer as each W finishes (the non-block parameters with layer
    // 0); loco reduces everything at once after the step.
    auto per_layer = [&] {
      for (int l = L - 1; l >= 0; --l)
        block(s + 1, l, reduce(w_end[size_t(l)], block_values + (l == 0 ? p.nonblock_params : 0.0), s, l));
    };
    auto whole = [&] {
      const double end = reduce(compute_free, p.params, s, -1);
      for (int l = 0; l < L; ++l) block(s + 1, l, end);
    };
    if (ddp || (diloco && s % H == 0)) {
      paper ? per_layer() : whole();
    } else if (!diloco) {
      for (const auto& f : plan) {
        if (!syncs_at(f, s, H)) continue;
        // A fragment's reduction is ready after its layers' W (paper) or after the step (loco);
        // the non-block fragment has no compute node of its own: after the step, and it gates
        // the first layer.
        double ready = f.nonblock || !paper ? compute_free : 0.0;
        for (int l : f.blocks) ready = std::max(ready, w_end[size_t(l)]);
        const double values = block_values * double(f.blocks.size()) + (f.nonblock ? p.nonblock_params : 0.0);
        const double end = reduce(ready, values, s, f.nonblock ? -1 : f.blocks.front());
        for (int l : f.blocks) block(s + 1 + tau, l, end);
        if (f.nonblock) block(s + 1 + tau, 0, end);
      }
    }
  }
  res.compute_s = double(steps - warm) * p.step_time_s;
  res.wall_s = res.compute_s + idle;  // summed, not differenced: CU <= 1 exactly
  res.cu = res.compute_s / res.wall_s;
  return res;
}

double bandwidth_for_cu(const Profile& p, Method method, double target, Convention convention) {
  double lo = 3, hi = 16;  // log10 bits/s
  auto cu = [&](double log_bw) { return simulate_cu(p, method, std::pow(10.0, log_bw), 0, convention).cu; };
  if (cu(hi) < target) return std::numeric_limits<double>::infinity();
  if (cu(lo) >= target) return std::pow(10.0, lo);
  for (int i = 0; i < 40; ++i) {
    const double mid = 0.5 * (lo + hi);
    (cu(mid) >= target ? hi : lo) = mid;
  }
  return std::pow(10.0, hi);
}

}  // namespace loco::sim
