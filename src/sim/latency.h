#pragma once
// NoLoCo's latency model (docs/simulator.md, `loco simulate latency`; the NoLoCo paper's section 5.3): message times t ~ LogNormal(mu,
// sigma^2). Closed forms and Monte Carlo estimates of
//  - a tree all-reduce over n workers (reduce to a root, then broadcast: 2 log2 n hops, each
//    waiting for the slower of two messages) vs pair averaging (2 hops with one partner);
//  - the global-barrier cost: n workers each run H steps with times ~ LogNormal(mu_s, sigma_s^2);
//    a blocking all-reduce waits for the slowest worker, a pairwise step for the slower of two.
#include <cstdint>

namespace loco::sim {

// E[max(t1, t2)] for two independent LogNormal(mu, sigma^2) times: (1 + erf(sigma/2)) e^(mu + sigma^2/2).
double expected_max2_lognormal(double mu, double sigma);

struct Estimate {
  double mean = 0, stderr_ = 0;
};

// Closed forms of the hop model.
double tree_allreduce_closed(int n, double mu, double sigma);
double pair_average_closed(double mu, double sigma);
// Monte Carlo of the same hop model (2 log2 n or 2 hops, each the max of two draws).
Estimate tree_allreduce_mc(int n, double mu, double sigma, int trials, uint64_t seed);
Estimate pair_average_mc(double mu, double sigma, int trials, uint64_t seed);
// Monte Carlo of a full binary tree: each node forwards when both children's messages have
// arrived (reduce), then the root's result travels down every path (broadcast); the time is
// that of the last leaf to receive it. Slower than the hop model, increasingly so with sigma.
Estimate tree_allreduce_full_mc(int n, double mu, double sigma, int trials, uint64_t seed);

// Relative cost of waiting: E[max over `group` workers of the sum of H step times] / E[sum] - 1.
// group = n: a global barrier (DiLoCo); group = 2: a pairwise step (NoLoCo).
// Step times: exp(mu + sigma Z) (log-normal), or with `folded` exp(mu) min(kJitterCap,
// exp(sigma |Z|)), what `network.compute_jitter = sigma` emulates in real runs (a step is
// slowed, never sped up, and at most kJitterCap times).
constexpr double kJitterCap = 20;
double barrier_cost_closed(int group, int64_t H, double mu, double sigma, bool folded = false);  // normal approx.
Estimate barrier_cost_mc(int group, int64_t H, double mu, double sigma, int trials, uint64_t seed,
                         bool folded = false);

}  // namespace loco::sim
