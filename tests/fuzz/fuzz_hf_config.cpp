// Hugging Face config.json files as loco reads them from checkpoints.
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "model/config.h"

LOCO_FUZZ_TARGET({
  const auto j = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  const auto c = loco::model_config_from_hf_json(j, "fuzz/config.json");
  c.validate("fuzz/config.json");
  if (loco::model_config_from_hf_json(loco::model_config_to_hf_json(c), "again") .parameter_count() !=
      c.parameter_count())
    __builtin_trap();
})
