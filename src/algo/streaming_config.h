#pragma once
// Streaming DiLoCo's own settings: the run config's streaming.* section (fragments, overlap,
// merge, evaluation, offloading); it reads DiLoCo's outer.* too (diloco_config.h). Keys and
// checks: streaming.cpp.
#include <cstdint>
#include <string>

#include "io/config_schema.h"

namespace loco {

struct RunConfig;

struct StreamingConfig {
  int fragment_blocks = 3;          // |p|; 0: the whole model is one fragment
  std::string pattern = "strided";  // strided or sequential
  int64_t tau = 1;                  // inner steps between starting and applying a fragment's sync
  std::string worker_tau;           // per-replica tau, e.g. "1,1,3,3" ("" : all tau)
  double alpha = 0.5;               // merge factor of the overlapped local progress
  std::string eval = "outer";       // outer, replica0, average
  bool offload_outer = false;       // keep outer state in a scratch file, not in memory
};

// Declares the section's keys (types, ranges, meanings) into `s`, bound to `c`.
void add_streaming_keys(ConfigSchema& s, StreamingConfig& c);
// The checks across keys that involve the section, on every run configuration (a key set for
// another method is refused), through `need`.
void check_streaming_config(const RunConfig& c, const ConfigCheck& need);

}  // namespace loco
