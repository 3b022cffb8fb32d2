// Streaming DiLoCo: the fragment schedule of docs/streaming.md, and a pinned regression for
// every (tau, alpha) in {0, 1} x {0, 0.5, 1}: loco's 2-replica run against an independent
// serial reference written here (its own fragment, overlap and merge logic). The reference
// computes with the same kernels as loco (the engine's inner steps, whose gradients and AdamW are
// verified against PyTorch; outer_sgd_step, verified by the DiLoCo tests), so the two must agree
// bitwise: an earlier version took the outer step in double precision and compared to 1e-4, a
// tolerance that held on AMD EPYC and failed on Intel Xeon (2.5e-4), because AdamW's division by
// sqrt(v) amplifies the outer step's float rounding on entries with tiny gradients, by an amount
// that depends on the trajectory the machine's GEMM kernels take. Nothing else differs: with 2
// replicas the float average (a + b) / 2 is exact in either order, and the merge alpha * local +
// (1 - alpha) * synced is exact for alpha in {0, 0.5, 1} (every product is exact).
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <cmath>
#include <filesystem>
#include <thread>

#include "algo/algorithm.h"
#include "algo/streaming.h"
#include "comm/codec.h"
#include "comm/inprocess.h"
#include "core/rng.h"
#include "run/trainer.h"
#include "core/error.h"
#include "core/parallel.h"
#include "data/loader.h"
#include "data/token_file.h"
#include "io/checkpoint.h"
#include "core/fs.h"
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
  EXPECT_EQ(seq[3].offset, 21);  // j floor(H / N) = 3 floor(30 / 4)
  // docs/streaming.md's 2-fragment example (one block fragment + the non-block one), H = 100:
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

constexpr int kReplicas = 2, kH = 6;

RunConfig tiny_config(const std::string& dir, int steps, int tau, double alpha, const std::string& worker_tau = "") {
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
  c.train.steps = steps;
  c.train.log_interval = 1;
  c.train.eval_interval = 0;
  c.train.checkpoint_interval = 0;
  c.train.out_dir = dir + "/run";
  c.train.threads = 1;
  c.distributed.replicas = kReplicas;
  c.outer.inner_steps = kH;
  c.outer.lr = 0.7;
  c.outer.momentum = 0.9;
  c.outer.nesterov = true;
  c.streaming.fragment_blocks = 2;
  c.streaming.pattern = "strided";
  c.streaming.tau = tau;
  c.streaming.worker_tau = worker_tau;
  c.streaming.alpha = alpha;
  return c;
}

