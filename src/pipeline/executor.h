#pragma once
// Runs one stage's side of a pipeline step: the stage's schedule (schedule.h), receiving its
// inputs from the neighbouring stages and sending its outputs to them over the transport's
// pipeline channel. Sends are buffered (they never wait for the receiver), so a stage goes on
// to its next microbatch while the previous one is on the wire; it blocks only when an input it
// needs has not arrived, and that time is the stage's bubble.
//
// Per microbatch and boundary, forward: "activations" (b*T*d floats) and "tokens" (the b
// windows, b*(T+1) ids, from which the next stages take their targets); backward:
// "activation_grads" (b*T*d floats). All are counted in the worker's traffic.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/stats.h"
#include "comm/transport.h"
#include "pipeline/grid.h"
#include "pipeline/schedule.h"

namespace loco {

// What crosses a stage boundary forward for one microbatch.
struct BoundaryMessage {
  std::vector<float> activations;  // (b, T, d) residual stream
  std::vector<int32_t> tokens;     // b windows of T + 1 ids: inputs are [0, T), targets [1, T]
};

// What a stage computes; the executor moves the data.
class StageCompute {
 public:
  virtual ~StageCompute() = default;
  // `in`: what the previous stage sent (on the first stage: empty; the stage reads its own
  // data). `out`: what the next stage needs (ignored on the last stage).
  virtual void forward(int mb, const BoundaryMessage& in, BoundaryMessage& out) = 0;
  // `grad_out`: the gradient of this stage's output from the next stage (empty on the last
  // stage). `grad_in`: the gradient of this stage's input (ignored on the first stage).
  virtual void backward(int mb, const std::vector<float>& grad_out, std::vector<float>& grad_in) = 0;
};

// World ranks of a stage's neighbours for each microbatch of a step.
struct Route {
  std::function<int(int mb)> prev, next;
};
// The grid's fixed pipelines: replica r's stages talk to replica r's neighbouring stages.
Route fixed_route(const Grid& grid, int rank);
// NoLoCo's random paths: at boundary b (stage b -> b + 1), microbatch mb of step *step, replica r
// of stage b sends to replica perm[r] of stage b + 1, perm = route_permutation(R, seed, *step,
// mb, b) (algo/noloco.h); the backward returns along the same path. Each boundary is a
// permutation, so every worker handles exactly one microbatch per slot.
Route random_route(const Grid& grid, int rank, uint64_t seed, const int64_t* step);
// The permutation of boundary b for microbatch mb of step `step`, drawn from (seed, step, mb, b).
std::vector<int> route_permutation(int R, uint64_t seed, int64_t step, int mb, int boundary);

class PipelineExecutor {
 public:
  PipelineExecutor(std::shared_ptr<Transport> transport, Grid grid, int rank, double timeout_s,
                   std::shared_ptr<TrafficStats> traffic, std::shared_ptr<TraceRecorder> trace);

  // Runs `ops` (this stage's schedule for one step).
  void run(const std::vector<PipeOp>& ops, StageCompute& compute, const Route& route);

  // Sends one forward message to `peer` / receives one from `peer`; evaluation counts its
  // traffic under "eval" instead of "activations" and "tokens".
  void send_forward(int peer, const BoundaryMessage& msg, bool evaluation = false);
  void recv_forward(int peer, BoundaryMessage& msg, int mb, bool evaluation = false);

  // Totals over every run: time in forward/backward passes, and time blocked waiting for a
  // neighbour (the bubble, including the link's transfer time of what was awaited).
  double compute_seconds() const { return compute_s_; }
  double backward_seconds() const { return backward_s_; }
  double bubble_seconds() const { return bubble_s_; }
  int64_t steps() const { return steps_; }
  const Grid& grid() const { return grid_; }
  int stage() const { return stage_; }

 private:
  std::string recv_from(int peer, const char* what, int mb);
  std::shared_ptr<Transport> transport_;
  Grid grid_;
  int rank_, stage_;
  double timeout_s_;
  std::shared_ptr<TrafficStats> traffic_;
  std::shared_ptr<TraceRecorder> trace_;
  double compute_s_ = 0, backward_s_ = 0, bubble_s_ = 0;
  int64_t steps_ = 0;
  BoundaryMessage in_, out_;
  std::vector<float> grad_out_, grad_in_;
};

}  // namespace loco
