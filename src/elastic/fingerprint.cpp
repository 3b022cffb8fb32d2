#include "elastic/fingerprint.h"

#include <sodium.h>

#include <set>

#include "core/error.h"
#include "elastic/secure_channel.h"

namespace loco {

namespace {

std::string digest(const std::vector<int32_t>& tokens) {
  if (sodium_init() < 0) fail("elastic: libsodium could not start");
  unsigned char h[16];
  crypto_generichash(h, sizeof h, reinterpret_cast<const unsigned char*>(tokens.data()),
                     tokens.size() * sizeof(int32_t), nullptr, 0);
  return std::to_string(tokens.size()) + " tokens, blake2b " + to_hex(h, sizeof h);
}

bool per_worker(const std::string& key) {
  for (const auto& k : per_worker_keys())
    if (k.back() == '.' ? key.compare(0, k.size(), k) == 0 : key == k) return true;
  return false;
}

}  // namespace

const std::vector<std::string>& per_worker_keys() {
  static const std::vector<std::string> keys = {
      "data.train",         "data.val",           "train.log_interval", "train.eval_interval",
      "train.eval_windows", "train.checkpoint_interval", "train.keep_checkpoints", "train.out_dir",
      "train.tensorboard",  "train.threads",      "train.precision",    "train.micro_batch_size",
      "distributed.",       "elastic.",           "network."};
  return keys;
}

nlohmann::json run_fingerprint(const RunConfig& cfg, const std::vector<int32_t>& train_tokens,
                               const std::vector<int32_t>* val_tokens) {
  RunConfig copy = cfg;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : run_config_schema(copy).values())
    if (!per_worker(key)) out[key] = value;
  out["data.train tokens"] = digest(train_tokens);
  out["data.val tokens"] = val_tokens ? digest(*val_tokens) : "none";
  return out;
}

std::string fingerprint_differences(const nlohmann::json& mine, const nlohmann::json& run) {
  std::set<std::string> keys;
  for (const auto& [k, v] : mine.items()) keys.insert(k);
  for (const auto& [k, v] : run.items()) keys.insert(k);
  std::string out;
  auto show = [](const nlohmann::json& j, const std::string& k) {
    return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("(not set)");
  };
  for (const auto& k : keys) {
    const std::string a = show(mine, k), b = show(run, k);
    if (a != b) out += (out.empty() ? "" : "; ") + k + ": this worker " + a + ", the run " + b;
  }
  return out;
}

}  // namespace loco
