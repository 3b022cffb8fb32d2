// DiLoCo, Streaming DiLoCo and NoLoCo through their membership interface (algo/sync_group.h), with a scripted
// membership in place of Redis: a failed attempt redone, a member dropped and taken in again, a joiner. What the
// elastic session does to a method, checked on the method itself: a redone reduction leaves no
// trace (parameters, momentum and the screening history equal the run without it), and a member
// that installs the run's outer state holds the same bits as the member that handed it over.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <set>
#include <thread>

#include "algo/algorithm.h"
#include "algo/sync_group.h"
#include "comm/fault.h"
#include "comm/inprocess.h"
#include "core/rng.h"
#include "tiny_diloco.h"

using namespace loco;

namespace {

constexpr int64_t kH = 5;  // inner steps per round (tiny_diloco_config)

// What happens at chosen rounds, shared by the workers of one run.
struct Script {
  std::set<int64_t> redo;  // rounds whose first attempt fails after its reduction: reduced again
  bool redo_all = false;   // ... every round
  int64_t drop = -1;       // round in which member 1 is dropped: member 0 reduces alone and hands
                           // member 1 its outer state, which member 1 installs (run_round: false)
  std::promise<OuterState> dropped_state;
  int64_t hand_over = -1;  // round whose outer state member 0 hands to a joiner
  OuterState handed;
};

// A membership of every worker, over the worker's own communicator, following the script.
class ScriptedGroup : public SyncGroup {
 public:
  explicit ScriptedGroup(Script& script, bool joiner = false) : script_(script), joiner_(joiner) {}

  void start(Worker& w, bool, const Install& install) override {
    if (joiner_) install(w, script_.handed);
  }
  bool run_round(Worker& w, const Round& r, const Install& install) override {
    if (r.id == script_.drop) {
      if (w.rank == 1) {
        OuterState s = script_.dropped_state.get_future().get();
        install(w, s);
        return false;
      }
      auto solo = make_inprocess_transports(1);
      Communicator comm(std::move(solo[0]), {}, nullptr);
      r.reduce(comm, 0, 1);
      OuterState s;
      r.outer_state(s);
      script_.dropped_state.set_value(std::move(s));
      r.commit();
      return true;
    }
    r.reduce(w.comm, w.rank, w.replicas);
    if (script_.redo_all || script_.redo.count(r.id)) r.reduce(w.comm, w.rank, w.replicas);  // failed: again
    if (r.id == script_.hand_over && w.rank == 0) r.outer_state(script_.handed);
    r.commit();
    ++rounds_;
    return true;
  }
  bool members_change() const override { return true; }  // as the elastic session: screening on
  void report(nlohmann::json& out) const override { out["scripted_rounds"] = rounds_; }

 private:
  Script& script_;
  bool joiner_;
  int rounds_ = 0;
};

// One member's end: its parameters, outer parameters and saved state.
struct End {
  std::vector<float> params, theta;
  TrainingState state;
  nlohmann::json report;
};

std::vector<float> initial_params(size_t n) {
  Rng init(1);
  std::vector<float> p(n);
  for (auto& x : p) x = float(init.normal());
  return p;
}

RunConfig config(const std::string& method) {
  RunConfig cfg = tiny_diloco_config();
  cfg.algorithm = method;
  cfg.noloco.inner_steps = kH;
  cfg.streaming.fragment_blocks = 1;  // 2 fragments: the block (offset 0), the rest (offset 2)
  cfg.streaming.tau = 0;
  return cfg;
}

std::unique_ptr<Algorithm> method(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group,
                                  const Fault& fault) {
  if (cfg.algorithm == "noloco") return make_noloco(cfg, w, std::move(group));
  if (cfg.algorithm == "streaming") return make_streaming(cfg, w, std::move(group), fault);
  return make_diloco(cfg, w, std::move(group), fault);
}

// Two members over `rounds` rounds, each round's "training" a deterministic move from the outer
// parameters; member 1 misbehaves as `fault` says (DiLoCo, Streaming DiLoCo).
std::vector<End> run(Script& script, int64_t rounds, const std::string& fault, const std::string& algorithm = "diloco") {
  const RunConfig cfg = config(algorithm);
  auto tokens = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>(200, 1));
  const int M = 2;
  const size_t n = ParamLayout(cfg.model).size();
  auto transports = make_inprocess_transports(M);
  std::vector<End> ends(M);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < M; ++rank)
    threads.emplace_back([&, rank] {
      Communicator comm(std::move(transports[size_t(rank)]), {}, nullptr);
      Worker w(cfg, comm, tokens);
      auto algo = method(cfg, w, std::make_unique<ScriptedGroup>(script), rank == 1 ? parse_fault(fault) : Fault{});
      w.params = initial_params(n);
      algo->start(w, false);
      for (int64_t round = 0; round < rounds; ++round) {
        Rng r(uint64_t(100 * round + rank));
        for (auto& x : w.params) x = float(x + 0.05 * (1 + r.normal()));
        for (int64_t step = kH * round + 1; step <= kH * (round + 1); ++step) algo->after_step(w, step, false);
      }
      End& e = ends[size_t(rank)];
      e.params = w.params;
      e.theta = algo->eval_params(w);
      algo->save_state(e.state);
      algo->report(e.report);
    });
  for (auto& t : threads) t.join();
  return ends;
}

