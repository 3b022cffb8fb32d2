// The simulator and estimators against cases with known answers (docs/simulator.md).
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <cmath>

#include "core/blas.h"
#include "core/error.h"
#include "model/layout.h"
#include "model/transformer.h"
#include "sim/cu.h"
#include "sim/estimate.h"
#include "sim/latency.h"

using namespace loco;
using namespace loco::sim;

namespace {

Profile small_profile() {
  Profile p;
  p.name = "test";
  p.layers = 6;
  p.params = 6.4e8;
  p.nonblock_params = 4e7;  // blocks of 1e8
  p.step_time_s = 0.5;
  p.fragment_layers = 2;    // 3 block fragments + the non-block one
  p.inner_steps = 40;       // a fragment every 10 steps
  p.tau = 2;
  return p;
}

ModelConfig small_model(int vocab, int d, int layers, int heads, int ff) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = d;
  c.num_layers = layers;
  c.num_heads = heads;
  c.intermediate_size = ff;
  return c;
}

}  // namespace

const Convention kConventions[] = {Convention::Loco, Convention::Paper};

TEST(SimCu, InfiniteBandwidthGivesFullUtilization) {
  const Profile p = small_profile();
  for (Convention c : kConventions)
    for (Method m : all_methods()) LOCO_EXPECT_NEAR(simulate_cu(p, m, 1e300, 0, c).cu, 1.0, 1e-12) << method_name(m);
}

TEST(SimCu, ReductionBytesAreWhatTheCodeSends) {
  Profile p = small_profile();
  const double n = 1e6;
  // loco: the fp32 ring all-reduce of 2 workers sends each value once; fp4 E3M0 in blocks of
  // 128 is half a byte per value plus one scale byte per block.
  EXPECT_DOUBLE_EQ(reduction_bytes(p, Method::DDP, n), 4 * n);
  EXPECT_DOUBLE_EQ(reduction_bytes(p, Method::StreamingOverlapFp4, n), n / 2 + std::ceil(n / 128));
  // The ring pays its 2 (M-1) latencies where a chunk is one piece; pieces forwarded as they
  // arrive hide all but one behind large chunks.
  p.latency_s = 0.03;
  EXPECT_DOUBLE_EQ(reduction_latency(p, Method::DDP, 1000, 1e8), 2 * p.latency_s);
  EXPECT_DOUBLE_EQ(reduction_latency(p, Method::DDP, 1e8, 1e8), p.latency_s);
  p.replicas = 4;
  EXPECT_DOUBLE_EQ(reduction_latency(p, Method::DDP, 1000, 1e8), 6 * p.latency_s);
  // 4 chunks of 2^18 floats (1 MiB, 4 pieces of 256 KiB) at 100 Mbit/s: 84 ms per chunk, 21 ms
  // per piece, so a 30 ms latency is hidden at every step but the first.
  LOCO_EXPECT_NEAR(reduction_latency(p, Method::DDP, 4 << 18, 1e8), p.latency_s, 1e-12);
  // 4 chunks of 2^15 floats (128 KiB, one piece): 10.5 ms per chunk, all six latencies.
  LOCO_EXPECT_NEAR(reduction_latency(p, Method::DDP, 4 << 15, 1e8), 6 * p.latency_s, 1e-12);
  p.replicas = 2;
  // paper: bf16, and 4 bits for fp4.
  EXPECT_DOUBLE_EQ(reduction_bytes(p, Method::DiLoCo, n, Convention::Paper), 2 * n);
  EXPECT_DOUBLE_EQ(reduction_bytes(p, Method::StreamingOverlapFp4, n, Convention::Paper), n / 2);
  // With many workers the fp32 ring tends to 8 bytes per value and worker, and fp4 (reduce-
  // scatter, then all-gather of the re-encoded shards) to about 1, whatever M.
  for (int M : {4, 8, 64}) {
    p.replicas = M;
    const double fp32 = reduction_bytes(p, Method::DDP, n) / n, fp4 = reduction_bytes(p, Method::StreamingOverlapFp4, n) / n;
    LOCO_EXPECT_NEAR(fp32, 8.0 * (M - 1) / M, 4.0 * 2 * 256 / n) << M;  // up to a 256-value block per chunk
    EXPECT_GT(fp4, 0.7);
    EXPECT_LT(fp4, 1.1) << M;
  }
}

