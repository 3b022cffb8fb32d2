// NoLoCo (docs/noloco.md): groups, the outer step against an independent reference of docs/noloco.md's
// equations, DiLoCo with heavy-ball momentum as the n = R case, bytes and peers per outer step
// at the transport, random routes.
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "algo/algorithm.h"
#include "algo/noloco.h"
#include "comm/communicator.h"
#include "comm/inprocess.h"
#include "core/rng.h"
#include "model/transformer.h"
#include "pipeline/executor.h"

namespace loco {
namespace {

constexpr int64_t kH = 4;

RunConfig small_config(int R, int group_size, const std::string& algorithm = "noloco") {
  RunConfig c;
  c.algorithm = algorithm;
  c.model.vocab_size = 64;
  c.model.hidden_size = 16;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.model.intermediate_size = 32;
  c.model.max_seq_len = 8;
  c.data = {"unused", "", 8, 2, 77};
  c.train.threads = 1;
  c.distributed.replicas = R;
  c.noloco.inner_steps = kH;
  c.noloco.outer_lr = 0.7;
  c.noloco.momentum = 0.5;
  c.noloco.pull = 0.6;  // unlike beta, so that a term taking the other's coefficient is caught
  c.noloco.group_size = group_size;
  c.noloco.seed = 5;
  c.outer.inner_steps = kH;
  c.outer.lr = 0.7;
  c.outer.momentum = 0.5;
  c.outer.nesterov = false;
  return c;
}

// Records the destination of every message a worker sends, by channel.
class RecordingTransport : public Transport {
 public:
  explicit RecordingTransport(std::unique_ptr<Transport> base) : base_(std::move(base)) {}
  int rank() const override { return base_->rank(); }
  int size() const override { return base_->size(); }
  SendTiming send(int peer, int channel, std::string message) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sent_to.push_back(peer);
    }
    return base_->send(peer, channel, std::move(message));
  }
  std::string recv(int peer, int channel, double timeout) override { return base_->recv(peer, channel, timeout); }
  void abort(const std::string& reason) override { base_->abort(reason); }
  std::string name() const override { return base_->name(); }
  const Clock& clock() const override { return base_->clock(); }
  std::vector<int> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(sent_to, {});
  }

 private:
  std::unique_ptr<Transport> base_;
  std::mutex mu_;
  std::vector<int> sent_to;
};

struct Rounds {
  std::vector<float> start;
  // Per outer step and replica: the parameters before the outer step (the "inner steps").
  std::vector<std::vector<std::vector<float>>> local;
  // Per outer step and replica: parameters after it; bytes sent by operation; peers sent to.
  std::vector<std::vector<std::vector<float>>> after;
  std::vector<std::vector<int64_t>> progress_bytes, weight_bytes;
  std::vector<std::vector<std::vector<int>>> peers;
};

// R workers take `steps` outer steps of `cfg.algorithm`, with random local progress before
// each (the same on every algorithm for a seed).
Rounds run_rounds(const RunConfig& cfg, int steps) {
  const int R = cfg.distributed.replicas;
  const ParamLayout layout(cfg.model);
  const size_t n = size_t(layout.size());
  Rounds r;
  r.start.resize(n);
  Transformer(cfg.model).init_params(r.start.data(), 1);
  r.local.assign(size_t(steps), std::vector<std::vector<float>>(size_t(R)));
  r.after = r.local;
  r.progress_bytes.assign(size_t(steps), std::vector<int64_t>(size_t(R)));
  r.weight_bytes = r.progress_bytes;
  r.peers.assign(size_t(steps), std::vector<std::vector<int>>(size_t(R)));
  auto base = make_inprocess_transports(R);
  auto tokens = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>(200, 1));
  std::vector<std::thread> threads;
  for (int m = 0; m < R; ++m)
    threads.emplace_back([&, m] {
      auto rec = std::make_shared<RecordingTransport>(std::move(base[size_t(m)]));
      Communicator comm(rec, {}, nullptr);
      Worker w(cfg, comm, tokens);
      auto algo = make_algorithm(cfg, w);
      w.params = r.start;
      algo->start(w, false);
      int64_t progress = 0, weights = 0;
      for (int k = 0; k < steps; ++k) {
        Rng rng(uint64_t(1000 * k + m));
        for (auto& x : w.params) x += float(0.01 * rng.normal());
        r.local[size_t(k)][size_t(m)] = w.params;
        algo->after_step(w, (k + 1) * kH, k + 1 == steps);
        r.after[size_t(k)][size_t(m)] = w.params;
        if (cfg.algorithm == "noloco") {
          // Wait for the weights sent for the next step before counting (they are sent right
          // after this outer step, on the communication thread).
          TrainingState st;
          algo->save_state(st);
        }
        const auto ops = comm.traffic().to_json()["by_operation"];
        auto bytes = [&](const char* op) { return ops.contains(op) ? ops[op]["bytes_sent"].get<int64_t>() : 0; };
        r.progress_bytes[size_t(k)][size_t(m)] = bytes("outer_progress") - progress;
        r.weight_bytes[size_t(k)][size_t(m)] = bytes("outer_weights") - weights;
        progress = bytes("outer_progress");
        weights = bytes("outer_weights");
        r.peers[size_t(k)][size_t(m)] = rec->take();
      }
    });
  for (auto& t : threads) t.join();
  return r;
}

