// DiLoCo (docs/diloco.md): replicas train independently with their own AdamW; every H inner
// steps the outer gradients Delta_m = theta - theta_m are averaged (the only communication),
// the outer parameters take a Nesterov step, and every replica restarts from them. The inner
// AdamW state is kept across rounds. The final step always ends a round, so the run's last
// inner steps count. Evaluation uses the outer parameters.
// With outer.start_step = S > 0 the first S steps are data-parallel (gradients averaged every
// step, as DDP), as the DiLoCo paper started from a pretrained model; the outer parameters are
// taken after step S and the rounds end at steps S + H, S + 2H, ...
// In fp32 the all-reduce carries the replicas' parameters theta_m: every worker knows theta,
// so this is the same information as Delta_m in the same bytes, and it keeps the outer step
// exact (see outer_sgd_step). With partial updates each entry is averaged over the replicas
// that train it (algo/partial.h).
// Each metrics record carries the last round's outer-gradient norm ||Delta|| and this replica's
// ||Delta_m|| (docs/metrics.md): their ratio says how much of a replica's move survives averaging
// (1: the replicas moved alike; about 1/sqrt(M): their moves were unrelated).
// Screening and robust aggregates (outer.screen, outer.aggregate): algo/robust.h; the rounds'
// rejections are counted in the metrics (outer_rejected) and said on stderr by replica 0. The
// metrics' outer_sync_s is the last round's time from the start of its reduction to the end of
// its outer step (link emulation included).
// With the outer state held by the caller (algo/algorithm.h, OuterResult) the round averages as
// always and hands the average to the caller, which takes the outer step and computes the norms.
// The rounds run through a SyncGroup (algo/sync_group.h): every replica in every round in
// in-process and MPI runs; the live members of the moment in elastic runs, where a round's
// reduction may be redone among the survivors (it writes only temporaries: the outer step is
// taken when the round commits), contributions are screened by default (outer.screen = auto),
// and a joiner receives the outer parameters and momentum with the round's outer step taken and
// the screening history. With a fixed membership both give the same bits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <utility>

#include "algo/algorithm.h"
#include "algo/diloco_config.h"
#include "algo/partial.h"
#include "algo/robust.h"
#include "algo/sync_group.h"
#include "comm/fault.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"

namespace loco {

namespace {

class Diloco : public Algorithm {
 public:
  Diloco(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group, const Fault& fault)
      : outer_(cfg.outer),
        start_step_(cfg.outer.start_step),
        n_(int64_t(w.params.size())),
        average_(count_vector_average(cfg, w, group->members_change())),
        whole_{{0, int64_t(w.params.size())}},
        group_(std::move(group)),
        elastic_(group_->members_change()),
        fault_(fault) {
    aggregate_ = aggregate_options(cfg.outer, elastic_ && cfg.partial.slices == 1);  // partial: see outer.screen
    robust_ = aggregate_.screen || aggregate_.rule != "mean" || fault_.kind != Fault::Kind::None;
    group_->set_norm_histories(1);
  }

  // The outer state is allocated here (or by load_state), not before: a caller that holds it
  // (hold_outer_elsewhere) never has it allocated on the host.
  void start(Worker& w, bool resumed) override {
    if (!held_ && !w.restored) {
      theta_ = copied_floats(w.params);
      momentum_ = zeroed_floats(size_t(n_));
    }
    group_->start(w, resumed, install());  // a joiner replaces them
  }

  std::string outer_elsewhere_refusal() const override {
    if (elastic_) return "an elastic run keeps the outer state on the host";
    if (robust_) return "outer.screen, outer.aggregate and outer.fault need the outer state on the host";
    return "";
  }
  void hold_outer_elsewhere() override { held_ = true; }
  std::vector<std::vector<OuterSegment>> outer_segments() const override {
    return {{{0, whole_[0].end, 0, false}}};  // one fragment, always replaced
  }
  void set_outer_norms(double outer, double replica) override { outer_norm_ = outer, replica_norm_ = replica; }
  std::vector<OuterResult> take_outer_results() override { return std::exchange(results_, {}); }

  void on_gradients(Worker& w) override {
    if (w.step < start_step_)
      w.comm.all_reduce(w.grads.data(), int64_t(w.grads.size()), ReduceOp::Mean, "gradients");
  }

