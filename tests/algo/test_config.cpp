// Configs read from outside: what a fuzzer found in them stays fixed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "algo/run_config.h"
#include "model/config.h"

namespace loco {

TEST(RunConfig, PrintedStringsReadBackAsThemselves) {
  // A value with quotes, a backslash, a comment sign and control characters (found by the
  // run_config fuzz target: quotes were printed unescaped).
  RunConfig cfg;
  cfg.data.val = "len = 5  # a \"quoted\" \\ part\nand\ta\x01 line";
  const std::string printed = run_config_to_toml(cfg);
  RunConfig again;
  auto schema = run_config_schema(again);
  schema.load_toml_string(printed, "printed.toml");
  EXPECT_EQ(again.data.val, cfg.data.val);
  EXPECT_EQ(run_config_to_toml(again), printed);
}

TEST(HfConfig, NonBooleanBiasFlagsAreOneLineErrors) {
  // "attention_bias": 4 made a JSON type error escape as an exception of another kind.
  auto j = nlohmann::json::parse(R"({"vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "intermediate_size": 8, "attention_bias": 4})");
  try {
    model_config_from_hf_json(j, "config.json");
    FAIL() << "accepted a numeric attention_bias";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_bias\" must be true or false"), std::string::npos) << e.what();
  }
  j["attention_bias"] = true;
  EXPECT_THROW(model_config_from_hf_json(j, "config.json"), Error);  // biases are not supported
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  EXPECT_EQ(model_config_from_hf_json(j, "config.json").hidden_size, 8);
}

TEST(HfConfig, GroupedQueryAttentionConfigsRead) {
  // TinyLlama-1.1B's config.json (keys loco reads): 32 query heads sharing 4 key/value heads.
  auto j = nlohmann::json::parse(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
      "intermediate_size": 5632, "num_attention_heads": 32, "num_hidden_layers": 22,
      "num_key_value_heads": 4, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "vocab_size": 32000,
      "max_position_embeddings": 2048, "tie_word_embeddings": false, "hidden_act": "silu"})");
  const ModelConfig c = model_config_from_hf_json(j, "config.json");
  EXPECT_EQ(c.kv_heads(), 4);
  EXPECT_EQ(c.kv_dim(), 256);
  EXPECT_EQ(c.parameter_count(), 1100048384.0);  // the published 1.1B
  // Written back, it says the same.
  const auto again = model_config_from_hf_json(model_config_to_hf_json(c), "again.json");
  EXPECT_EQ(again.num_kv_heads, 4);
  EXPECT_EQ(model_config_to_hf_json(again), model_config_to_hf_json(c));
  // As many key/value heads as query heads is plain multi-head attention (stored as 0).
  j["num_key_value_heads"] = 32;
  EXPECT_EQ(model_config_from_hf_json(j, "config.json").num_kv_heads, 0);
  for (int bad : {3, 0, -4, 64}) {
    j["num_key_value_heads"] = bad;
    try {
      model_config_from_hf_json(j, "config.json");
      FAIL() << "accepted num_key_value_heads " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("num_key_value_heads must divide num_attention_heads"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace loco
