#pragma once
// Warnings at the start of a run whose settings lie where the quality-parity study
// (docs/results/parity.md) found low-communication methods trailing data-parallel training:
// few tokens per replica per step, or a budget far below 20 tokens per parameter.
#include <cstdint>
#include <string>
#include <vector>

#include "io/run_config.h"

namespace loco {

// Per-replica batch (tokens per step) at which the study found DiLoCo on par with data-parallel
// training (one replica of 8,192 tokens); with 4 replicas of 2,048 it trailed far behind.
constexpr int64_t kParityTokensPerReplica = 8192;
// Tokens per parameter at which the papers and the study compare methods.
constexpr double kParityTokensPerParam = 20;

// One line per finding (empty when none applies): `replicas` is the run's replica count (for an
// elastic run, any number above one), `params` the model's parameter count.
std::vector<std::string> regime_warnings(const RunConfig& cfg, int replicas, int64_t params);

}  // namespace loco
