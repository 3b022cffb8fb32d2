// DiLoCo's outer step with two in-process replicas against the formula of docs/diloco.md,
// computed independently here: Delta_m = theta - theta_m, Delta = mean, v = mu v + Delta,
// theta -= eta (Delta + mu v); every replica restarts from theta.
#include <gtest/gtest.h>

#include "../tolerance.h"
#include "tiny_diloco.h"

#include <thread>

#include "algo/algorithm.h"
#include "comm/inprocess.h"
#include "core/rng.h"

using namespace loco;

TEST(Diloco, OuterStepMatchesTheFormulaOverTwoRounds) {
  const RunConfig cfg = tiny_diloco_config();
  auto tokens = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>(200, 1));
  const int M = 2;
  const size_t n = ParamLayout(cfg.model).size();

  // Independent reference, in double.
  std::vector<double> theta(n), v(n, 0.0);
  Rng init(1);
  std::vector<float> theta0(n);
  for (auto& x : theta0) x = float(init.normal());
  for (size_t i = 0; i < n; ++i) theta[i] = theta0[i];
  auto inner = [&](int rank, int round) {  // the replicas' parameters after a round of "training"
    Rng r(uint64_t(100 * round + rank));
    std::vector<float> p(n);
    for (size_t i = 0; i < n; ++i) p[i] = float(theta[i] + 0.01 * r.normal());
    return p;
  };

  std::vector<std::vector<float>> round_inputs[2];
  double outer_norm[M], replica_norm[M];  // the last round's ||Delta|| and ||Delta_m||, as recorded
  for (int round = 0; round < 2; ++round) {
    for (int rank = 0; rank < M; ++rank) round_inputs[round].push_back(inner(rank, round));
    double outer = 0, own[M] = {};
    for (size_t i = 0; i < n; ++i) {
      double delta = 0;
      for (int rank = 0; rank < M; ++rank) {
        delta += (theta[i] - round_inputs[round][rank][i]) / M;
        own[rank] += std::pow(theta[i] - round_inputs[round][rank][i], 2);
      }
      outer += delta * delta;
      v[i] = 0.9 * v[i] + delta;
      theta[i] -= 0.7 * (delta + 0.9 * v[i]);
    }
    for (int rank = 0; rank < M; ++rank) outer_norm[rank] = std::sqrt(outer), replica_norm[rank] = std::sqrt(own[rank]);
  }

  auto transports = make_inprocess_transports(M);
  std::vector<std::vector<float>> after(M);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < M; ++rank)
    threads.emplace_back([&, rank] {
      Communicator comm(std::move(transports[size_t(rank)]), {}, nullptr);
      Worker w(cfg, comm, tokens);
      auto algo = make_algorithm(cfg, w);
      w.params = theta0;
      algo->start(w, false);
      for (int round = 0; round < 2; ++round) {
        w.params = round_inputs[round][size_t(rank)];
        for (int64_t step = 5 * round + 1; step <= 5 * round + 5; ++step) algo->after_step(w, step, false);
      }
      after[size_t(rank)] = w.params;
      EXPECT_EQ(algo->eval_params(w), w.params) << "replicas restart from the outer parameters";
      nlohmann::json rec = nlohmann::json::object();
      algo->annotate(rec);
      LOCO_EXPECT_NEAR(rec.value("outer_delta_norm", -1.0), outer_norm[rank], 1e-4 * outer_norm[rank]);
      LOCO_EXPECT_NEAR(rec.value("replica_delta_norm", -1.0), replica_norm[rank], 1e-4 * replica_norm[rank]);
      // Two replicas with independent moves of equal size: about 1/sqrt(2) of a move survives.
      LOCO_EXPECT_NEAR(outer_norm[rank] / replica_norm[rank], 1 / std::sqrt(2.0), 0.05);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(after[0], after[1]);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(after[0][i] - theta[i]) / (std::abs(theta[i]) + 1e-3));
  LOCO_EXPECT_BELOW(worst, 1e-5);
}
