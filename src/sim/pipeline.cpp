#include "sim/pipeline.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace loco::sim {

namespace {

// One stage's outgoing link: first come, first served.
struct Link {
  double free = 0;
  double send(double t, double bytes, const PipelineProfile& p) {
    const double start = std::max(t, free);
    free = start + (p.bandwidth_bps > 0 ? 8.0 * bytes / p.bandwidth_bps : 0.0);
    return free + p.latency_s;  // arrival
  }
};

}  // namespace

PipelineResult simulate_pipeline(const PipelineProfile& p, int steps) {
  const int S = p.stages, m = p.microbatches;
  check(S >= 1 && m >= 1 && steps >= 1, "pipeline simulation: stages, microbatches and steps must be >= 1");
  check(int(p.forward_s.size()) == S && int(p.backward_s.size()) == S,
        "pipeline simulation: forward and backward times are needed for every stage");
  const double unknown = std::numeric_limits<double>::infinity();
  std::vector<std::vector<PipeOp>> ops(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) ops[size_t(s)] = stage_schedule(p.schedule, S, s, m);
  std::vector<Link> links(static_cast<size_t>(S));
  std::vector<double> start(size_t(S), 0.0);  // when each stage may start the step
  std::vector<double> step_starts;
  PipelineResult out;
  std::vector<double> compute_total(size_t(S), 0.0), bubble_total(size_t(S), 0.0);
  for (int step = 0; step < steps; ++step) {
    // Arrival times of each microbatch's input at each stage (forward from s-1, backward from s+1).
    std::vector<std::vector<double>> fwd_in(size_t(S), std::vector<double>(size_t(m), unknown)),
        bwd_in(size_t(S), std::vector<double>(size_t(m), unknown));
    std::vector<size_t> next(size_t(S), 0);
    std::vector<double> now = start;
    std::vector<PipelineStageTimes> times(static_cast<size_t>(S));
    // Run every stage's schedule as far as its inputs allow until all are done (the schedules
    // are deadlock-free, so each sweep makes progress).
    for (bool progress = true; progress;) {
      progress = false;
      for (int s = 0; s < S; ++s) {
        auto& t = times[size_t(s)];
        while (next[size_t(s)] < ops[size_t(s)].size()) {
          const PipeOp op = ops[size_t(s)][next[size_t(s)]];
          const bool fwd = op.kind == PipeOp::Forward;
          const bool needs_input = fwd ? s > 0 : s < S - 1;
          const double ready = needs_input ? (fwd ? fwd_in : bwd_in)[size_t(s)][size_t(op.microbatch)] : 0.0;
          if (ready == unknown) break;
          const double begin = std::max(now[size_t(s)], ready);
          t.bubble += begin - now[size_t(s)];
          const double dur = fwd ? p.forward_s[size_t(s)] : p.backward_s[size_t(s)];
          now[size_t(s)] = begin + dur;
          t.compute += dur;
          if (fwd && s < S - 1) {
            links[size_t(s)].send(now[size_t(s)], p.activation_bytes, p);
            fwd_in[size_t(s + 1)][size_t(op.microbatch)] = links[size_t(s)].send(now[size_t(s)], p.token_bytes, p);
          }
          if (!fwd && s > 0)
            bwd_in[size_t(s - 1)][size_t(op.microbatch)] = links[size_t(s)].send(now[size_t(s)], p.activation_bytes, p);
          ++next[size_t(s)];
          progress = true;
        }
      }
    }
    for (int s = 0; s < S; ++s)
      check(next[size_t(s)] == ops[size_t(s)].size(), "internal: pipeline simulation did not finish a schedule");
    for (int s = 0; s < S; ++s) times[size_t(s)].schedule_end = now[size_t(s)];
    // Tied embedding: the first and last stage exchange their gradients.
    if (S > 1 && p.tied_bytes > 0) {
      const double a = links[0].send(now[0], p.tied_bytes, p);
      const double b = links[size_t(S - 1)].send(now[size_t(S - 1)], p.tied_bytes, p);
      now[0] = std::max(now[0], b);
      now[size_t(S - 1)] = std::max(now[size_t(S - 1)], a);
    }
    // Gradient norm: every stage sends its partial sums to every other and waits for them all.
    std::vector<double> arrival(size_t(S), 0.0);
    if (S > 1)
      for (int s = 0; s < S; ++s)
        for (int k = 0; k < S; ++k)
          if (k != s) arrival[size_t(k)] = std::max(arrival[size_t(k)], links[size_t(s)].send(now[size_t(s)], p.norm_bytes, p));
    for (int s = 0; s < S; ++s) {
      const double opt = p.optimizer_s.empty() ? 0.0 : p.optimizer_s[size_t(s)];
      times[size_t(s)].compute += opt;
      start[size_t(s)] = std::max(now[size_t(s)], arrival[size_t(s)]) + opt;
    }
    if (step == 0) out.first_step = times;
    if (step > 0)
      for (int s = 0; s < S; ++s) {
        compute_total[size_t(s)] += times[size_t(s)].compute;
        bubble_total[size_t(s)] += times[size_t(s)].bubble;
      }
    step_starts.push_back(*std::min_element(start.begin(), start.end()));
  }
  // Steady state: from the end of the first step to the end of the last.
  const int measured = steps - 1;
  out.step_s = measured > 0 ? (step_starts.back() - step_starts.front()) / measured : step_starts.back();
  for (int s = 0; s < S; ++s) {
    const double c = measured > 0 ? compute_total[size_t(s)] / measured : out.first_step[size_t(s)].compute;
    out.compute_utilization.push_back(c / out.step_s);
    out.bubble_share.push_back(1.0 - c / out.step_s);
  }
  return out;
}

}  // namespace loco::sim
