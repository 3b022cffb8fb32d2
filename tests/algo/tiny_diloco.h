#pragma once
// The DiLoCo run of the algo tests: a one-block model of 8 hidden units, H = 5, outer lr 0.7 and
// Nesterov momentum 0.9 (docs/diloco.md).
#include "algo/run_config.h"

inline loco::RunConfig tiny_diloco_config() {
  loco::RunConfig cfg;
  cfg.model.vocab_size = 16;
  cfg.model.hidden_size = 8;
  cfg.model.num_layers = 1;
  cfg.model.num_heads = 2;
  cfg.model.intermediate_size = 8;
  cfg.data.seq_len = 4;
  cfg.data.batch_size = 1;
  cfg.algorithm = "diloco";
  cfg.outer.inner_steps = 5;
  cfg.outer.lr = 0.7;
  cfg.outer.momentum = 0.9;
  cfg.outer.nesterov = true;
  return cfg;
}
