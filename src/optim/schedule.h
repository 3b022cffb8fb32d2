#pragma once
#include <cstdint>

namespace loco {

// Linear warmup from 0 to peak over `warmup_steps`, then cosine decay to min_lr at total_steps.
struct LrSchedule {
  double peak_lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 100;
  int64_t total_steps = 1000;
  // Learning rate of the step that follows `completed` finished steps (0-based).
  double at(int64_t completed) const;
};

}  // namespace loco
