#pragma once
// NoLoCo (docs/noloco.md): no collective at all. Every H inner steps each replica averages
// with a small random group (one partner by default) instead of everyone, and with pipeline
// stages every microbatch can take a random path through the stages. The pieces every worker
// must compute identically from shared seeds live here.
#include <cstdint>
#include <string>
#include <vector>

#include "algo/run_config.h"

namespace loco {

// The groups of outer step k (1-based) among R replicas: a permutation of 0..R-1 drawn from
// (seed, k), cut into floor(R / n) consecutive groups of n; the R mod n replicas left over join
// the last group (never an idle replica; fewer than n replicas make one group). Each group is
// sorted ascending. Every worker derives the same partition.
std::vector<std::vector<int>> noloco_groups(int R, int n, uint64_t seed, int64_t k);
// The group of replica r at outer step k (sorted, r included).
std::vector<int> noloco_group_of(int R, int n, uint64_t seed, int64_t k, int r);

// Random pipeline routing is pipeline/executor.h's random_route.

// One outer step of replica i (docs/noloco.md, heavy-ball form), for n values:
//   d_j = theta_j - phi_j;   delta = alpha delta + beta mean_G(d) - gamma (phi_i - mean_G(phi))
//   phi_i += delta;   theta_i = phi_i
// `phis` and `progress` hold the group's members' phi_j and d_j in ascending member order (this
// replica's own among them, at `self`); the means are summed in that order, so every member of
// a group computes the same means. Writes phi (in place), delta and theta.
struct NolocoStepParams {
  double beta, alpha, gamma;
};
void noloco_outer_step(const std::vector<const float*>& phis, const std::vector<const float*>& progress, int self,
                       float* phi, float* delta, float* theta, int64_t n, const NolocoStepParams& p);
// Screening of a group (outer.screen; docs/security.md): the members whose exchange the outer step
// takes, this replica's own always. A partner is left out when its local progress or slow weights
// are not finite, when the norm of its progress exceeds `reject_norm` times the median of the
// group's (this replica's included), or when its slow weights are farther from this replica's
// than `reject_distance` times the norm of this replica's (0 turns either rule off; honest
// replicas measured 0.30 apart at most, see docs/security.md). `distance_ratio`: the largest
// such relative distance among the kept partners (a diagnostic: how close the rule came).
struct NolocoScreen {
  std::vector<size_t> kept;  // indices into the group, ascending
  std::string why;           // the partners left out and why ("" when none)
  double distance_ratio = 0;
};
NolocoScreen noloco_screen(const std::vector<const float*>& phis, const std::vector<const float*>& progress,
                           int self, int64_t n, double reject_norm, double reject_distance);
// Keeps only s.kept in phis and progress; returns this replica's index among them.
int noloco_keep(const NolocoScreen& s, int self, std::vector<const float*>& phis, std::vector<const float*>& progress);
// beta, alpha and gamma of the config (noloco.pull = -1: gamma = beta).
NolocoStepParams noloco_step_params(const NolocoConfig& c);

// What members exchange (slow weights, local progress): n floats as bytes, and back, failing
// with a message naming `who` sent `what` if the size is wrong.
std::string noloco_to_bytes(const std::vector<float>& v);
std::vector<float> noloco_from_bytes(const std::string& bytes, int64_t n, const std::string& who,
                                     const std::string& what);

}  // namespace loco
