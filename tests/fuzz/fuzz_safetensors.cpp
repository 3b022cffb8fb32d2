// safetensors as loco reads them: any file; as a model checkpoint of a small config; as a
// training state.
#include "fuzz_common.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/train_state.h"

LOCO_FUZZ_TARGET({
  loco::SafetensorsReader file(input, "fuzz.safetensors", false);
  for (const auto& name : file.names())
    if (file.dtype(name) == "F32") file.read_f32(name, file.shape(name));
  const auto state = loco::state_from_reader(file, "fuzz.safetensors");
  for (const auto& [key, value] : state.meta) state.get_int(key), state.get_double(key);
  const loco::ParamLayout layout(fuzz_model(1));
  std::vector<float> params(size_t(layout.size()));
  loco::import_hf(layout, file, params.data());
})