  // Gradients in the data-parallel steps before outer.start_step; the whole model when a round
  // ends (and its outer parameters are taken, after step S).
  StepAccess access(const Worker& w, int64_t done, bool last) const override {
    StepAccess a = StepAccess::nothing();
    a.gradients = done - 1 < start_step_ && uses_gradients(w);
    if (done < start_step_ || (done > start_step_ && !round_ends(done, last))) return a;
    // With partial updates the count-vector average reads only the entries this replica trains;
    // the others equal the outer parameters since the last round (inner steps leave them).
    a.reads = trained_only(w, done) ? intersect_ranges(whole_, w.trainable.ranges()) : whole_;
    if (held_ && (w.replicas == 1 || done == start_step_)) a.reads.clear();  // the caller's own parameters
    if (held_ && done == start_step_) a.writes = whole_;  // the caller takes its outer parameters now
    if (done > start_step_) a.writes = whole_;
    return a;
  }
  bool uses_gradients(const Worker& w) const override { return start_step_ > 0 && w.replicas > 1; }
  // Whether the round ending at `done` reads only the trained entries (see access).
  bool trained_only(const Worker& w, int64_t done) const {
    return w.trainable.size() < int64_t(w.params.size()) && !robust_ && w.replicas > 1 && done > start_step_;
  }
  // After the data-parallel steps: whether step `done` ends a round (the last step always does).
  bool round_ends(int64_t done, bool last) const { return last || (done - start_step_) % outer_.inner_steps == 0; }

  void after_step(Worker& w, int64_t done, bool last) override {
    group_->count_step();
    if (done <= start_step_) {
      if (done == start_step_) {  // identical on every replica after data-parallel steps
        if (held_) {
          results_.push_back(OuterResult{});
          results_.back().take = true;
        } else {
          theta_ = w.params;
        }
      }
      return;
    }
    if (!round_ends(done, last)) return;
    sync_start_ = w.comm.clock().now();
    if (held_) {
      held_round(w);
      return;
    }
    SyncGroup::Round r;
    r.id = (done - start_step_ + outer_.inner_steps - 1) / outer_.inner_steps;
    r.step = round_done_ = done;
    r.take_joiners = !last;
    r.reduce = [&](Communicator& comm, int rank, int size) { reduce(w, comm, rank, size, r.id); };
    r.outer_state = [&](OuterState& s) {  // the outer step taken on copies
      s.theta = theta_;
      s.momentum = momentum_;
      outer_sgd_step(s.theta.data(), s.momentum.data(), average(w), n_, outer_);
      s.norm_history = {round_history_};
    };
    r.commit = [&] { commit(w); };
    r.checksum = [&] { return crc32c(theta_.data(), theta_.size() * sizeof(float)); };
    group_->run_round(w, r, install());
    if (last) group_->finish_run();
  }

  // Called after a step: w.step + 1 steps are done. Before the rounds, the replicas' (equal) parameters.
  // (Held by the caller: it evaluates its own outer parameters.)
  const std::vector<float>& eval_params(Worker& w) override {
    if (held_ && w.step + 1 >= start_step_) fail("internal: the caller holds DiLoCo's outer parameters");
    return w.step + 1 < start_step_ ? w.params : theta_;
  }
  int64_t continue_from(int64_t done) override { return group_->continue_from(done); }
  double wait_seconds() const override { return group_->wait_seconds(); }
  bool writes_checkpoints() const override { return group_->writes_checkpoints(); }
  void annotate(nlohmann::json& rec) override {
    group_->annotate(rec);
    if (outer_norm_ < 0) return;  // no round ended yet in this segment
    rec["outer_delta_norm"] = outer_norm_;
    rec["replica_delta_norm"] = replica_norm_;
    rec["outer_sync_s"] = sync_s_;
    if (robust_) rec["outer_rejected"] = rejected_;
  }
  void report(nlohmann::json& out) const override {
    out["outer_state_bytes"] = int64_t(theta_.size() + momentum_.size()) * 4;
    group_->report(out);
  }