TEST(SimCu, WholeReductionIsComputeOverComputePlusTransfer) {
  Profile p = small_profile();
  p.latency_s = 0.03;
  const double bw = 1e10;
  // loco's DDP reduces the whole gradient after the backward: nothing overlaps.
  const double ring =
      8 * reduction_bytes(p, Method::DDP, p.params) / bw + reduction_latency(p, Method::DDP, p.params, bw);
  LOCO_EXPECT_NEAR(simulate_cu(p, Method::DDP, bw).cu, p.step_time_s / (p.step_time_s + ring), 1e-12);
  // The paper's per-layer reductions: with one layer there is nothing to overlap either.
  p.layers = 1;
  const double bf16 = 8 * 2 * p.params / bw;
  LOCO_EXPECT_NEAR(simulate_cu(p, Method::DDP, bw, 0, Convention::Paper).cu, p.step_time_s / (p.step_time_s + bf16), 1e-12);
}

TEST(SimCu, DilocoRoundIsHStepsOverHStepsPlusTransfer) {
  Profile p = small_profile();
  for (double bw : {1e8, 1e9, 1e10}) {
    const double H = double(p.inner_steps), transfer = 8 * reduction_bytes(p, Method::DiLoCo, p.params) / bw;
    LOCO_EXPECT_NEAR(simulate_cu(p, Method::DiLoCo, bw).cu, H * p.step_time_s / (H * p.step_time_s + transfer), 1e-12);
  }
  p.layers = 1;
  const double bw = 1e9, H = double(p.inner_steps), transfer = 8 * 2 * p.params / bw;
  LOCO_EXPECT_NEAR(simulate_cu(p, Method::DiLoCo, bw, 0, Convention::Paper).cu,
              H * p.step_time_s / (H * p.step_time_s + transfer), 1e-12);
}

TEST(SimCu, PaperDilocoOverlapsTheLastBackward) {
  // Per-layer reductions start as each layer's W finishes, so the paper's DiLoCo needs less
  // bandwidth than loco's, which reduces everything after the step.
  const Profile p = small_profile();
  const double bw = 8 * 2 * p.params / (0.5 * p.step_time_s);
  EXPECT_GT(simulate_cu(p, Method::DiLoCo, bw, 0, Convention::Paper).cu,
            simulate_cu(p, Method::DiLoCo, bw / 2, 0, Convention::Loco).cu);
}

TEST(SimCu, OverlapReachesFullUtilizationWhenAFragmentFitsInTauSteps) {
  const Profile p = small_profile();
  // The largest fragment (2 blocks, 2e8 values) takes 0.9 steps: hidden by tau = 2 steps of
  // compute, but not without overlap.
  const double bw = 8 * reduction_bytes(p, Method::StreamingOverlap, 2e8) / (0.9 * p.step_time_s);
  LOCO_EXPECT_NEAR(simulate_cu(p, Method::StreamingOverlap, bw).cu, 1.0, 1e-12);
  EXPECT_LT(simulate_cu(p, Method::Streaming, bw).cu, 0.999);
  // At a quarter of that bandwidth it no longer fits.
  EXPECT_LT(simulate_cu(p, Method::StreamingOverlap, bw / 4).cu, 0.999);
  // fp4 moves about 0.13 of fp32's bytes, so it fits at a quarter.
  LOCO_EXPECT_NEAR(simulate_cu(p, Method::StreamingOverlapFp4, bw / 4).cu, 1.0, 1e-12);
}

TEST(SimCu, UtilizationNeverFallsWithBandwidthAndFp4NeverNeedsMore) {
  for (Convention c : kConventions)
    for (const auto& [name, p] : load_profiles(std::string(LOCO_SOURCE_DIR) + "/configs/sim-profiles.toml")) {
      for (Method m : all_methods()) {
        double prev = 0;
        for (double bw = 1e7; bw <= 1e14; bw *= 1.7) {
          const double cu = simulate_cu(p, m, bw, 0, c).cu;
          EXPECT_GE(cu, prev - 1e-12) << name << " " << method_name(m) << " at " << bw;
          LOCO_EXPECT_AT_MOST(cu, 1.0 + 1e-12);
          prev = cu;
        }
      }
      for (double target : {0.5, 0.9, 0.99})
        EXPECT_LE(bandwidth_for_cu(p, Method::StreamingOverlapFp4, target, c),
                  bandwidth_for_cu(p, Method::StreamingOverlap, target, c))
            << name;
    }
}

