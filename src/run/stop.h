#pragma once
// Where the workers of a run stop when SIGTERM or SIGINT asks them to (core/stop_signal.h): all
// after the same step, so that the checkpoint they write is one consistent state.
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

namespace loco {

// The workers that share a process (in-process runs; an elastic or MPI process has one).
class StopAgreement {
 public:
  // Called by worker `index` after each step: whether it stops after step `done`. The first
  // worker to see the signal fixes the step to stop after: the latest one any worker is committed
  // to (its own `done`; for the others, the step after the one they last reported, since they
  // were told to go on). None goes past it, and each stops when it gets there.
  bool stop_after(int index, int64_t done, bool signalled);

 private:
  std::mutex mu_;
  std::vector<int64_t> done_;  // the latest step each worker finished
  int64_t stop_at_ = std::numeric_limits<int64_t>::max();
};

}  // namespace loco
