#pragma once
// Training checkpoints: RUN/checkpoints/step_NNNNNNNN/ holds the model (config.json +
// model.safetensors, loadable by PyTorch as is) and state.safetensors: named float tensors
// (optimizer moments, outer parameters, ...) plus string metadata (step, data position, ...).
// A checkpoint is written into step_NNNNNNNN.tmp/ and renamed into place, then
// RUN/checkpoints/latest is replaced atomically: a kill at any moment leaves the previous
// checkpoint intact and `latest` pointing to a complete one.
#include <map>
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
};

// Writes the checkpoint of `step` and returns its directory.
std::string write_training_checkpoint(const std::string& run_dir, int64_t step, const ModelConfig& config,
                                      const ParamLayout& layout, const float* params, const TrainingState& state);
// Directory of the newest complete checkpoint of a run (fails if there is none).
std::string latest_checkpoint(const std::string& run_dir);
TrainingState read_training_state(const std::string& checkpoint_dir);

}  // namespace loco
