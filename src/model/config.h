#pragma once
// The model architecture of docs/model.md. Serialized as a Hugging Face LlamaForCausalLM
// config.json (plus a few loco keys) and read from the [model] table of a TOML run config.
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace loco {

struct ModelConfig {
  int vocab_size = 4096;
  int hidden_size = 256;         // d
  int num_layers = 6;            // L
  int num_heads = 8;             // head size d / num_heads
  int num_kv_heads = 0;          // key/value heads (grouped-query attention); 0: num_heads
  int intermediate_size = 688;   // SwiGLU hidden f
  int max_seq_len = 1024;        // max_position_embeddings
  bool tie_embeddings = false;
  bool qk_norm = false;
  double rms_eps = 1e-5;
  double rope_theta = 10000.0;
  double z_loss = 0.0;           // coefficient c of c * mean(logsumexp^2)
  double init_std = 0.02;
  bool scale_residual_init = true;  // o_proj and down_proj init std scaled by 1/sqrt(2L)

  int head_dim() const { return hidden_size / num_heads; }
  // Key/value heads, each shared by num_heads / kv_heads() query heads, and their width.
  int kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int kv_dim() const { return kv_heads() * head_dim(); }
  // Parameters of the whole model, and of a stage holding `blocks` blocks and maybe the
  // embedding and/or the final norm and head (in double: a config read from outside may
  // describe a model far too large to lay out).
  double parameter_count() const;
  double stage_parameter_count(double blocks, bool embedding, bool head) const;
  double block_parameter_count() const;
  // Throws loco::Error naming `source` and the offending key.
  void validate(const std::string& source) const;
};

nlohmann::json model_config_to_hf_json(const ModelConfig& c);
// Reads a config.json written by loco or by Hugging Face for a Llama model.
ModelConfig model_config_from_hf_json(const nlohmann::json& j, const std::string& source);
ModelConfig read_hf_config_file(const std::string& path);

}  // namespace loco
