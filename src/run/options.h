#pragma once
// What `loco train` is asked (TrainOptions) and what it reports (TrainSummary): the training
// loop's public types, shared by run/trainer.h (its entry point) and run/run.h (its internals).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loco {

struct TrainOptions {
  std::string config_path;             // TOML run config (fresh run)
  std::string resume_dir;              // run directory to resume (uses its config.toml)
  std::vector<std::string> overrides;  // --set key=value
  int64_t until = -1;                  // stop (with a checkpoint) after this step; -1: train.steps
  bool overwrite = false;              // a fresh run may replace a finished one in train.out_dir
  std::string trace_path;              // Chrome trace-event JSON of all workers ("" for none)
  bool quiet = false;
  std::string join_url;                // elastic: redis://HOST:PORT/RUN
  std::string worker_name;             // elastic: this worker's name (its run directory under train.out_dir)
};

struct TrainSummary {
  std::string run_dir, checkpoint, algorithm, backend;
  int replicas = 1, stages = 1;
  int64_t steps = 0, tokens = 0;
  double final_train_loss = 0, final_val_loss = -1;  // -1: no validation data
  double unigram_entropy = 0;                        // nats, of the training tokens
  double seconds = 0;
  nlohmann::json workers;  // per-worker traffic and time accounting
  bool is_reporter = true; // false on MPI ranks other than the reporter (last stage of replica 0)
  bool already_complete = false;  // --resume of a run that had finished: nothing was run or written
  int stopped_by = 0;             // the signal that stopped the run early (with a checkpoint), or 0
};

}  // namespace loco
