#include "sim/latency.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace loco::sim {
namespace {

double lognormal(Rng& rng, double mu, double sigma) { return std::exp(mu + sigma * rng.normal()); }

int log2_exact(int n) {
  check(n >= 2 && (n & (n - 1)) == 0, "worker count must be a power of two >= 2, got " + std::to_string(n));
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

Estimate summarize(const std::vector<double>& x) {
  double mean = 0;
  for (double v : x) mean += v;
  mean /= double(x.size());
  double var = 0;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= double(std::max<size_t>(1, x.size() - 1));
  return {mean, std::sqrt(var / double(x.size()))};
}

// Standard normal quantile by bisection on the CDF (accurate to ~1e-12, ample here).
double normal_quantile(double p) {
  double lo = -40, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace

double expected_max2_lognormal(double mu, double sigma) {
  return (1.0 + std::erf(sigma / 2.0)) * std::exp(mu + sigma * sigma / 2.0);
}

double tree_allreduce_closed(int n, double mu, double sigma) {
  return 2.0 * log2_exact(n) * expected_max2_lognormal(mu, sigma);
}

double pair_average_closed(double mu, double sigma) { return 2.0 * expected_max2_lognormal(mu, sigma); }

namespace {
Estimate hops_mc(int hops, double mu, double sigma, int trials, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> x(static_cast<size_t>(trials));
  for (auto& v : x) {
    v = 0;
    for (int h = 0; h < hops; ++h) v += std::max(lognormal(rng, mu, sigma), lognormal(rng, mu, sigma));
  }
  return summarize(x);
}
}  // namespace

Estimate tree_allreduce_mc(int n, double mu, double sigma, int trials, uint64_t seed) {
  return hops_mc(2 * log2_exact(n), mu, sigma, trials, seed);
}

Estimate pair_average_mc(double mu, double sigma, int trials, uint64_t seed) {
  return hops_mc(2, mu, sigma, trials, seed);
}

Estimate tree_allreduce_full_mc(int n, double mu, double sigma, int trials, uint64_t seed) {
  log2_exact(n);
  Rng rng(seed);
  std::vector<double> x(static_cast<size_t>(trials)), level;
  for (auto& v : x) {
    level.assign(size_t(n), 0.0);  // reduce: each parent waits for both children's messages
    while (level.size() > 1) {
      for (size_t i = 0; i < level.size() / 2; ++i)
        level[i] = std::max(level[2 * i] + lognormal(rng, mu, sigma), level[2 * i + 1] + lognormal(rng, mu, sigma));
      level.resize(level.size() / 2);
    }
    std::vector<double> down{level[0]};  // broadcast: each node sends to its two children
    while (down.size() < size_t(n)) {
      std::vector<double> next(down.size() * 2);
      for (size_t i = 0; i < down.size(); ++i) {
        next[2 * i] = down[i] + lognormal(rng, mu, sigma);
        next[2 * i + 1] = down[i] + lognormal(rng, mu, sigma);
      }
      down.swap(next);
    }
    v = *std::max_element(down.begin(), down.end());
  }
  return summarize(x);
}

namespace {
// Mean and variance of one step time.
std::pair<double, double> step_moments(double mu, double sigma, bool folded) {
  if (!folded) {
    const double m = std::exp(mu + sigma * sigma / 2);
    return {m, (std::exp(sigma * sigma) - 1) * m * m};
  }
  // X = min(cap, exp(s |Z|)); with c = ln(cap) / s, E[X^p] = 2 exp((ps)^2 / 2) (Phi(c - ps) -
  // Phi(-ps)) + cap^p 2 (1 - Phi(c)).
  auto Phi = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  const double cap = kJitterCap, c = sigma > 0 ? std::log(cap) / sigma : INFINITY;
  auto moment = [&](double p) {
    const double ps = p * sigma;
    return 2 * std::exp(ps * ps / 2) * (Phi(c - ps) - Phi(-ps)) + std::pow(cap, p) * 2 * (1 - Phi(c));
  };
  const double m = std::exp(mu) * moment(1), m2 = std::exp(2 * mu) * moment(2);
  return {m, m2 - m * m};
}
}  // namespace

double barrier_cost_closed(int group, int64_t H, double mu, double sigma, bool folded) {
  check(group >= 1 && H >= 1, "barrier cost needs group >= 1 and H >= 1");
  // The sum of H step times is close to normal with mean H m and variance H v; the expected
  // maximum of n normals is mean + sd * Phi^-1((n - 0.375) / (n + 0.25)) (Blom).
  const auto [m, v] = step_moments(mu, sigma, folded);
  if (group == 1) return 0.0;
  // Two workers: E[max(Z1, Z2)] = 1 / sqrt(pi) exactly.
  const double z = group == 2 ? 1.0 / std::sqrt(M_PI) : normal_quantile((group - 0.375) / (group + 0.25));
  return z * std::sqrt(double(H) * v) / (double(H) * m);
}

Estimate barrier_cost_mc(int group, int64_t H, double mu, double sigma, int trials, uint64_t seed, bool folded) {
  check(group >= 1 && H >= 1 && trials >= 2, "barrier cost needs group >= 1, H >= 1, trials >= 2");
  Rng rng(seed);
  const double m = step_moments(mu, sigma, folded).first;
  std::vector<double> x(static_cast<size_t>(trials));
  for (auto& v : x) {
    double slowest = 0;
    for (int w = 0; w < group; ++w) {
      double sum = 0;
      for (int64_t h = 0; h < H; ++h)
        sum += folded ? std::exp(mu) * std::min(kJitterCap, std::exp(sigma * std::abs(rng.normal())))
                      : lognormal(rng, mu, sigma);
      slowest = std::max(slowest, sum);
    }
    v = slowest / (double(H) * m) - 1.0;
  }
  return summarize(x);
}

}  // namespace loco::sim
