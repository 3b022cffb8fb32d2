#pragma once
// The run configuration (TOML): every key is declared once in run_config.cpp with its type,
// range and meaning.
#include <string>

#include "io/config_schema.h"
#include "model/config.h"

namespace loco {

struct RunConfig {
  ModelConfig model;
};

// Binds every key of `cfg` into a schema (keep `cfg` alive while the schema is used).
ConfigSchema run_config_schema(RunConfig& cfg);
// Loads a TOML run config (only defaults if path is empty) and applies "key=value" overrides;
// the model section is validated.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
// A model config from either a TOML run config or a Hugging Face config.json.
ModelConfig read_model_config(const std::string& path);

}  // namespace loco
