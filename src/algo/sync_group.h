#pragma once
// Who takes part in a method's outer synchronizations, and how each one completes: the one
// interface through which a method runs its rounds, whatever the membership (docs/architecture.md).
//
// A method describes a round (Round): the reduction among the round's members over a
// communicator, the outer state a joiner would start from once the reduction is in, and what it
// applies when the round commits. The group runs it:
//   - FixedGroup (in-process and MPI runs): every worker in every round, over its own
//     communicator; the reduction, then the commit, once.
//   - the elastic session (elastic/session.h): the live members of the moment, with Redis and the
//     secure transport; an attempt that fails is redone among the survivors (the reduction again,
//     from scratch: it must compute into the method's temporaries), the commit runs once the
//     members voted it in, and a worker dropped in between is taken in again instead, installing
//     the run's outer state (Install) and continuing from the run's step (continue_from).
// The method keeps its outer state across rounds; the group never looks inside it.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "algo/robust.h"
#include "algo/worker.h"
#include "comm/communicator.h"

namespace loco {

// A method's outer state as a joiner receives it.
struct OuterState {
  std::vector<float> theta, momentum;     // outer parameters and momentum (NoLoCo: slow weights and delta)
  std::vector<NormHistory> norm_history;  // screening's history, one per sync (algo/robust.h)
};

class SyncGroup {
 public:
  struct Round {
    int64_t id = 0;            // unique and increasing over the run
    int64_t step = 0;          // inner steps done
    bool take_joiners = true;  // false for the rounds of the last step
    // The reduction among the round's members: this worker is `rank` of `size` on `comm`.
    std::function<void(Communicator& comm, int rank, int size)> reduce;
    // The outer state a joiner starts from once this round's reduction is in (asked of one member).
    std::function<void(OuterState& s)> outer_state;
    // Applies the round's result, once, after the round committed.
    std::function<void()> commit;
    // The CRC-32C of the outer parameters after the commit (what a joiner starts from; logged by
    // groups that log their rounds).
    std::function<uint32_t()> checksum;
  };
  // Installs a joiner's outer state into the method (its parameters included).
  using Install = std::function<void(Worker& w, OuterState& s)>;

  virtual ~SyncGroup() = default;
  // Before the first step (after the method set its outer state up): a worker that comes late,
  // or is resumed into a running group, is taken in and installs the run's outer state.
  virtual void start(Worker& w, bool resumed, const Install& install) {}
  // Runs the round until it commits (true). False: this worker was dropped and taken in again
  // instead, having installed the run's outer state; the round's result is not applied.
  virtual bool run_round(Worker& w, const Round& round, const Install& install) = 0;
  // After the last step's rounds.
  virtual void finish_run() {}
  // Called once per inner step trained.
  virtual void count_step() {}
  // Time the method spent computing inside a round (not waiting on the others).
  virtual void add_compute(double seconds) {}
  // Whether members come and go: a round may then replace the whole model (Install).
  virtual bool members_change() const { return false; }
  // How many screening histories the method's outer state holds (OuterState::norm_history; a
  // group that receives states from peers refuses one with another count).
  virtual void set_norm_histories(size_t count) {}
  // The Algorithm hooks the group answers (algo/algorithm.h).
  virtual double wait_seconds() const { return 0; }
  virtual bool writes_checkpoints() const { return true; }
  virtual int64_t continue_from(int64_t done) { return done; }
  virtual void annotate(nlohmann::json& rec) {}
  virtual void report(nlohmann::json& out) const {}
};

// Every worker of an in-process or MPI run, in every round.
class FixedGroup : public SyncGroup {
 public:
  bool run_round(Worker& w, const Round& round, const Install&) override {
    round.reduce(w.comm, w.rank, w.replicas);
    round.commit();
    return true;
  }
};

}  // namespace loco
