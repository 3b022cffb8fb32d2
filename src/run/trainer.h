#pragma once
// `loco train`: S pipeline stages x R replicas of workers (in-process threads, or MPI
// processes) running the training loop, the replicas of each stage combined by the configured
// algorithm (DDP, DiLoCo, Streaming DiLoCo, partial updates), with evaluation, metrics, traffic
// and time accounting, and resumable checkpoints.
#include "run/options.h"

namespace loco {

TrainSummary run_training(const TrainOptions& options);

}  // namespace loco
