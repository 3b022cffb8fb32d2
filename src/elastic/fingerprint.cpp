#include "elastic/fingerprint.h"

#include <sodium.h>

#include <set>

#include "comm/link.h"
#include "core/error.h"
#include "elastic/secure_channel.h"

namespace loco {

namespace {

bool per_worker(const std::string& key) {
  for (const auto& k : per_worker_keys())
    if (k.back() == '.' ? key.compare(0, k.size(), k) == 0 : key == k) return true;
  return false;
}

std::string blake2b(const void* data, size_t bytes) {
  if (sodium_init() < 0) fail("elastic: libsodium could not start");
  unsigned char h[16];
  crypto_generichash(h, sizeof h, static_cast<const unsigned char*>(data), bytes, nullptr, 0);
  return "blake2b " + to_hex(h, sizeof h);
}

nlohmann::json config_fingerprint(const RunConfig& cfg) {
  RunConfig copy = cfg;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : run_config_schema(copy).values())
    if (!per_worker(key)) out[key] = value;
  // The link model (network.*) is each member's own outgoing link, and may differ between them;
  // but its messages carry their arrival time, so either every member models its link or none.
  const bool link = parse_bandwidth(cfg.network.bandwidth, "network.bandwidth") > 0 ||
                    parse_duration(cfg.network.latency, "network.latency") > 0;
  out["network link model"] = link ? "on (network.bandwidth or network.latency set)" : "off";
  return out;
}

}  // namespace

std::string token_digest(const std::vector<int32_t>& tokens) {
  return std::to_string(tokens.size()) + " tokens, " + blake2b(tokens.data(), tokens.size() * sizeof(int32_t));
}

const std::vector<std::string>& per_worker_keys() {
  static const std::vector<std::string> keys = {
      "data.train",         "data.val",           "train.log_interval", "train.eval_interval",
      "train.eval_windows", "train.checkpoint_interval", "train.keep_checkpoints", "train.out_dir",
      "train.tensorboard",  "train.threads",      "train.precision",    "train.micro_batch_size",
      "distributed.",       "elastic.",           "network."};
  return keys;
}

nlohmann::json run_fingerprint(const RunConfig& cfg, const std::string& train_digest, const std::string& val_digest) {
  nlohmann::json out = config_fingerprint(cfg);
  out["data.train tokens"] = train_digest;
  out["data.val tokens"] = val_digest;
  return out;
}

nlohmann::json foreign_fingerprint(const RunConfig& cfg, const std::vector<ForeignTensor>& tensors) {
  nlohmann::json out = config_fingerprint(cfg);
  std::string shapes;
  for (const auto& t : tensors)
    shapes += t.name + ":" + std::to_string(t.block) + ":" + std::to_string(t.rows) + "x" + std::to_string(t.cols) + "\n";
  out["model tensors"] = std::to_string(tensors.size()) + " tensors, " + blake2b(shapes.data(), shapes.size());
  return out;
}

std::string fingerprint_differences(const nlohmann::json& mine, const nlohmann::json& run, const std::string& mine_label,
                                    const std::string& run_label) {
  std::set<std::string> keys;
  for (const auto& [k, v] : mine.items()) keys.insert(k);
  for (const auto& [k, v] : run.items()) keys.insert(k);
  std::string out;
  auto show = [](const nlohmann::json& j, const std::string& k) {
    return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("(not set)");
  };
  for (const auto& k : keys) {
    const std::string a = show(mine, k), b = show(run, k);
    if (a != b) out += (out.empty() ? "" : "; ") + k + ": " + mine_label + " " + a + ", " + run_label + " " + b;
  }
  return out;
}

}  // namespace loco
