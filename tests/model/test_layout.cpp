// Parameter layout: fragments and slices are short lists of contiguous ranges that select
// exactly the intended Hugging Face entries; stages compose into the full model.
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <set>

#include "core/error.h"
#include "io/checkpoint.h"
#include "model/layout.h"
#include "model/trainable.h"
#include "model/transformer.h"

using namespace loco;

namespace {

ModelConfig tiny(bool tied = false, bool qk = false, int kv_heads = 0) {
  ModelConfig c;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.num_layers = 3;
  c.num_heads = 4;
  c.intermediate_size = 24;
  c.max_seq_len = 16;
  c.tie_embeddings = tied;
  c.qk_norm = qk;
  c.num_kv_heads = kv_heads;
  return c;
}

// Marks every entry of the buffer with its own index, exports to HF layout.
std::map<std::string, HfTensor> indexed_hf(const ParamLayout& layout) {
  std::vector<float> buf(size_t(layout.size()));
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(i);
  std::map<std::string, HfTensor> out;
  for (auto& t : export_hf(layout, buf.data())) out[t.name] = std::move(t);
  return out;
}

std::set<int64_t> indices(const std::vector<Range>& ranges) {
  std::set<int64_t> s;
  for (const auto& r : ranges)
    for (int64_t i = r.begin; i < r.end; ++i) s.insert(i);
  return s;
}

}  // namespace

TEST(Layout, FragmentsPartitionTheBuffer) {
  for (bool tied : {false, true})
    for (bool qk : {false, true}) {
      ParamLayout layout(tiny(tied, qk));
      std::vector<Range> all = layout.nonblock_ranges();
      EXPECT_EQ(all.size(), 1u) << "non-block tensors are one range";
      for (int l = 0; l < 3; ++l) all.push_back(layout.block_range(l));
      const auto merged = merge_ranges(all);
      ASSERT_EQ(merged.size(), 1u);
      EXPECT_EQ(merged[0], (Range{0, layout.size()}));
      EXPECT_EQ(total_size(all), layout.size()) << "fragments do not overlap";
      // Every tensor of block l is inside block_range(l).
      for (const auto& t : layout.tensors()) {
        if (t.block < 0) continue;
        const Range r = layout.block_range(t.block);
        EXPECT_GE(t.offset, r.begin);
        EXPECT_LE(t.offset + t.numel(), r.end);
      }
    }
}

TEST(Layout, ParameterCount) {
  const auto c = tiny();
  const int64_t d = 16, f = 24, v = 50, L = 3;
  EXPECT_EQ(ParamLayout(c).size(), 2 * v * d + d + L * (4 * d * d + 3 * d * f + 2 * d));
  EXPECT_EQ(ParamLayout(tiny(true, true)).size(), v * d + d + L * (4 * d * d + 3 * d * f + 2 * d + 2 * (d / 4)));
}

TEST(Layout, MlpSliceSelectsHiddenUnits) {
  const auto c = tiny();
  ParamLayout layout(c);
  const auto hf = indexed_hf(layout);
  const int N = 3, per = 24 / N;
  std::set<int64_t> seen;
  for (int n = 0; n < N; ++n) {
    const auto ranges = layout.slice_ranges(n, N, SliceStrategy::Mlp);
    EXPECT_EQ(ranges.size(), 3u * 3u) << "gate, up, down per block";
    const auto idx = indices(ranges);
    for (int64_t i : idx) EXPECT_TRUE(seen.insert(i).second) << "slices overlap";
    for (int l = 0; l < 3; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
      const auto& gate = hf.at(p + "gate_proj.weight");  // (f, d)
      const auto& up = hf.at(p + "up_proj.weight");      // (f, d)
      const auto& down = hf.at(p + "down_proj.weight");  // (d, f)
      for (int u = 0; u < 24; ++u) {
        const bool mine = u / per == n;
        for (int j = 0; j < 16; ++j) {
          EXPECT_EQ(idx.count(int64_t(gate.data[u * 16 + j])) == 1, mine);
          EXPECT_EQ(idx.count(int64_t(up.data[u * 16 + j])) == 1, mine);
          EXPECT_EQ(idx.count(int64_t(down.data[j * 24 + u])) == 1, mine);  // column u of down
        }
      }
    }
  }
}

