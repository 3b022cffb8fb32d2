// Protocol models (docs/protocol.md): the compressed pipeline against the uncompressed one (exactness,
// and a mutation that must break it), the two ways of keeping weights in the subspace, and
// Grassmann updates of the subspace.
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <cmath>
#include <cstdio>
#include <memory>

#include "core/blas.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/protocol.h"
#include "optim/adamw.h"
#include "pipeline/grid.h"
#include "pipeline/stage_model.h"

using namespace loco;

namespace {

ModelConfig model_config(int layers, int kv_heads = 0) {
  ModelConfig m;
  m.vocab_size = 64;
  m.hidden_size = 32;
  m.num_layers = layers;
  m.num_heads = 4;
  m.intermediate_size = 48;
  m.max_seq_len = 16;
  m.num_kv_heads = kv_heads;
  return m;
}

constexpr int kRank = 6, kWindows = 2, kSeq = 8, kMicro = 2;

// The stages of a protocol model, each with its parameters, gradients and TransformerStage,
// driven by hand in one thread: forward through every stage, backward back.
struct ProtocolPipeline {
  ModelConfig model;
  Subspace sub;
  std::vector<StageSpec> specs;
  std::vector<std::unique_ptr<Transformer>> stages;
  std::vector<std::vector<float>> params, grads;
  std::vector<std::unique_ptr<TransformerStage>> compute;
  std::vector<double> a;  // Grassmann accumulator of the last stage

  ProtocolPipeline(int layers, int S, bool compress, uint64_t seed = 5, int kv_heads = 0)
      : model(model_config(layers, kv_heads)), sub(model, kRank, 9, 1.0), specs(partition_stages(model, S, "")) {
    specs.front().embedding_rank = kRank;
    for (auto& s : specs) s.constrained_end = specs.back().first_block;
    for (int s = 0; s < S; ++s) {
      stages.push_back(std::make_unique<Transformer>(model, specs[size_t(s)]));
      stages.back()->set_protocol(&sub);
      const auto& layout = stages.back()->layout();
      params.emplace_back(size_t(layout.size()));
      grads.emplace_back(size_t(layout.size()));
      stages.back()->init_params(params.back().data(), seed);
      sub.init_constrained(layout, params.back().data());
      compute.push_back(std::make_unique<TransformerStage>(*stages.back(), kWindows, kSeq, kMicro, kMicro));
      compute.back()->set_protocol(&sub, compress, s == S - 1 ? &a : nullptr);
    }
  }

