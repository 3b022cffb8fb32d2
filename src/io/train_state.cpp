#include "io/train_state.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/safetensors.h"

namespace loco {

namespace fs = std::filesystem;

int64_t TrainingState::get_int(const std::string& key) const {
  auto it = meta.find(key);
  if (it == meta.end()) fail("training state: missing \"" + key + "\"");
  try {
    size_t used = 0;
    const int64_t v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument(key);
    return v;
  } catch (const std::exception&) {
    fail("training state: \"" + key + "\" is not an integer: " + it->second);
  }
}

double TrainingState::get_double(const std::string& key) const {
  auto it = meta.find(key);
  if (it == meta.end()) fail("training state: missing \"" + key + "\"");
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    fail("training state: \"" + key + "\" is not a number: " + it->second);
  }
}

std::string write_training_checkpoint(const std::string& run_dir, int64_t step, const ModelConfig& config,
                                      const ParamLayout& layout, const float* params, const TrainingState& state) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", (long long)step);
  const std::string root = run_dir + "/checkpoints";
  const std::string final_dir = root + "/" + name, tmp_dir = final_dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  make_dirs(tmp_dir);
  save_model_checkpoint(tmp_dir, config, layout, params);
  std::vector<TensorRef> refs;
  for (const auto& [k, v] : state.tensors) refs.push_back({k, {int64_t(v.size())}, v.data()});
  auto meta = state.meta;
  meta["loco.format"] = "training-state-1";
  write_safetensors(tmp_dir + "/state.safetensors", refs, meta);
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) fail(final_dir + ": cannot rename checkpoint into place: " + ec.message());
  write_file_atomic(root + "/latest", std::string(name) + "\n");
  return final_dir;
}

std::string latest_checkpoint(const std::string& run_dir) {
  const std::string latest = run_dir + "/checkpoints/latest";
  if (!file_exists(latest)) fail(run_dir + ": no checkpoint to resume from (missing checkpoints/latest)");
  std::string name = read_file(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos) fail(latest + ": malformed");
  const std::string dir = run_dir + "/checkpoints/" + name;
  if (!file_exists(dir + "/state.safetensors")) fail(dir + ": checkpoint is incomplete (no state.safetensors)");
  return dir;
}

TrainingState read_training_state(const std::string& dir) {
  SafetensorsReader r(dir + "/state.safetensors");
  TrainingState st;
  st.meta = r.metadata();
  if (st.meta["loco.format"] != "training-state-1") fail(r.path() + ": not a loco training state");
  for (const auto& name : r.names()) {
    const auto& shape = r.shape(name);
    st.tensors[name] = r.read_f32(name, shape);
  }
  return st;
}

}  // namespace loco