TEST(SimCu, ProfileErrors) {
  Profile p = small_profile();
  EXPECT_THROW(set_profile_key(p, "layers=2.5"), Error);
  EXPECT_THROW(set_profile_key(p, "nope=1"), Error);
  EXPECT_THROW(set_profile_key(p, "layers"), Error);
  set_profile_key(p, "tau=40");
  EXPECT_THROW(validate_profile(p), Error);  // tau >= H
  set_profile_key(p, "tau=1");
  set_profile_key(p, "replicas=1");
  EXPECT_THROW(validate_profile(p), Error);
  EXPECT_THROW(parse_method("fsdp"), Error);
  EXPECT_THROW(parse_convention("mine"), Error);
  EXPECT_THROW(load_profiles("/nonexistent/profiles.toml"), Error);
}

TEST(Estimate, ParameterCountsEqualTheEngineLayout) {
  for (bool tied : {false, true})
    for (bool qk : {false, true})
      for (int kv : {0, 2}) {
        ModelConfig c = small_model(97, 24, 3, 4, 40);
        c.tie_embeddings = tied;
        c.qk_norm = qk;
        c.num_kv_heads = kv;
        EXPECT_EQ(param_counts(arch_of(c)).total, double(ParamLayout(c).size())) << tied << qk << kv;
      }
}

TEST(Estimate, SlicedTrainableCountsFollowTheSlices) {
  const Arch a = gpt3_xl();
  const auto full = param_counts(a), half = param_counts(a, {2, "mlp"}), heads = param_counts(a, {4, "mlp+heads"});
  EXPECT_DOUBLE_EQ(full.trainable, full.total);
  EXPECT_DOUBLE_EQ(full.total - half.trainable, a.layers * full.mlp_per_block / 2);
  EXPECT_DOUBLE_EQ(full.total - heads.trainable, a.layers * 0.75 * (full.mlp_per_block + full.qkv_per_block));
  EXPECT_THROW(param_counts(a, {3, "mlp"}), Error);  // 8192 not divisible by 3
}

TEST(Estimate, MatmulFlopsEqualTheKernelsProducts) {
  // Two sequence lengths: one attention row block, and several (causal blocks of 64 rows).
  // Last: grouped-query attention (4 query heads, 2 key/value heads).
  for (int S : {24, 150, 70}) {
    ModelConfig c = small_model(50, 16, 2, S == 70 ? 4 : 2, 24);
    if (S == 70) c.num_kv_heads = 2;
    c.max_seq_len = S;
    const int B = 2;
    Transformer model(c);
    std::vector<float> params(size_t(model.layout().size())), grads(params.size(), 0.0f);
    model.init_params(params.data(), 5);
    std::vector<int32_t> tokens(size_t(B * S)), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = int32_t(i * 7 % 50);
      targets[i] = int32_t(i * 11 % 50);
    }
    Workspace ws(c, model.stage(), B, S);
    const Flops f = step_flops(arch_of(c), B, S);
    gemm_flop_counter() = 0;
    model.forward(params.data(), tokens.data(), nullptr, targets.data(), ws);
    EXPECT_EQ(double(gemm_flop_counter().load()), f.matmul_forward) << S;
    gemm_flop_counter() = 0;
    model.backward(params.data(), grads.data(), tokens.data(), targets.data(), 1.0, nullptr, nullptr, ws);
    EXPECT_EQ(double(gemm_flop_counter().load()), f.matmul_backward) << S;
  }
}