  // One step's gradients over kMicro microbatches (GPipe order); returns the mean loss.
  double run(const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets) {
    const size_t S = stages.size();
    for (size_t s = 0; s < S; ++s) {
      std::fill(grads[s].begin(), grads[s].end(), 0.0f);
      compute[s]->begin_step(1, params[s].data(), grads[s].data(), nullptr, &inputs, &targets);
    }
    for (int mb = 0; mb < kMicro; ++mb) {
      BoundaryMessage in, out;
      for (size_t s = 0; s < S; ++s) {
        compute[s]->forward(mb, in, out);
        in = out;
      }
    }
    for (int mb = 0; mb < kMicro; ++mb) {
      std::vector<float> g_out, g_in;
      for (size_t s = S; s-- > 0;) {
        compute[s]->backward(mb, g_out, g_in);
        g_out = g_in;
      }
    }
    for (size_t s = 0; s < S; ++s) sub.project_constrained(stages[s]->layout(), grads[s].data());
    return compute.back()->loss();
  }
};

void make_batch(std::vector<int32_t>& inputs, std::vector<int32_t>& targets, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> stream(size_t(kMicro * kWindows * kSeq + 1));
  for (auto& t : stream) t = int32_t(rng.next_u64() % 64);
  inputs.assign(stream.begin(), stream.end() - 1);
  targets.assign(stream.begin() + 1, stream.end());
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

}  // namespace

// The compressed pipeline computes the loss and every gradient of the uncompressed one, to
// float32 rounding. The two round differently: the compressed path rebuilds h as E_fixed[tokens]
// + c U^T, where E_fixed (std 1) is tens of times larger than what the blocks add, so h carries
// an absolute error of about 1e-7 x |E_fixed| that the uncompressed path does not; gradients are
// compared with a relative tolerance of 1e-5 per tensor (measured: 3e-7) and the loss to 1e-6.
TEST(Protocol, CompressedPipelineEqualsUncompressed) {
  std::vector<int32_t> inputs, targets;
  make_batch(inputs, targets, 3);
  for (int S : {2, 3}) {
    const int kv_heads = S == 3 ? 2 : 0;  // 3 stages: grouped-query attention (2 key/value heads of 4)
    ProtocolPipeline full(5, S, false, 5, kv_heads), comp(5, S, true, 5, kv_heads);
    const double l_full = full.run(inputs, targets), l_comp = comp.run(inputs, targets);
    LOCO_EXPECT_NEAR(l_full, l_comp, 1e-6 * std::abs(l_full)) << "S " << S;
    double worst = 0;
    for (int s = 0; s < S; ++s)
      for (const auto& t : full.stages[size_t(s)]->layout().tensors()) {
        const std::vector<float> a(full.grads[size_t(s)].begin() + t.offset,
                                   full.grads[size_t(s)].begin() + t.offset + t.numel());
        const std::vector<float> b(comp.grads[size_t(s)].begin() + t.offset,
                                   comp.grads[size_t(s)].begin() + t.offset + t.numel());
        LOCO_EXPECT_BELOW(rel_diff(b, a), 1e-5) << "S " << S << " stage " << s << " " << t.name;
        worst = std::max(worst, rel_diff(b, a));
      }
    std::printf("S %d: loss %.9g vs %.9g, largest relative gradient difference %.2e\n", S, l_full, l_comp, worst);
  }
}

// The mutation: one constrained matrix with a component outside the subspace puts part of the
// residual stream outside it, which the compressed boundary drops: loss and gradients differ.
TEST(Protocol, AWeightOutsideTheSubspaceBreaksExactness) {
  std::vector<int32_t> inputs, targets;
  make_batch(inputs, targets, 3);
  for (int S : {2, 3}) {
    const int kv_heads = S == 3 ? 2 : 0;  // 3 stages: grouped-query attention (2 key/value heads of 4)
    ProtocolPipeline full(5, S, false, 5, kv_heads), comp(5, S, true, 5, kv_heads);
    for (auto* p : {&full, &comp}) {
      const auto& layout = p->stages[0]->layout();
      const auto& o = layout.get(TensorKind::O, 0);
      Rng rng(77);
      for (int64_t i = 0; i < o.numel(); ++i) p->params[0][size_t(o.offset + i)] += float(0.05 * rng.normal());
      EXPECT_GT(p->sub.max_residual(layout, p->params[0].data()), 0.1);
    }
    const double l_full = full.run(inputs, targets), l_comp = comp.run(inputs, targets);
    double worst = std::abs(l_full - l_comp) / std::abs(l_full);
    for (int s = 0; s < S; ++s) worst = std::max(worst, rel_diff(comp.grads[size_t(s)], full.grads[size_t(s)]));
    EXPECT_GT(worst, 1e-2) << "S " << S;
  }
}

TEST(Protocol, BoundariesCarryKNumbersPerToken) {
  ProtocolPipeline p(4, 2, true);
  std::vector<int32_t> inputs, targets;
  make_batch(inputs, targets, 4);
  p.compute[0]->begin_step(1, p.params[0].data(), p.grads[0].data(), nullptr, &inputs, &targets);
  BoundaryMessage in, out;
  p.compute[0]->forward(0, in, out);
  EXPECT_EQ(out.activations.size(), size_t(kWindows) * kSeq * kRank);
  EXPECT_EQ(out.tokens.size(), size_t(kWindows) * (kSeq + 1));
}

namespace {
// A stage holding constrained matrices, and AdamW over it fed projected random gradients.
double residual_after_steps(bool subspace_adamw, bool project, int steps) {
  const ModelConfig m = model_config(3);
  StageSpec spec{0, 3, true, false, kRank, 3};
  const ParamLayout layout(m, spec);
  Subspace sub(m, kRank, 2, 1.0);
  std::vector<float> params(size_t(layout.size())), grads(params.size());
  Rng rng(8);
  for (auto& x : params) x = float(0.02 * rng.normal());
  sub.project_constrained(layout, params.data());
  AdamW opt(AdamWConfig{}, layout, nullptr, subspace_adamw);
  for (int s = 0; s < steps; ++s) {
    for (auto& g : grads) g = float(rng.normal());
    sub.project_constrained(layout, grads.data());
    opt.step(params.data(), grads.data(), 1e-2);
    if (project) sub.project_constrained(layout, params.data());
  }
  return sub.max_residual(layout, params.data());
}
}  // namespace

TEST(Protocol, SubspaceAdamwKeepsWeightsInTheSubspace) {
  LOCO_EXPECT_BELOW(residual_after_steps(true, false, 300), 1e-5);
  LOCO_EXPECT_BELOW(residual_after_steps(false, true, 300), 1e-6);
  // Plain AdamW leaves it at once (its per-entry second moment bends the update): the check can fail.
  EXPECT_GT(residual_after_steps(false, false, 20), 1e-2);
}

TEST(Protocol, GrassmannStepKeepsUOrthonormalAndLowersTheLoss) {
  const ModelConfig m = model_config(2);
  const int d = m.hidden_size, k = kRank;
  Subspace sub(m, k, 4, 1.0);
  // A fixed A = sum g^T g from random low-rank gradients.
  Rng rng(6);
  std::vector<double> g(size_t(40) * d), a(size_t(d) * d);
  for (auto& x : g) x = rng.normal();
  for (int r = 0; r < 40; ++r)
    for (int j = 0; j < 8; ++j) g[size_t(r) * d + j] *= 10;  // most energy in 8 directions
  gemm(true, false, d, d, 40, 1.0, g.data(), d, g.data(), d, 0.0, a.data(), d);
  std::vector<float> u = sub.basis();
  double first = -1, prev = 2;
  for (int it = 0; it < 20; ++it) {
    double before, after;
    u = grassmann_step(u, a, d, k, 1.0, before, after);
    if (it == 0) first = before;
    EXPECT_LT(after, before) << "step " << it;
    LOCO_EXPECT_NEAR(before, std::min(prev, before), 1e-6);  // U_new rounded to float
    prev = after;
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j) {
        double s = 0;
        for (int r = 0; r < d; ++r) s += double(u[size_t(r) * k + i]) * u[size_t(r) * k + j];
        LOCO_EXPECT_NEAR(s, i == j ? 1.0 : 0.0, 1e-6);
      }
  }
  EXPECT_LT(prev, first - 0.1);
}

