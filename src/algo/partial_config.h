#pragma once
// Partial parameter updates' settings: the run config's partial.* section (slices of the MLPs,
// and of the heads), taken by DiLoCo and Streaming DiLoCo. Keys and checks: partial.cpp.
#include <cstdint>
#include <string>

#include "io/config_schema.h"

namespace loco {

struct RunConfig;

struct PartialConfig {
  int slices = 1;                // N: node k trains slice k mod N of the sliced matrices
  std::string strategy = "mlp";  // mlp, or mlp+heads (also q/k/v by head groups)
};

// Declares the section's keys (types, ranges, meanings) into `s`, bound to `c`.
void add_partial_keys(ConfigSchema& s, PartialConfig& c);
// The checks across keys that involve the section, on every run configuration (a key set for
// another method is refused), through `need`.
void check_partial_config(const RunConfig& c, const ConfigCheck& need);

}  // namespace loco
