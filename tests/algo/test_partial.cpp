// Partial parameter updates (docs/partial.md): sliced backward, trainable-only state,
// count-vector synchronization.
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "algo/algorithm.h"
#include "algo/partial.h"
#include "comm/inprocess.h"
#include "core/rng.h"
#include "model/trainable.h"
#include "model/transformer.h"
#include "optim/adamw.h"

using namespace loco;

namespace {

ModelConfig model_config(int kv_heads = 0) {
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_heads = 4;
  c.intermediate_size = 24;
  c.max_seq_len = 8;
  c.qk_norm = true;
  c.num_kv_heads = kv_heads;
  return c;
}

bool in_ranges(const std::vector<Range>& ranges, int64_t i) {
  for (const auto& r : ranges)
    if (i >= r.begin && i < r.end) return true;
  return false;
}

}  // namespace

TEST(Partial, SlicedBackwardEqualsTheFullBackwardOnTrainedEntries) {
  for (int kv_heads : {0, 2}) {  // 0: 4 heads of their own; 2: grouped-query attention
    SCOPED_TRACE("kv_heads " + std::to_string(kv_heads));
    const ModelConfig c = model_config(kv_heads);
    // A stage without the embedding, so the gradient with respect to its input is visible.
    const StageSpec stage{0, c.num_layers, false, true};
    Transformer model(c, stage);
    const auto& layout = model.layout();
    std::vector<float> params(size_t(layout.size()));
    model.init_params(params.data(), 3);
    const int B = 2, S = 8, d = c.hidden_size;
    Rng rng(4);
    std::vector<float> x(size_t(B * S * d));
    for (auto& v : x) v = float(rng.normal());
    std::vector<int32_t> targets(size_t(B * S));
    for (size_t i = 0; i < targets.size(); ++i) targets[i] = int32_t((i * 13) % 40);

    Workspace ws(c, stage, B, S);
    model.forward(params.data(), nullptr, x.data(), targets.data(), ws);
    std::vector<float> full(params.size(), 0.0f), dx_full(x.size(), 0.0f);
    model.backward(params.data(), full.data(), nullptr, targets.data(), 1.0, nullptr, dx_full.data(), ws);

    for (const std::string strategy : {"mlp", "mlp+heads"})
      for (int N : {1, 2, 4})
        for (int n = 0; n < N; ++n) {
          if (strategy == "mlp+heads" && c.kv_heads() % N != 0) continue;  // would split a group
          const TrainableSet set(layout, n, N, strategy);
          std::vector<float> compact(size_t(set.size()), 0.0f), dx(x.size(), 0.0f);
          model.forward(params.data(), nullptr, x.data(), targets.data(), ws);
          model.backward(params.data(), compact.data(), nullptr, targets.data(), 1.0, nullptr, dx.data(), ws, &set);
          // Activation gradients: unchanged by slicing (the same products, bit for bit).
          EXPECT_EQ(dx, dx_full) << strategy << " " << N;
          // Parameter gradients: the full backward's entries, range by range.
          double worst = 0, scale = 0;
          for (size_t k = 0; k < set.ranges().size(); ++k) {
            const auto& r = set.ranges()[k];
            for (int64_t i = 0; i < r.size(); ++i) {
              const double a = compact[size_t(set.compact_offsets()[k] + i)], b = full[size_t(r.begin + i)];
              worst = std::max(worst, std::abs(a - b));
              scale = std::max(scale, std::abs(b));
            }
          }
          LOCO_EXPECT_BELOW(worst, 1e-6 * scale) << strategy << " N=" << N << " n=" << n;
          if (N == 1) {
            EXPECT_TRUE(set.full());
            EXPECT_EQ(compact, full) << "N = 1 is the full backward, bitwise";
          }
        }
  }
}

TEST(Partial, OnlyTrainedEntriesGetGradientAndOptimizerStorage) {
  const ModelConfig c = model_config();
  const ParamLayout layout(c);
  const int64_t d = c.hidden_size, f = c.intermediate_size, L = c.num_layers, P = layout.size();
  for (int N : {1, 2, 4}) {
    const TrainableSet mlp(layout, 1 % N, N, "mlp"), heads(layout, N - 1, N, "mlp+heads");
    // Frozen: (1 - 1/N) of gate, up, down (3 f d) and, with heads, of q, k, v (3 d d) per block.
    EXPECT_EQ(mlp.size(), P - L * 3 * f * d * (N - 1) / N) << N;
    EXPECT_EQ(heads.size(), P - L * (3 * f * d + 3 * d * d) * (N - 1) / N) << N;
    // Grouped-query attention (2 key/value heads of 4): k and v have d / 2 rows.
    if (N <= 2) {
      const ParamLayout gqa(model_config(2));
      const TrainableSet sliced(gqa, N - 1, N, "mlp+heads");
      EXPECT_EQ(sliced.size(), gqa.size() - L * (3 * f * d + 2 * d * d) * (N - 1) / N) << N;
    }
    EXPECT_EQ(total_size(heads.ranges()), heads.size());
    AdamW opt({}, layout, &heads);
    EXPECT_EQ(int64_t(opt.m().size() + opt.v().size()), 2 * heads.size());
  }
}

