#include "io/checkpoint.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/memory.h"
#include "core/fs.h"

namespace loco {

static std::vector<int64_t> hf_shape(const TensorInfo& t) {
  if (!t.is_matrix()) return {t.numel()};
  return t.transposed ? std::vector<int64_t>{t.cols, t.rows} : std::vector<int64_t>{t.rows, t.cols};
}

std::vector<HfTensor> export_hf(const ParamLayout& layout, const float* buffer) {
  std::vector<HfTensor> out;
  for (const auto& t : layout.tensors()) {
    HfTensor h{t.name, hf_shape(t), std::vector<float>(size_t(t.numel()))};
    const float* src = buffer + t.offset;
    if (t.transposed) {
      for (int64_t r = 0; r < t.rows; ++r)
        for (int64_t c = 0; c < t.cols; ++c) h.data[c * t.rows + r] = src[r * t.cols + c];
    } else {
      std::copy_n(src, t.numel(), h.data.begin());
    }
    out.push_back(std::move(h));
  }
  return out;
}

std::vector<TensorRef> tensor_refs(const std::vector<HfTensor>& tensors) {
  std::vector<TensorRef> refs;
  for (const auto& t : tensors) refs.push_back({t.name, t.shape, t.data.data()});
  return refs;
}

void check_hf_tensors(const ParamLayout& layout, const SafetensorsReader& file) {
  std::set<std::string> expected;
  for (const auto& t : layout.tensors()) {
    expected.insert(t.name);
    if (!file.has(t.name)) fail(file.path() + ": missing tensor \"" + t.name + "\"");
    if (file.dtype(t.name) != "F32")
      fail(file.path() + ": tensor \"" + t.name + "\" has dtype " + file.dtype(t.name) + ", expected F32");
    if (file.shape(t.name) != hf_shape(t))
      fail(file.path() + ": tensor \"" + t.name + "\" has shape " + shape_str(file.shape(t.name)) + ", expected " +
           shape_str(hf_shape(t)));
  }
  for (const auto& name : file.names())
    if (!expected.count(name)) fail(file.path() + ": unexpected tensor \"" + name + "\" for this model config");
}

void import_hf(const ParamLayout& layout, const SafetensorsReader& file, float* buffer) {
  check_hf_tensors(layout, file);
  for (const auto& t : layout.tensors()) {
    const auto data = file.read_f32(t.name, hf_shape(t));
    float* dst = buffer + t.offset;
    if (t.transposed) {
      for (int64_t r = 0; r < t.rows; ++r)
        for (int64_t c = 0; c < t.cols; ++c) dst[r * t.cols + c] = data[c * t.rows + r];
    } else {
      std::copy(data.begin(), data.end(), dst);
    }
  }
}

void save_model_checkpoint(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                           const float* params) {
  make_dirs(dir);
  const auto tensors = export_hf(layout, params);
  write_safetensors(dir + "/model.safetensors", tensor_refs(tensors), {{"format", "pt"}});
  write_file_atomic(dir + "/config.json", model_config_to_hf_json(config).dump(2) + "\n");
}

LoadedModel load_model_checkpoint(const std::string& dir) {
  if (!file_exists(dir + "/config.json")) fail(dir + ": not a checkpoint directory (no config.json)");
  LoadedModel m;
  m.config = read_hf_config_file(dir + "/config.json");
  SafetensorsReader file(dir + "/model.safetensors");
  // The config must describe exactly the tensors present before the parameters are allocated.
  ParamLayout layout(m.config);
  check_hf_tensors(layout, file);
  require_memory(4.0 * double(layout.size()), 0, dir + ": a model of " + std::to_string(layout.size()) + " parameters",
                 "");
  m.params.assign(size_t(layout.size()), 0.0f);
  import_hf(layout, file, m.params.data());
  return m;
}

}  // namespace loco
