#pragma once
// Fragment schedule of Streaming DiLoCo (docs/streaming.md).
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "algo/algorithm.h"
#include "comm/fault.h"
#include "algo/outer_store.h"
#include "algo/partial.h"
#include "algo/robust.h"
#include "algo/sync_group.h"
#include "comm/codec.h"

namespace loco {

struct FragmentPlan {
  std::vector<int> blocks;  // transformer blocks in the fragment
  bool nonblock = false;    // holds the parameters outside the blocks (embeddings, final norm, head)
  int64_t offset = 0;       // syncs at offset + k H, k >= 1
};

// P = ceil(L / |p|) block fragments, sequential ([j|p|, (j+1)|p|)) or strided ({l : l mod P = j}),
// then one fragment for the non-block parameters; F = P + 1 fragments with offsets j floor(H / F).
// fragment_blocks = 0: a single fragment with the whole model (offset 0), i.e. DiLoCo.
std::vector<FragmentPlan> plan_fragments(int num_layers, int fragment_blocks, const std::string& pattern,
                                         int64_t inner_steps);

// True if a fragment with this offset synchronizes after inner step `step` (1-based count).
bool syncs_at(const FragmentPlan& f, int64_t step, int64_t inner_steps);
// The step at which the fragment's latest sync started, at or before `step` (-1: none yet).
int64_t last_sync_start(const FragmentPlan& f, int64_t step, int64_t inner_steps);

// Per-replica tau from streaming.tau and streaming.worker_tau ("1,1,3,3").
int64_t worker_tau(int64_t tau, const std::string& list, int rank, int replicas);

// Streaming DiLoCo as an algorithm (streaming.cpp explains the method), among the members of
// `group` (algo/sync_group.h): every replica (FixedGroup), or the live members of each sync's
// moment (the elastic session); this member misbehaves as `fault` says (comm/fault.h).
class Streaming : public Algorithm {
 public:
  Streaming(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group, const Fault& fault);

  void start(Worker& w, bool resumed) override;
  void after_step(Worker& w, int64_t done, bool last) override;
  StepAccess access(const Worker& w, int64_t done, bool last) const override;
  StepAccess merge_access(const Worker& w, int64_t done, bool last) const override;
  void merge_step(Worker& w, int64_t done, bool last) override;
  void prepare_merges(const std::map<size_t, SyncedBuffer>& synced) override;
  std::vector<size_t> merges_ahead() const override;
  bool mix_merges_elsewhere() override;
  int64_t quiet_until(const Worker& w, int64_t done, bool last) const override;
  bool uses_gradients(const Worker&) const override { return false; }
  const std::vector<float>& eval_params(Worker& w) override;
  std::string eval_note(int64_t step) const override;
  void save_state(TrainingState& st) override;
  void load_state(const TrainingState& st) override;
  void report(nlohmann::json& out) const override;
  void annotate(nlohmann::json& rec) override;
  int64_t continue_from(int64_t done) override { return group_->continue_from(done); }
  double wait_seconds() const override { return group_->wait_seconds(); }
  bool writes_checkpoints() const override { return group_->writes_checkpoints(); }
  std::string outer_elsewhere_refusal() const override;
  void hold_outer_elsewhere() override;
  std::vector<std::vector<OuterSegment>> outer_segments() const override;
  std::vector<size_t> outer_starts(const Worker& w, int64_t done, bool last) const override;
  int outer_shards(const Worker& w) const override;
  void provide_outer(size_t fragment, std::vector<std::string> payloads) override;
  std::vector<OuterResult> take_outer_results() override;
  std::vector<OuterResult> peek_outer_results() override;

