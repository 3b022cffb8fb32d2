#pragma once
// The state one worker trains: its stage of the model (all of it without a pipeline),
// parameters, gradients, inner optimizer, data stream, and the communicator of its
// data-parallel group (the replicas of its stage). Algorithms act on it through the hooks of
// algorithm.h and see only that group: `rank` is the replica index and `replicas` its size.
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "data/loader.h"
#include "io/run_config.h"
#include "model/transformer.h"
#include "optim/adamw.h"

namespace loco {

struct Worker {
  // `comm` is the stage's data-parallel group; `stage` the blocks this worker holds (default:
  // the whole model) and `world_rank` its rank among all workers (default: comm's rank).
  Worker(const RunConfig& cfg, Communicator& comm, std::shared_ptr<const std::vector<int32_t>> train_tokens,
         StageSpec stage = {}, int world_rank = -1)
      : cfg(cfg),
        comm(comm),
        rank(comm.rank()),
        replicas(comm.size()),
        world_rank(world_rank < 0 ? comm.rank() : world_rank),
        model(cfg.model, stage),
        trainable(cfg.partial.slices > 1 ? TrainableSet(model.layout(), rank % cfg.partial.slices,
                                                        cfg.partial.slices, cfg.partial.strategy)
                                         : TrainableSet(model.layout())),
        params(size_t(model.layout().size())),
        grads(size_t(trainable.size())),
        adamw(cfg.optim.adamw, model.layout(), &trainable, cfg.protocol.constraint == "subspace-adamw"),
        loader(std::move(train_tokens), cfg.data.seq_len, cfg.data.batch_size, rank, replicas,
               uint64_t(cfg.data.seed)) {}

  const RunConfig& cfg;
  Communicator& comm;
  const int rank, replicas;  // replica index and count (this stage's data-parallel group)
  const int world_rank;
  Transformer model;
  TrainableSet trainable;          // what this replica trains (partial.slices); grads are compact
  std::vector<float> params, grads;
  AdamW adamw;
  DataLoader loader;               // read by the first stage only
  double compute_seconds = 0;  // forward, backward, optimizer and outer updates
  int64_t step = 0;            // inner steps completed before the one being taken
  bool restored = false;       // from a checkpoint (a resumed run)
};

}  // namespace loco