  void save_state(TrainingState& st) override {
    if (held_) return;  // the caller saves its outer parameters and momentum under the same names
    st.tensors["outer.params"] = theta_;
    st.tensors["outer.momentum"] = momentum_;
    st.meta["outer.norm_history"] = norm_history_text({history_});
  }
  void load_state(const TrainingState& st) override {
    if (held_) {  // the caller loads the outer parameters and momentum
      st.taken_by_caller("outer.params");
      st.taken_by_caller("outer.momentum");
      return;
    }
    theta_.resize(size_t(n_));
    momentum_.resize(size_t(n_));
    st.take("outer.params", theta_);
    st.take("outer.momentum", momentum_);
    const auto it = st.meta.find("outer.norm_history");
    history_ = parse_norm_history(it == st.meta.end() ? "" : it->second, 1, "training state")[0];
  }

 private:
  // A round's reduction among `size` members (this one `rank`): the average of the accepted
  // contributions into avg_ (the screening's verdict into rejected_ and round_history_). Only
  // temporaries: the group may redo it.
  void reduce(Worker& w, Communicator& comm, int rank, int size, int64_t round) {
    const int64_t done = round_done_;
    round_size_ = size;
    round_history_ = history_;
    if (robust_) {
      const float* contribution = w.params.data();
      if (fault_.kind != Fault::Kind::None) {
        contribution_ = w.params;
        apply_fault(fault_, done, theta_, contribution_, uint64_t(done) * 1000003 + uint64_t(rank));
        contribution = contribution_.data();
      }
      avg_.resize(size_t(n_));
      const auto s = reduce_outer(comm, theta_.data(), contribution, n_, aggregate_, avg_.data(), "outer_gradients",
                                  history_);
      if (aggregate_.screen) round_history_.record(s);
      rejected_ = int(s.rejected.size());
      if (rejected_ && elastic_)
        std::cerr << "loco: warning: round " << round << ", left out: " << describe_rejections(s, "round member")
                  << "\n";
      else if (rejected_ && rank == 0)
        std::cerr << "loco: warning: round ending at step " << done << ", left out: "
                  << describe_rejections(s, "replica") << "\n";
    } else if (size > 1) {
      // With partial updates, each entry is averaged over the replicas that train it.
      avg_ = w.params;
      average_.average_in_place(comm, avg_);
    }
  }
  // The reduced average: a lone member's own parameters.
  const float* average(const Worker& w) const { return robust_ || round_size_ > 1 ? avg_.data() : w.params.data(); }

  // The round's result: the norms, the outer step, and every replica restarts from theta. One
  // pass over the model, chunk by chunk: the chunk's norm sums, its outer step, its copy into
  // the replica's parameters (avg may be those parameters: a chunk is read before it is written).
  void commit(Worker& w) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n = n_;
    const float* avg = average(w);
    float* params = w.params.data();
    float* theta = theta_.data();
    float* momentum = momentum_.data();
    // The norms' sums over fixed chunks, added in order: the same bits whatever the threads.
    constexpr int64_t kChunk = 1 << 16;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    const bool trained = trained_only(w, round_done_);  // the replica's own delta is 0 outside them
    double own = 0;
    if (trained)  // before the outer step changes theta
      for (const auto& r : w.trainable.ranges())
        for (int64_t i = r.begin; i < r.end; ++i) {
          const double m = double(theta[i]) - params[i];
          own += m * m;
        }
    std::vector<double> outer_sq(static_cast<size_t>(chunks)), own_sq(static_cast<size_t>(chunks));
    parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t begin = c * kChunk, end = std::min(n, (c + 1) * kChunk);
        double outer = 0, mine = 0;
        for (int64_t i = begin; i < end; ++i) {
          const double d = double(theta[i]) - avg[i];
          outer += d * d;
          if (!trained) {
            const double m = double(theta[i]) - params[i];
            mine += m * m;
          }
        }
        outer_sq[size_t(c)] = outer, own_sq[size_t(c)] = mine;
        outer_sgd_step_range(theta, momentum, avg, begin, end, outer_);
        std::copy(theta + begin, theta + end, params + begin);
      }
    });
    double outer = 0;
    for (int64_t c = 0; c < chunks; ++c) outer += outer_sq[size_t(c)], own += own_sq[size_t(c)];
    outer_norm_ = std::sqrt(outer), replica_norm_ = std::sqrt(own);
    history_ = std::move(round_history_);
    sync_s_ = w.comm.clock().now() - sync_start_;
    group_->add_compute(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }

  // A round with the outer state held by the caller: the average handed over.
  void held_round(Worker& w) {
    OuterResult r;
    r.replace = true;
    r.own = w.replicas == 1;
    if (!r.own) {  // into the parameters' buffer, which only stages the caller's parameters
      average_.average_in_place(w.comm, w.params);
      r.in_params = true;
    }
    results_.push_back(std::move(r));
    sync_s_ = w.comm.clock().now() - sync_start_;
  }

  SyncGroup::Install install() {
    return [this](Worker& w, OuterState& s) {
      check(s.norm_history.size() == 1, "internal: a joiner's outer state without DiLoCo's screening history");
      theta_ = std::move(s.theta);
      momentum_ = std::move(s.momentum);
      history_ = std::move(s.norm_history[0]);
      w.params = theta_;
    };
  }

  OuterConfig outer_;
  const int64_t start_step_;
  const int64_t n_;  // parameters
  std::vector<float> theta_, momentum_, avg_;
  double outer_norm_ = -1, replica_norm_ = -1;  // of the last round: ||Delta||, ||Delta_m||
  CountVectorAverage average_;
  std::vector<Range> whole_;
  std::unique_ptr<SyncGroup> group_;
  const bool elastic_;  // members come and go (group_->members_change())
  AggregateOptions aggregate_;
  Fault fault_;
  bool robust_ = false;  // reduce through reduce_outer (screening, a robust rule or a fault)
  std::vector<float> contribution_;  // a faulty replica's corrupted parameters
  int rejected_ = 0;  // contributions rejected in the last round
  NormHistory history_, round_history_;  // screening's record of the accepted rounds; with this round's
  int round_size_ = 1;                   // members of the round being reduced
  int64_t round_done_ = 0;               // ... and the steps done when it started
  double sync_start_ = 0, sync_s_ = 0;  // the last round's synchronization and outer step, on the transport's clock
  bool held_ = false;                 // the caller holds theta and the momentum
  std::vector<OuterResult> results_;  // ... and takes these
};

}  // namespace

