#pragma once
// Microbatch schedules of one pipeline step: the order in which stage s of S runs the forward
// (F) and backward (B) passes of microbatches 0..m-1. Both schedules run the backward passes in
// microbatch order, so every stage accumulates its gradients in the order one worker
// accumulating the same micro-batches would.
//
//   GPipe, S = 3, m = 4           1F1B, S = 3, m = 4
//   s0: F0 F1 F2 F3 B0 B1 B2 B3   s0: F0 F1 F2 B0 F3 B1 B2 B3
//   s1: F0 F1 F2 F3 B0 B1 B2 B3   s1: F0 F1 B0 F2 B1 F3 B2 B3
//   s2: F0 F1 F2 F3 B0 B1 B2 B3   s2: F0 B0 F1 B1 F2 B2 F3 B3
//
// 1F1B (one forward, one backward) starts S-1-s forwards early, then alternates, so stage s
// holds the activations of at most S - s microbatches; GPipe holds all m. With equal stage times
// both leave each stage idle for (S-1)/(m+S-1) of the step (the bubble).
#include <string>
#include <vector>

namespace loco {

enum class ScheduleKind { OneFOneB, GPipe };
ScheduleKind parse_schedule(const std::string& name);  // "1f1b" or "gpipe"

struct PipeOp {
  enum Kind { Forward, Backward } kind;
  int microbatch;
  bool operator==(const PipeOp&) const = default;
};

std::vector<PipeOp> stage_schedule(ScheduleKind kind, int stages, int stage, int microbatches);

// Most microbatches whose activations are held at once (forward done, backward not yet).
int max_in_flight(const std::vector<PipeOp>& ops);

// "F0 F1 B0 ..." for messages and tests.
std::string describe(const std::vector<PipeOp>& ops);

}  // namespace loco
