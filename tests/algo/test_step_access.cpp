// Algorithm::access (algo/algorithm.h) is a contract: a caller that keeps the parameters elsewhere
// (loco.torch's CUDA models) copies to the host only the ranges a step's hooks read, and back only
// those they write. Each method runs here twice with 2 in-process replicas and the same
// deterministic "inner steps": once as the native trainer does (w.params always current), once as
// loco.torch does with a device copy (w.params filled with NaN outside the ranges read before the
// hooks, only the ranges written taken back after them). The two must end bitwise equal, and the
// hooks must write nothing outside the ranges they declare, nor use anything in the steps that
// quiet_until said would use nothing. The device run is made twice more as loco.torch runs a step
// on a device: the merge first (merge_access, merge_step), then the rest (access, after_step),
// then the syncs in flight prepared ahead of their merge (prepare_merges, on loco.torch's thread);
// and once more with the merges made by the caller (mix_merges_elsewhere: Streaming DiLoCo's
// synchronized values taken ahead and merged with alpha on the device, the outer state written
// back to the store later), with the outer state saved mid-run compared too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <thread>

#include "algo/algorithm.h"
#include "comm/inprocess.h"
#include "core/error.h"
#include "model/transformer.h"

using namespace loco;

namespace {

RunConfig access_config(const std::string& algorithm) {
  RunConfig c;
  c.algorithm = algorithm;
  c.model.vocab_size = 32;
  c.model.hidden_size = 8;
  c.model.num_layers = 4;
  c.model.num_heads = 2;
  c.model.intermediate_size = 16;
  c.model.max_seq_len = 8;
  c.data.seq_len = 8;
  c.data.batch_size = 2;
  c.train.steps = 23;
  c.distributed.replicas = 2;
  c.outer.inner_steps = 6;
  c.outer.lr = 0.7;
  c.outer.momentum = 0.9;
  c.streaming.fragment_blocks = 1;
  c.noloco.inner_steps = 5;
  c.noloco.group_size = 2;
  return c;
}

// A replica-dependent gradient of an inner step.
void make_grads(std::vector<float>& grads, int rank, int64_t step) {
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = float(std::sin(0.37 * double(i) + 1.3 * rank + 0.11 * step));
}
void apply_grads(std::vector<float>& params, const std::vector<float>& grads) {
  for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.01f * grads[i % grads.size()];
}

bool inside(const std::vector<Range>& rs, int64_t i) {
  for (const auto& r : rs)
    if (i >= r.begin && i < r.end) return true;
  return false;
}

struct Outcome {
  std::vector<std::vector<float>> params, eval;  // per replica: the trained and the evaluated parameters
  std::vector<std::vector<float>> saved;         // per replica: the outer state saved after step 11
  int64_t steps_touching = 0;                     // steps whose hooks read or wrote anything (replica 0)
  int64_t first_touching = 0;                     // the first of them
  std::string violation;                          // a write outside the declared ranges
};

// DevicePeek: as DeviceSplit, the merges made by the caller where the method lets it
// (mix_merges_elsewhere): the synchronized values taken ahead of the merge (written by
// prepare_merges into a buffer for each sync merges_ahead() names, then peek_outer_results) and
// merged from that copy, as loco.torch does.
enum class Mode { Host, Device, DeviceSplit, DevicePeek };

// alpha * local + (1 - alpha) * synced, one rounding per operation (no fused multiply-add), as
// algo/streaming.cpp and loco.torch on a device compute it.
float mixed(float alpha, float local, float synced) {
  volatile float kept = alpha * local, taken = (1.0f - alpha) * synced;
  return kept + taken;
}

// The values of a fragment: its segments' sizes summed.
int64_t fragment_size(const std::vector<OuterSegment>& segments) {
  int64_t n = 0;
  for (const auto& x : segments) n += x.end - x.begin;
  return n;
}

// As loco.torch gives prepare_merges: a buffer for each fragment merges_ahead() names, NaN-filled,
// in `values`.
std::map<size_t, SyncedBuffer> buffers_ahead(const Algorithm& algo, std::map<size_t, std::vector<float>>& values) {
  const auto segments = algo.outer_segments();
  std::map<size_t, SyncedBuffer> buffers;
  for (size_t j : algo.merges_ahead()) {
    const int64_t n = fragment_size(segments[j]);
    values[j].assign(size_t(n), std::numeric_limits<float>::quiet_NaN());
    buffers[j] = SyncedBuffer{values[j].data(), n};
  }
  return buffers;
}

// One replica of Streaming DiLoCo with tau 2 whose merges the caller mixes (mix_merges_elsewhere),
// started: fragment 0's sync starts at step 6 and merges at 8.
struct CallerMixed {
  explicit CallerMixed(const RunConfig& base)
      : cfg(one_replica(base)),
        comm(std::move(make_inprocess_transports(1)[0]), {}, nullptr),
        w(cfg, comm, std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>(400, 1))) {
    Transformer(cfg.model).init_params(w.params.data(), 5);
    algo = make_algorithm(cfg, w);
    mixes = algo->mix_merges_elsewhere();
    algo->start(w, false);
  }
  static RunConfig one_replica(RunConfig c) {
    c.distributed.replicas = 1;
    c.streaming.tau = 2;
    return c;
  }
  RunConfig cfg;
  Communicator comm;
  Worker w;
  std::unique_ptr<Algorithm> algo;
  bool mixes = false;
};

