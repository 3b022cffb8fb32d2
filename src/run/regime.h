#pragma once
// Warnings at the start of a run whose settings lie where the quality-parity study
// (docs/results/parity-32k.md, parity.md) found low-communication methods trailing data-parallel
// training far more than the papers report:
// few tokens per replica per step, or a budget far below 20 tokens per parameter.
#include <cstdint>
#include <string>
#include <vector>

#include "algo/run_config.h"

namespace loco {

// Per-replica batch (tokens per step) below which the study's tuned DiLoCo ended more than 3%
// above data-parallel training at 20 tokens per parameter: with a global batch of 32,768 tokens,
// M = 2 (16,384 per replica) was the last within it, M = 4 (8,192) and M = 8 (4,096) far above;
// with 2,048 per replica (M = 4, the first phase) further still.
constexpr int64_t kParityTokensPerReplica = 16384;
// Tokens per parameter at which the papers and the study compare methods.
constexpr double kParityTokensPerParam = 20;

// One line per finding (empty when none applies): `replicas` is the run's replica count (for an
// elastic run, any number above one), `params` the model's parameter count.
std::vector<std::string> regime_warnings(const RunConfig& cfg, int replicas, int64_t params);

}  // namespace loco