TEST(Partial, InnerStepsLeaveFrozenSlicesUntouched) {
  const ModelConfig c = model_config();
  Transformer model(c);
  const auto& layout = model.layout();
  const TrainableSet set(layout, 1, 2, "mlp+heads");
  std::vector<float> params(size_t(layout.size())), grads(size_t(set.size()));
  model.init_params(params.data(), 9);
  const auto before = params;
  AdamW opt({}, layout, &set);
  std::vector<int32_t> tokens(16), targets(16);
  Workspace ws(c, model.stage(), 2, 8);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = int32_t((i * 7 + size_t(step)) % 40);
      targets[i] = int32_t((i * 5 + 3) % 40);
    }
    std::fill(grads.begin(), grads.end(), 0.0f);
    model.forward(params.data(), tokens.data(), nullptr, targets.data(), ws);
    model.backward(params.data(), grads.data(), tokens.data(), targets.data(), 1.0, nullptr, nullptr, ws, &set);
    opt.step(params.data(), grads.data(), 1e-2);
  }
  int64_t changed = 0, frozen_changed = 0;
  for (int64_t i = 0; i < layout.size(); ++i) {
    const bool moved = params[size_t(i)] != before[size_t(i)];
    (in_ranges(set.ranges(), i) ? changed : frozen_changed) += moved;
  }
  EXPECT_EQ(frozen_changed, 0);
  EXPECT_GT(changed, set.size() / 2);
}

TEST(Partial, RoundAveragesEachEntryOverTheNodesThatTrainIt) {
  RunConfig cfg;
  cfg.model = model_config();
  cfg.data.seq_len = 8;
  cfg.data.batch_size = 1;
  cfg.algorithm = "diloco";
  cfg.outer.inner_steps = 4;
  cfg.outer.lr = 0.7;
  cfg.outer.momentum = 0.9;
  cfg.outer.nesterov = true;
  cfg.partial = {2, "mlp+heads"};
  const int M = 4;
  const ParamLayout layout(cfg.model);
  const size_t n = size_t(layout.size());
  auto tokens = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>(200, 1));
  std::vector<float> theta0(n);
  Rng init(1);
  for (auto& x : theta0) x = float(init.normal());
  // "Training": each node moves only the entries it trains.
  std::vector<std::vector<float>> trained(M, theta0);
  std::vector<TrainableSet> sets;
  for (int r = 0; r < M; ++r) {
    sets.emplace_back(layout, r % 2, 2, "mlp+heads");
    Rng noise(uint64_t(50 + r));
    for (const auto& range : sets.back().ranges())
      for (int64_t i = range.begin; i < range.end; ++i) trained[size_t(r)][size_t(i)] += float(0.01 * noise.normal());
  }
  // Independent reference in double: count vector, then Nesterov.
  std::vector<double> expect(n);
  for (size_t i = 0; i < n; ++i) {
    double sum = 0;
    int count = 0;
    for (int r = 0; r < M; ++r)
      if (in_ranges(sets[size_t(r)].ranges(), int64_t(i))) {
        sum += theta0[i] - trained[size_t(r)][i];
        ++count;
      }
    EXPECT_TRUE(count == M || count == M / 2);
    const double delta = sum / count, v = delta;
    expect[i] = theta0[i] - 0.7 * (delta + 0.9 * v);
  }
  auto transports = make_inprocess_transports(M);
  std::vector<std::vector<float>> after(M);
  std::vector<int64_t> sent(M);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < M; ++rank)
    threads.emplace_back([&, rank] {
      Communicator comm(std::move(transports[size_t(rank)]), {}, nullptr);
      Worker w(cfg, comm, tokens);
      EXPECT_EQ(w.grads.size(), size_t(sets[size_t(rank)].size()));
      auto algo = make_algorithm(cfg, w);
      w.params = theta0;
      algo->start(w, false);
      w.params = trained[size_t(rank)];
      for (int64_t step = 1; step <= 4; ++step) algo->after_step(w, step, false);
      after[size_t(rank)] = w.params;
      sent[size_t(rank)] = comm.traffic().to_json()["bytes_sent"].get<int64_t>();
    });
  for (auto& t : threads) t.join();
  for (int r = 1; r < M; ++r) EXPECT_EQ(after[size_t(r)], after[0]) << "every node ends with the same parameters";
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(after[0][i] - expect[i]) / (std::abs(expect[i]) + 1e-3));
  LOCO_EXPECT_BELOW(worst, 1e-5);
  // On the wire: the shared entries by ring all-reduce (2 (M-1)/M of them); the own slice by
  // a ring all-reduce in its group of G = M/N nodes (2 (G-1)/G of it) and to the N - 1 other
  // members of its column; no zeros for slices a node does not train.
  const int64_t shared = total_size(subtract_ranges({{0, int64_t(n)}}, merge_ranges([&] {
    auto all = layout.slice_ranges(0, 2, SliceStrategy::MlpHeads);
    for (const auto& r : layout.slice_ranges(1, 2, SliceStrategy::MlpHeads)) all.push_back(r);
    return all;
  }())));
  const int64_t own = sets[0].size() - shared;
  const int N = 2, G = M / N;
  EXPECT_EQ(sent[0], 4 * (ring_all_reduce_floats_sent(shared, M, 0) + ring_all_reduce_floats_sent(own, G, 0) +
                         (N - 1) * own));
}