TEST(Layout, HeadSliceSelectsQkvRowsOfItsHeads) {
  ParamLayout layout(tiny());
  const auto hf = indexed_hf(layout);
  const int N = 2, hd = 4, heads_per = 4 / N;
  for (int n = 0; n < N; ++n) {
    const auto ranges = layout.slice_ranges(n, N, SliceStrategy::MlpHeads);
    EXPECT_EQ(ranges.size(), 3u * 6u);
    const auto idx = indices(ranges);
    for (int l = 0; l < 3; ++l)
      for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
        const auto& t = hf.at("model.layers." + std::to_string(l) + ".self_attn." + m + ".weight");
        for (int row = 0; row < 16; ++row)
          for (int j = 0; j < 16; ++j) {
            const bool mine = std::string(m) != "o_proj" && row / hd / heads_per == n;
            EXPECT_EQ(idx.count(int64_t(t.data[row * 16 + j])) == 1, mine) << m << " row " << row;
          }
      }
  }
  EXPECT_THROW(layout.slice_ranges(0, 5, SliceStrategy::Mlp), Error);      // 5 does not divide f = 24
  EXPECT_THROW(layout.slice_ranges(0, 3, SliceStrategy::MlpHeads), Error);  // 3 does not divide 4 heads
}

TEST(Layout, GroupedQueryHeadSliceHoldsWholeGroups) {
  // 4 query heads in 2 groups (2 key/value heads of size 4): k and v have 8 rows. Slice n of 2
  // holds key/value head n and the query heads 2n, 2n + 1 that read it.
  ParamLayout layout(tiny(false, false, 2));
  const auto hf = indexed_hf(layout);
  EXPECT_EQ(hf.at("model.layers.0.self_attn.k_proj.weight").shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(hf.at("model.layers.0.self_attn.q_proj.weight").shape, (std::vector<int64_t>{16, 16}));
  const int N = 2, hd = 4;
  for (int n = 0; n < N; ++n) {
    const auto idx = indices(layout.slice_ranges(n, N, SliceStrategy::MlpHeads));
    for (int l = 0; l < 3; ++l)
      for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
        const auto& t = hf.at("model.layers." + std::to_string(l) + ".self_attn." + m + ".weight");
        const int rows = int(t.shape[0]), per_slice = rows / N;
        for (int row = 0; row < rows; ++row)
          for (int j = 0; j < 16; ++j)
            EXPECT_EQ(idx.count(int64_t(t.data[row * 16 + j])) == 1, row / per_slice == n) << m << " row " << row;
        EXPECT_EQ(per_slice, std::string(m) == "q_proj" ? 2 * hd : hd);
      }
  }
  // 4 slices would split a group: refused, though 4 divides the query heads.
  EXPECT_THROW(layout.slice_ranges(0, 4, SliceStrategy::MlpHeads), Error);
  EXPECT_NO_THROW(layout.slice_ranges(0, 4, SliceStrategy::Mlp));
}

