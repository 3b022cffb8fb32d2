#include <gtest/gtest.h>

#include "../tolerance.h"

#include <cmath>

#include "optim/adamw.h"
#include "optim/schedule.h"

using namespace loco;

TEST(Schedule, WarmupThenCosine) {
  LrSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  LOCO_EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway through the cosine
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  for (int64_t t = 10; t < 110; ++t) EXPECT_GE(s.at(t), s.at(t + 1));
}

TEST(Clip, ScalesToMaxNorm) {
  std::vector<float> g = {3, 4};
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 2, 10.0), 5.0);
  EXPECT_EQ(g, (std::vector<float>{3, 4}));  // below the limit: untouched
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 2, 1.0), 5.0);
  LOCO_EXPECT_NEAR(std::sqrt(g[0] * g[0] + g[1] * g[1]), 1.0, 1e-6);
  LOCO_EXPECT_NEAR(g[0] / g[1], 0.75, 1e-6);
}

TEST(AdamW, FirstStepMovesByLrAndDecayOnlyMatrices) {
  ModelConfig c;
  c.vocab_size = 8;
  c.hidden_size = 4;
  c.num_layers = 1;
  c.num_heads = 1;
  c.intermediate_size = 4;
  ParamLayout layout(c);
  std::vector<float> p(size_t(layout.size()), 1.0f), g(p.size(), 0.5f);
  AdamWConfig oc;
  oc.weight_decay = 0.1;
  AdamW opt(oc, layout);
  opt.step(p.data(), g.data(), 0.01);
  // Bias-corrected first step: update = lr * sign(g) (up to eps); decay 1 - lr * wd on matrices.
  for (const auto& t : layout.tensors()) {
    const float expect = t.is_matrix() ? 1.0f * (1.0f - 0.001f) - 0.01f : 1.0f - 0.01f;
    LOCO_EXPECT_NEAR(p[t.offset], expect, 1e-6) << t.name;
  }
  EXPECT_EQ(opt.steps(), 1);
}
