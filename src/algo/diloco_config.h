#pragma once
// DiLoCo's settings: the run config's outer.* section (the outer optimizer, the rounds, how the
// replicas' contributions are combined and screened, and the codec that Streaming DiLoCo sends
// them with). Streaming DiLoCo reads all of it, NoLoCo its screening keys. Keys and checks:
// diloco.cpp.
#include <cstdint>
#include <string>

#include "io/config_schema.h"

namespace loco {

struct RunConfig;

struct OuterConfig {
  int64_t inner_steps = 100;        // H: inner steps per outer round
  // eta and mu: the quality-parity study's best at every M (docs/results/parity-32k.md), for
  // diloco and streaming alike; the papers used 0.7 (DiLoCo) or 0.4 (Streaming DiLoCo) with 0.9.
  double lr = 0.6;
  double momentum = 0.4;
  bool nesterov = true;
  std::string codec = "fp32";       // outer-gradient encoding (streaming)
  std::string reduce = "auto";      // encoded outer gradients: auto, all-gather, reduce-scatter
  std::string rounding = "nearest";
  int block = 128;                  // values per shared scale
  double keep_fraction = 0.1;       // random-drop, topk
  int64_t start_step = 0;           // diloco: data-parallel steps before the first round
  std::string aggregate = "mean";   // diloco: mean, trimmed-mean, median, centered-clip (algo/robust.h)
  double trim = 0.25;               // trimmed-mean: fraction dropped at each end
  std::string screen = "auto";      // diloco: reject non-finite and outlying contributions: auto, on, off
  double reject_norm = 3;           // screening: norm above this times the round's median (0: off)
  std::string fault;                // replicas that misbehave on purpose (comm/fault.h)
  int faulty_replicas = 1;          // outer.fault applies to the last this many replicas
};

// Declares the section's keys (types, ranges, meanings) into `s`, bound to `c`.
void add_outer_keys(ConfigSchema& s, OuterConfig& c);
// The checks across keys that involve the section, on every run configuration (a key set for
// another method is refused), through `need`.
void check_outer_config(const RunConfig& c, const ConfigCheck& need);

}  // namespace loco
