#include "algo/algorithm.h"

#include "core/error.h"

namespace loco {

std::unique_ptr<Algorithm> make_algorithm(const RunConfig& cfg, const Worker& w) {
  if (cfg.algorithm == "ddp") return make_ddp();
  if (cfg.algorithm == "diloco") {
    if (cfg.outer.codec != "fp32") fail("outer.codec applies to algorithm = \"streaming\"; diloco sends fp32");
    return make_diloco(cfg, w);
  }
  if (cfg.algorithm == "streaming") return make_streaming(cfg, w);
  if (cfg.algorithm == "noloco") return make_noloco(cfg, w);
  fail("unknown algorithm \"" + cfg.algorithm + "\"");
}

void outer_sgd_step(float* theta, float* momentum, const float* avg, int64_t n, const OuterConfig& outer) {
  const float mu = float(outer.momentum), lr = float(outer.lr);
  for (int64_t i = 0; i < n; ++i) {
    const float delta = theta[i] - avg[i];
    const float v = mu * momentum[i] + delta;
    momentum[i] = v;
    const float d = outer.nesterov ? delta + mu * v : v;
    theta[i] = avg[i] + (delta - lr * d);
  }
}

}  // namespace loco
