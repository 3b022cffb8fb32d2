// DiLoCo over the elastic backend: each outer synchronization is one round among the live
// members of that moment (elastic/session.h), reduced with loco's ring all-reduce among the
// round's contributors, so with a fixed membership the parameters equal the in-process run's bit
// for bit. A joiner receives the outer parameters and momentum with the round's outer step taken.
// Contributions are screened by default here (outer.screen = auto): a member whose contribution
// is not finite or far larger than the others' is left out of the round (algo/robust.h).
#include "elastic/methods.h"

#include <chrono>
#include <iostream>

#include "algo/robust.h"
#include "core/checksum.h"
#include "elastic/session.h"

namespace loco {

namespace {

class ElasticDiloco : public ElasticMethod<Algorithm> {
 public:
  ElasticDiloco(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                std::shared_ptr<TrafficStats> traffic, std::shared_ptr<TraceRecorder> trace)
      : ElasticMethod(cfg, w, options, std::move(traffic), std::move(trace)),
        outer_(cfg.outer),
        fault_(options.fault),
        theta_(w.params.size()),
        momentum_(w.params.size(), 0.0f),
        aggregate_(aggregate_options(cfg.outer, true)) {
    session_.expect_norm_histories(1);
  }

  void start(Worker& w, bool resumed) override {
    if (!w.restored) theta_ = w.params;  // else from the checkpoint (load_state); a join replaces it
    session_.start(w, resumed, install());
  }

  bool rounds_at(const Worker&, int64_t done, bool last) const override {
    return done % outer_.inner_steps == 0 || last;
  }

  void after_step(Worker& w, int64_t done, bool last) override {
    session_.count_step();
    if (!rounds_at(w, done, last)) return;
    const int64_t n = int64_t(theta_.size());
    std::vector<float> theta, momentum, avg;
    NormHistory history;
    ElasticSession::Round r;
    r.id = (done + outer_.inner_steps - 1) / outer_.inner_steps;
    r.step = done;
    r.take_joiners = !last;
    r.reduce = [&](Communicator& comm, int, int) {
      avg = w.params;
      apply_fault(fault_, done, theta_, avg, uint64_t(r.id));
      const auto s =
          reduce_outer(comm, theta_.data(), avg.data(), n, aggregate_, avg.data(), "outer_gradients", history_);
      history = history_;
      if (aggregate_.screen) history.record(s);
      rejected_ = int(s.rejected.size());
      if (rejected_)
        std::cerr << "loco: warning: round " << r.id << ", left out: " << describe_rejections(s, "round member")
                  << "\n";
      theta = theta_;
      momentum = momentum_;
      const auto t0 = std::chrono::steady_clock::now();
      outer_sgd_step(theta.data(), momentum.data(), avg.data(), n, outer_);
      session_.add_compute(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    };
    r.outer_state = [&](JoinState& s) {
      s.theta = theta;
      s.momentum = momentum;
      s.norm_history = {history};
    };
    r.commit = [&] {
      theta_ = std::move(theta);
      momentum_ = std::move(momentum);
      history_ = std::move(history);
      w.params = theta_;
      return crc32c(theta_.data(), theta_.size() * sizeof(float));
    };
    session_.run_round(w, r, install());
    if (last) session_.finish_run();
  }

  const std::vector<float>& eval_params(Worker&) override { return theta_; }
  void annotate(nlohmann::json& rec) override {
    ElasticMethod::annotate(rec);
    rec["outer_rejected"] = rejected_;
  }

  void report(nlohmann::json& out) const override {
    out["outer_state_bytes"] = int64_t(theta_.size() + momentum_.size()) * 4;
    ElasticMethod::report(out);
  }

  void save_state(TrainingState& st) override {
    st.tensors["outer.params"] = theta_;
    st.tensors["outer.momentum"] = momentum_;
    st.meta["outer.norm_history"] = norm_history_text({history_});
  }
  void load_state(const TrainingState& st) override {
    st.take("outer.params", theta_);
    st.take("outer.momentum", momentum_);
    const auto it = st.meta.find("outer.norm_history");
    history_ = parse_norm_history(it == st.meta.end() ? "" : it->second, 1, "training state")[0];
  }

 private:
  ElasticSession::Install install() {
    return [this](Worker& w, JoinState& s) {
      theta_ = std::move(s.theta);
      momentum_ = std::move(s.momentum);
      check(s.norm_history.size() == 1, "internal: a join state without DiLoCo's screening history");
      history_ = std::move(s.norm_history[0]);
      w.params = theta_;
    };
  }

  OuterConfig outer_;
  Fault fault_;
  std::vector<float> theta_, momentum_;
  AggregateOptions aggregate_;
  int rejected_ = 0;  // contributions left out of the last round
  NormHistory history_;  // screening's record of the accepted rounds (algo/robust.h)
};

}  // namespace

std::unique_ptr<Algorithm> make_elastic_diloco(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                                               std::shared_ptr<TrafficStats> traffic,
                                               std::shared_ptr<TraceRecorder> trace) {
  return std::make_unique<ElasticDiloco>(cfg, w, options, std::move(traffic), std::move(trace));
}

}  // namespace loco
