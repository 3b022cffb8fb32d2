#include "model/config.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loco {

void ModelConfig::validate(const std::string& source) const {
  auto need = [&](bool ok, const std::string& key, const std::string& what) {
    if (!ok) fail(source + ": model." + key + " " + what);
  };
  need(vocab_size >= 2, "vocab_size", "must be >= 2, got " + std::to_string(vocab_size));
  need(hidden_size >= 2, "hidden_size", "must be >= 2, got " + std::to_string(hidden_size));
  need(num_layers >= 1 && num_layers <= 100000, "num_layers", "must be in [1, 100000], got " + std::to_string(num_layers));
  need(num_heads >= 1, "num_heads", "must be >= 1, got " + std::to_string(num_heads));
  need(hidden_size % num_heads == 0, "num_heads",
       "must divide hidden_size (" + std::to_string(hidden_size) + "), got " + std::to_string(num_heads));
  need(head_dim() % 2 == 0, "num_heads",
       "must give an even head size for RoPE, got head size " + std::to_string(head_dim()));
  need(num_kv_heads >= 0 && num_kv_heads <= num_heads && num_heads % kv_heads() == 0, "num_kv_heads",
       "must divide num_heads (" + std::to_string(num_heads) + "), or be 0 for num_heads, got " +
           std::to_string(num_kv_heads));
  need(intermediate_size >= 1, "intermediate_size", "must be >= 1, got " + std::to_string(intermediate_size));
  need(max_seq_len >= 1, "max_seq_len", "must be >= 1, got " + std::to_string(max_seq_len));
  need(rms_eps > 0 && rms_eps < 1, "rms_eps", "must be in (0, 1)");
  need(rope_theta > 1, "rope_theta", "must be > 1");
  need(z_loss >= 0, "z_loss", "must be >= 0");
  need(init_std > 0, "init_std", "must be > 0");
}

double ModelConfig::block_parameter_count() const {
  const double d = hidden_size, f = intermediate_size;
  // Key/value width (d without grouped-query attention; no division by an unchecked count).
  const double kv = num_kv_heads > 0 && num_heads > 0 ? d * num_kv_heads / num_heads : d;
  return 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d + (qk_norm ? 2.0 * head_dim() : 0.0);
}

double ModelConfig::stage_parameter_count(double blocks, bool embedding, bool head) const {
  const double d = hidden_size, V = vocab_size;
  // The head is lm_head, or the tied embedding (a copy unless this stage also holds it).
  const bool head_matrix = head && (!tie_embeddings || !embedding);
  return blocks * block_parameter_count() + (embedding ? V * d : 0.0) + (head_matrix ? V * d : 0.0) + (head ? d : 0.0);
}

double ModelConfig::parameter_count() const { return stage_parameter_count(num_layers, true, true); }

nlohmann::json model_config_to_hf_json(const ModelConfig& c) {
  nlohmann::json j;
  // With QK-norm the model is Qwen3's architecture (Llama's, plus an RMSNorm over each head's q
  // and k before RoPE, weights shared by the heads), and says so: Llama's loader would drop the
  // q_norm/k_norm tensors without a word.
  j["architectures"] = {c.qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = c.qk_norm ? "qwen3" : "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.kv_heads();
  j["head_dim"] = c.head_dim();
  j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["torch_dtype"] = "float32";
  j["qk_norm"] = c.qk_norm;
  j["loco_z_loss"] = c.z_loss;
  j["initializer_range"] = c.init_std;
  j["loco_scale_residual_init"] = c.scale_residual_init;
  return j;
}

namespace {

template <class T>
T get_key(const nlohmann::json& j, const char* key, const std::string& source, bool required, T fallback) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) fail(source + ": missing key \"" + key + "\"");
    return fallback;
  }
  try {
    if constexpr (std::is_same_v<T, int>) {
      if (!it->is_number_integer()) fail(source + ": key \"" + key + "\" must be an integer, got " + it->dump());
      const int64_t v = it->get<int64_t>();
      if (v < INT32_MIN || v > INT32_MAX) fail(source + ": key \"" + key + "\" is out of range: " + it->dump());
      return int(v);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) fail(source + ": key \"" + key + "\" must be true or false, got " + it->dump());
      return it->get<bool>();
    } else {
      if (!it->is_number()) fail(source + ": key \"" + key + "\" must be a number, got " + it->dump());
      return it->get<T>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail(source + ": key \"" + key + "\": " + e.what());
  }
}

}  // namespace

ModelConfig model_config_from_hf_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) fail(source + ": expected a JSON object");
  ModelConfig c;
  c.vocab_size = get_key<int>(j, "vocab_size", source, true, 0);
  c.hidden_size = get_key<int>(j, "hidden_size", source, true, 0);
  c.num_layers = get_key<int>(j, "num_hidden_layers", source, true, 0);
  c.num_heads = get_key<int>(j, "num_attention_heads", source, true, 0);
  c.intermediate_size = get_key<int>(j, "intermediate_size", source, true, 0);
  c.max_seq_len = get_key<int>(j, "max_position_embeddings", source, false, c.max_seq_len);
  c.rms_eps = get_key<double>(j, "rms_norm_eps", source, false, c.rms_eps);
  c.rope_theta = get_key<double>(j, "rope_theta", source, false, c.rope_theta);
  c.tie_embeddings = get_key<bool>(j, "tie_word_embeddings", source, false, c.tie_embeddings);
  // Qwen3's configs have QK-norm without a key for it; loco's say "qk_norm" too.
  const bool qwen3 = j.contains("model_type") && j["model_type"] == "qwen3";
  c.qk_norm = get_key<bool>(j, "qk_norm", source, false, qwen3);
  c.z_loss = get_key<double>(j, "loco_z_loss", source, false, c.z_loss);
  c.init_std = get_key<double>(j, "initializer_range", source, false, c.init_std);
  c.scale_residual_init = get_key<bool>(j, "loco_scale_residual_init", source, false, c.scale_residual_init);
  // Stored as 0 when every query head has its own key/value head, as a TOML config says it.
  const int kv_heads = get_key<int>(j, "num_key_value_heads", source, false, c.num_heads);
  if (kv_heads < 1 || c.num_heads < 1 || c.num_heads % kv_heads != 0)
    fail(source + ": num_key_value_heads must divide num_attention_heads (" + std::to_string(c.num_heads) + "), got " +
         std::to_string(kv_heads));
  c.num_kv_heads = kv_heads == c.num_heads ? 0 : kv_heads;
  if (j.contains("head_dim") && c.num_heads > 0 && c.hidden_size % c.num_heads == 0) {
    const int hd = get_key<int>(j, "head_dim", source, false, 0);
    if (hd != c.hidden_size / c.num_heads) fail(source + ": head_dim must equal hidden_size / num_attention_heads");
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") fail(source + ": hidden_act must be \"silu\"");
  if (get_key<bool>(j, "attention_bias", source, false, false) || get_key<bool>(j, "mlp_bias", source, false, false))
    fail(source + ": biases are not supported");
  c.validate(source);
  return c;
}

ModelConfig read_hf_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path + ": cannot open");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    fail(path + ": invalid JSON (" + std::string(e.what()) + ")");
  }
  return model_config_from_hf_json(j, path);
}

}  // namespace loco