// The average written over the parameters (loco.torch's held DiLoCo round, DiLoCo's reduce) is
// what start and finish compute into a vector of their own, bit for bit, with and without slices.
TEST(Partial, AverageInPlaceEqualsStartAndFinish) {
  const ModelConfig model = model_config();
  const ParamLayout layout(model);
  const int64_t n = layout.size();
  const int M = 4;
  std::vector<float> plain;  // rank 0's average without slices
  for (int slices : {1, 2}) {
    auto transports = make_inprocess_transports(M);
    std::vector<std::thread> threads;
    std::vector<std::vector<float>> packed(M), in_place(M);
    for (int rank = 0; rank < M; ++rank)
      threads.emplace_back([&, rank] {
        Communicator comm(std::move(transports[size_t(rank)]), {}, nullptr);
        const CountVectorAverage average(layout, slices, "mlp", rank, M);
        std::vector<float> params(static_cast<size_t>(n));
        Rng rng(uint64_t(7 + rank));
        for (auto& x : params) x = float(rng.normal());
        const std::vector<Range> whole{{0, n}};
        CountVectorAverage::Op op;
        average.start(comm, params.data(), whole, op);
        average.finish(comm, op, whole, packed[size_t(rank)]);
        in_place[size_t(rank)] = params;
        const float* at = in_place[size_t(rank)].data();
        average.average_in_place(comm, in_place[size_t(rank)]);
        EXPECT_EQ(in_place[size_t(rank)].data(), at) << "the buffer moved (loco.torch registered it)";
      });
    for (auto& t : threads) t.join();
    for (int rank = 0; rank < M; ++rank) {
      ASSERT_EQ(packed[size_t(rank)].size(), size_t(n));
      EXPECT_EQ(0, std::memcmp(packed[size_t(rank)].data(), in_place[size_t(rank)].data(), size_t(n) * sizeof(float)))
          << slices << " slice(s), rank " << rank;
    }
    if (slices == 1) plain = packed[0];
    else  // each slice averaged over its trainers differs from the plain mean: slicing was exercised
      EXPECT_NE(0, std::memcmp(plain.data(), packed[0].data(), size_t(n) * sizeof(float)));
  }
}

