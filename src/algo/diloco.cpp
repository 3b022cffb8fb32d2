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
#include <cmath>
#include <iostream>
#include <utility>

#include "algo/algorithm.h"
#include "comm/fault.h"
#include "algo/partial.h"
#include "algo/robust.h"
#include "core/parallel.h"

namespace loco {

namespace {

class Diloco : public Algorithm {
 public:
  Diloco(const RunConfig& cfg, const Worker& w)
      : outer_(cfg.outer),
        start_step_(cfg.outer.start_step),
        n_(int64_t(w.params.size())),
        average_(w.layout(), cfg.partial.slices, cfg.partial.strategy, w.rank, w.replicas),
        whole_{{0, int64_t(w.params.size())}} {
    aggregate_ = aggregate_options(cfg.outer, false);
    if (w.rank >= w.replicas - cfg.outer.faulty_replicas) fault_ = parse_fault(cfg.outer.fault, "outer.fault");
    robust_ = aggregate_.screen || aggregate_.rule != "mean" || fault_.kind != Fault::Kind::None;
  }

  // The outer state is allocated here (or by load_state), not before: a caller that holds it
  // (hold_outer_elsewhere) never has it allocated on the host.
  void start(Worker& w, bool resumed) override {
    if (resumed || held_) return;
    theta_ = w.params;
    momentum_.assign(size_t(n_), 0.0f);
  }

  std::string outer_elsewhere_refusal() const override {
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
    return w.trainable.size() < int64_t(w.params.size()) && !robust_ && fault_.kind == Fault::Kind::None &&
           w.replicas > 1 && done > start_step_;
  }
  // After the data-parallel steps: whether step `done` ends a round (the last step always does).
  bool round_ends(int64_t done, bool last) const { return last || (done - start_step_) % outer_.inner_steps == 0; }

  void after_step(Worker& w, int64_t done, bool last) override {
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
    const int64_t n = int64_t(w.params.size());
    const double sync_start = w.comm.clock().now();
    if (held_) {
      OuterResult r;
      r.replace = true;
      r.own = w.replicas == 1;
      if (!r.own) {
        CountVectorAverage::Op op;
        average_.start(w.comm, w.params.data(), whole_, op);
        average_.finish(w.comm, op, whole_, r.avg);
      }
      results_.push_back(std::move(r));
      sync_s_ = w.comm.clock().now() - sync_start;
      return;
    }
    if (robust_) {
      const float* contribution = w.params.data();
      if (fault_.kind != Fault::Kind::None) {
        contribution_ = w.params;
        apply_fault(fault_, done, theta_, contribution_, uint64_t(done) * 1000003 + uint64_t(w.rank));
        contribution = contribution_.data();
      }
      avg_.resize(size_t(n));
      const auto s =
          reduce_outer(w.comm, theta_.data(), contribution, n, aggregate_, avg_.data(), "outer_gradients", history_);
      if (aggregate_.screen) history_.record(s);
      rejected_ = int(s.rejected.size());
      if (rejected_ && w.rank == 0)
        std::cerr << "loco: warning: round ending at step " << done << ", left out: "
                  << describe_rejections(s, "replica") << "\n";
    } else if (w.replicas > 1) {
      // With partial updates, each entry is averaged over the replicas that train it.
      CountVectorAverage::Op op;
      average_.start(w.comm, w.params.data(), whole_, op);
      average_.finish(w.comm, op, whole_, avg_);
    }
    const float* avg = robust_ || w.replicas > 1 ? avg_.data() : w.params.data();  // one replica: its own
    // The norms' sums over fixed chunks, added in order: the same bits whatever the threads.
    constexpr int64_t kChunk = 1 << 16;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    const bool trained = trained_only(w, done);  // the replica's own delta is 0 outside them
    std::vector<double> outer_sq(static_cast<size_t>(chunks)), own_sq(static_cast<size_t>(chunks));
    parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double outer = 0, own = 0;
        for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
          const double d = double(theta_[i]) - avg[i];
          outer += d * d;
          if (!trained) {
            const double m = double(theta_[i]) - w.params[i];
            own += m * m;
          }
        }
        outer_sq[size_t(c)] = outer, own_sq[size_t(c)] = own;
      }
    });
    double outer = 0, own = 0;
    for (int64_t c = 0; c < chunks; ++c) outer += outer_sq[size_t(c)], own += own_sq[size_t(c)];
    if (trained)
      for (const auto& r : w.trainable.ranges())
        for (int64_t i = r.begin; i < r.end; ++i) {
          const double m = double(theta_[i]) - w.params[i];
          own += m * m;
        }
    outer_norm_ = std::sqrt(outer), replica_norm_ = std::sqrt(own);
    outer_sgd_step(theta_.data(), momentum_.data(), avg, n, outer_);
    w.params = theta_;
    sync_s_ = w.comm.clock().now() - sync_start;
  }

  // Called after a step: w.step + 1 steps are done. Before the rounds, the replicas' (equal) parameters.
  // (Held by the caller: it evaluates its own outer parameters.)
  const std::vector<float>& eval_params(Worker& w) override {
    if (held_ && w.step + 1 >= start_step_) fail("internal: the caller holds DiLoCo's outer parameters");
    return w.step + 1 < start_step_ ? w.params : theta_;
  }
  void annotate(nlohmann::json& rec) override {
    if (outer_norm_ < 0) return;  // no round ended yet in this segment
    rec["outer_delta_norm"] = outer_norm_;
    rec["replica_delta_norm"] = replica_norm_;
    rec["outer_sync_s"] = sync_s_;
    if (robust_) rec["outer_rejected"] = rejected_;
  }
  void report(nlohmann::json& out) const override {
    out["outer_state_bytes"] = int64_t(theta_.size() + momentum_.size()) * 4;
  }

  void save_state(TrainingState& st) override {
    if (held_) return;  // the caller saves its outer parameters and momentum under the same names
    st.tensors["outer.params"] = theta_;
    st.tensors["outer.momentum"] = momentum_;
    st.meta["outer.norm_history"] = norm_history_text({history_});
  }
  void load_state(const TrainingState& st) override {
    if (held_) return;
    theta_.resize(size_t(n_));
    momentum_.resize(size_t(n_));
    st.take("outer.params", theta_);
    st.take("outer.momentum", momentum_);
    const auto it = st.meta.find("outer.norm_history");
    history_ = parse_norm_history(it == st.meta.end() ? "" : it->second, 1, "training state")[0];
  }

 private:
  OuterConfig outer_;
  const int64_t start_step_;
  const int64_t n_;  // parameters
  std::vector<float> theta_, momentum_, avg_;
  double outer_norm_ = -1, replica_norm_ = -1;  // of the last round: ||Delta||, ||Delta_m||
  AggregateOptions aggregate_;
  Fault fault_;
  bool robust_ = false;  // reduce through reduce_outer (screening, a robust rule or a fault)
  std::vector<float> contribution_;  // a faulty replica's corrupted parameters
  int rejected_ = 0;  // contributions rejected in the last round
  NormHistory history_;  // screening's record of the accepted rounds
  double sync_s_ = 0;  // the last round's synchronization and outer step, on the transport's clock
  CountVectorAverage average_;
  std::vector<Range> whole_;
  bool held_ = false;                 // the caller holds theta and the momentum
  std::vector<OuterResult> results_;  // ... and takes these
};

}  // namespace

std::unique_ptr<Algorithm> make_diloco(const RunConfig& cfg, const Worker& w) {
  return std::make_unique<Diloco>(cfg, w);
}

}  // namespace loco
