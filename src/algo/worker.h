#pragma once
// The state one worker (one replica) trains: model, parameters, gradients, inner optimizer,
// data stream and communicator. Algorithms act on it through the hooks of algorithm.h.
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "data/loader.h"
#include "io/run_config.h"
#include "model/transformer.h"
#include "optim/adamw.h"

namespace loco {

struct Worker {
  Worker(const RunConfig& cfg, Communicator& comm, std::shared_ptr<const std::vector<int32_t>> train_tokens)
      : cfg(cfg),
        comm(comm),
        rank(comm.rank()),
        replicas(comm.size()),
        model(cfg.model),
        trainable(cfg.partial.slices > 1 ? TrainableSet(model.layout(), rank % cfg.partial.slices,
                                                        cfg.partial.slices, cfg.partial.strategy)
                                         : TrainableSet(model.layout())),
        params(size_t(model.layout().size())),
        grads(size_t(trainable.size())),
        adamw(cfg.optim.adamw, model.layout(), &trainable),
        loader(std::move(train_tokens), cfg.data.seq_len, cfg.data.batch_size, rank, replicas,
               uint64_t(cfg.data.seed)) {}

  const RunConfig& cfg;
  Communicator& comm;
  const int rank, replicas;
  Transformer model;
  TrainableSet trainable;          // what this replica trains (partial.slices); grads are compact
  std::vector<float> params, grads;
  AdamW adamw;
  DataLoader loader;
  double compute_seconds = 0;  // forward, backward, optimizer and outer updates
};

}  // namespace loco