// The reference: M replicas trained one after the other in this thread, with the Streaming DiLoCo
// paper's Algorithm 2 written out again: at a fragment's sync step t the outer step is taken on the
// replicas' average; replica m merges the result at t + tau_m. The last step ends every round:
// syncs in flight are applied, and a fragment whose latest sync started within the last
// max tau steps ends with it, every other one takes a final sync; local values are replaced.
std::vector<float> reference_outer_params(const RunConfig& c, const std::vector<int32_t>& tokens,
                                           const std::vector<int64_t>& taus) {
  set_compute_threads(1);
  Transformer model(c.model);
  const auto& layout = model.layout();
  const size_t n = size_t(layout.size());
  const int64_t steps = c.train.steps;
  auto toks = std::make_shared<const std::vector<int32_t>>(tokens);
  std::vector<std::vector<float>> p(kReplicas, std::vector<float>(n));
  std::vector<AdamW> opt;
  std::vector<DataLoader> data;
  for (int r = 0; r < kReplicas; ++r) {
    model.init_params(p[size_t(r)].data(), uint64_t(c.train.seed));
    opt.emplace_back(c.optim.adamw, layout);
    data.emplace_back(toks, c.data.seq_len, c.data.batch_size, r, kReplicas, uint64_t(c.data.seed));
  }
  std::vector<float> theta = p[0], v(n, 0.0f);
  // Fragments for L = 4, |p| = 2, strided: {0, 2}, {1, 3}, then the non-block parameters;
  // offsets j floor(H / 3).
  std::vector<std::vector<Range>> frag = {{layout.block_range(0), layout.block_range(2)},
                                          {layout.block_range(1), layout.block_range(3)},
                                          layout.nonblock_ranges()};
  const int64_t offset[3] = {0, kH / 3, 2 * (kH / 3)};
  const float alpha = float(c.streaming.alpha);
  const int64_t max_tau = *std::max_element(taus.begin(), taus.end());
  struct Pending {
    int j;
    int64_t start;
    std::vector<float> synced;  // the fragment's outer parameters after this sync's step
    std::vector<bool> merged;   // per replica
  };
  std::vector<Pending> pending;
  auto outer_step = [&](int j) {  // on the replicas' current average; returns the new theta
    for (const auto& r : frag[size_t(j)]) {
      std::vector<float> avg(size_t(r.size()));
      for (int64_t i = r.begin; i < r.end; ++i) avg[size_t(i - r.begin)] = (p[0][size_t(i)] + p[1][size_t(i)]) / 2;
      outer_sgd_step(theta.data() + r.begin, v.data() + r.begin, avg.data(), r.size(), c.outer);
    }
    return theta;
  };
  auto merge = [&](Pending& q, int m, bool replace) {
    for (const auto& r : frag[size_t(q.j)])
      for (int64_t i = r.begin; i < r.end; ++i) {
        float& local = p[size_t(m)][size_t(i)];
        local = replace ? q.synced[size_t(i)] : alpha * local + (1 - alpha) * q.synced[size_t(i)];
      }
    q.merged[size_t(m)] = true;
  };
  const LrSchedule sched{c.optim.lr, c.optim.min_lr, c.optim.warmup_steps, steps};
  Workspace ws(c.model, model.stage(), c.data.batch_size, c.data.seq_len);
  std::vector<float> g(n);
  std::vector<int32_t> in, tg;
  for (int64_t t = 1; t <= steps; ++t) {
    for (int m = 0; m < kReplicas; ++m) {
      std::fill(g.begin(), g.end(), 0.0f);
      data[size_t(m)].next(in, tg);
      model.forward(p[size_t(m)].data(), in.data(), nullptr, tg.data(), ws);
      model.backward(p[size_t(m)].data(), g.data(), in.data(), tg.data(), 1.0, nullptr, nullptr, ws);
      clip_grad_norm(g.data(), int64_t(n), c.optim.clip);
      opt[size_t(m)].step(p[size_t(m)].data(), g.data(), sched.at(t - 1));
    }
    const bool last = t == steps;
    for (auto& q : pending)
      for (int m = 0; m < kReplicas; ++m)
        if (!q.merged[size_t(m)] && (q.start + taus[size_t(m)] <= t || last)) merge(q, m, last);
    for (int j = 0; j < 3; ++j) {
      const bool due = t > offset[j] && (t - offset[j]) % kH == 0;
      const int64_t started = t >= offset[j] + kH ? offset[j] + (t - offset[j]) / kH * kH : -1;
      const bool final = last && !due && !(started >= 0 && started >= t - max_tau);
      if (!due && !final) continue;
      Pending q{j, t, outer_step(j), std::vector<bool>(kReplicas, false)};
      for (int m = 0; m < kReplicas; ++m)
        if (taus[size_t(m)] == 0 || last) merge(q, m, last);
      pending.push_back(std::move(q));
    }
  }
  return theta;
}

std::vector<float> run_loco(const RunConfig& cfg, const std::string& dir) {
  std::filesystem::remove_all(cfg.train.out_dir);
  write_file_atomic(dir + "/c.toml", run_config_to_toml(cfg));
  TrainOptions o;
  o.config_path = dir + "/c.toml";
  o.quiet = true;
  return load_model_checkpoint(run_training(o).checkpoint).params;
}

double worst_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (std::abs(double(want[i])) + 1e-2));
  return worst;
}

std::vector<int32_t> reference_tokens(const std::string& dir) {
  std::filesystem::remove_all(dir);
  make_dirs(dir);
  std::vector<int32_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + i / 7) % 64);
  write_token_file(dir + "/train.tok", tokens, 64);
  return tokens;
}

}  // namespace