 private:
  struct Segment {
    int64_t begin, end, packed;  // params[begin, end) is packed[packed, ...)
    bool trained;                // merged with alpha; else replaced
  };
  struct Pending {
    size_t fragment = 0;
    int64_t apply_at = 0;
    EncodedReduce reduce = EncodedReduce::AllGather;  // codecs: how the payloads were combined
    Communicator::Handle handle;
    CountVectorAverage::Op op;           // fp32: the replicas' parameters, averaged per entry
    std::vector<float> buffer;           // a fault or a robust rule: this replica's parameters (or delta), packed
    std::vector<std::string> gathered;   // codecs: every replica's encoded delta (or reduced shard)
    std::vector<float> avg;              // the replicas' average parameters, once completed
    std::vector<float> theta, momentum;  // the fragment's outer state, packed
    // theta and momentum not read: the store's values are read in place (they do not change
    // before the sync's merge) until the outer step writes the new ones into theta and momentum
    // (begin_sync with a codec, an in-memory store and nothing else to do with them first), or,
    // taken at the merge itself, into the store (stepped then too).
    bool in_store = false;
    bool completed = false;
    bool stepped = false;                // theta and momentum hold the outer step (prepare_merges)
    // A codec's completion that took the outer step kept no average (avg empty): a checkpoint
    // computes it from the payloads kept in `gathered` (stepped_average).
    bool avg_from_payloads = false;
    bool own = false;                    // held outer state, fp32, one replica: the caller's own parameters
    bool peeked = false;                 // handed to the caller ahead of its merge (peek_outer_results)
    // Within prepare_merges: the caller's buffer for the new outer parameters, until they are
    // written there (nullptr: none, or written).
    float* synced_out = nullptr;
    // Screening or a robust rule (outer.screen, outer.aggregate): the screened mean's verdict
    // (known when the all-reduce starts), or every member's encoded delta in `gathered`.
    bool robust = false;
    Screening screening;
  };

  // How complete() may take the outer step in the pass that computes the average (a codec's):
  // not at all; into p.theta and p.momentum (ahead of the merge, or at it); or, at a merge that
  // writes the outer state to the store at once, in the store itself. p.stepped then, and
  // step_outer after it does nothing.
  enum class Step { none, ahead, in_place };
  // Buffers of finished syncs kept for the next ones (a large fragment's buffers, made anew
  // for every sync, cost the kernel a page fault per 4 KiB each time): a vector of n values
  // (its contents undefined), and one given back (left empty).
  std::vector<float> take_spare(int64_t n);
  void give_spare(std::vector<float>& v);
  std::vector<std::vector<float>> spare_;
  // The outer step of a completed sync into p.theta and p.momentum, once.
  void step_outer(Pending& p);
  // p.theta and p.momentum read from the store if they were left there (Pending::in_store).
  void read_outer_state(Pending& p);
  // complete's codec path: the payloads decoded and summed, then the average (Step::none) or
  // the outer step from it as `step` says.
  void complete_encoded(Pending& p, Step step);
  // The average of a sync completed with the outer step (Pending::avg_from_payloads), as
  // complete_encoded gives it without the step, for a checkpoint.
  std::vector<float> stepped_average(const Pending& p);
  // Entries [b, b + len) of the packed fragment: avg = theta - d / M, d the slice's decoded sum,
  // or with `step` the outer step from there: in place (in the store, or in p.theta and
  // p.momentum), or into p.theta and p.momentum ahead of the merge (the store's left as it is).
  // On the calling thread.
  void average_packed(Pending& p, const float* d, int64_t b, int64_t len, Step step, float M) const;
  // What applying fragment j adds to a step's access (writes; reads merged with alpha).
  void add_applied(StepAccess& a, size_t j, bool replace) const;
  // Starts fragment j's sync after `step` (pushed onto pending_). A fixed world reduces over the
  // worker's communicator and returns at once; when members come and go the sync is a round,
  // completed within it; false when the worker was dropped and taken in again instead (nothing
  // pushed).
  bool sync_fragment(Worker& w, size_t j, int64_t step, bool last);
  // A joiner's (or a dropped member's) outer state into the method.
  SyncGroup::Install install();
  // Starts the reduction of fragment j among `replicas` workers on `comm` (this one is `rank`),
  // into `p` (placed in pending_ first: the communication thread writes into it).
  void begin_sync(Communicator& comm, int rank, int replicas, const std::vector<float>& params, size_t j,
                  int64_t step, Pending& p);
  // Waits for the reduction and computes the replicas' average parameters of the fragment.
  void complete(Communicator& comm, Pending& p, Step step = Step::none);
  // The outer parameters and momentum with the outer step of every sync pending (and of `extra`,
  // if given) taken: the state a worker joining now starts from. Installing such a state leaves
  // no sync pending.
  void latest_outer_state(std::vector<float>& theta, std::vector<float>& momentum, Pending* extra);
  void install_outer_state(const std::vector<float>& theta, const std::vector<float>& momentum);
  size_t fragments() const { return plan_.size(); }
  // The screening (outer.screen = auto is on in elastic runs) and this member's fault.
  void set_robustness(const AggregateOptions& aggregate, const Fault& fault, const std::string& noun);