TEST(Layout, ForeignModelsLayOutBlocksAsFragments) {
  // A torch model's parameters (the Python layer): non-block tensors first, then blocks.
  const auto layout = ParamLayout::foreign({{"embed.weight", -1, 10, 4}, {"norm.weight", -1, 1, 4},
                                            {"layers.0.w", 0, 4, 4}, {"layers.0.b", 0, 1, 4},
                                            {"layers.1.w", 1, 4, 4}, {"layers.1.b", 1, 1, 4}},
                                           2);
  EXPECT_EQ(layout.size(), 40 + 4 + 2 * 20);
  EXPECT_EQ(layout.num_blocks(), 2);
  EXPECT_EQ(layout.nonblock_ranges(), (std::vector<Range>{{0, 44}}));
  EXPECT_EQ(layout.block_range(0), (Range{44, 64}));
  EXPECT_EQ(layout.block_range(1), (Range{64, 84}));
  EXPECT_EQ(TrainableSet(layout).size(), layout.size());
  auto refused = [](const std::vector<ForeignTensor>& t, int blocks, const std::string& what) {
    try {
      ParamLayout::foreign(t, blocks);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused({{"a", 0, 1, 1}, {"b", -1, 1, 1}}, 1, "b is out of order");
  refused({{"a", 1, 1, 1}}, 2, "a is out of order");
  refused({{"a", 0, 1, 1}, {"b", 1, 1, 1}, {"c", 0, 1, 1}}, 2, "c is out of order");
  refused({{"a", 0, 1, 1}}, 2, "blocks 1 .. 1 have no parameters");
  refused({{"a", -1, 1, 1}, {"a", -1, 1, 1}}, 0, "a appears twice");
  refused({{"a", 3, 1, 1}}, 2, "outside [0, 2)");
  refused({{"a", -1, 0, 1}}, 0, "a has no elements");
}

TEST(Layout, ForeignMlpProjectionsAreSlicedByHiddenUnits) {
  // gate and up (f = 6 rows of d = 4) and down laid transposed (6 x 4): slice n of 2 is rows
  // [3n, 3n + 3) of each; the other tensors are trained by every slice.
  const std::vector<ForeignTensor> t = {{"embed", -1, 5, 4, ""},
                                        {"l.0.gate_proj.weight", 0, 6, 4, "gate"},
                                        {"l.0.up_proj.weight", 0, 6, 4, "up"},
                                        {"l.0.down_proj.weight", 0, 6, 4, "down"},
                                        {"l.0.norm", 0, 1, 4, ""}};
  const auto layout = ParamLayout::foreign(t, 1);
  EXPECT_EQ(layout.config().intermediate_size, 6);
  EXPECT_TRUE(layout.tensors()[3].transposed);
  EXPECT_EQ(layout.slice_ranges(1, 2, SliceStrategy::Mlp), (std::vector<Range>{{32, 44}, {56, 68}, {80, 92}}));
  const TrainableSet s0(layout, 0, 2, "mlp");
  EXPECT_EQ(s0.ranges(), (std::vector<Range>{{0, 32}, {44, 56}, {68, 80}, {92, 96}}));
  EXPECT_EQ(s0.size(), 20 + 3 * 12 + 4);
  auto refused = [](const std::vector<ForeignTensor>& ts, const std::string& what) {
    try {
      ParamLayout::foreign(ts, 1);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused({{"g", 0, 6, 4, "gate"}, {"u", 0, 8, 4, "up"}}, "u: 8 hidden units, another MLP projection has 6");
  refused({{"g", -1, 6, 4, "gate"}, {"x", 0, 1, 1, ""}}, "g: an MLP projection must belong to a block");
  refused({{"g", 0, 6, 4, "gates"}}, "mlp must be");
}

TEST(Layout, ForeignAttentionProjectionsAreSlicedByWholeHeads) {
  // Grouped-query attention: 8 query heads and 2 key/value heads of 4 units (q 32 x 16, k and v
  // 8 x 16). Slice n of 2 holds key/value head n and the 4 query heads that read it: rows
  // [16n, 16n + 16) of q and [4n, 4n + 4) of k and v; the MLP (f = 6) as before, o shared.
  const std::vector<ForeignTensor> t = {{"l.0.q_proj.weight", 0, 32, 16, "q"}, {"l.0.k_proj.weight", 0, 8, 16, "k"},
                                        {"l.0.v_proj.weight", 0, 8, 16, "v"},  {"l.0.o_proj.weight", 0, 16, 32, ""},
                                        {"l.0.gate_proj.weight", 0, 6, 16, "gate"}};
  const auto layout = ParamLayout::foreign(t, 1, 8, 2);
  EXPECT_EQ(layout.config().head_dim(), 4);
  EXPECT_EQ(layout.config().kv_heads(), 2);
  // q at 0 (512), k at 512 (128), v at 640 (128), o at 768 (512), gate at 1280 (96).
  EXPECT_EQ(layout.slice_ranges(1, 2, SliceStrategy::MlpHeads),
            (std::vector<Range>{{256, 512}, {576, 640}, {704, 768}, {1328, 1376}}));
  EXPECT_EQ(layout.slice_ranges(1, 2, SliceStrategy::Mlp), (std::vector<Range>{{1328, 1376}}));
  const TrainableSet s0(layout, 0, 2, "mlp+heads");
  EXPECT_EQ(s0.size(), 256 + 64 + 64 + 512 + 48);
  auto refused = [](const std::vector<ForeignTensor>& ts, int heads, int kv, const std::string& what) {
    try {
      ParamLayout::foreign(ts, 1, heads, kv);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused({{"q", 0, 32, 16, "q"}}, 0, 0, "q is marked q, and the head count is not given");
  refused({{"q", 0, 30, 16, "q"}}, 8, 2, "q: 30 rows are not 8 heads of equal width");
  refused({{"q", 0, 32, 16, "q"}, {"k", 0, 16, 16, "k"}}, 8, 2, "k: heads of 8 units, another projection's have 4");
  refused({{"q", 0, 32, 16, "q"}}, 8, 3, "must be a multiple of the key/value heads");
}

TEST(Layout, ExportImportRoundTrip) {
  for (bool tied : {false, true}) {
    const auto c = tiny(tied, true);
    Transformer model(c);
    std::vector<float> params(size_t(model.layout().size()));
    model.init_params(params.data(), 9);
    const std::string dir = ::testing::TempDir() + "/roundtrip" + std::to_string(tied);
    save_model_checkpoint(dir, c, model.layout(), params.data());
    const auto loaded = load_model_checkpoint(dir);
    EXPECT_EQ(loaded.params, params);
    EXPECT_EQ(loaded.config.tie_embeddings, tied);
    EXPECT_TRUE(loaded.config.qk_norm);
  }
}

TEST(Stages, PipelineOfStagesEqualsFullModel) {
  const auto c = tiny(true, true, 2);
  const int B = 2, S = 12;
  Transformer full(c);
  std::vector<float> params(size_t(full.layout().size())), grads(params.size(), 0.0f);
  full.init_params(params.data(), 3);
  std::vector<int32_t> tokens(B * S), targets(B * S);
  for (int i = 0; i < B * S; ++i) {
    tokens[i] = (i * 7 + 3) % 50;
    targets[i] = (i * 11 + 5) % 50;
  }
  Workspace ws(c, full.stage(), B, S);
  const double loss = full.forward(params.data(), tokens.data(), nullptr, targets.data(), ws);
  full.backward(params.data(), grads.data(), tokens.data(), targets.data(), 1.0, nullptr, nullptr, ws);

  // Stage 0: embedding + block 0; stage 1: blocks 1-2 + head (tied: its own embedding copy).
  Transformer s0(c, {0, 1, true, false}), s1(c, {1, 3, false, true});
  auto slice_params = [&](const Transformer& st) {
    std::vector<float> p(size_t(st.layout().size()));
    st.init_params(p.data(), 3);  // same seed: same values as the full model's tensors
    for (const auto& t : st.layout().tensors()) {
      const auto* ft = full.layout().find(t.name);
      EXPECT_NE(ft, nullptr);
      for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(p[t.offset + i], params[ft->offset + i]) << t.name;
    }
    return p;
  };
  auto p0 = slice_params(s0), p1 = slice_params(s1);
  std::vector<float> g0(p0.size(), 0.0f), g1(p1.size(), 0.0f);
  Workspace w0(c, s0.stage(), B, S), w1(c, s1.stage(), B, S);
  s0.forward(p0.data(), tokens.data(), nullptr, nullptr, w0);
  const double loss1 = s1.forward(p1.data(), nullptr, w0.x_out.data(), targets.data(), w1);
  LOCO_EXPECT_NEAR(loss1, loss, 1e-6);
  std::vector<float> dx(size_t(B) * S * c.hidden_size, 0.0f);
  s1.backward(p1.data(), g1.data(), nullptr, targets.data(), 1.0, nullptr, dx.data(), w1);
  s0.backward(p0.data(), g0.data(), tokens.data(), nullptr, 0.0, dx.data(), nullptr, w0);
  // Stage gradients equal the full model's; the tied embedding's gradient is split across
  // the two stages (input use in stage 0, output use in stage 1) and sums to the full one.
  auto grad_of = [&](const Transformer& st, const std::vector<float>& g, const std::string& name) {
    const auto* t = st.layout().find(name);
    return t ? std::vector<float>(g.begin() + t->offset, g.begin() + t->offset + t->numel())
             : std::vector<float>();
  };
  for (const auto& t : full.layout().tensors()) {
    std::vector<float> a = grad_of(s0, g0, t.name), b = grad_of(s1, g1, t.name);
    if (a.empty()) a.assign(size_t(t.numel()), 0.0f);
    if (b.empty()) b.assign(size_t(t.numel()), 0.0f);
    float scale = 1e-12f;
    for (int64_t i = 0; i < t.numel(); ++i) scale = std::max(scale, std::abs(grads[t.offset + i]));
    for (int64_t i = 0; i < t.numel(); ++i)
      LOCO_ASSERT_NEAR(a[i] + b[i], grads[t.offset + i], 1e-5 * scale) << t.name << "[" << i << "]";
  }
}

TEST(Determinism, ForwardBackwardIsBitwiseRepeatable) {
  const auto c = tiny(false, true);
  Transformer model(c);
  std::vector<float> params(size_t(model.layout().size()));
  model.init_params(params.data(), 1);
  std::vector<int32_t> tokens(64), targets(64);
  for (int i = 0; i < 64; ++i) tokens[i] = targets[(i + 63) % 64] = (i * 13 + 1) % 50;
  double loss = 0;
  auto run = [&](double fused_dloss) {
    std::vector<float> g(params.size(), 0.0f);
    Workspace ws(c, model.stage(), 4, 16);
    loss = model.forward(params.data(), tokens.data(), nullptr, targets.data(), ws, fused_dloss);
    model.backward(params.data(), g.data(), tokens.data(), targets.data(), 0.5, nullptr, nullptr, ws);
    return g;
  };
  const auto plain = run(0);
  const double plain_loss = loss;
  EXPECT_EQ(plain, run(0));
  // Training fuses the cross-entropy's backward into the forward: the same bits.
  EXPECT_EQ(plain, run(0.5));
  EXPECT_EQ(plain_loss, loss);
  // A backward with another dloss than the one fused is refused.
  EXPECT_THROW(run(0.25), std::exception);
}

TEST(Layout, ParameterCountFromTheConfigEqualsTheLayout) {
  for (bool tied : {false, true})
    for (bool qk : {false, true})
      for (int kv : {0, 1, 2})
        EXPECT_EQ(tiny(tied, qk, kv).parameter_count(), double(ParamLayout(tiny(tied, qk, kv)).size())) << kv;
}

TEST(Workspace, SizeFormulaMatchesAllocation) {
  for (bool qk : {false, true})
    for (bool head : {false, true}) {
      const auto c = tiny(false, qk, qk ? 2 : 1);
      const StageSpec st{1, 3, !head, head};
      Workspace ws(c, st, 3, 7);
      EXPECT_EQ(ws.floats(), Workspace::floats_for(c, st, 3, 7));
    }
}
