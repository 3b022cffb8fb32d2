// Run configs (TOML): read, validated, the stage partition derived, printed and read back to
// the same configuration.
#include "fuzz_common.h"
#include "algo/run_config.h"
#include "pipeline/grid.h"

LOCO_FUZZ_TARGET({
  loco::RunConfig cfg;
  auto schema = loco::run_config_schema(cfg);
  schema.load_toml_string(input, "fuzz.toml");
  loco::validate_run_config(cfg, "fuzz.toml");
  loco::partition_stages(cfg.model, cfg.pipeline.stages, cfg.pipeline.split);
  const std::string printed = loco::run_config_to_toml(cfg);
  loco::RunConfig again;
  auto schema2 = loco::run_config_schema(again);
  schema2.load_toml_string(printed, "printed.toml");
  if (loco::run_config_to_toml(again) != printed) __builtin_trap();  // printing must round-trip
})
