#pragma once
// Model checkpoints: DIR/config.json (Hugging Face Llama config) + DIR/model.safetensors
// (Hugging Face names and (out, in) shapes). Conversion from loco's internal layout (down_proj
// stored transposed) happens here and only here.
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/layout.h"

namespace loco {

struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Every tensor of `layout` copied out of `buffer` (parameters or gradients) in HF layout.
std::vector<HfTensor> export_hf(const ParamLayout& layout, const float* buffer);
std::vector<TensorRef> tensor_refs(const std::vector<HfTensor>& tensors);
// Fails unless the file holds exactly the tensors of `layout` (names, F32, HF shapes).
void check_hf_tensors(const ParamLayout& layout, const SafetensorsReader& file);
// Fills `buffer` from a safetensors file holding every tensor of `layout` in HF layout.
void import_hf(const ParamLayout& layout, const SafetensorsReader& file, float* buffer);

void save_model_checkpoint(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                           const float* params);

struct LoadedModel {
  ModelConfig config;
  std::vector<float> params;  // full-model layout
};
LoadedModel load_model_checkpoint(const std::string& dir);

}  // namespace loco