TEST(Estimate, SlicingScalesOnlyParameterGradients) {
  const Arch a = gpt3_xl();
  const double B = 4, S = 2048, H = a.d, F = a.ff, L = a.layers;
  const Flops full = step_flops(a, B, S), mlp4 = step_flops(a, B, S, {4, "mlp"});
  EXPECT_DOUBLE_EQ(full.forward, mlp4.forward);
  EXPECT_DOUBLE_EQ(full.backward_input, mlp4.backward_input);
  // Appendix C.2: the MLP's parameter term 4 B S H D_ff becomes 4 rho B S H D_ff.
  LOCO_EXPECT_NEAR(full.backward_params - mlp4.backward_params, L * 4 * B * S * H * F * 0.75, 1.0);
}

TEST(Estimate, RingAllReduceTime) {
  // 2.6 GB of bf16 gradients over 32 nodes at 2.875 GB/s: 2 x 31/32 x 2.6 / 2.875 s.
  LOCO_EXPECT_NEAR(ring_allreduce_seconds(2.6e9, 32, 2.875e9 * 8), 2.0 * 31 / 32 * 2.6 / 2.875, 1e-12);
}

TEST(Latency, ClosedFormsAgreeWithMonteCarlo) {
  for (double sigma : {0.3, 1.0, 1.5})
    for (int n : {4, 64, 1024}) {
      const auto tree = tree_allreduce_mc(n, 0.2, sigma, 20000, 7);
      LOCO_EXPECT_NEAR(tree.mean, tree_allreduce_closed(n, 0.2, sigma), 4 * tree.stderr_) << n << " " << sigma;
    }
  for (double sigma : {0.3, 1.0}) {
    const auto pair = pair_average_mc(0.0, sigma, 40000, 9);
    LOCO_EXPECT_NEAR(pair.mean, pair_average_closed(0.0, sigma), 4 * pair.stderr_) << sigma;
  }
  // The hop ratio is log2 n; the full tree (max over paths) is slower, more so with variance.
  LOCO_EXPECT_NEAR(tree_allreduce_closed(1024, 0, 1) / pair_average_closed(0, 1), 10.0, 1e-12);
  const double full_low = tree_allreduce_full_mc(256, 0, 0.3, 200, 3).mean / tree_allreduce_closed(256, 0, 0.3);
  const double full_high = tree_allreduce_full_mc(256, 0, 1.5, 200, 3).mean / tree_allreduce_closed(256, 0, 1.5);
  EXPECT_GT(full_low, 1.0);
  EXPECT_GT(full_high, full_low);
  EXPECT_THROW(tree_allreduce_closed(48, 0, 1), Error);
}

TEST(Latency, BarrierCostNormalApproximationAgreesWithMonteCarlo) {
  // Pairs: E[max of two normals] is exact, so only the normal approximation of the sum errs.
  const auto pair = barrier_cost_mc(2, 100, 1.0, 0.5, 4000, 11);
  LOCO_EXPECT_NEAR(pair.mean, barrier_cost_closed(2, 100, 1.0, 0.5), 4 * pair.stderr_ + 0.002);
  // 1024 workers: Blom's approximation of the expected maximum, within 15%. About 20% at H = 100.
  const auto global = barrier_cost_mc(1024, 100, 1.0, 0.5, 40, 12);
  LOCO_EXPECT_NEAR(global.mean, barrier_cost_closed(1024, 100, 1.0, 0.5), 0.15 * global.mean);
  EXPECT_GT(global.mean, 0.15);
  EXPECT_LT(pair.mean, 0.05);
  // Step times exp(sigma |Z|) (network.compute_jitter): the folded moments
  // E[exp(s|Z|)] = 2 exp(s^2/2) Phi(s), capped at 20, carry the same approximation.
  for (double sigma : {0.25, 0.5, 1.0, 2.0}) {  // at 2 the cap of 20 is reached by 13% of steps
    const auto folded = barrier_cost_mc(2, 50, 0.0, sigma, 4000, 13, true);
    LOCO_EXPECT_NEAR(folded.mean, barrier_cost_closed(2, 50, 0.0, sigma, true), 4 * folded.stderr_ + 0.002) << sigma;
    EXPECT_LT(folded.mean, barrier_cost_mc(2, 50, 0.0, sigma, 4000, 13).mean) << "folding narrows the spread";
  }
  EXPECT_EQ(barrier_cost_closed(8, 20, 0.0, 0.0, true), 0.0);
}