// docs/noloco.md's equations in double precision, for every replica and outer step.
std::vector<std::vector<std::vector<double>>> reference(const RunConfig& cfg, const Rounds& r) {
  const int R = cfg.distributed.replicas, steps = int(r.local.size());
  const size_t n = r.start.size();
  const double beta = cfg.noloco.outer_lr, alpha = cfg.noloco.momentum, gamma = cfg.noloco.pull;
  std::vector<std::vector<double>> phi(size_t(R), std::vector<double>(r.start.begin(), r.start.end()));
  std::vector<std::vector<double>> delta(size_t(R), std::vector<double>(n, 0.0));
  std::vector<std::vector<std::vector<double>>> out;
  for (int k = 0; k < steps; ++k) {
    const auto groups = noloco_groups(R, cfg.noloco.group_size, uint64_t(cfg.noloco.seed), k + 1);
    auto next = phi;
    for (const auto& g : groups)
      for (int i : g)
        for (size_t p = 0; p < n; ++p) {
          double mean_d = 0, mean_phi = 0;
          for (int j : g) {
            mean_d += (double(r.local[size_t(k)][size_t(j)][p]) - phi[size_t(j)][p]) / double(g.size());
            mean_phi += phi[size_t(j)][p] / double(g.size());
          }
          delta[size_t(i)][p] = alpha * delta[size_t(i)][p] + beta * mean_d - gamma * (phi[size_t(i)][p] - mean_phi);
          next[size_t(i)][p] = phi[size_t(i)][p] + delta[size_t(i)][p];
        }
    phi = next;
    out.push_back(phi);
  }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

}  // namespace

TEST(Noloco, GroupsPartitionTheReplicasForEverySeedAndStep) {
  for (int R = 1; R <= 13; ++R)
    for (int n = 2; n <= 5; ++n)
      for (uint64_t seed = 0; seed < 12; ++seed)
        for (int64_t k = 1; k <= 15; ++k) {
          const auto groups = noloco_groups(R, n, seed, k);
          std::vector<int> all;
          for (const auto& g : groups) {
            EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
            all.insert(all.end(), g.begin(), g.end());
            // Every member derives the same group.
            for (int m : g) EXPECT_EQ(noloco_group_of(R, n, seed, k, m), g);
          }
          std::sort(all.begin(), all.end());
          std::vector<int> expect(static_cast<size_t>(R));
          for (int i = 0; i < R; ++i) expect[size_t(i)] = i;
          ASSERT_EQ(all, expect) << "R " << R << " n " << n;
          // Groups of n; the replicas left over join the last group (none idle).
          ASSERT_EQ(int(groups.size()), std::max(1, R / n));
          for (size_t g = 0; g + 1 < groups.size(); ++g) EXPECT_EQ(int(groups[g].size()), n);
          EXPECT_EQ(int(groups.back().size()), R < n ? R : n + R % n);
        }
  // Partners change between outer steps.
  std::set<std::vector<int>> seen;
  for (int64_t k = 1; k <= 20; ++k) seen.insert(noloco_group_of(8, 2, 0, k, 0));
  EXPECT_GT(seen.size(), 3u);
}