// Members that come and go (the elastic backend): each average learns the round's slices. With
// the fixed run's assignment (member k trains slice k mod N) it equals the fixed replicas'
// average bit for bit; with any other (a slice trained by one member, by three, by nobody) each
// entry is the mean over the members that train it, and a slice nobody trains keeps its values.
// A member naming a slice that does not exist is refused, and blamed.
TEST(Partial, AverageAmongMembersCountsTheRoundsSlices) {
  const ModelConfig model = model_config();
  const ParamLayout layout(model);
  const int64_t n = layout.size();
  const int N = 3;
  const std::vector<Range> whole{{0, n}};
  auto run = [&](const std::vector<int>& slice_of, bool fixed, std::vector<std::vector<float>>& in,
                 std::vector<std::vector<float>>& out, std::vector<std::string>* errors = nullptr) {
    const int M = int(slice_of.size());
    auto transports = make_inprocess_transports(M);
    in.assign(size_t(M), {});
    out.assign(size_t(M), {});
    if (errors) errors->assign(size_t(M), "");
    std::vector<std::thread> threads;
    for (int rank = 0; rank < M; ++rank)
      threads.emplace_back([&, rank] {
        Communicator comm(std::move(transports[size_t(rank)]), {2.0, 1.0}, nullptr);
        std::vector<float> params(static_cast<size_t>(n));
        Rng rng(uint64_t(11 + rank));
        for (auto& x : params) x = float(rng.normal());
        in[size_t(rank)] = params;
        try {
          const CountVectorAverage average =
              fixed ? CountVectorAverage(layout, N, "mlp", rank, M)
                    : CountVectorAverage::among_members(layout, N, "mlp", std::max(0, slice_of[size_t(rank)]));
          if (slice_of[size_t(rank)] < 0) {  // a hostile member: names slice 7 of 3
            std::vector<std::string> got;
            const int32_t bad = 7;
            auto h = comm.all_gather_direct_start(std::string(reinterpret_cast<const char*>(&bad), 4), &got,
                                                  "partial_slices");
            comm.wait(h);
            return;
          }
          CountVectorAverage::Op op;
          average.start(comm, params.data(), whole, op);
          average.finish(comm, op, whole, out[size_t(rank)]);
        } catch (const PeerError& e) {
          if (errors) (*errors)[size_t(rank)] = e.what() + std::string(" peers ") + std::to_string(e.peers().at(0));
          comm.abort(e.what());
        } catch (const std::exception& e) {  // a member failed by another's abort
          if (errors) (*errors)[size_t(rank)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
  };
  std::vector<std::vector<float>> in, fixed_out, among_out;
  run({0, 1, 2, 0, 1, 2}, true, in, fixed_out);
  run({0, 1, 2, 0, 1, 2}, false, in, among_out);
  for (int r = 0; r < 6; ++r)
    EXPECT_EQ(0, std::memcmp(fixed_out[size_t(r)].data(), among_out[size_t(r)].data(), size_t(n) * sizeof(float)))
        << "member " << r;
  std::vector<std::vector<Range>> slice(N);
  for (int s = 0; s < N; ++s) slice[size_t(s)] = layout.slice_ranges(s, N, SliceStrategy::Mlp);
  for (const std::vector<int>& assignment : {std::vector<int>{2, 0, 2, 2}, std::vector<int>{1, 1}, std::vector<int>{0}}) {
    run(assignment, false, in, among_out);
    const int M = int(assignment.size());
    double worst = 0;
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      int owner = -1;
      for (int s = 0; s < N; ++s)
        if (in_ranges(slice[size_t(s)], i)) owner = s;
      double sum = 0;
      int count = 0;
      for (int m = 0; m < M; ++m)
        if (owner < 0 || assignment[size_t(m)] == owner) {
          sum += in[size_t(m)][size_t(i)];
          ++count;
        }
      for (int m = 0; m < M; ++m) {
        // Nobody trains the entry: each member keeps its own value.
        const double expect = count ? sum / count : in[size_t(m)][size_t(i)];
        kept += count == 0 && m == 0;
        worst = std::max(worst, std::abs(among_out[size_t(m)][size_t(i)] - expect));  // values of about 1
      }
    }
    LOCO_EXPECT_BELOW(worst, 1e-6);
    for (int m = 1; m < M; ++m) {  // the entries some member trains are the same everywhere
      for (int s = 0; s < N; ++s) {
        if (!std::count(assignment.begin(), assignment.end(), s)) continue;
        for (const auto& r : slice[size_t(s)]) {
          EXPECT_EQ(0, std::memcmp(among_out[size_t(m)].data() + r.begin, among_out[0].data() + r.begin,
                                   size_t(r.size()) * sizeof(float)));
        }
      }
    }
    EXPECT_GT(kept, 0) << "an assignment leaving a slice untrained was exercised";
  }
  std::vector<std::string> errors;
  run({0, -1, 1}, false, in, among_out, &errors);
  // Both honest members stop with the reason; the first to find it (or both) blames member 1,
  // the other may fail by its abort first.
  for (int m : {0, 2}) EXPECT_NE(errors[size_t(m)].find("member 1 sent no valid slice"), std::string::npos) << errors[size_t(m)];
  EXPECT_TRUE(errors[0].find("peers 1") != std::string::npos || errors[2].find("peers 1") != std::string::npos)
      << errors[0] << " | " << errors[2];
}
