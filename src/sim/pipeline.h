#pragma once
// Step time of a pipelined step (the pipeline issue's model of loco's own runs): each stage is a
// compute lane running its schedule (pipeline/schedule.h); each stage's outgoing link carries
// its messages first come, first served, taking 8 bytes / bandwidth on the wire and arriving
// latency later (the link model of comm/link.h). Forward, a boundary carries the activations
// and then the token ids of a microbatch; backward, the activation gradients. After its
// schedule a stage exchanges its tied-embedding gradient (first and last stage, if tied), then
// sends its gradient-norm partial sums to every other stage, then runs the optimizer; the next
// step starts when every partial sum has arrived.
#include <cstdint>
#include <vector>

#include "pipeline/schedule.h"

namespace loco::sim {

struct PipelineProfile {
  int stages = 2, microbatches = 4;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  std::vector<double> forward_s, backward_s;  // per stage, per microbatch
  std::vector<double> optimizer_s;            // per stage, per step (may be empty: 0)
  double activation_bytes = 0;                // per microbatch and boundary, each direction
  double token_bytes = 0;                     // per microbatch and boundary, forward
  double tied_bytes = 0;                      // tied embedding gradient (0: untied)
  double norm_bytes = 0;                      // gradient-norm partials per stage
  double bandwidth_bps = 0;                   // 0: unlimited
  double latency_s = 0;
};

struct PipelineStageTimes {
  double schedule_end = 0;  // when the stage finished its last pass of the step
  double bubble = 0;        // waiting for inputs during the schedule
  double compute = 0;       // forward + backward + optimizer
};

struct PipelineResult {
  double step_s = 0;  // steady-state time per step (mean over the steps after the first)
  std::vector<PipelineStageTimes> first_step;  // per stage, the first step from time 0
  std::vector<double> compute_utilization;     // per stage: compute / step time, steady state
  std::vector<double> bubble_share;            // per stage: idle / step time, steady state
};

PipelineResult simulate_pipeline(const PipelineProfile& p, int steps = 4);

}  // namespace loco::sim