std::unique_ptr<Algorithm> make_diloco(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group,
                                       const Fault& fault) {
  if (cfg.outer.codec != "fp32") fail("outer.codec applies to algorithm = \"streaming\"; diloco sends fp32");
  return std::make_unique<Diloco>(cfg, w, std::move(group), fault);
}

// The data-parallel steps need every replica at every step.
std::string diloco_elastic_refusal(const RunConfig& cfg) {
  if (cfg.outer.start_step > 0) return "outer.start_step is not supported with distributed.backend = \"elastic\"";
  return "";
}

std::unique_ptr<Algorithm> make_diloco(const RunConfig& cfg, const Worker& w) {
  const bool faulty = w.rank >= w.replicas - cfg.outer.faulty_replicas;
  return make_diloco(cfg, w, std::make_unique<FixedGroup>(), faulty ? parse_fault(cfg.outer.fault, "outer.fault") : Fault{});
}

void add_outer_keys(ConfigSchema& s, OuterConfig& o2) {
  s.add("outer.inner_steps", &o2.inner_steps, "H: inner steps per outer round (diloco, streaming)", 1);
  s.add("outer.start_step", &o2.start_step,
        "diloco: steps of data-parallel training (gradients averaged every step) before the first outer round, "
        "as the DiLoCo paper started from a pretrained model; 0: DiLoCo from the first step", 0);
  s.add("outer.lr", &o2.lr,
        "outer learning rate eta (diloco, streaming); the default is the quality-parity study's best "
        "(docs/results/parity-32k.md; the DiLoCo paper used 0.7, the Streaming DiLoCo paper 0.4)", 0.0, 10.0);
  s.add("outer.momentum", &o2.momentum,
        "outer momentum mu (diloco, streaming); the default is the quality-parity study's best, where the papers' "
        "0.9 ended 4.6-8.1 points further from data-parallel training (docs/results/parity-32k.md)", 0.0, 0.999999);
  s.add("outer.nesterov", &o2.nesterov, "Nesterov outer momentum (diloco, streaming; else heavy ball)");
  s.add("outer.codec", &o2.codec, "outer-gradient encoding (streaming): fp32, bf16, fp8, fp4-e3m0, fp4-e2m1, int8, "
        "random-drop, topk", {"fp32", "bf16", "fp8", "fp4-e3m0", "fp4-e2m1", "int8", "random-drop", "topk"});
  s.add("outer.rounding", &o2.rounding, "rounding of quantized codecs", {"nearest", "stochastic"});
  s.add("outer.reduce", &o2.reduce,
        "how encoded (non-fp32) outer gradients are combined: all-gather (exact float32 sum of what every replica "
        "sent; M-1 payloads per worker), reduce-scatter (each shard summed by one replica and re-encoded: about 2 "
        "payloads per worker whatever M, a second quantization), auto (all-gather up to 2 replicas, else "
        "reduce-scatter)", {"auto", "all-gather", "reduce-scatter"});
  s.add("outer.aggregate", &o2.aggregate,
        "diloco, streaming: how the replicas' contributions are combined: mean (all-reduce), or, sent to every member so that "
        "each sees all of them, trimmed-mean, median (per coordinate) or centered-clip (docs/security.md)",
        {"mean", "trimmed-mean", "median", "centered-clip"});
  s.add("outer.trim", &o2.trim, "trimmed-mean: fraction of the contributions dropped at each end, per coordinate",
        0.0, 0.49);
  s.add("outer.screen", &o2.screen,
        "diloco, streaming, noloco: reject a contribution that is not finite or whose outer-gradient norm exceeds outer.reject_norm "
        "times the round's median; auto: on for the elastic backend (but not with partial updates) and for the "
        "aggregates other than mean",
        {"auto", "on", "off"});
  s.add("outer.reject_norm", &o2.reject_norm,
        "screening: the factor over the round's median outer-gradient norm beyond which a contribution is "
        "rejected (0: reject only non-finite ones)", 0.0, 1e6);
  s.add("outer.fault", &o2.fault,
        "for robustness tests (not elastic): the last outer.faulty_replicas replicas corrupt their DiLoCo "
        "and Streaming DiLoCo contributions: \"\" (none), \"nan\", \"inf\", \"noise\" (Gaussian, the outer gradient's norm) or \"scale:X\" (the outer gradient times X)");
  s.add("outer.faulty_replicas", &o2.faulty_replicas, "replicas that apply outer.fault (the last ones)", 1);
  s.add("outer.block", &o2.block, "values per shared scale of block-scaled codecs", 1, 1 << 20);
  s.add("outer.keep_fraction", &o2.keep_fraction, "fraction of values kept by random-drop and topk", 1e-9, 1.0);
}