// A change of basis keeps the model's function where the weights lie in both subspaces, and
// puts the constrained matrices in the new one.
TEST(Protocol, ChangeOfBasisKeepsTheFunctionInTheCommonSubspace) {
  ProtocolPipeline p(4, 2, true);
  const int d = p.sub.d(), k = kRank;
  const std::vector<float> u_old = p.sub.basis();
  // U_new: the first k - 1 columns of U_old and one direction orthogonal to U_old.
  std::vector<double> x(size_t(d) * (k + 1));
  Rng rng(12);
  for (int r = 0; r < d; ++r) {
    for (int c = 0; c < k; ++c) x[size_t(r) * (k + 1) + c] = u_old[size_t(r) * k + c];
    x[size_t(r) * (k + 1) + k] = rng.normal();
  }
  const auto q = orthonormalise(x, d, k + 1);
  std::vector<float> u_new(size_t(d) * k);
  for (int r = 0; r < d; ++r)
    for (int c = 0; c < k; ++c) u_new[size_t(r) * k + c] = float(q[size_t(r) * (k + 1) + (c < k - 1 ? c : k)]);
  // Weights and E_s in the common subspace: drop the k-th direction of U_old.
  const auto& l0 = p.stages[0]->layout();
  const auto& e = l0.get(TensorKind::Embedding);
  for (int64_t v = 0; v < e.rows; ++v) p.params[0][size_t(e.offset + v * k + (k - 1))] = 0.0f;
  Subspace common(p.model, k - 1, 1, 1.0);
  std::vector<float> uc(size_t(d) * (k - 1));
  for (int r = 0; r < d; ++r)
    for (int c = 0; c < k - 1; ++c) uc[size_t(r) * (k - 1) + c] = u_old[size_t(r) * k + c];
  common.set_basis(uc, "test");
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const auto& layout = p.stages[s]->layout();
    for (const auto& t : layout.tensors())
      if (is_constrained(layout.stage(), t)) common.project(t, p.params[s].data() + t.offset);
  }
  std::vector<int32_t> inputs, targets;
  make_batch(inputs, targets, 21);
  const double before = p.run(inputs, targets);
  for (size_t s = 0; s < p.stages.size(); ++s) p.sub.change_basis(u_new, p.stages[s]->layout(), {p.params[s].data()});
  // (change_basis on each stage's layout sets the same U each time.)
  const double after = p.run(inputs, targets);
  LOCO_EXPECT_NEAR(after, before, 1e-6 * std::abs(before));
  for (size_t s = 0; s < p.stages.size(); ++s)
    LOCO_EXPECT_BELOW(p.sub.max_residual(p.stages[s]->layout(), p.params[s].data()), 1e-6);
  // Without the rotation of E_s the function would change: the check can fail.
  for (int64_t v = 0; v < e.rows; ++v) p.params[0][size_t(e.offset + v * k + 0)] += 0.5f;
  EXPECT_GT(std::abs(p.run(inputs, targets) - before), 1e-4);
}

TEST(Protocol, MaterialisedEmbeddingIsFixedPlusCoordinates) {
  const ModelConfig m = model_config(2);
  Subspace sub(m, kRank, 3, 1.0);
  StageSpec spec{0, 1, true, false, kRank, 1};
  const ParamLayout layout(m, spec);
  std::vector<float> params(size_t(layout.size()));
  Rng rng(1);
  for (auto& x : params) x = float(rng.normal());
  const auto plain = sub.materialise(layout, params.data());
  StageSpec plain_spec = spec;
  plain_spec.embedding_rank = 0;
  const ParamLayout pl(m, plain_spec);
  ASSERT_EQ(int64_t(plain.size()), pl.size());
  // Row v of E: compress(E[v], token v) gives back E_s[v].
  const auto& e = layout.get(TensorKind::Embedding);
  const auto& pe = pl.get(TensorKind::Embedding);
  for (int32_t v : {0, 17, 63}) {
    std::vector<float> c(kRank);
    sub.compress(plain.data() + pe.offset + int64_t(v) * m.hidden_size, &v, 1, c.data());
    for (int j = 0; j < kRank; ++j) LOCO_EXPECT_NEAR(c[size_t(j)], params[size_t(e.offset + v * kRank + j)], 1e-5);
  }
  EXPECT_THROW(sub.set_basis(std::vector<float>(size_t(m.hidden_size) * kRank, 0.1f), "test"), Error);
}
