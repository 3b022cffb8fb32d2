// DiLoCo (spec 01-diloco.md): replicas train independently with their own AdamW; every H inner
// steps the outer gradients Delta_m = theta - theta_m are averaged (the only communication),
// the outer parameters take a Nesterov step, and every replica restarts from them. The inner
// AdamW state is kept across rounds. The final step always ends a round, so the run's last
// inner steps count. Evaluation uses the outer parameters.
// In fp32 the all-reduce carries the replicas' parameters theta_m: every worker knows theta,
// so this is the same information as Delta_m in the same bytes, and it keeps the outer step
// exact (see outer_sgd_step).
#include "algo/algorithm.h"

namespace loco {

namespace {

class Diloco : public Algorithm {
 public:
  Diloco(const OuterConfig& outer, size_t n) : outer_(outer), theta_(n), momentum_(n, 0.0f), avg_(n) {}

  void start(Worker& w, bool resumed) override {
    if (!resumed) theta_ = w.params;
  }

  void after_step(Worker& w, int64_t done, bool last) override {
    if (done % outer_.inner_steps != 0 && !last) return;
    const int64_t n = int64_t(theta_.size());
    avg_ = w.params;
    w.comm.all_reduce(avg_.data(), n, ReduceOp::Mean, "outer_gradients");
    outer_sgd_step(theta_.data(), momentum_.data(), avg_.data(), n, outer_);
    w.params = theta_;
  }

  const std::vector<float>& eval_params(Worker&) override { return theta_; }
  void report(nlohmann::json& out) const override {
    out["outer_state_bytes"] = int64_t(theta_.size() + momentum_.size()) * 4;
  }

  void save_state(TrainingState& st) override {
    st.tensors["outer.params"] = theta_;
    st.tensors["outer.momentum"] = momentum_;
  }
  void load_state(const TrainingState& st) override {
    st.take("outer.params", theta_);
    st.take("outer.momentum", momentum_);
  }

 private:
  OuterConfig outer_;
  std::vector<float> theta_, momentum_, avg_;
};

}  // namespace

std::unique_ptr<Algorithm> make_diloco(const OuterConfig& outer, size_t num_params) {
  return std::make_unique<Diloco>(outer, num_params);
}

}  // namespace loco
