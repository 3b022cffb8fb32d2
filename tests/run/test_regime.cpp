// The start-of-run warnings for settings where the quality-parity study found low-communication
// methods trailing data-parallel training.
#include <gtest/gtest.h>

#include "run/regime.h"

using namespace loco;

namespace {

RunConfig config(const std::string& algorithm, int batch, int seq, int64_t steps) {
  RunConfig cfg;
  cfg.algorithm = algorithm;
  cfg.data.batch_size = batch;
  cfg.data.seq_len = seq;
  cfg.train.steps = steps;
  return cfg;
}

bool mentions(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(Regime, SmallPerReplicaBatchOfALowCommunicationMethodIsWarned) {
  // 16 x 128 = 2,048 tokens per replica, 4 replicas, 40 tokens per parameter: only the batch.
  const auto w = regime_warnings(config("diloco", 16, 128, 1000), 4, 204800);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(mentions(w, "diloco with 2,048 tokens per replica per step (fewer than 16,384)"));
  EXPECT_TRUE(mentions(w, "docs/results/parity-32k.md"));
  // The study's M = 4 (8,192 tokens per replica, 20.4 tokens per parameter) ended 8.6% above.
  EXPECT_TRUE(mentions(regime_warnings(config("diloco", 64, 128, 337), 4, 541536), "(fewer than 16,384)"));
  for (const char* a : {"streaming", "noloco"}) EXPECT_EQ(regime_warnings(config(a, 16, 128, 1000), 4, 204800).size(), 1u);
}

TEST(Regime, NoWarningAtTheStudysParitySettingsOrWithoutCommunication) {
  // 128 x 128 = 16,384 per replica, 2 replicas, 20.4 tokens per parameter (the study's M = 2).
  EXPECT_TRUE(regime_warnings(config("diloco", 128, 128, 337), 2, 541536).empty());
  // Data-parallel training synchronizes every step: no per-replica batch warning.
  EXPECT_TRUE(regime_warnings(config("ddp", 4, 128, 100000), 4, 541536).empty());
  // One replica: nothing to compare.
  EXPECT_TRUE(regime_warnings(config("diloco", 4, 128, 10), 1, 541536).empty());
}

TEST(Regime, ShortBudgetIsWarnedWithItsTokensPerParameter) {
  // 64 x 128 x 4 x 100 = 3.28M tokens for 541,536 parameters: 6.1 per parameter.
  const auto w = regime_warnings(config("ddp", 64, 128, 100), 4, 541536);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(mentions(w, "a budget of 6.1 tokens per parameter (fewer than 20"));
}
