// Streaming DiLoCo over the elastic backend: each fragment's synchronization is one round among
// the live members of its moment (elastic/session.h). The round's reduction is the same as in
// Streaming (fp32 average, or encoded outer gradients all-gathered or reduce-scattered among
// the round's contributors; screened by default, outer.screen = auto, as elastic DiLoCo: a member
// whose contribution is not finite or far larger than the others' is left out), but it completes within the round: the result is then held, as
// any sync in flight, and merged tau steps later, so with a fixed membership every number
// equals the in-process run's. Communication does not overlap the inner steps here. A joiner
// starts from the outer parameters with every completed sync's outer step taken, and its own
// parameters equal to them.
#include <iostream>
#include <memory>

#include "algo/streaming.h"
#include "core/checksum.h"
#include "elastic/methods.h"
#include "elastic/session.h"

namespace loco {

namespace {

class ElasticStreaming : public ElasticMethod<Streaming> {
 public:
  ElasticStreaming(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                   std::shared_ptr<TrafficStats> traffic, std::shared_ptr<TraceRecorder> trace)
      : ElasticMethod(cfg, w, options, std::move(traffic), std::move(trace), cfg, w) {
    // outer.screen = auto is on here, except with quantized outer gradients reduce-scattered on
    // request (no member sees another's contribution there: said at start).
    const bool scattered = cfg.outer.codec != "fp32" && cfg.outer.reduce == "reduce-scatter";
    if (scattered && cfg.outer.screen == "auto" && cfg.outer.aggregate == "mean")
      std::cerr << "loco: warning: outer.reduce = \"reduce-scatter\": the members' contributions are not screened "
                   "(no member sees another's); outer.reduce = \"auto\" or \"all-gather\" screens them\n";
    set_robustness(aggregate_options(cfg.outer, !scattered), options.fault, "round member");
    session_.expect_norm_histories(fragments());
  }

  void start(Worker& w, bool resumed) override {
    Streaming::start(w, w.restored);  // a restored outer state is kept (a join replaces it)
    session_.start(w, resumed, install());
  }

  // Streaming DiLoCo's own schedule: the steps whose syncs start (a round each) or merge.
  bool rounds_at(const Worker& w, int64_t done, bool last) const override {
    const StepAccess a = Streaming::access(w, done, last);
    return last || !a.reads.empty() || !a.writes.empty();
  }

  void after_step(Worker& w, int64_t done, bool last) override {
    session_.count_step();
    Streaming::after_step(w, done, last);
    if (last) session_.finish_run();
  }

 protected:
  bool sync_fragment(Worker& w, size_t j, int64_t step, bool last) override {
    std::unique_ptr<Pending> p;
    const std::vector<NormHistory> history = norm_history_;  // each attempt screens from it
    ElasticSession::Round r;
    r.id = step * int64_t(fragments()) + int64_t(j);
    r.step = step;
    r.take_joiners = !last;
    r.reduce = [&](Communicator& comm, int rank, int size) {
      p = std::make_unique<Pending>();
      norm_history_ = history;
      begin_sync(comm, rank, size, w.params, j, step, *p);
      complete(comm, *p);
    };
    r.outer_state = [&](OuterState& s) {
      latest_outer_state(s.theta, s.momentum, p.get());
      s.norm_history = norm_history_;
    };
    r.commit = [&] { pending_.push_back(std::move(*p)); };
    r.checksum = [&] {
      std::vector<float> theta, momentum;
      latest_outer_state(theta, momentum, nullptr);
      return crc32c(theta.data(), theta.size() * sizeof(float));
    };
    // Dropped and taken in again: the rest of this step's syncs are not this worker's either.
    return session_.run_round(w, r, install());
  }

 private:
  ElasticSession::Install install() {
    return [this](Worker& w, OuterState& s) {
      install_outer_state(s.theta, s.momentum);
      check(s.norm_history.size() == fragments(), "internal: a join state without every fragment's screening history");
      norm_history_ = std::move(s.norm_history);
      w.params = s.theta;
    };
  }
};

}  // namespace

std::unique_ptr<Algorithm> make_elastic_streaming(const RunConfig& cfg, const Worker& w,
                                                  const ElasticOptions& options,
                                                  std::shared_ptr<TrafficStats> traffic,
                                                  std::shared_ptr<TraceRecorder> trace) {
  return std::make_unique<ElasticStreaming>(cfg, w, options, std::move(traffic), std::move(trace));
}

}  // namespace loco
