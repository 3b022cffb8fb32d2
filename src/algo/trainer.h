#pragma once
// `loco train`: the training loop of one replica with AdamW, evaluation, metrics and
// resumable checkpoints.
#include <string>
#include <vector>

#include "io/run_config.h"

namespace loco {

struct TrainOptions {
  std::string config_path;             // TOML run config (fresh run)
  std::string resume_dir;              // run directory to resume (uses its config.toml)
  std::vector<std::string> overrides;  // --set key=value
  int64_t until = 0;                   // stop (with a checkpoint) after this step; 0: train.steps
  bool quiet = false;
};

struct TrainSummary {
  std::string run_dir, checkpoint;
  int64_t steps = 0, tokens = 0;
  double final_train_loss = 0, final_val_loss = -1;  // -1: no validation data
  double unigram_entropy = 0;                        // nats, of the training tokens
  double seconds = 0;
};

TrainSummary run_training(const TrainOptions& options);

}  // namespace loco