Outcome run(const RunConfig& cfg, Mode mode) {
  const bool device = mode != Mode::Host;
  auto transports = make_inprocess_transports(2);
  auto tokens = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>(400, 1));
  Outcome out;
  out.params.resize(2);
  out.eval.resize(2);
  out.saved.resize(2);
  std::vector<std::string> violation(2);
  std::vector<int64_t> touching(2, 0), first(2, 0), quiet(2, 0);
  std::vector<std::thread> threads;
  for (int m = 0; m < 2; ++m)
    threads.emplace_back([&, m] {
      Communicator comm(std::move(transports[size_t(m)]), {}, nullptr);
      Worker w(cfg, comm, tokens);
      Transformer(cfg.model).init_params(w.params.data(), 5);
      auto algo = make_algorithm(cfg, w);
      const bool peeks = mode == Mode::DevicePeek;
      if (peeks) algo->mix_merges_elsewhere();
      const auto segments = algo->outer_segments();
      std::map<size_t, std::vector<float>> taken;  // fragment -> its synchronized values, peeked
      algo->start(w, false);
      std::vector<float> dev = w.params, dgrads = w.grads;  // the device's parameters and gradients
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (int64_t t = 0; t < cfg.train.steps; ++t) {
        const int64_t done = t + 1;
        const bool last = done == cfg.train.steps;
        w.step = t;
        // With the merge first, its hooks run after the inner step (below); what they use is
        // asked now, with the rest's, as loco.torch asks before either.
        const bool split = mode == Mode::DeviceSplit || peeks;
        const StepAccess ma = split ? algo->merge_access(w, done, last) : StepAccess::nothing();
        StepAccess a = algo->access(w, done, last);
        const bool merges_first = !ma.writes.empty();
        const bool uses = !a.reads.empty() || !a.writes.empty() || a.gradients || merges_first;
        if (uses && done < quiet[size_t(m)] && violation[size_t(m)].empty())
          violation[size_t(m)] = "step " + std::to_string(done) + " uses buffers inside a quiet window";
        const int64_t q = algo->quiet_until(w, done, last);
        if (q <= done && violation[size_t(m)].empty()) violation[size_t(m)] = "quiet_until <= done";
        quiet[size_t(m)] = q;
        std::vector<float>& p = device ? dev : w.params;
        std::vector<float>& g = device ? dgrads : w.grads;
        make_grads(g, m, t);
        if (device) w.grads = a.gradients ? dgrads : std::vector<float>(dgrads.size(), nan);
        algo->on_gradients(w);
        if (device && a.gradients) dgrads = w.grads;
        apply_grads(p, g);
        auto take_back = [&](const std::vector<float>& before, const std::vector<Range>& writes) {
          for (int64_t i = 0; i < int64_t(dev.size()); ++i) {
            const float b = before[size_t(i)], now = w.params[size_t(i)];
            const bool same = (std::isnan(b) && std::isnan(now)) || b == now;
            if (!same && !inside(writes, i) && violation[size_t(m)].empty())
              violation[size_t(m)] = "step " + std::to_string(done) + " wrote entry " + std::to_string(i) + " outside its writes";
            if (device && inside(writes, i)) dev[size_t(i)] = now;
          }
        };
        if (merges_first) {
          for (int64_t i = 0; i < int64_t(dev.size()); ++i) w.params[size_t(i)] = inside(ma.reads, i) ? dev[size_t(i)] : nan;
          const std::vector<float> before = w.params, local = dev;
          algo->merge_step(w, done, last);
          take_back(before, ma.writes);
          for (auto it = taken.begin(); it != taken.end();) {  // merged from the values peeked
            if (!inside(ma.writes, segments[it->first].front().begin)) {
              ++it;
              continue;
            }
            for (const auto& x : segments[it->first])
              for (int64_t i = x.begin; i < x.end; ++i) {
                const float synced = it->second[size_t(x.packed + i - x.begin)];
                dev[size_t(i)] = x.trained && cfg.streaming.alpha != 0
                                     ? mixed(float(cfg.streaming.alpha), local[size_t(i)], synced)
                                     : synced;
              }
            it = taken.erase(it);
          }
          const StepAccess rest = algo->access(w, done, last);  // what is left of the step
          for (const auto& r : rest.writes)
            if (!inside(a.writes, r.begin) && violation[size_t(m)].empty())
              violation[size_t(m)] = "step " + std::to_string(done) + ": the rest writes what access() did not declare";
          a = rest;
        }
        if (device) {
          for (int64_t i = 0; i < int64_t(dev.size()); ++i) w.params[size_t(i)] = inside(a.reads, i) ? dev[size_t(i)] : nan;
        }
        const std::vector<float> before = w.params;
        algo->after_step(w, done, last);
        if (uses && ++touching[size_t(m)] == 1) first[size_t(m)] = done;
        take_back(before, a.writes);
        // Saved after step 11 (Streaming DiLoCo: syncs in flight; with tau 2 fragment 3 merged at
        // 11, where no sync starts, so that its outer state is still to be written to the store
        // when the caller mixes), before the syncs in flight are prepared.
        if (done == 11) {
          TrainingState st;
          algo->save_state(st);
          for (const char* key : {"outer.params", "outer.momentum"}) {
            auto it = st.tensors.find(key);
            if (it != st.tensors.end())
              out.saved[size_t(m)].insert(out.saved[size_t(m)].end(), it->second.begin(), it->second.end());
          }
        }
        if (split) {
          // As loco.torch: a buffer for each sync merges_ahead() names, written by prepare_merges.
          std::map<size_t, std::vector<float>> into;
          algo->prepare_merges(buffers_ahead(*algo, into));
          for (const auto& r : algo->peek_outer_results()) {
            if (!peeks || !into.count(r.fragment)) {
              if (violation[size_t(m)].empty())
                violation[size_t(m)] = "step " + std::to_string(done) + ": peek names fragment " +
                                       std::to_string(r.fragment) + ", which merges_ahead() did not";
              continue;
            }
            taken[r.fragment] = std::move(into[r.fragment]);
          }
        }
        // Saved again after step 11's syncs in flight were prepared (device modes; a codec's then
        // stepped ahead, its average computed again for the state), with their averages: as the host
        // run saves them at the same point, without preparing.
        if (done == 11) {
          TrainingState st;
          algo->save_state(st);
          for (const auto& [key, v] : st.tensors)
            if (key.rfind("pending.", 0) == 0 || key.rfind("outer.", 0) == 0)
              out.saved[size_t(m)].insert(out.saved[size_t(m)].end(), v.begin(), v.end());
        }
        if (last) taken.clear();  // the last step applied every sync itself
      }
      if (device) w.params = dev;  // what loco.torch copies to the host before an evaluation
      out.eval[size_t(m)] = algo->eval_params(w);
      out.params[size_t(m)] = w.params;
    });
  for (auto& t : threads) t.join();
  out.steps_touching = touching[0];
  out.first_touching = first[0];
  out.violation = violation[0] + violation[1];
  return out;
}

