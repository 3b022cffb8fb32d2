#include "io/run_config.h"

#include "core/error.h"

namespace loco {

ConfigSchema run_config_schema(RunConfig& cfg) {
  ConfigSchema s;
  auto& m = cfg.model;
  s.add("model.vocab_size", &m.vocab_size, "vocabulary size V (must match the data's tokenizer)", 2);
  s.add("model.hidden_size", &m.hidden_size, "model width d", 2);
  s.add("model.num_layers", &m.num_layers, "number of transformer blocks L", 1);
  s.add("model.num_heads", &m.num_heads, "attention heads (head size d / heads, even)", 1);
  s.add("model.intermediate_size", &m.intermediate_size, "SwiGLU hidden size f", 1);
  s.add("model.max_seq_len", &m.max_seq_len, "longest sequence the model accepts", 1);
  s.add("model.tie_embeddings", &m.tie_embeddings, "output head shares the token embedding matrix");
  s.add("model.qk_norm", &m.qk_norm, "RMSNorm over each head's q and k before RoPE");
  s.add("model.rms_eps", &m.rms_eps, "RMSNorm epsilon", 1e-12, 0.1);
  s.add("model.rope_theta", &m.rope_theta, "RoPE base", 1.0001, 1e9);
  s.add("model.z_loss", &m.z_loss, "z-loss coefficient c in c * mean(logsumexp^2); 0 disables", 0.0, 1.0);
  s.add("model.init_std", &m.init_std, "std of the normal init of matrices", 1e-6, 1.0);
  s.add("model.scale_residual_init", &m.scale_residual_init, "scale o_proj/down_proj init by 1/sqrt(2L)");
  return s;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  RunConfig cfg;
  auto schema = run_config_schema(cfg);
  if (!path.empty()) schema.load_toml_file(path);
  for (const auto& o : overrides) schema.apply_override(o);
  cfg.model.validate(path.empty() ? "config" : path);
  return cfg;
}

ModelConfig read_model_config(const std::string& path) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return read_hf_config_file(path);
  return load_run_config(path).model;
}

}  // namespace loco