void check_outer_config(const RunConfig& c, const ConfigCheck& need) {
  if (c.outer.start_step > 0) {
    need(c.method() == MethodId::Diloco, "outer.start_step applies to algorithm = \"diloco\"");
    need(c.outer.start_step < c.train.steps, "outer.start_step (" + std::to_string(c.outer.start_step) +
                                                 ") must be below train.steps (" + std::to_string(c.train.steps) + ")");
    need(c.partial.slices == 1, "outer.start_step with partial.slices > 1 is not supported (data-parallel steps "
                                "need every replica to train every parameter)");
  }
  const auto& o = c.outer;
  if (o.aggregate != "mean" || o.screen == "on" || !o.fault.empty()) {
    const std::string what = o.aggregate != "mean" ? "outer.aggregate = \"" + o.aggregate + "\""
                             : o.screen == "on"    ? std::string("outer.screen = \"on\"")
                                                   : std::string("outer.fault");
    need(c.method() == MethodId::Diloco || c.method() == MethodId::Streaming ||
             (c.method() == MethodId::Noloco && o.aggregate == "mean" && o.fault.empty()),
         what + " needs algorithm = \"diloco\" or \"streaming\" (NoLoCo screens its partners with outer.screen)");
    need(c.partial.slices == 1, what + " with partial.slices > 1 is not supported");
  }
  if (!o.fault.empty()) {
    parse_fault(o.fault, "outer.fault");
    need(c.distributed.backend != "elastic", "outer.fault is for in-process and MPI runs; an elastic worker "
                                             "misbehaves with elastic.fault");
    need(o.faulty_replicas <= c.distributed.replicas,
         "outer.faulty_replicas (" + std::to_string(o.faulty_replicas) + ") exceeds distributed.replicas (" +
             std::to_string(c.distributed.replicas) + ")");
  }
}

}  // namespace loco