TEST(Streaming, PinnedAgainstIndependentReference) {
  // Every (tau, alpha); 12 steps end with fragment syncs due or long past, 11 steps end one
  // step after a sync started (with tau 1 it ends with that sync, without a final one).
  const std::string dir = ::testing::TempDir() + "/streaming-ref";
  const auto tokens = reference_tokens(dir);
  for (int steps : {12, 11})
    for (int tau : {0, 1})
      for (double alpha : {0.0, 0.5, 1.0}) {
        const RunConfig cfg = tiny_config(dir, steps, tau, alpha);
        const auto got = run_loco(cfg, dir), want = reference_outer_params(cfg, tokens, {tau, tau});
        EXPECT_TRUE(got == want) << "steps " << steps << " tau " << tau << " alpha " << alpha
                                 << ": not bitwise equal, worst relative difference " << worst_difference(got, want);
      }
}

TEST(Streaming, HeterogeneousTauAgainstIndependentReference) {
  // Replica 0 waits 1 step, replica 1 waits 3: they merge each sync at different steps, and
  // the final model follows the largest tau.
  const std::string dir = ::testing::TempDir() + "/streaming-tau";
  const auto tokens = reference_tokens(dir);
  for (int steps : {12, 14}) {
    const RunConfig cfg = tiny_config(dir, steps, 1, 0.5, "1,3");
    const auto got = run_loco(cfg, dir), want = reference_outer_params(cfg, tokens, {1, 3});
    EXPECT_TRUE(got == want) << "steps " << steps << ": not bitwise equal, worst relative difference " << worst_difference(got, want);
    // ... and it is not the same as both replicas waiting 1 step.
    EXPECT_GT(worst_difference(got, reference_outer_params(tiny_config(dir, steps, 1, 0.5), tokens, {1, 1})), 1e-3);
  }
}

namespace {

// One synchronization of fragment 0 with M in-process workers whose parameters differ from the
// common start by their own random delta; outer lr 1 and momentum 0, so the new outer
// parameters are exactly the average the reduction produced. Returns every worker's outer
// parameters and the exact (double) average.
struct SyncResult {
  std::vector<std::vector<float>> outer, local;
  std::vector<int64_t> bytes_sent;  // outer_gradients, per worker
  std::vector<double> exact;
  std::vector<Range> fragment;
  double largest_delta = 0;
};

SyncResult one_sync(int M, const std::string& codec, const std::string& reduce, int slices = 1, double alpha = 0) {
  RunConfig cfg = tiny_config(::testing::TempDir(), 12, 0, alpha);
  cfg.distributed.replicas = M;
  cfg.outer.inner_steps = kH;
  cfg.outer.lr = 1.0;
  cfg.outer.momentum = 0.0;
  cfg.outer.nesterov = true;
  cfg.outer.codec = codec;
  cfg.outer.block = 32;
  cfg.outer.reduce = reduce;
  cfg.partial = {slices, "mlp"};
  const ParamLayout layout(cfg.model);
  const size_t n = size_t(layout.size());
  std::vector<float> start(n);
  Transformer(cfg.model).init_params(start.data(), 1);
  std::vector<std::vector<float>> local(size_t(M), start);
  SyncResult r;
  r.fragment = merge_ranges({layout.block_range(0), layout.block_range(2)});
  for (int m = 0; m < M; ++m) {
    Rng rng(uint64_t(100 + m));
    for (auto& x : local[size_t(m)]) x += float(0.01 * rng.normal());
  }
  r.exact.assign(n, 0.0);
  for (const auto& range : r.fragment)
    for (int64_t i = range.begin; i < range.end; ++i)
      for (int m = 0; m < M; ++m) {
        r.exact[size_t(i)] += double(local[size_t(m)][size_t(i)]) / M;
        r.largest_delta = std::max(r.largest_delta, std::abs(double(start[size_t(i)]) - local[size_t(m)][size_t(i)]));
      }
  r.local = local;
  auto transports = make_inprocess_transports(M);
  auto tokens = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>(200, 1));
  r.outer.resize(size_t(M));
  r.bytes_sent.resize(size_t(M));
  std::vector<std::thread> threads;
  for (int m = 0; m < M; ++m)
    threads.emplace_back([&, m] {
      Communicator comm(std::move(transports[size_t(m)]), {}, nullptr);
      Worker w(cfg, comm, tokens);
      auto algo = make_algorithm(cfg, w);
      w.params = start;
      algo->start(w, false);
      w.params = local[size_t(m)];
      algo->after_step(w, kH, false);  // fragment 0 (offset 0) syncs after step H
      r.outer[size_t(m)] = algo->eval_params(w);
      if (slices > 1) r.outer[size_t(m)] = w.params;
      const auto ops = comm.traffic().to_json()["by_operation"];
      r.bytes_sent[size_t(m)] = ops.contains("outer_gradients") ? ops["outer_gradients"]["bytes_sent"].get<int64_t>() : 0;
    });
  for (auto& t : threads) t.join();
  return r;
}

}  // namespace

