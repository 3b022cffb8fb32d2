#pragma once
// Fragment schedule of Streaming DiLoCo (spec 02-streaming.md).
#include <cstdint>
#include <string>
#include <vector>

namespace loco {

struct FragmentPlan {
  std::vector<int> blocks;  // transformer blocks in the fragment
  bool nonblock = false;    // holds the parameters outside the blocks (embeddings, final norm, head)
  int64_t offset = 0;       // syncs at offset + k H, k >= 1
};

// P = ceil(L / |p|) block fragments, sequential ([j|p|, (j+1)|p|)) or strided ({l : l mod P = j}),
// then one fragment for the non-block parameters; F = P + 1 fragments with offsets j floor(H / F).
// fragment_blocks = 0: a single fragment with the whole model (offset 0), i.e. DiLoCo.
std::vector<FragmentPlan> plan_fragments(int num_layers, int fragment_blocks, const std::string& pattern,
                                         int64_t inner_steps);

// True if a fragment with this offset synchronizes after inner step `step` (1-based count).
bool syncs_at(const FragmentPlan& f, int64_t step, int64_t inner_steps);
// The step at which the fragment's latest sync started, at or before `step` (-1: none yet).
int64_t last_sync_start(const FragmentPlan& f, int64_t step, int64_t inner_steps);

// Per-replica tau from streaming.tau and streaming.worker_tau ("1,1,3,3").
int64_t worker_tau(int64_t tau, const std::string& list, int rank, int replicas);

}  // namespace loco
