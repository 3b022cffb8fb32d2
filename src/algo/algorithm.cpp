#include "algo/algorithm.h"

#include <cstring>

#include "core/error.h"
#include "core/parallel.h"

namespace loco {

std::unique_ptr<Algorithm> make_algorithm(const RunConfig& cfg, const Worker& w) {
  switch (cfg.method()) {
    case MethodId::Ddp: return make_ddp();
    case MethodId::Diloco: return make_diloco(cfg, w);
    case MethodId::Streaming: return make_streaming(cfg, w);
    case MethodId::Noloco: return make_noloco(cfg, w);
  }
  fail("internal: no algorithm for \"" + cfg.algorithm + "\"");
}

std::string elastic_refusal(const RunConfig& cfg) {
  switch (cfg.method()) {
    case MethodId::Ddp:
      return "distributed.backend = \"elastic\" runs algorithm = \"diloco\", \"streaming\" or \"noloco\" (ddp needs "
             "every worker at every step)";
    case MethodId::Diloco: return diloco_elastic_refusal(cfg);
    case MethodId::Streaming: return streaming_elastic_refusal(cfg);
    case MethodId::Noloco: return noloco_elastic_refusal(cfg);
  }
  return "internal: no algorithm for \"" + cfg.algorithm + "\"";
}

void share_for_eval(Communicator& comm, std::vector<float>& params, const std::string& how) {
  if (how == "average") {
    comm.all_reduce(params.data(), int64_t(params.size()), ReduceOp::Mean, "eval");
    return;
  }
  check(how == "replica0", "internal: share_for_eval(" + how + ")");
  std::string bytes(reinterpret_cast<const char*>(params.data()), params.size() * sizeof(float));
  auto h = comm.broadcast_start(&bytes, 0, "eval");
  comm.wait(h);
  if (bytes.size() != params.size() * sizeof(float)) fail("eval: replica 0 sent parameters of the wrong size");
  std::memcpy(params.data(), bytes.data(), bytes.size());
}

void outer_sgd_step_range(float* theta, float* momentum, const float* avg, int64_t begin, int64_t end,
                          const OuterConfig& outer) {
  const float mu = float(outer.momentum), lr = float(outer.lr);
  const bool nesterov = outer.nesterov;
  for (int64_t i = begin; i < end; ++i) outer_sgd_entry(theta[i], momentum[i], avg[i], mu, lr, nesterov);
}

void outer_sgd_step(float* theta, float* momentum, const float* avg, int64_t n, const OuterConfig& outer) {
  // Elementwise: the same bits whatever the compute threads (a large model's host outer step
  // is bound by memory bandwidth, which one thread does not fill).
  parallel_for(n, 1 << 16, [=, &outer](int64_t begin, int64_t end) {
    outer_sgd_step_range(theta, momentum, avg, begin, end, outer);
  });
}

}  // namespace loco
