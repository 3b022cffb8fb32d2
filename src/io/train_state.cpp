#include "io/train_state.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/checkpoint.h"
#include "core/fs.h"
#include "io/safetensors.h"

namespace loco {

namespace fs = std::filesystem;

namespace {
std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", (long long)step);
  return name;
}
}  // namespace

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

void TrainingState::take(const std::string& name, std::vector<float>& out) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail("training state: missing tensor \"" + name + "\"");
  if (it->second.size() != out.size())
    fail("training state: tensor \"" + name + "\" has " + std::to_string(it->second.size()) + " values, expected " +
         std::to_string(out.size()));
  out = it->second;
  taken_.insert(name);
}

void TrainingState::check_all_taken(const std::string& source) const {
  std::string left;
  int count = 0;
  for (const auto& entry : tensors) {
    if (taken_.count(entry.first)) continue;
    if (++count <= 8) left += (left.empty() ? "" : ", ") + entry.first;
  }
  if (count == 0) return;
  if (count > 8) left += " and " + std::to_string(count - 8) + " more";
  fail(source + ": the state holds tensor(s) this run does not read: " + left +
       " (saved by another method or configuration, or edited)");
}

std::string begin_checkpoint(const std::string& run_dir, int64_t step) {
  const std::string tmp = run_dir + "/checkpoints/" + step_name(step) + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  make_dirs(tmp);
  return tmp;
}

void write_state_file(const std::string& path, const TrainingState& state) {
  std::vector<TensorRef> refs;
  for (const auto& [k, v] : state.tensors) refs.push_back({k, {int64_t(v.size())}, v.data()});
  auto meta = state.meta;
  meta["loco.format"] = "training-state-1";
  write_safetensors(path, refs, meta);
}

TrainingState read_state_file(const std::string& path) {
  return state_from_reader(SafetensorsReader(path, /*require_checksum=*/true), path);
}

TrainingState state_from_reader(const SafetensorsReader& r, const std::string& path) {
  TrainingState st;
  st.meta = r.metadata();
  if (st.meta["loco.format"] != "training-state-1") fail(path + ": not a loco training state");
  for (const auto& name : r.names()) st.tensors[name] = r.read_f32(name, r.shape(name));
  return st;
}

std::string commit_checkpoint(const std::string& run_dir, int64_t step, const ModelConfig& config,
                              const ParamLayout& layout, const float* eval_params, const TrainingState& run_state) {
  const std::string root = run_dir + "/checkpoints", name = step_name(step);
  const std::string final_dir = root + "/" + name, tmp_dir = final_dir + ".tmp";
  save_model_checkpoint(tmp_dir, config, layout, eval_params);
  // The run's tokenizer goes with the model, so that the checkpoint directory can be copied and
  // used alone (loco generate).
  for (const char* f : {"tokenizer.json", "tokenizer.model"})
    if (file_exists(run_dir + "/" + f)) write_file_atomic(tmp_dir + "/" + f, read_file(run_dir + "/" + f));
  write_state_file(tmp_dir + "/state.safetensors", run_state);
  std::error_code ec;
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) fail(final_dir + ": cannot rename checkpoint into place: " + ec.message());
  write_file_atomic(root + "/latest", name + "\n");
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

std::string worker_state_path(const std::string& checkpoint_dir, int stage, int replica, int stages) {
  const std::string r = "replica-" + std::to_string(replica) + ".safetensors";
  return checkpoint_dir + "/" + (stages > 1 ? "stage-" + std::to_string(stage) + "-" + r : r);
}

}  // namespace loco
