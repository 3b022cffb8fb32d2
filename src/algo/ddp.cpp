// Data-parallel baseline (spec 01-diloco.md): every step, each replica's gradient is averaged
// with an all-reduce, so every replica applies the same AdamW step.
#include "algo/algorithm.h"

namespace loco {

namespace {

class Ddp : public Algorithm {
 public:
  void on_gradients(Worker& w) override {
    w.comm.all_reduce(w.grads.data(), int64_t(w.grads.size()), ReduceOp::Mean, "gradients");
  }
};

}  // namespace

std::unique_ptr<Algorithm> make_ddp() { return std::make_unique<Ddp>(); }

}  // namespace loco