  std::deque<Pending> pending_;
  // Screening's record of each fragment's accepted syncs (algo/robust.h), with screening on.
  std::vector<NormHistory> norm_history_;

  // Outer step on the fragment, then merge into (or, at the end of the run, replace) the
  // replica's parameters; entries this node does not train are always replaced.
  void apply(Worker& w, Pending& p, bool replace, bool merging = false);
  // Whether fragment j's sync starts after step `done` (due, or the last step's final one).
  bool starts_sync(size_t j, int64_t done, bool last) const;
  // begin_sync and complete with screening or a robust rule.
  // begin_sync's encoded paths: the payloads (one, or one per shard) all-gathered or reduce-scattered.
  void start_encoded(Communicator& comm, int rank, int replicas, std::vector<std::string> payloads, uint64_t stream,
                     Pending& p);
  // A codec's payloads decoded and averaged (the mean outer gradient of the fragment, packed),
  // into zeros; decode_sum leaves the division to the caller and returns the divisor (the
  // members' count for all-gathered payloads, 1 for reduce-scattered shards, each a mean).
  void decode_mean(const Pending& p, std::vector<float>& delta) const;
  float decode_sum(const Pending& p, std::vector<float>& delta) const;
  // begin_sync with the outer state held by the caller.
  void begin_held_sync(Communicator& comm, int rank, int replicas, const std::vector<float>& params, uint64_t stream,
                       Pending& p);
  void begin_robust_sync(Communicator& comm, const std::vector<float>& params, uint64_t stream, uint64_t fault_seed,
                         Pending& p);
  void complete_robust(Communicator& comm, Pending& p);
  // The wreck and history rules' bounds for p's sync (none without screening).
  ScreenBounds bounds(const Pending& p) const;

  StreamingConfig cfg_;
  OuterConfig outer_;
  std::vector<FragmentPlan> plan_;
  std::vector<std::vector<Range>> ranges_;
  std::vector<std::vector<Segment>> segments_;
  std::unique_ptr<Codec> codec_;
  std::string reduce_setting_;
  EncodedReduce last_reduce_;  // of the latest sync (with the elastic backend the group varies)
  int64_t tau_, max_tau_ = 0;
  uint64_t seed_;
  int64_t run_steps_;
  // The outer state, made at its first use (store()); never with the outer state held by the caller.
  OuterStore& store() const;
  // The store with every merged fragment's outer state written to it (all but report's uses).
  OuterStore& written_store();
  std::string scratch_dir_, scratch_;  // streaming.offload_outer's directory and file
  mutable std::unique_ptr<OuterStore> store_;
  std::vector<float> eval_buffer_;
  CountVectorAverage average_;
  Communicator& comm_;
  size_t num_params_;
  AggregateOptions aggregate_;
  Fault fault_;          // outer.fault (in-process and MPI) or elastic.fault
  bool robust_ = false;  // screening, or a rule other than the mean
  // The caller holds the outer state (algo/algorithm.h): the encoded outer gradients it provided
  // for the syncs about to start, and the completed syncs it takes.
  bool held_ = false;
  // The caller merges merge_step's merges from values it took ahead (mix_merges_elsewhere). Such
  // a caller (loco.torch on a device) runs sync starts and prepare_merges on a thread of its own,
  // so a merge leaves its fragment's outer state to be written to the store at the store's next
  // use (written_store()), which comes on that thread, instead of on the training loop's; an
  // in-memory store takes it by swapping buffers (OuterStore::exchange), without a copy.
  bool caller_mixes_ = false;
  struct Unwritten {
    size_t fragment;
    std::vector<float> theta, momentum;
  };
  std::vector<Unwritten> unwritten_;
  std::map<size_t, std::vector<std::string>> provided_;
  std::vector<OuterResult> results_;
  std::vector<float> faulty_params_;  // a faulty replica's parameters with its fragment corrupted (fp32)
  int rejected_ = -1;    // contributions left out of the last completed sync (-1: none yet)
  std::string noun_ = "replica";  // who contributes, in the rejection warnings
  std::unique_ptr<SyncGroup> group_;
  const bool elastic_;  // members come and go (group_->members_change()): each sync a round of its own
};

}  // namespace loco