// touching: how many steps copy anything, first: the first of them.
void expect_contract(const RunConfig& cfg, const std::string& what, int64_t touching, int64_t first) {
  const Outcome host = run(cfg, Mode::Host);
  EXPECT_EQ(host.violation, "") << what;
  for (Mode mode : {Mode::Device, Mode::DeviceSplit, Mode::DevicePeek}) {
    const Outcome device = run(cfg, mode);
    const std::string how = what + (mode == Mode::Device        ? ""
                                    : mode == Mode::DeviceSplit ? ", merge first"
                                                                : ", merged by the caller from values taken ahead");
    EXPECT_EQ(device.violation, "") << how;
    for (int m = 0; m < 2; ++m) {
      EXPECT_TRUE(host.params[size_t(m)] == device.params[size_t(m)]) << how << ": replica " << m << "'s parameters";
      EXPECT_TRUE(host.eval[size_t(m)] == device.eval[size_t(m)]) << how << ": replica " << m << "'s evaluated ones";
      EXPECT_TRUE(host.saved[size_t(m)] == device.saved[size_t(m)]) << how << ": replica " << m << "'s saved outer state";
      for (float x : device.params[size_t(m)]) ASSERT_TRUE(std::isfinite(x)) << how << ": a stale entry was read";
    }
    EXPECT_EQ(device.steps_touching, touching) << how << ": steps that copy anything";
    EXPECT_EQ(device.first_touching, first) << how << ": the first step that copies anything";
  }
}

}  // namespace

TEST(StepAccess, DdpUsesTheGradientsOfEveryStepAndNeverTheParameters) {
  expect_contract(access_config("ddp"), "ddp", 23, 1);
}

TEST(StepAccess, DilocoTouchesTheModelOnlyWhenARoundEnds) {
  // 23 steps, H = 6: rounds end at 6, 12, 18 and the last step.
  expect_contract(access_config("diloco"), "diloco", 4, 6);
  RunConfig warm = access_config("diloco");
  warm.outer.start_step = 4;  // data-parallel steps 1..4 (gradients), then rounds at 10, 16, 22, 23
  expect_contract(warm, "diloco start_step 4", 8, 1);
}

