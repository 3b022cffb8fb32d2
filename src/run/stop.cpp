#include "run/stop.h"

#include <algorithm>

namespace loco {

bool StopAgreement::stop_after(int index, int64_t done, bool signalled) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_.size() <= size_t(index)) done_.resize(size_t(index) + 1, 0);
  done_[size_t(index)] = done;
  if (signalled && stop_at_ == std::numeric_limits<int64_t>::max()) {
    // Every other worker has already been told to go on past the step it last reported.
    stop_at_ = done;
    for (size_t i = 0; i < done_.size(); ++i)
      if (i != size_t(index)) stop_at_ = std::max(stop_at_, done_[i] + 1);
  }
  return done >= stop_at_;
}

}  // namespace loco