TEST(Noloco, OuterStepsMatchTheSpecsEquations) {
  // Two outer steps (the second with unequal slow weights, so the pull term acts) for groups of
  // two and three, and for R = 4 and 5 in pairs (5: one group of three).
  for (auto [R, n] : std::vector<std::pair<int, int>>{{2, 2}, {3, 3}, {4, 2}, {5, 2}}) {
    const RunConfig cfg = small_config(R, n);
    const Rounds r = run_rounds(cfg, 3);
    const auto ref = reference(cfg, r);
    for (int k = 0; k < 3; ++k)
      for (int m = 0; m < R; ++m)
        LOCO_EXPECT_BELOW(max_diff(r.after[size_t(k)][size_t(m)], ref[size_t(k)][size_t(m)]), 2e-6)
            << "R " << R << " n " << n << " outer step " << k + 1 << " replica " << m;
    // Replicas in different groups differ (the spread is real).
    if (R >= 4) {
      std::set<std::vector<float>> distinct(r.after[2].begin(), r.after[2].end());
      EXPECT_GT(distinct.size(), 1u);
    }
  }
}

TEST(Noloco, PullTermMovesSlowWeightsTowardTheGroupMean) {
  // beta = alpha = 0: delta = -gamma (phi_i - mean); a sign error would push them apart.
  const std::vector<float> a = {1, 2, 3}, b = {3, 2, -1}, zero = {0, 0, 0};
  std::vector<float> phi = a, delta = zero, theta = zero;
  noloco_outer_step({phi.data(), b.data()}, {zero.data(), zero.data()}, 0, phi.data(), delta.data(), theta.data(), 3,
                    {0.0, 0.0, 0.5});
  // mean = (2, 2, 1): phi = a - 0.5 (a - mean) = (1.5, 2, 2).
  EXPECT_EQ(phi, (std::vector<float>{1.5f, 2.0f, 2.0f}));
  EXPECT_EQ(theta, phi);
  EXPECT_EQ(delta, (std::vector<float>{0.5f, 0.0f, -1.0f}));
}

TEST(Noloco, GroupOfAllReplicasIsDilocoWithHeavyBallMomentum) {
  // n = R: the pull term vanishes and the step is DiLoCo's outer SGD with heavy-ball momentum
  // alpha and lr beta (outer.nesterov = false), up to the order of the float sums.
  for (int R : {2, 4}) {
    RunConfig nl = small_config(R, R);
    RunConfig dl = small_config(R, R, "diloco");
    const Rounds a = run_rounds(nl, 3), b = run_rounds(dl, 3);
    for (int k = 0; k < 3; ++k)
      for (int m = 0; m < R; ++m) {
        const auto& x = a.after[size_t(k)][size_t(m)];
        const std::vector<double> y(b.after[size_t(k)][size_t(m)].begin(), b.after[size_t(k)][size_t(m)].end());
        LOCO_EXPECT_BELOW(max_diff(x, y), 1e-6) << "R " << R << " outer step " << k + 1;
      }
  }
}

TEST(Noloco, EachOuterStepTalksOnlyToTheGroupWithTheFormulasBytes) {
  // Transport-level: every message a worker sends in an outer step (its local progress) and
  // right after it (its slow weights for the next step) goes to a member of its group; bytes per
  // worker = (|G| - 1) x parameters x 4 for each of the two, and no weights for step 1.
  for (auto [R, n] : std::vector<std::pair<int, int>>{{4, 2}, {5, 2}, {6, 3}}) {
    const RunConfig cfg = small_config(R, n);
    const Rounds r = run_rounds(cfg, 4);
    const int64_t P = ParamLayout(cfg.model).size();
    for (int k = 0; k < 4; ++k)
      for (int m = 0; m < R; ++m) {
        const auto g = noloco_group_of(R, n, uint64_t(cfg.noloco.seed), k + 1, m);
        const int64_t partners = int64_t(g.size()) - 1;
        EXPECT_EQ(r.progress_bytes[size_t(k)][size_t(m)], partners * P * 4);
        // Weights sent after step k go to step k + 2's group (0-based k + 1), none after the last.
        if (k == 3) {
          EXPECT_EQ(r.weight_bytes[size_t(k)][size_t(m)], 0);
        } else {
          const auto next = noloco_group_of(R, n, uint64_t(cfg.noloco.seed), k + 2, m);
          EXPECT_EQ(r.weight_bytes[size_t(k)][size_t(m)], (int64_t(next.size()) - 1) * P * 4);
          std::set<int> allowed(g.begin(), g.end());
          allowed.insert(next.begin(), next.end());
          allowed.erase(m);
          const auto& peers = r.peers[size_t(k)][size_t(m)];
          EXPECT_EQ(int64_t(peers.size()), partners + int64_t(next.size()) - 1);
          for (int p : peers) EXPECT_TRUE(allowed.count(p)) << "replica " << m << " sent to " << p;
        }
      }
  }
}

