#pragma once
// A run directory as `loco report` reads it: metrics.jsonl (required), summary.json,
// config.toml and invocations.jsonl when present; plus what the report derives from the config.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loco::report {

struct Run {
  std::string dir, name;
  int color = 0;
  std::vector<nlohmann::json> metrics;
  nlohmann::json summary;                     // null when the run has not finished a segment
  std::map<std::string, std::string> config;  // flattened "table.key" -> value as written in config.toml
  std::string config_text;
  std::vector<nlohmann::json> invocations;    // invocations.jsonl: what trained the run, start and resumes

  // A config value without TOML quotes ("" when the key is not in config.toml).
  std::string setting(const std::string& key) const;
  // The transport the run used: the summary's backend, else config's distributed.backend.
  std::string backend() const;
};

// Fails naming the file when `dir` is not a run or one of its files is malformed.
Run load_run(const std::string& dir);

// summary.json as loco writes it (docs/metrics.md), read from `path`: an object with a `workers`
// list of objects; `replicas`, `stages` and each worker's `rank`, `stage`, `replica` whole numbers
// in range; `steps`, `tokens`, `seconds` and the workers' traffic, times and compute utilization
// finite and >= 0. Fails naming the file and the value.
nlohmann::json read_summary(const std::string& path);
// j[key] of a summary read by read_summary, failing "SOURCE: WHERE has no KEY" when it is missing
// or null.
const nlohmann::json& required(const nlohmann::json& j, const char* key, const std::string& source,
                               const std::string& where);

double num_or(const nlohmann::json& j, const char* key, double fallback);
std::string str_or(const nlohmann::json& j, const char* key, const std::string& fallback);

// Whether config key `key` can change what run `r` computes or measures: keys of other methods
// (outer.* for ddp, noloco.* for diloco, ...), of the elastic backend in runs that are not
// elastic, of a pipeline with one stage, of protocol models with protocol.rank 0, and so on do not.
bool key_applies(const std::string& key, const Run& r);

// The run's emulated link as a reader wants it: "none" (no link model), or bandwidth, latency
// and whether TCP is emulated, e.g. "100Mbit, 30ms, TCP".
std::string network_text(const Run& r);

}  // namespace loco::report