// A joiner, in a one-member world of its own, whose group installs the outer state the script's
// hand_over round left: its parameters, outer parameters and state after start().
End join(Script& script, const std::string& algorithm) {
  const RunConfig cfg = config(algorithm);
  auto transport = make_inprocess_transports(1);
  Communicator comm(std::move(transport[0]), {}, nullptr);
  Worker w(cfg, comm, std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>(200, 1)));
  w.params = initial_params(w.params.size());
  auto joiner = method(cfg, w, std::make_unique<ScriptedGroup>(script, true), Fault{});
  joiner->start(w, false);
  End e;
  e.params = w.params;
  e.theta = joiner->eval_params(w);
  joiner->save_state(e.state);
  return e;
}

}  // namespace

TEST(SyncGroup, ARedoneReductionLeavesNoTrace) {
  for (const char* fault : {"", "scale:-10@20"}) {  // member 1 bad from round 4: the history leaves it out
    Script plain, redone;
    redone.redo = {1, 4, 5};
    const auto a = run(plain, 6, fault), b = run(redone, 6, fault);
    for (int m = 0; m < 2; ++m) {
      EXPECT_EQ(a[size_t(m)].params, b[size_t(m)].params) << fault << " member " << m;
      EXPECT_EQ(a[size_t(m)].state.tensors, b[size_t(m)].state.tensors) << fault << " member " << m;
      EXPECT_EQ(a[size_t(m)].state.meta, b[size_t(m)].state.meta) << fault << " member " << m;
      EXPECT_EQ(a[size_t(m)].report.at("scripted_rounds"), 6);  // the group's own hooks are the method's
    }
    EXPECT_EQ(a[0].params, a[1].params);
    if (*fault) {  // the history holds the accepted rounds only: 3 with both, 3 with member 0 alone
      const auto h = parse_norm_history(a[0].state.meta.at("outer.norm_history"), 1, "state")[0];
      EXPECT_EQ(h.recent.size(), 6u);
      EXPECT_LT(h.recent.back(), 3 * h.recent.front());
    }
  }
}

TEST(SyncGroup, ADroppedMemberInstallsTheRunsOuterStateAndGoesOn) {
  Script script;
  script.drop = 3;
  const auto e = run(script, 6, "");
  // Member 1 installed member 0's outer state in round 3 and took part in rounds 4-6 again: both
  // end with the same bits, which differ from the run without the drop.
  EXPECT_EQ(e[0].params, e[1].params);
  EXPECT_EQ(e[0].state.tensors, e[1].state.tensors);
  EXPECT_EQ(e[0].state.meta, e[1].state.meta);
  Script none;
  EXPECT_NE(run(none, 6, "")[0].params, e[0].params);
}

TEST(SyncGroup, AJoinerStartsFromTheRoundsOuterState) {
  Script script;
  script.hand_over = 6;
  const auto members = run(script, 6, "scale:-10@20");  // the history has rounds to hand over
  const End j = join(script, "diloco");
  EXPECT_EQ(j.params, members[0].params);  // the outer parameters with round 6's outer step
  EXPECT_EQ(j.theta, members[0].theta);
  EXPECT_EQ(j.state.tensors, members[0].state.tensors);  // outer parameters and momentum
  EXPECT_EQ(j.state.meta, members[0].state.meta);        // the screening history: it screens as the members do
}

TEST(SyncGroup, NolocoRedoneDroppedAndJoined) {
  Script plain, redone, dropped, handing;
  redone.redo = {1, 3};
  dropped.drop = 3;
  handing.hand_over = 4;
  const auto a = run(plain, 5, "", "noloco"), b = run(redone, 5, "", "noloco");
  for (int m = 0; m < 2; ++m) {
    EXPECT_EQ(a[size_t(m)].params, b[size_t(m)].params) << m;  // the exchange redone leaves no trace
    EXPECT_EQ(a[size_t(m)].state.tensors, b[size_t(m)].state.tensors) << m;
  }
  const auto d = run(dropped, 5, "", "noloco");  // member 1 took member 0's phi and delta in round 3
  EXPECT_NE(d[0].params, a[0].params);
  const auto h = run(handing, 4, "", "noloco");
  const End j = join(handing, "noloco");
  EXPECT_EQ(j.params, h[0].theta);  // member 0's slow weights after round 4
  EXPECT_EQ(j.state.tensors, h[0].state.tensors);  // phi and delta
}

TEST(SyncGroup, StreamingRedoneAndJoined) {
  // Fragment j's sync after step s is round s x 2 + j: fragment 0 at steps 5, 10, 15, 20, 25, 30,
  // fragment 1 at 7, 12, ...; member 1 goes bad at step 20 (the history leaves it out).
  Script plain, redone, handing;
  redone.redo_all = true;
  handing.hand_over = 30 * 2;
  const auto a = run(plain, 6, "scale:-10@20", "streaming"), b = run(redone, 6, "scale:-10@20", "streaming");
  for (int m = 0; m < 2; ++m) {
    EXPECT_EQ(a[size_t(m)].params, b[size_t(m)].params) << m;
    EXPECT_EQ(a[size_t(m)].state.tensors, b[size_t(m)].state.tensors) << m;
    EXPECT_EQ(a[size_t(m)].state.meta, b[size_t(m)].state.meta) << m;  // the screening histories included
  }
  const auto h = parse_norm_history(a[0].state.meta.at("outer.norm_history"), 2, "state");
  EXPECT_EQ(h[0].recent.size(), 6u);
  const auto members = run(handing, 6, "scale:-10@20", "streaming");
  const End j = join(handing, "streaming");
  EXPECT_EQ(j.theta, members[0].theta);  // the outer parameters after step 30's syncs
  EXPECT_EQ(j.state.tensors, members[0].state.tensors);
  EXPECT_EQ(j.state.meta.at("outer.norm_history"), members[0].state.meta.at("outer.norm_history"));
}
