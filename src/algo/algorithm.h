#pragma once
// A training method as hooks around the inner step of every worker:
//   forward/backward -> on_gradients -> clip + AdamW step -> after_step
// The loop (trainer.cpp) owns the data, the model and the inner optimizer; an algorithm only
// decides what crosses the network and how parameters are combined.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "algo/worker.h"
#include "io/train_state.h"

namespace loco {

class SyncGroup;
struct Fault;

// What one step's hooks use of a worker's buffers: on_gradients (w.step = done - 1) and
// after_step(w, done, last). A caller whose parameters live elsewhere (loco.torch's CUDA models)
// copies exactly these to the host before the hooks and back after them, and nothing on the
// steps that use nothing. Outside the ranges read, w.params may hold stale values.
struct StepAccess {
  bool gradients = true;      // on_gradients reads and writes w.grads
  std::vector<Range> reads;   // after_step reads these ranges of w.params
  std::vector<Range> writes;  // ... and writes these (sorted, merged)
  static StepAccess everything(int64_t n) { return {true, {{0, n}}, {{0, n}}}; }
  static StepAccess nothing() { return {false, {}, {}}; }
};

// loco.torch's outer_device (docs/python.md, "Where the outer state lives"): the outer
// parameters and momentum live with the caller, as tensors on its model's device, and the
// caller computes the outer gradients' encoding and the outer step there; the method keeps its
// schedule and its communication. A fragment's sync then reads of w.params only what fp32
// averaging sends (nothing with one replica), takes a codec's encoded outer gradient from the
// caller (provide_outer, before the step's after_step), and hands the caller each completed sync
// to apply (take_outer_results, after it) instead of writing w.params.
struct OuterResult {
  size_t fragment = 0;
  bool take = false;        // DiLoCo after its data-parallel steps: the outer parameters := the replica's
  bool replace = false;     // the run's last step: the synchronized values replace the replica's
  bool own = false;         // one replica in fp32: the average is the replica's own parameters
  std::vector<float> avg;   // fp32 (or a sync restored from a checkpoint): the average parameters, packed
  bool in_params = false;   // fp32 DiLoCo with others: the average is in w.params instead (no copy of the model)
  std::vector<std::string> payloads;  // a codec: every replica's encoded outer gradient, in rank order,
  bool reduce_scatter = false;        // or (reduce-scatter) every shard's reduced mean
};
// Where a caller that merges elsewhere (Algorithm::mix_merges_elsewhere) wants a fragment's
// synchronized values written: n floats, packed as the fragment's segments.
struct SyncedBuffer {
  float* data;
  int64_t n;
};
// The fragments of a method whose outer state the caller holds: their ranges of the flat
// buffer, packed in order, and which entries merge with alpha (trained) or are replaced.
struct OuterSegment {
  int64_t begin, end, packed;
  bool trained;
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  // Once before the first step, after parameters are initialized or restored.
  virtual void start(Worker& w, bool resumed) {}
  // After backward, before clipping and the optimizer step (DDP averages gradients here).
  virtual void on_gradients(Worker& w) {}
  // After the optimizer step; `done` steps are complete, `last` is the final step.
  virtual void after_step(Worker& w, int64_t done, bool last) {}
  // What on_gradients and after_step(w, done, last) will use, asked before them (the default,
  // for a method that does not say: everything).
  virtual StepAccess access(const Worker& w, int64_t done, bool last) const {
    return StepAccess::everything(int64_t(w.params.size()));
  }
  // Asked with access(w, done, last), before after_step(w, done, last): the first later step
  // whose access may use anything (the steps between use nothing, whatever the hooks do). A caller
  // may run after_step(done) and the hooks of those steps in the background meanwhile.
  virtual int64_t quiet_until(const Worker& w, int64_t done, bool last) const { return done + 1; }
  // A step in two parts, for a caller that overlaps a sync's start with training (loco.torch on a
  // device): merge_step(w, done, last) applies the syncs due at `done` (merge_access says what it
  // uses), then after_step(w, done, last) does the rest (access() asked after merge_step says what:
  // the syncs starting). A method that does not split its steps does nothing in merge_step.
  virtual StepAccess merge_access(const Worker& w, int64_t done, bool last) const { return StepAccess::nothing(); }
  virtual void merge_step(Worker& w, int64_t done, bool last) {}
  // The work of the syncs in flight that uses nothing of the worker's buffers (waiting for their
  // communication, decoding, their outer step), done ahead of their merge by a caller with a
  // thread to spare (loco.torch's background thread, while the loop runs the steps before it);
  // the merge then only applies it. Doing it or not leaves every result the same. `synced`: for
  // a caller that merges elsewhere, buffers for some of the fragments merges_ahead() names, into
  // which each one's synchronized values are written (with the outer step, in its pass where it
  // can), for the caller to merge from; empty otherwise.
  virtual void prepare_merges(const std::map<size_t, SyncedBuffer>& synced) {}
  // The fragments whose syncs in flight prepare_merges would prepare and peek_outer_results has
  // not yet named, for a caller that merges elsewhere (none otherwise).
  virtual std::vector<size_t> merges_ahead() const { return {}; }
  // A caller whose parameters live elsewhere (loco.torch on a device) may merge there: after
  // mix_merges_elsewhere() returns true, merge_access reads nothing and merge_step writes nothing
  // into w.params; before each merge_step the caller takes every sync it merges with
  // prepare_merges given a buffer for each of merges_ahead()'s fragments, then
  // peek_outer_results, and merges each fragment from its buffer: local = alpha * local + (1 -
  // alpha) * synced over the segments trained, in float32 with one rounding per operation,
  // synced over the others. A merge of a sync not so taken is an internal error. False: the
  // method has no such merges.
  virtual bool mix_merges_elsewhere() { return false; }
  // False: on_gradients never reads w.grads in this run (the caller need not provide them).
  virtual bool uses_gradients(const Worker& w) const { return true; }
  // Parameters to evaluate and to save as the model, identical on every worker. Called by all
  // workers at the same step (it may communicate).
  virtual const std::vector<float>& eval_params(Worker& w) { return w.params; }
  // What eval_params(w) holds after `step` steps, when a reader needs to be told (e.g. outer
  // parameters whose fragments were synchronized at different steps); "" otherwise.
  virtual std::string eval_note(int64_t step) const { return ""; }
  // Terms of the spread between replicas (docs/noloco.md), for algorithms whose replicas differ:
  // {sum over this worker's parameters of (p_r - mean over replicas)^2, parameter count};
  // summed over all workers, spread = sqrt(first / second). Called by every worker at each
  // evaluation (it may communicate); empty: replicas are identical.
  virtual std::vector<double> spread_terms(Worker& w) { return {}; }
  // The step to continue from after `done` steps: `done`, except for an elastic member that
  // (re)joined the run and continues from the run's current step.
  virtual int64_t continue_from(int64_t done) { return done; }
  // Seconds this worker spent blocked on peers or a coordinator outside the run's communicators
  // (elastic rounds), counted as communication wait, not compute.
  virtual double wait_seconds() const { return 0; }
  // False: this worker writes no checkpoint at the checkpoint interval or the end (elastic: only
  // the first member of the current round's members writes the model).
  virtual bool writes_checkpoints() const { return true; }
  // Extra fields for the metrics record being written (elastic: membership and rounds).
  virtual void annotate(nlohmann::json& rec) {}
  // Algorithm-specific accounting for the run summary.
  virtual void report(nlohmann::json& out) const {}
  // Held outer state (OuterResult above): "" when the method can leave its outer state to the
  // caller in this run, else why not; hold_outer_elsewhere() then switches it, before start().
  virtual std::string outer_elsewhere_refusal() const { return "this method keeps its outer state on the host"; }
  virtual void hold_outer_elsewhere() {}
  virtual std::vector<std::vector<OuterSegment>> outer_segments() const { return {}; }
  // The fragments whose sync starts after step `done` (asked with access()); with a codec the
  // caller provides each one's encoded outer gradient: one payload, or one per replica's shard
  // (outer_shards()) with reduce-scatter. (DiLoCo's rounds need nothing from the caller first.)
  virtual std::vector<size_t> outer_starts(const Worker& w, int64_t done, bool last) const { return {}; }
  virtual int outer_shards(const Worker& w) const { return 1; }
  virtual void provide_outer(size_t fragment, std::vector<std::string> payloads) {}
  virtual std::vector<OuterResult> take_outer_results() { return {}; }
  // Ahead of their merge (after prepare_merges, on the caller's background thread): the syncs
  // completed and not yet merged, each once, with a copy of what take_outer_results will hand
  // over for them (a codec's payloads, or fp32's average), so that the caller can decode them and
  // bring them to its device while its training loop goes on. take_outer_results still hands
  // each one over at its merge. A caller that merges elsewhere (mix_merges_elsewhere) is named
  // each sync once its outer step is taken (the fragment only; its synchronized values are in the
  // buffer prepare_merges was given for it), and merges the fragment from them.
  virtual std::vector<OuterResult> peek_outer_results() { return {}; }
  // The caller's norms of the last round (DiLoCo's outer_delta_norm, replica_delta_norm).
  virtual void set_outer_norms(double outer, double replica) {}
  // This worker's algorithm state for checkpoints (called by every worker at the same step; it
  // may finish communication in flight, without changing the result).
  virtual void save_state(TrainingState& st) {}
  virtual void load_state(const TrainingState& st) {}
};

std::unique_ptr<Algorithm> make_algorithm(const RunConfig& cfg, const Worker& w);
// What the method of cfg cannot do when its members come and go (an elastic run), "" when it
// can run cfg so; each method says it for itself (the *_elastic_refusal below).
std::string elastic_refusal(const RunConfig& cfg);
std::string diloco_elastic_refusal(const RunConfig& cfg);
std::string streaming_elastic_refusal(const RunConfig& cfg);
std::string noloco_elastic_refusal(const RunConfig& cfg);

// Data-parallel baseline: gradients averaged with an all-reduce every step.
std::unique_ptr<Algorithm> make_ddp();
// DiLoCo: every H inner steps, outer gradients averaged and a Nesterov outer step; among every
// replica (the first form: outer.fault on the last outer.faulty_replicas), or among the members
// of `group` (algo/sync_group.h), this one misbehaving as `fault` says (comm/fault.h).
std::unique_ptr<Algorithm> make_diloco(const RunConfig& cfg, const Worker& w);
std::unique_ptr<Algorithm> make_diloco(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group,
                                       const Fault& fault);
// Streaming DiLoCo: fragments synchronized at staggered offsets, overlapped, optionally quantized;
// among every replica or among the members of `group`.
std::unique_ptr<Algorithm> make_streaming(const RunConfig& cfg, const Worker& w);
std::unique_ptr<Algorithm> make_streaming(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group,
                                          const Fault& fault);
// NoLoCo: every H inner steps, a heavy-ball outer step within a random group (algo/noloco.h), among
// every replica or among the members of `group`.
std::unique_ptr<Algorithm> make_noloco(const RunConfig& cfg, const Worker& w);
std::unique_ptr<Algorithm> make_noloco(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group);

// The outer optimizer (SGD with momentum, PyTorch convention) given the average of the
// replicas' parameters: delta = theta - avg (the averaged outer gradient, old minus new);
// v = mu v + delta; theta -= lr d with d = delta + mu v (Nesterov) or v. Written as
// theta = avg + (delta - lr d), which is the same update and exactly avg for lr = 1, mu = 0
// (so DiLoCo with one replica and plain averaging reproduces ordinary training bit for bit).
void outer_sgd_step(float* theta, float* momentum, const float* avg, int64_t n, const OuterConfig& outer);
// The step of one entry (a loop that computes its average in the same pass). The files that
// call it are compiled without fused multiply-adds, as the outer step's bits require.
inline void outer_sgd_entry(float& theta, float& momentum, float avg, float mu, float lr, bool nesterov) {
  const float delta = theta - avg;
  const float v = mu * momentum + delta;
  momentum = v;
  const float d = nesterov ? delta + mu * v : v;
  theta = avg + (delta - lr * d);
}
// The same step for entries [begin, end) on the calling thread (a caller that splits the work).
void outer_sgd_step_range(float* theta, float* momentum, const float* avg, int64_t begin, int64_t end,
                          const OuterConfig& outer);

// For evaluating replicas that differ: replaces every replica's `params` by the replicas'
// average (`how` = "average": one all-reduce) or by replica 0's ("replica0": a broadcast), so
// that every worker holds the same parameters. Traffic "eval"; every replica calls it.
void share_for_eval(Communicator& comm, std::vector<float>& params, const std::string& how);

}  // namespace loco
