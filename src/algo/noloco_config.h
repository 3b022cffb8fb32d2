#pragma once
// NoLoCo's settings: the run config's noloco.* section (outer step, groups, pipeline routing,
// evaluation, partner screening). Keys and checks: noloco.cpp.
#include <cstdint>
#include <string>

#include "io/config_schema.h"

namespace loco {

struct RunConfig;

struct NolocoConfig {
  int64_t inner_steps = 50;         // H (NoLoCo paper)
  double outer_lr = 0.7;            // beta
  double momentum = 0.5;            // alpha (heavy ball)
  double pull = -1;                 // gamma; -1: = beta (the authors' code)
  int group_size = 2;               // n: replicas averaged together (2: one partner)
  std::string routing = "random";   // random or fixed pipeline paths (pipeline.stages > 1)
  int64_t seed = 0;                 // groups and routes
  std::string eval = "shards";      // shards, replica0, average
  double reject_distance = 1.0;     // screening: partner weights farther than this x the norm of one's own
};

// Declares the section's keys (types, ranges, meanings) into `s`, bound to `c`.
void add_noloco_keys(ConfigSchema& s, NolocoConfig& c);
// The checks across keys that involve the section, on every run configuration (a key set for
// another method is refused), through `need`.
void check_noloco_config(const RunConfig& c, const ConfigCheck& need);

}  // namespace loco
