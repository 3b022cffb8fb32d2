#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace loco {

double LrSchedule::at(int64_t completed) const {
  if (warmup_steps > 0 && completed < warmup_steps) return peak_lr * double(completed + 1) / double(warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::clamp(double(completed - warmup_steps) / double(decay_steps), 0.0, 1.0);
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace loco
