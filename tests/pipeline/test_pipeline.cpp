// Pipeline building blocks: schedules (each microbatch forward then backward once, in-flight
// bounds), the stage partition, the grid's rank layout, and the executor's bubble on ideal
// machines (virtual clocks): (S-1)/(m+S-1) of the step for equal stage times.
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <functional>
#include <mutex>
#include <thread>

#include "comm/inprocess.h"
#include "comm/link.h"
#include "core/error.h"
#include "core/rng.h"
#include "pipeline/executor.h"
#include "pipeline/grid.h"
#include "pipeline/schedule.h"
#include "sim/pipeline.h"

using namespace loco;

TEST(PipeSchedule, MatchesTheDiagrams) {
  EXPECT_EQ(describe(stage_schedule(ScheduleKind::OneFOneB, 3, 0, 4)), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(describe(stage_schedule(ScheduleKind::OneFOneB, 3, 1, 4)), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(describe(stage_schedule(ScheduleKind::OneFOneB, 3, 2, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(describe(stage_schedule(ScheduleKind::GPipe, 3, 1, 2)), "F0 F1 B0 B1");
  // One stage is plain gradient accumulation: forward and backward of each micro-batch in turn.
  EXPECT_EQ(describe(stage_schedule(ScheduleKind::OneFOneB, 1, 0, 3)), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(describe(stage_schedule(ScheduleKind::OneFOneB, 4, 0, 2)), "F0 F1 B0 B1");
}

TEST(PipeSchedule, EveryMicrobatchOnceInOrderWithinBounds) {
  for (auto kind : {ScheduleKind::OneFOneB, ScheduleKind::GPipe})
    for (int S = 1; S <= 6; ++S)
      for (int m = 1; m <= 9; ++m)
        for (int s = 0; s < S; ++s) {
          const auto ops = stage_schedule(kind, S, s, m);
          ASSERT_EQ(int(ops.size()), 2 * m);
          std::vector<int> fwd, bwd;
          std::vector<bool> forwarded(size_t(m), false);
          for (const auto& op : ops) {
            if (op.kind == PipeOp::Forward) {
              fwd.push_back(op.microbatch);
              forwarded[size_t(op.microbatch)] = true;
            } else {
              EXPECT_TRUE(forwarded[size_t(op.microbatch)]) << "backward before forward";
              bwd.push_back(op.microbatch);
            }
          }
          for (int i = 0; i < m; ++i) {
            EXPECT_EQ(fwd[size_t(i)], i);
            EXPECT_EQ(bwd[size_t(i)], i) << "backward passes in microbatch order";
          }
          const int bound = kind == ScheduleKind::GPipe ? m : std::min(S - s, m);
          EXPECT_EQ(max_in_flight(ops), bound) << describe(ops);
        }
  EXPECT_THROW(parse_schedule("zigzag"), Error);
}

TEST(Grid, RankLayout) {
  const Grid g{3, 4};
  EXPECT_EQ(g.size(), 12);
  for (int k = 0; k < 12; ++k) EXPECT_EQ(g.rank(g.stage_of(k), g.replica_of(k)), k);
  EXPECT_EQ(g.rank(2, 1), 5);
  EXPECT_EQ(g.stage_group(1), (std::vector<int>{1, 4, 7, 10}));
  EXPECT_EQ(g.replica_chain(2), (std::vector<int>{6, 7, 8}));
  EXPECT_EQ(g.describe(5), "stage 2, replica 1 (worker 5)");
}

namespace {
ModelConfig small_model(int layers, bool tied) {
  ModelConfig m;
  m.vocab_size = 512;
  m.hidden_size = 32;
  m.num_layers = layers;
  m.num_heads = 2;
  m.intermediate_size = 64;
  m.tie_embeddings = tied;
  return m;
}
}  // namespace

TEST(Partition, ContiguousWithEmbeddingFirstAndHeadLast) {
  for (bool tied : {false, true})
    for (int L = 1; L <= 7; ++L)
      for (int S = 1; S <= L; ++S) {
        const auto m = small_model(L, tied);
        const auto stages = partition_stages(m, S, "");
        ASSERT_EQ(int(stages.size()), S);
        int next = 0;
        for (int s = 0; s < S; ++s) {
          EXPECT_EQ(stages[size_t(s)].first_block, next);
          EXPECT_GT(stages[size_t(s)].last_block, stages[size_t(s)].first_block);
          EXPECT_EQ(stages[size_t(s)].embedding, s == 0);
          EXPECT_EQ(stages[size_t(s)].head, s == S - 1);
          next = stages[size_t(s)].last_block;
        }
        EXPECT_EQ(next, L);
        // Balanced: no split into S contiguous non-empty parts has a smaller largest stage.
        const auto sizes = stage_param_counts(m, stages);
        for (int s = 0; s < S; ++s) EXPECT_EQ(sizes[size_t(s)], ParamLayout(m, stages[size_t(s)]).size());
        const int64_t worst = *std::max_element(sizes.begin(), sizes.end());
        std::function<int64_t(int, int, std::vector<int>&)> best = [&](int s, int used, std::vector<int>& c) {
          if (s == S) {
            if (used != L) return std::numeric_limits<int64_t>::max();
            std::string split;
            for (int x : c) split += (split.empty() ? "" : ",") + std::to_string(x);
            const auto sz = stage_param_counts(m, partition_stages(m, S, split));
            return *std::max_element(sz.begin(), sz.end());
          }
          int64_t b = std::numeric_limits<int64_t>::max();
          for (int n = 1; used + n <= L - (S - s - 1); ++n) {
            c.push_back(n);
            b = std::min(b, best(s + 1, used + n, c));
            c.pop_back();
          }
          return b;
        };
        std::vector<int> c;
        EXPECT_EQ(worst, best(0, 0, c)) << "L " << L << " S " << S;
      }
}

TEST(Partition, ExplicitSplitAndErrors) {
  const auto m = small_model(6, false);
  const auto st = partition_stages(m, 3, "1,2,3");
  EXPECT_EQ(st[1].first_block, 1);
  EXPECT_EQ(st[1].last_block, 3);
  EXPECT_EQ(st[2].last_block, 6);
  EXPECT_THROW(partition_stages(m, 3, "1,2"), Error);
  EXPECT_THROW(partition_stages(m, 3, "1,2,2"), Error);
  EXPECT_THROW(partition_stages(m, 3, "0,3,3"), Error);
  EXPECT_THROW(partition_stages(m, 3, "a,3,3"), Error);
  EXPECT_THROW(partition_stages(m, 7, ""), Error);
  // The stages hold every parameter once, except a tied embedding (on the first and last).
  for (bool tied : {false, true}) {
    const auto mt = small_model(6, tied);
    int64_t total = 0;
    for (auto n : stage_param_counts(mt, partition_stages(mt, 3, ""))) total += n;
    const int64_t emb = int64_t(mt.vocab_size) * mt.hidden_size;
    EXPECT_EQ(total, ParamLayout(mt).size() + (tied ? emb : 0));
  }
}

namespace {

// A stage on an ideal machine: forward takes tf and backward tb of virtual time; it sends
// `floats` activations (or gradients) and 3 token ids.
class TimedStage : public StageCompute {
 public:
  TimedStage(VirtualClock& clock, double tf, double tb, int64_t floats) : clock_(clock), tf_(tf), tb_(tb), n_(floats) {}
  void forward(int, const BoundaryMessage&, BoundaryMessage& out) override {
    clock_.advance(tf_);
    out.activations.assign(size_t(n_), 1.0f);
    out.tokens.assign(3, 7);
  }
  void backward(int, const std::vector<float>&, std::vector<float>& grad_in) override {
    clock_.advance(tb_);
    grad_in.assign(size_t(n_), 2.0f);
  }

 private:
  VirtualClock& clock_;
  double tf_, tb_;
  int64_t n_;
};

struct StageTimes {
  double end = 0, bubble = 0, compute = 0;
  int64_t activation_bytes = 0, grad_bytes = 0;
};

// One step of an S-stage pipeline, each stage on its own virtual clock over the link model.
std::vector<StageTimes> run_pipeline(ScheduleKind kind, int S, int m, std::vector<double> tf, std::vector<double> tb,
                                     LinkConfig link, int64_t floats) {
  auto transports = make_inprocess_transports(S);
  std::vector<StageTimes> out(static_cast<size_t>(S));
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr err;
  const Grid grid{S, 1};
  for (int s = 0; s < S; ++s)
    threads.emplace_back([&, s] {
      try {
        auto clock = std::make_shared<VirtualClock>();
        std::shared_ptr<Transport> t = wrap_with_link(std::move(transports[size_t(s)]), link, clock);
        auto traffic = std::make_shared<TrafficStats>();
        PipelineExecutor ex(t, grid, s, 10.0, traffic, nullptr);
        TimedStage stage(*clock, tf[size_t(s)], tb[size_t(s)], floats);
        ex.run(stage_schedule(kind, S, s, m), stage, fixed_route(grid, s));
        auto j = traffic->to_json()["by_operation"];
        out[size_t(s)] = {clock->now(), ex.bubble_seconds(), ex.compute_seconds(),
                          j.contains("activations") ? j["activations"]["bytes_sent"].get<int64_t>() : 0,
                          j.contains("activation_grads") ? j["activation_grads"]["bytes_sent"].get<int64_t>() : 0};
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!err) err = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (err) std::rethrow_exception(err);
  return out;
}

}  // namespace

TEST(Executor, BubbleIsStagesMinusOneOverMicrobatchesPlusStagesMinusOne) {
  const double tf = 1.0, tb = 2.0;  // exact in binary: the times below are exact
  for (auto kind : {ScheduleKind::OneFOneB, ScheduleKind::GPipe})
    for (int S : {1, 2, 3, 4})
      for (int m : {1, 2, 4, 8}) {
        const auto times = run_pipeline(kind, S, m, std::vector<double>(size_t(S), tf),
                                        std::vector<double>(size_t(S), tb), LinkConfig{}, 16);
        double makespan = 0;
        for (const auto& t : times) makespan = std::max(makespan, t.end);
        EXPECT_EQ(makespan, (m + S - 1) * (tf + tb)) << "S " << S << " m " << m;
        for (int s = 0; s < S; ++s) {
          const auto& t = times[size_t(s)];
          EXPECT_EQ(t.compute, m * (tf + tb));
          // Idle: waiting for neighbours during the step, plus after the stage's own last pass.
          const double idle = t.bubble + (makespan - t.end);
          EXPECT_DOUBLE_EQ(idle / makespan, double(S - 1) / double(m + S - 1)) << "S " << S << " m " << m << " s " << s;
        }
      }
}

TEST(Executor, BoundaryBytesAndLinkTime) {
  // b*T*d = 1000 floats per microbatch and direction; on a 32 Mbit/s link with 5 ms latency a
  // message of 4000 bytes takes 1 ms on the wire and arrives 6 ms after it is sent.
  const int S = 2, m = 3;
  const auto times = run_pipeline(ScheduleKind::GPipe, S, m, {0.010, 0.010}, {0.020, 0.020}, LinkConfig{32e6, 0.005},
                                  1000);
  EXPECT_EQ(times[0].activation_bytes, m * 1000 * 4);
  EXPECT_EQ(times[0].grad_bytes, 0);
  EXPECT_EQ(times[1].activation_bytes, 0);
  EXPECT_EQ(times[1].grad_bytes, m * 1000 * 4);
  // Stage 1 waits for F0 until its tokens (12 bytes, 3 us on the wire, sent after the
  // activations) arrive: 10 + 1 + 0.003 + 5 ms; later inputs arrive before they are needed.
  const double tokens_wire = 12 * 8 / 32e6;
  LOCO_EXPECT_NEAR(times[1].bubble, 0.016 + tokens_wire, 1e-12);
  // Stage 0 idles from the end of F2 (30 ms) until B0's gradient arrives: stage 1 ends F2 at
  // 46.003 ms and B0 at 66.003 ms, then 1 + 5 ms of link; B1 and B2 arrive just in time.
  LOCO_EXPECT_NEAR(times[0].bubble, 0.072 + tokens_wire - 0.030, 1e-12);
}

TEST(PipelineSimulator, EqualsTheExecutorOnIdealMachines) {
  // Random stage times, links and shapes: the simulator's first step is the executor's.
  Rng rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int S = 1 + int(rng.next_u64() % 4), m = 1 + int(rng.next_u64() % 6);
    const auto kind = rng.next_u64() % 2 ? ScheduleKind::GPipe : ScheduleKind::OneFOneB;
    sim::PipelineProfile p;
    p.stages = S;
    p.microbatches = m;
    p.schedule = kind;
    for (int s = 0; s < S; ++s) {
      p.forward_s.push_back(0.001 + 0.01 * rng.uniform());
      p.backward_s.push_back(0.002 + 0.02 * rng.uniform());
    }
    const int64_t floats = 1 + int64_t(rng.next_u64() % 5000);
    p.activation_bytes = double(floats) * 4;
    p.token_bytes = 12;
    p.bandwidth_bps = rng.next_u64() % 4 ? 1e6 + 1e8 * rng.uniform() : 0.0;
    p.latency_s = rng.next_u64() % 3 ? 0.02 * rng.uniform() : 0.0;
    const auto sim = sim::simulate_pipeline(p, 1);
    const auto real =
        run_pipeline(kind, S, m, p.forward_s, p.backward_s, LinkConfig{p.bandwidth_bps, p.latency_s}, floats);
    for (int s = 0; s < S; ++s) {
      LOCO_EXPECT_NEAR(sim.first_step[size_t(s)].schedule_end, real[size_t(s)].end, 1e-12) << "trial " << trial;
      LOCO_EXPECT_NEAR(sim.first_step[size_t(s)].bubble, real[size_t(s)].bubble, 1e-12) << "trial " << trial;
      LOCO_EXPECT_NEAR(sim.first_step[size_t(s)].compute, real[size_t(s)].compute, 1e-12);
    }
  }
}

TEST(PipelineSimulator, SteadyStateBubbleOnEqualStages) {
  // With free links and equal stages the step takes (m + S - 1)(tf + tb).
  for (auto kind : {ScheduleKind::OneFOneB, ScheduleKind::GPipe})
    for (int S : {2, 4})
      for (int m : {1, 4, 8}) {
        sim::PipelineProfile p;
        p.stages = S;
        p.microbatches = m;
        p.schedule = kind;
        p.forward_s.assign(size_t(S), 0.5);
        p.backward_s.assign(size_t(S), 1.0);
        const auto r = sim::simulate_pipeline(p, 5);
        EXPECT_DOUBLE_EQ(r.step_s, (m + S - 1) * 1.5);
        for (double b : r.bubble_share) LOCO_EXPECT_NEAR(b, double(S - 1) / (m + S - 1), 1e-12);
      }
}
