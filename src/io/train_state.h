#pragma once
// Training checkpoints: RUN/checkpoints/step_NNNNNNNN/ holds
//   config.json + model.safetensors   the evaluation parameters (loadable by PyTorch as is)
//   tokenizer.json (+ .model)         the run's tokenizer, so that the directory stands alone
//   state.safetensors                 run-level state (step, elapsed time, ...)
//   replica-R.safetensors             each worker's own state: its parameters, optimizer
//   (stage-S-replica-R.safetensors    moments, data position, algorithm state (with a pipeline,
//    with a pipeline)                 one file per stage and replica, holding that stage's part)
// Each file is named float tensors plus string metadata. A checkpoint is written into
// step_NNNNNNNN.tmp/ and renamed into place, then RUN/checkpoints/latest is replaced
// atomically: a kill at any moment leaves the previous checkpoint intact and `latest` pointing
// to a complete one. With MPI on several hosts, RUN must be on a shared file system.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layout.h"

namespace loco {

struct TrainingState {
  std::map<std::string, std::vector<float>> tensors;
  std::map<std::string, std::string> meta;
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  // Copies tensor `name` into `out`, failing if it is missing or of another size.
  void take(const std::string& name, std::vector<float>& out) const;
  // Once everything is loaded: fails, naming them, if tensors remain that nothing took (a state
  // of another configuration, or edited: values it holds would otherwise be dropped unsaid).
  void check_all_taken(const std::string& source) const;
  // Counts `name` as taken, by a caller that reads it itself (loco.torch's outer state on a device).
  void taken_by_caller(const std::string& name) const { taken_.insert(name); }

 private:
  mutable std::set<std::string> taken_;
};

// Fresh temporary directory for the checkpoint of `step` (removes a stale one).
std::string begin_checkpoint(const std::string& run_dir, int64_t step);
void write_state_file(const std::string& path, const TrainingState& state);
TrainingState read_state_file(const std::string& path);
class SafetensorsReader;
// The training state held by an opened file (`path` names it in messages).
TrainingState state_from_reader(const SafetensorsReader& file, const std::string& path);
// Writes the model files into the temporary directory, renames it into place, updates latest.
std::string commit_checkpoint(const std::string& run_dir, int64_t step, const ModelConfig& config,
                              const ParamLayout& layout, const float* eval_params, const TrainingState& run_state);
// Directory of the newest complete checkpoint of a run (fails if there is none).
std::string latest_checkpoint(const std::string& run_dir);
// The state file of one worker: replica-R.safetensors, or stage-S-replica-R.safetensors in a
// pipelined run (stages > 1).
std::string worker_state_path(const std::string& checkpoint_dir, int stage, int replica, int stages);

}  // namespace loco
