#pragma once
// Workers of a run as an S x R grid: S pipeline stages (contiguous groups of blocks) times R
// data-parallel replicas. Stage s of replica r is world rank r * S + s, so the S ranks of one
// replica's pipeline are consecutive (with S = 1 the rank is the replica index).
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layout.h"

namespace loco {

struct Grid {
  int stages = 1, replicas = 1;
  int size() const { return stages * replicas; }
  int rank(int stage, int replica) const { return replica * stages + stage; }
  int stage_of(int rank) const { return rank % stages; }
  int replica_of(int rank) const { return rank / stages; }
  // World ranks of the replicas of `stage` (its data-parallel group), ascending.
  std::vector<int> stage_group(int stage) const;
  // World ranks of the stages of `replica` (its pipeline), ascending.
  std::vector<int> replica_chain(int replica) const;
  // "stage s, replica r (worker k)", for messages.
  std::string describe(int rank) const;
};

// Blocks per stage from "2,4" (pipeline.split): every stage gets >= 1 block and the counts sum
// to num_layers. Errors name `key`.
std::vector<int> parse_split(const std::string& text, int stages, int num_layers, const std::string& key);

// The stages of a model: contiguous blocks, the embedding on stage 0 and the final norm and head
// on stage S-1 (with tied embeddings the last stage holds a copy of the embedding as its head).
// With an empty `split` the block counts minimise the largest stage's parameter count (among
// equally good splits, the fullest stages are the earliest).
std::vector<StageSpec> partition_stages(const ModelConfig& model, int stages, const std::string& split);

// Parameters held by each stage of a partition.
std::vector<int64_t> stage_param_counts(const ModelConfig& model, const std::vector<StageSpec>& stages);

}  // namespace loco