TEST(Streaming, QuantizedSyncStaysWithinTheCodecsErrorOfTheExactOne) {
  // Per round: the quantized average differs from the exact float average of the same deltas by
  // at most the codec's error bound x the largest delta (all-gather: every replica's own
  // quantization; reduce-scatter: that plus the second quantization of the reduced mean).
  for (const std::string codec : {"fp8", "fp4-e3m0", "fp4-e2m1", "int8"})
    for (const std::string reduce : {"all-gather", "reduce-scatter"})
      for (int M : {2, 4}) {
        const auto r = one_sync(M, codec, reduce);
        const double e = make_codec({codec, "nearest", 32, 0.1})->error_bound();
        const double bound = e * r.largest_delta * (reduce == "all-gather" ? 1.0 : 2.0 + e) + 1e-6;
        double worst = 0;
        for (const auto& range : r.fragment)
          for (int64_t i = range.begin; i < range.end; ++i)
            worst = std::max(worst, std::abs(double(r.outer[0][size_t(i)]) - r.exact[size_t(i)]));
        EXPECT_LE(worst, bound) << codec << " " << reduce << " M " << M;
        EXPECT_GT(worst, 0.0) << "a quantized sync should not be exact: " << codec;
        for (int m = 1; m < M; ++m) EXPECT_EQ(r.outer[size_t(m)], r.outer[0]) << "replicas agree bitwise";
      }
  // fp32 is the exact average (to float rounding).
  const auto r = one_sync(4, "fp32", "auto");
  for (const auto& range : r.fragment)
    for (int64_t i = range.begin; i < range.end; ++i)
      LOCO_EXPECT_NEAR(r.outer[0][size_t(i)], r.exact[size_t(i)], 1e-6);
}

TEST(Streaming, PartialUpdatesReplaceTheSlicesANodeDoesNotTrain) {
  // Two nodes, two slices: an entry of node 1's slice is averaged over node 1 alone, so with
  // outer lr 1 its synced value is node 1's. Node 0 never trains it: with alpha 0.5 it must take
  // that value, not half of it (a merge would move it half-way back to node 0's stale copy).
  const auto r = one_sync(2, "fp32", "auto", 2, 0.5);
  const ParamLayout layout(tiny_config(::testing::TempDir(), 12, 0, 0.5).model);
  const TrainableSet node0(layout, 0, 2, "mlp");
  int64_t frozen = 0;
  for (const auto& range : r.fragment)
    for (int64_t i = range.begin; i < range.end; ++i) {
      bool trains = false;
      for (const auto& t : node0.ranges()) trains = trains || (i >= t.begin && i < t.end);
      if (trains) continue;
      ++frozen;
      EXPECT_EQ(r.outer[0][size_t(i)], r.local[1][size_t(i)]) << "frozen entry " << i;
    }
  EXPECT_GT(frozen, 0);
}

TEST(Streaming, EncodedSyncBytesEqualTheFormula) {
  // What each worker sends for one fragment, counted by the transport, against the formula the
  // simulator and estimator use (comm/codec.h): reduce-scatter stays about 2 payloads whatever M.
  for (const std::string reduce : {"all-gather", "reduce-scatter"})
    for (int M : {2, 4, 8}) {
      const auto r = one_sync(M, "fp4-e3m0", reduce);
      const auto codec = make_codec({"fp4-e3m0", "nearest", 32, 0.1});
      const auto how = choose_encoded_reduce(reduce, M);
      for (int m = 0; m < M; ++m)
        EXPECT_EQ(r.bytes_sent[size_t(m)], encoded_sync_bytes(*codec, how, total_size(r.fragment), M, m))
            << reduce << " M " << M << " worker " << m;
      const double per_value = double(r.bytes_sent[0]) / double(total_size(r.fragment));
      std::printf("fp4 %-14s M %d: %.3f bytes per value per worker\n", reduce.c_str(), M, per_value);
      if (reduce == "reduce-scatter") {
        EXPECT_LT(per_value, 2 * 0.5 * 1.1);
      }
    }
}
