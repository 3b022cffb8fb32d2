#pragma once
// The state one worker trains: the layout of its stage of the model (all of it without a
// pipeline), parameters, gradients, inner optimizer, data stream, and the communicator of its
// data-parallel group (the replicas of its stage). Algorithms act on it through the hooks of
// algorithm.h and see only that group: `rank` is the replica index and `replicas` its size.
// Nothing here computes the model: loco's CPU engine (model/transformer.h) runs the stage over
// `params` and `grads` (run/ holds it beside the Worker), and a foreign model is its caller's.
#include <memory>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/memory.h"
#include "data/loader.h"
#include "algo/run_config.h"
#include "model/layout.h"
#include "model/trainable.h"
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
        layout_(cfg.model, stage),
        slice(rank % cfg.partial.slices),
        trainable(trainable_set(cfg, layout_, slice)),
        params(zeroed_floats(size_t(layout_.size()))),
        grads(zeroed_floats(size_t(trainable.size()))),
        adamw(std::in_place, cfg.optim.adamw, layout_, &trainable,
              cfg.protocol.constraint == "subspace-adamw"),
        loader(std::in_place, std::move(train_tokens), cfg.data.seq_len, cfg.data.batch_size, rank, replicas,
               uint64_t(cfg.data.seed)) {}

  // A model loco does not hold (the Python layer's torch modules): parameters laid out by
  // `layout` (named tensors, blocks as fragments), trained by the caller, which owns the inner
  // optimizer and the data; the algorithms see params and grads as for loco's own model.
  // Without `with_grads` grads stays empty until the caller sizes it (a method that reads no
  // gradients of a model on a GPU never needs it).
  Worker(const RunConfig& cfg, Communicator& comm, ParamLayout foreign_layout, bool with_grads = true)
      : cfg(cfg),
        comm(comm),
        rank(comm.rank()),
        replicas(comm.size()),
        world_rank(comm.rank()),
        layout_(std::move(foreign_layout)),
        slice(rank % cfg.partial.slices),
        trainable(trainable_set(cfg, layout_, slice)),
        params(zeroed_floats(size_t(layout_.size()))),
        grads(zeroed_floats(with_grads ? size_t(trainable.size()) : 0)) {}

  const ParamLayout& layout() const { return layout_; }

  // Partial updates in an elastic run: the slice this worker trains, chosen when it first
  // registers (elastic/session.h), before it trains or its method is made. Rebuilds what depends
  // on it (the trainable set, the gradient buffer if sized, loco's AdamW state, empty again).
  void set_slice(int s) {
    check(s >= 0 && s < cfg.partial.slices, "internal: slice out of range");
    slice = s;
    trainable = trainable_set(cfg, layout_, slice);
    if (!grads.empty()) grads = zeroed_floats(size_t(trainable.size()));
    if (adamw) adamw.emplace(cfg.optim.adamw, layout_, &trainable, cfg.protocol.constraint == "subspace-adamw");
  }

  const RunConfig& cfg;
  Communicator& comm;
  const int rank, replicas;  // replica index and count (this stage's data-parallel group)
  const int world_rank;

 private:
  const ParamLayout layout_;  // loco's model stage (cfg.model, stage), or a foreign model's
  static TrainableSet trainable_set(const RunConfig& cfg, const ParamLayout& layout, int slice) {
    return cfg.partial.slices > 1 ? TrainableSet(layout, slice, cfg.partial.slices, cfg.partial.strategy)
                                  : TrainableSet(layout);
  }

 public:
  int slice;                       // partial updates: the slice trained (rank mod partial.slices; elastic: set_slice)
  TrainableSet trainable;          // what this replica trains (partial.slices); grads are compact
  std::vector<float> params, grads;
  std::optional<AdamW> adamw;      // loco's inner optimizer (absent for a foreign model)
  std::optional<DataLoader> loader;  // read by the first stage only (absent for a foreign model)
  double compute_seconds = 0;  // forward, backward, optimizer and outer updates
  int64_t step = 0;            // inner steps completed before the one being taken
  bool restored = false;       // from a checkpoint (a resumed run)
};

}  // namespace loco
