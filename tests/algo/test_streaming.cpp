// Streaming DiLoCo: the fragment schedule of spec 02-streaming.md, and a pinned regression for
// every (tau, alpha) in {0, 1} x {0, 0.5, 1}: loco's 2-replica run against an independent
// serial reference written here (its own fragment/overlap/outer logic, in double precision;
// inner steps use the engine, whose gradients and AdamW are verified against PyTorch).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "algo/streaming.h"
#include "algo/trainer.h"
#include "core/error.h"
#include "core/parallel.h"
#include "data/loader.h"
#include "data/token_file.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

using namespace loco;

TEST(StreamingPlan, FragmentsAndOffsets) {
  const auto strided = plan_fragments(6, 3, "strided", 100);
  ASSERT_EQ(strided.size(), 3u);
  EXPECT_EQ(strided[0].blocks, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(strided[1].blocks, (std::vector<int>{1, 3, 5}));
  EXPECT_TRUE(strided[2].nonblock);
  EXPECT_TRUE(strided[2].blocks.empty());
  EXPECT_EQ(strided[0].offset, 0);
  EXPECT_EQ(strided[1].offset, 33);
  EXPECT_EQ(strided[2].offset, 66);
  const auto seq = plan_fragments(7, 3, "sequential", 30);
  ASSERT_EQ(seq.size(), 4u);
  EXPECT_EQ(seq[0].blocks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(seq[1].blocks, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(seq[2].blocks, (std::vector<int>{6}));
  EXPECT_EQ(seq[3].offset, 22);
  // The spec's 2-fragment example (one block fragment + the non-block one), H = 100:
  // syncs at 100, 200 and at 150, 250.
  const auto two = plan_fragments(3, 3, "strided", 100);
  ASSERT_EQ(two.size(), 2u);
  std::vector<int64_t> a, b;
  for (int64_t t = 1; t <= 300; ++t) {
    if (syncs_at(two[0], t, 100)) a.push_back(t);
    if (syncs_at(two[1], t, 100)) b.push_back(t);
  }
  EXPECT_EQ(a, (std::vector<int64_t>{100, 200, 300}));
  EXPECT_EQ(b, (std::vector<int64_t>{150, 250}));
  const auto whole = plan_fragments(4, 0, "strided", 10);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_TRUE(whole[0].nonblock);
  EXPECT_EQ(whole[0].blocks.size(), 4u);
  EXPECT_EQ(worker_tau(1, "", 3, 4), 1);
  EXPECT_EQ(worker_tau(1, "0,2,5,1", 2, 4), 5);
  EXPECT_THROW(worker_tau(1, "0,2", 0, 4), Error);
}

namespace {

constexpr int kReplicas = 2, kSteps = 12, kH = 6;

RunConfig tiny_config(const std::string& dir, int tau, double alpha) {
  RunConfig c;
  c.algorithm = "streaming";
  c.model.vocab_size = 64;
  c.model.hidden_size = 16;
  c.model.num_layers = 4;
  c.model.num_heads = 2;
  c.model.intermediate_size = 32;
  c.model.max_seq_len = 8;
  c.data = {dir + "/train.tok", "", 8, 2, 77};
  c.optim.lr = 0.01;
  c.optim.min_lr = 0.001;
  c.optim.warmup_steps = 2;
  c.train.steps = kSteps;
  c.train.log_interval = 1;
  c.train.eval_interval = 0;
  c.train.checkpoint_interval = 0;
  c.train.out_dir = dir + "/run";
  c.train.threads = 1;
  c.distributed.replicas = kReplicas;
  c.outer = {kH, 0.7, 0.9, true};
  c.streaming.fragment_blocks = 2;
  c.streaming.pattern = "strided";
  c.streaming.tau = tau;
  c.streaming.alpha = alpha;
  return c;
}

// The reference: M replicas trained one after the other in this thread.
std::vector<double> reference_outer_params(const RunConfig& c, const std::vector<int32_t>& tokens) {
  set_compute_threads(1);
  Transformer model(c.model);
  const auto& layout = model.layout();
  const size_t n = size_t(layout.size());
  auto toks = std::make_shared<const std::vector<int32_t>>(tokens);
  std::vector<std::vector<float>> p(kReplicas, std::vector<float>(n));
  std::vector<AdamW> opt;
  std::vector<DataLoader> data;
  for (int r = 0; r < kReplicas; ++r) {
    model.init_params(p[size_t(r)].data(), uint64_t(c.train.seed));
    opt.emplace_back(c.optim.adamw, layout);
    data.emplace_back(toks, c.data.seq_len, c.data.batch_size, r, kReplicas, uint64_t(c.data.seed));
  }
  std::vector<double> theta(p[0].begin(), p[0].end()), v(n, 0.0);
  // Fragments for L = 4, |p| = 2, strided: {0, 2}, {1, 3}, then the non-block parameters;
  // offsets 0, H/3, 2H/3.
  std::vector<std::vector<Range>> frag = {{layout.block_range(0), layout.block_range(2)},
                                          {layout.block_range(1), layout.block_range(3)},
                                          layout.nonblock_ranges()};
  const int64_t offset[3] = {0, kH / 3, 2 * kH / 3};
  const double eta = c.outer.lr, mu = c.outer.momentum, alpha = c.streaming.alpha;
  const int64_t tau = c.streaming.tau;
  struct Pending {
    int j;
    int64_t apply_at;
    std::vector<double> avg;  // indexed like the flat buffer
  };
  std::vector<Pending> pending;
  auto average = [&](int j) {
    std::vector<double> avg(n, 0.0);
    for (const auto& r : frag[size_t(j)])
      for (int64_t i = r.begin; i < r.end; ++i)
        for (int m = 0; m < kReplicas; ++m) avg[size_t(i)] += double(p[size_t(m)][size_t(i)]) / kReplicas;
    return avg;
  };
  auto outer_and_merge = [&](int j, const std::vector<double>& avg, bool replace) {
    for (const auto& r : frag[size_t(j)])
      for (int64_t i = r.begin; i < r.end; ++i) {
        const double delta = theta[size_t(i)] - avg[size_t(i)];  // mean of theta - theta_m
        v[size_t(i)] = mu * v[size_t(i)] + delta;
        theta[size_t(i)] -= eta * (delta + mu * v[size_t(i)]);
        for (int m = 0; m < kReplicas; ++m) {
          float& local = p[size_t(m)][size_t(i)];
          local = replace ? float(theta[size_t(i)]) : float(alpha * local + (1 - alpha) * theta[size_t(i)]);
        }
      }
  };
  const LrSchedule sched{c.optim.lr, c.optim.min_lr, c.optim.warmup_steps, c.train.steps};
  Workspace ws(c.model, model.stage(), c.data.batch_size, c.data.seq_len);
  std::vector<float> g(n);
  std::vector<int32_t> in, tg;
  for (int64_t t = 1; t <= kSteps; ++t) {
    for (int m = 0; m < kReplicas; ++m) {
      std::fill(g.begin(), g.end(), 0.0f);
      data[size_t(m)].next(in, tg);
      model.forward(p[size_t(m)].data(), in.data(), nullptr, tg.data(), ws);
      model.backward(p[size_t(m)].data(), g.data(), in.data(), tg.data(), 1.0, nullptr, nullptr, ws);
      clip_grad_norm(g.data(), int64_t(n), c.optim.clip);
      opt[size_t(m)].step(p[size_t(m)].data(), g.data(), sched.at(t - 1));
    }
    const bool last = t == kSteps;
    for (size_t k = 0; k < pending.size();) {
      if (pending[k].apply_at <= t || last) {
        outer_and_merge(pending[k].j, pending[k].avg, tau == 0);
        pending.erase(pending.begin() + std::ptrdiff_t(k));
      } else {
        ++k;
      }
    }
    for (int j = 0; j < 3; ++j) {
      const bool due = t > offset[j] && (t - offset[j]) % kH == 0;
      if (!due && !last) continue;
      if (tau == 0 || last)
        outer_and_merge(j, average(j), true);
      else
        pending.push_back({j, t + tau, average(j)});
    }
  }
  return theta;
}

}  // namespace

TEST(Streaming, PinnedAgainstIndependentReference) {
  const std::string dir = ::testing::TempDir() + "/streaming-ref";
  std::filesystem::remove_all(dir);
  make_dirs(dir);
  std::vector<int32_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + i / 7) % 64);
  write_token_file(dir + "/train.tok", tokens, 64);
  std::vector<float> tau0;
  for (int tau : {0, 1})
    for (double alpha : {0.0, 0.5, 1.0}) {
      RunConfig cfg = tiny_config(dir, tau, alpha);
      std::filesystem::remove_all(cfg.train.out_dir);
      write_file_atomic(dir + "/c.toml", run_config_to_toml(cfg));
      TrainOptions o;
      o.config_path = dir + "/c.toml";
      o.quiet = true;
      const auto sum = run_training(o);
      const auto got = load_model_checkpoint(sum.checkpoint).params;
      const auto want = reference_outer_params(cfg, tokens);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (std::abs(want[i]) + 1e-2));
      EXPECT_LT(worst, 1e-4) << "tau " << tau << " alpha " << alpha;
      if (tau == 0) {
        // With tau = 0 the fragment is replaced: alpha plays no part.
        if (tau0.empty()) tau0 = got;
        EXPECT_EQ(got, tau0) << "alpha " << alpha;
      }
    }
}
