#pragma once
// What the members of an elastic run must agree on, compared when a worker registers: every key
// of the run config except those that only concern the worker itself (where it writes, how it
// logs, its threads and precision, its timeouts, address and secrets, its emulated link), with
// the data files compared by content (a BLAKE2b digest of their tokens), not by path. The first
// member to register publishes its fingerprint in Redis with a MAC under the run key; every
// later one compares its own with it and is refused, the differing keys named, on a mismatch.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "algo/run_config.h"
#include "model/layout.h"

namespace loco {

// Keys (or "section." prefixes) whose values may differ between the members of a run.
const std::vector<std::string>& per_worker_keys();

// "N tokens, blake2b HEX": the tokens of a data file, as the fingerprint and a checkpoint
// (which a resume checks) record them.
std::string token_digest(const std::vector<int32_t>& tokens);

// key -> value as printed, plus "data.train tokens" / "data.val tokens" (token_digest, or
// "none" for no validation file).
nlohmann::json run_fingerprint(const RunConfig& cfg, const std::string& train_digest, const std::string& val_digest);

// A model loco does not hold (the Python layer, which reads its own data): the run config's keys
// as above, and instead of the data files the model's tensors (names and shapes, by digest).
nlohmann::json foreign_fingerprint(const RunConfig& cfg, const std::vector<ForeignTensor>& tensors);

// The keys on which `mine` and `run` differ, each with both values (named by the labels),
// "; "-separated ("" if none).
std::string fingerprint_differences(const nlohmann::json& mine, const nlohmann::json& run,
                                    const std::string& mine_label = "this worker",
                                    const std::string& run_label = "the run");

}  // namespace loco
