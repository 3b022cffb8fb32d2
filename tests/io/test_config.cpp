// Configs read from outside: what a fuzzer found in them stays fixed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/run_config.h"
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

}  // namespace loco