TEST(StepAccess, StreamingTouchesOnlyTheFragmentsItSyncsOrMerges) {
  for (int tau : {0, 2})
    for (double alpha : {0.0, 0.5}) {
      RunConfig c = access_config("streaming");
      c.streaming.tau = tau;
      c.streaming.alpha = alpha;
      // 5 fragments (4 blocks, then the rest) with offsets j floor(6 / 5) = j: fragment j syncs at
      // j + 6, j + 12, j + 18 (steps 6-10, 12-16, 18-22), merges tau steps later, and the last
      // step (23) ends every round. Steps 1-5 copy nothing; with tau 0 neither do 11 and 17.
      const int64_t touching = tau == 0 ? 16 : 18;
      const std::string what = "streaming tau " + std::to_string(tau) + " alpha " + std::to_string(alpha);
      expect_contract(c, what, touching, 6);
      c.outer.codec = "fp4-e3m0";
      expect_contract(c, what + " fp4", touching, 6);
    }
}

TEST(StepAccess, PartialUpdatesReadOnlyTheEntriesEachReplicaTrains) {
  // 2 slices of the MLPs over 2 replicas: a sync reads the shared entries and the replica's own
  // slice (the rest is NaN on the device run, so a read of it fails the finiteness check) and
  // writes the whole fragment.
  for (const char* algorithm : {"diloco", "streaming"}) {
    RunConfig c = access_config(algorithm);
    c.partial.slices = 2;
    expect_contract(c, std::string("partial ") + algorithm, algorithm == std::string("diloco") ? 4 : 18, 6);
  }
}

TEST(StepAccess, NolocoTouchesTheModelOnlyAtOuterSteps) {
  // 23 steps, H = 5: outer steps at 5, 10, 15, 20 and the last step.
  expect_contract(access_config("noloco"), "noloco", 5, 5);
}

TEST(StepAccess, AMergeByTheCallerOfASyncNotTakenAheadIsRefused) {
  // One replica, Streaming DiLoCo with tau 2: fragment 0's sync starts at step 6 and merges at 8.
  // Merged by the caller (mix_merges_elsewhere) without its values taken ahead, the merge would
  // leave the fragment's synchronized values nowhere: it fails instead of training on stale ones.
  for (bool take : {true, false}) {
    RunConfig c = access_config("streaming");
    c.streaming.alpha = 0.5;
    CallerMixed run(c);
    ASSERT_TRUE(run.mixes);
    auto& algo = run.algo;
    std::string error;
    for (int64_t done = 1; done <= 8 && error.empty(); ++done) {
      run.w.step = done - 1;
      try {
        algo->merge_step(run.w, done, false);
        algo->after_step(run.w, done, false);
        std::map<size_t, std::vector<float>> values;
        algo->prepare_merges(buffers_ahead(*algo, values));
        if (take) algo->peek_outer_results();
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (take)
      EXPECT_EQ(error, "");
    else
      EXPECT_NE(error.find("without having taken its synchronized values ahead"), std::string::npos) << error;
  }
}

TEST(StepAccess, PrepareMergesRefusesABufferOfTheWrongSizeOrForNoSyncAhead) {
  // As above: fragment 0's sync starts at step 6. A buffer of another size than the fragment's,
  // or for a fragment with no sync in flight, is refused before anything is written into it.
  RunConfig c = access_config("streaming");
  c.outer.codec = "fp4-e3m0";
  CallerMixed run(c);
  ASSERT_TRUE(run.mixes);
  auto& algo = run.algo;
  for (int64_t done = 1; done <= 6; ++done) {
    run.w.step = done - 1;
    algo->after_step(run.w, done, false);
  }
  ASSERT_EQ(algo->merges_ahead(), std::vector<size_t>{0});
  const int64_t n = fragment_size(algo->outer_segments()[0]);
  std::vector<float> values(size_t(n + 1), -1.0f);
  auto refusal = [&](size_t j, int64_t size) {
    try {
      algo->prepare_merges({{j, SyncedBuffer{values.data(), size}}});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal(0, n + 1).find("its buffer " + std::to_string(n + 1)), std::string::npos);
  EXPECT_NE(refusal(1, n).find("not one of merges_ahead()'s"), std::string::npos);
  EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float x) { return x == -1.0f; }));
  EXPECT_EQ(refusal(0, n), "");
  EXPECT_TRUE(std::none_of(values.begin(), values.begin() + n, [](float x) { return x == -1.0f; }));
  ASSERT_EQ(algo->peek_outer_results().size(), 1u);
  EXPECT_TRUE(algo->merges_ahead().empty());
}