TEST(Noloco, RandomRoutesArePermutationsAndRetraceTheirPath) {
  const Grid grid{3, 4};  // 3 stages x 4 replicas
  int64_t step = 1;
  std::set<std::vector<int>> distinct;
  for (step = 1; step <= 6; ++step)
    for (int mb = 0; mb < 3; ++mb)
      for (int b = 0; b < 2; ++b) {
        auto p = route_permutation(4, 9, step, mb, b);
        EXPECT_EQ(p, route_permutation(4, 9, step, mb, b));  // deterministic
        distinct.insert(p);
        auto sorted = p;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3}));
        // The receiver's prev is the sender: the backward returns along the same path.
        for (int r = 0; r < 4; ++r) {
          const int64_t at = step;
          const Route from = random_route(grid, grid.rank(b, r), 9, &at);
          const int to = from.next(mb);
          const Route back = random_route(grid, to, 9, &at);
          EXPECT_EQ(back.prev(mb), grid.rank(b, r));
          EXPECT_EQ(grid.stage_of(to), b + 1);
        }
      }
  EXPECT_GT(distinct.size(), 5u);
}

TEST(NolocoScreen, LeavesOutNonFiniteFarOrOversizedPartnersAndKeepsSelf) {
  const int64_t n = 100;
  Rng rng(2);
  std::vector<std::vector<float>> phi(4, std::vector<float>(n)), d(4, std::vector<float>(n));
  for (int j = 0; j < 4; ++j)
    for (int64_t i = 0; i < n; ++i) {
      phi[j][size_t(i)] = float(1 + 0.001 * rng.normal());  // slow weights close together
      d[j][size_t(i)] = float(0.01 * rng.normal());          // progress norms about 0.1
    }
  auto ptrs = [](const std::vector<std::vector<float>>& v) {
    std::vector<const float*> p;
    for (const auto& x : v) p.push_back(x.data());
    return p;
  };
  auto honest = noloco_screen(ptrs(phi), ptrs(d), 1, n, 3, 0.5);
  EXPECT_EQ(honest.kept, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(honest.why, "");
  EXPECT_GT(honest.distance_ratio, 0.0005);  // about 0.014 / 10
  EXPECT_LT(honest.distance_ratio, 0.005);
  auto bad_phi = phi, bad_d = d;
  bad_d[0][3] = std::numeric_limits<float>::quiet_NaN();      // partner 0: NaN progress
  for (auto& x : bad_d[2]) x *= 5;                             // partner 2: 5x the progress
  for (auto& x : bad_phi[3]) x *= -1;                          // partner 3: slow weights 2x their norm away
  auto s = noloco_screen(ptrs(bad_phi), ptrs(bad_d), 1, n, 3, 0.5);
  EXPECT_EQ(s.kept, std::vector<size_t>{1});
  EXPECT_NE(s.why.find("partner 0: non-finite local progress"), std::string::npos) << s.why;
  EXPECT_NE(s.why.find("partner 2: local progress norm"), std::string::npos) << s.why;
  EXPECT_NE(s.why.find("partner 3: slow weights"), std::string::npos) << s.why;
  // Rules off: only the non-finite one goes; its own entry is always kept, whatever it holds.
  EXPECT_EQ(noloco_screen(ptrs(bad_phi), ptrs(bad_d), 1, n, 0, 0).kept, (std::vector<size_t>{1, 2, 3}));
  EXPECT_EQ(noloco_screen(ptrs(bad_phi), ptrs(bad_d), 0, n, 3, 0.5).kept.front(), 0u);
  // Keeping a subset: the outer step's arrays shrink and self's index follows.
  auto p = ptrs(bad_phi), q = ptrs(bad_d);
  NolocoScreen keep;
  keep.kept = {1, 3};
  EXPECT_EQ(noloco_keep(keep, 3, p, q), 1);
  EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1], bad_phi[3].data());
  EXPECT_EQ(q[0], bad_d[1].data());
}

}  // namespace loco
