// Data-parallel baseline (docs/diloco.md): every step, each replica's gradient is averaged
// with an all-reduce, so every replica applies the same AdamW step.
#include "algo/algorithm.h"

namespace loco {

namespace {

class Ddp : public Algorithm {
 public:
  void on_gradients(Worker& w) override {
    w.comm.all_reduce(w.grads.data(), int64_t(w.grads.size()), ReduceOp::Mean, "gradients");
  }
  // The gradients of every step, when there is anyone to average them with; never the parameters.
  StepAccess access(const Worker& w, int64_t, bool) const override { return {uses_gradients(w), {}, {}}; }
  bool uses_gradients(const Worker& w) const override { return w.replicas > 1; }
};

}  // namespace

std::unique_ptr<Algorithm> make_ddp() { return std::make_unique<Ddp>(); }

}  // namespace loco
