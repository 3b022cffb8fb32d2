#pragma once
// What every elastic method shares (distributed.backend = "elastic"): joining the run, rounds
// among the live members of the moment, the state a joiner receives, data under churn and the
// accounting. A method supplies the round's reduction and what it applies when the round
// commits; the session runs the attempts: a roster from the membership (elastic/membership.h),
// a secure transport among the round's contributors (elastic/secure_transport.h), the method's
// reduction on a communicator over it, the commit/abort vote, and the redo among the survivors
// when an attempt fails. The first contributor then sends each joiner the outer state, its own
// inner optimizer state (AdamW's; for a model loco does not hold, the caller's bytes:
// ForeignWorker in membership.h), the step and where the joiner's data starts (JoinState,
// CRC-32C), over a transport of its own. After each committed round the next round's members (contributors and
// joiners) take disjoint rows of the data permutation, continuing where this round's stopped
// (DataLoader::assign), so with a fixed membership the data equal the in-process run's.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "algo/algorithm.h"
#include "algo/worker.h"
#include "comm/stats.h"
#include "algo/sync_group.h"
#include "elastic/join_state.h"
#include "elastic/membership.h"

namespace loco {

// The elastic backend's SyncGroup (algo/sync_group.h): each round among the live members of its
// moment.
class ElasticSession : public SyncGroup {
 public:
  // Attempts of one round before the run gives up (each is bounded by the timeouts; a member
  // blamed for elastic.exclude_after of them in a row is excluded well before).
  static constexpr int64_t kMaxAttempts = 20;

  ElasticSession(const RunConfig& cfg, const ElasticOptions& options, std::shared_ptr<TrafficStats> traffic,
                 std::shared_ptr<TraceRecorder> trace, size_t num_params);

  // Registers as a member, before the method is made: with partial updates the worker then
  // trains slice (id - 1) mod partial.slices of its first id, for the whole of its life (a
  // rejoin keeps it, and so does a worker resumed from its checkpoint: ElasticOptions::slice;
  // in a run whose members all start together, member k of the start trains slice k mod N, as
  // replica k of an in-process run).
  void register_worker(Worker& w);
  // A worker that starts with the run gets its data slot, one that comes later (or is resumed)
  // joins and installs the state it receives (the outer state into the method, the AdamW state
  // or the caller's inner optimizer state into the worker, with partial updates that of a member
  // training its slice; the session then sets the data and the step to continue from).
  void start(Worker& w, bool resumed, const Install& install) override;
  // Runs the round's attempts until one commits (true). If this worker was dropped it rejoins
  // instead (as a new member, installing the state it receives; false).
  bool run_round(Worker& w, const Round& round, const Install& install) override;
  // After the last step's rounds: joiners still waiting give up.
  void finish_run() override;
  bool members_change() const override { return true; }

  // True while this worker is the first (lowest id) of the current round's members: it writes
  // the model checkpoints; the others write none.
  bool first_member() const { return !epoch_.empty() && epoch_.front() == membership_.id(); }
  bool writes_checkpoints() const override { return first_member(); }
  // How many screening histories the method's state holds (JoinState::norm_history; a joiner
  // refuses a state with another count).
  void set_norm_histories(size_t count) override { norm_histories_ = count; }
  void count_step() override { ++steps_trained_; }
  double wait_seconds() const override { return wait_s_; }
  int64_t continue_from(int64_t done) override;
  void annotate(nlohmann::json& rec) override;
  void report(nlohmann::json& out) const override;
  // Time the method spends computing inside a round (outer steps), not counted as waiting.
  void add_compute(double seconds) override { round_compute_s_ += seconds; }

 private:
  std::unique_ptr<Transport> connect(const std::string& name, int rank, int size);
  CommOptions comm_options() const;
  void note_abort(const Roster& roster, const std::string& error, const std::vector<int64_t>& blamed);
  void rejoin(Worker& w, const std::string& why, const Install& install);
  // Waits to be taken in (Membership::wait_for_join_roster); with can_restart (restored from a
  // checkpoint), restarts the run from it when no member is live.
  void join(Worker& w, const std::string& why, const Install& install, bool can_restart = false);
  void assign_data(Worker& w, const DataLoader::Position& at);
  // A foreign model's starting members take the first one's parameters (ForeignWorker).
  void equalize_start(Worker& w, const Roster& r, const Install& install);
  // Partial updates, a round with joiners, after its reduction: the contributors learn each
  // other's slices, and the first trainer of each slice sends its inner optimizer state to
  // rank 0, which returns them by slice (empty where nobody trains it; elsewhere, nothing).
  // `inbox` (one entry per contributor) outlives the communicator, which writes into it.
  std::vector<std::string> slice_states(Worker& w, Communicator& comm, int me, int C, std::vector<std::string>& inbox);
  // This worker's inner optimizer state as bytes (loco's AdamW: steps, m, v; else the caller's).
  std::string inner_state(Worker& w);
  // The state sent to a joiner that trains `slice` (partial updates; -1 without): the optimizer
  // state of that slice's trainer among the contributors, or none.
  void set_optimizer_state(Worker& w, JoinState& s, int slice, const std::vector<std::string>& by_slice);

  const RunConfig& cfg_;
  Membership membership_;
  std::shared_ptr<TrafficStats> traffic_;
  std::shared_ptr<TraceRecorder> trace_;
  size_t num_params_;
  size_t norm_histories_ = 0;
  std::vector<int64_t> epoch_;  // this round's members (ids ascending); data slot = index
  std::vector<int64_t> ids_;    // every id this worker has held
  int64_t last_round_step_ = 0, jump_to_ = -1, steps_trained_ = 0, aborted_ = 0;
  int64_t slice_state_crc_ = -1;  // partial updates: the optimizer state this member handed over in the attempt
  bool missed_end_ = false;
  double wait_s_ = 0, round_compute_s_ = 0;
  nlohmann::json rounds_ = nlohmann::json::array(), pending_rounds_ = nlohmann::json::array();
  std::vector<nlohmann::json> events_;
};

}  // namespace loco
