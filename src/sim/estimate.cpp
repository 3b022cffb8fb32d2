#include "sim/estimate.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loco::sim {

Arch arch_of(const ModelConfig& c) {
  Arch a;
  a.d = c.hidden_size;
  a.layers = c.num_layers;
  a.ff = c.intermediate_size;
  a.vocab = c.vocab_size;
  a.heads = c.num_heads;
  a.kv_heads = c.num_kv_heads;
  a.tied = c.tie_embeddings;
  a.qk_norm = c.qk_norm;
  a.mlp_matrices = 3;
  a.loco_kernels = true;
  return a;
}

Arch gpt3_xl() { return Arch{}; }

void validate_slicing(const Arch& a, const Slicing& s) {
  check(s.slices >= 1, "slices must be >= 1");
  check(s.strategy == "mlp" || s.strategy == "mlp+heads", "strategy must be mlp or mlp+heads");
  check(std::fmod(a.ff, s.slices) == 0, "the MLP hidden size must be divisible by the number of slices");
  if (s.strategy == "mlp+heads")
    check(std::fmod(a.kv_count(), s.slices) == 0,
          "heads (key/value heads with grouped-query attention) must be divisible by the slices");
}

ParamCounts param_counts(const Arch& a, const Slicing& s) {
  validate_slicing(a, s);
  ParamCounts p;
  p.mlp_per_block = a.mlp_matrices * a.d * a.ff;
  p.qkv_per_block = a.d * a.d + 2 * a.d * a.kv_width();
  const double head_dim = a.d / a.heads;
  const double other_per_block = a.d * a.d + 2 * a.d + (a.qk_norm ? 2 * head_dim : 0.0);  // o, norms
  p.per_block = p.mlp_per_block + p.qkv_per_block + other_per_block;
  p.nonblock = a.vocab * a.d * (a.tied ? 1 : 2) + a.d;
  p.total = a.layers * p.per_block + p.nonblock;
  const double rho = 1.0 / s.slices;
  const double trainable_block =
      p.mlp_per_block * rho + p.qkv_per_block * (s.strategy == "mlp+heads" ? rho : 1.0) + other_per_block;
  p.trainable = a.layers * trainable_block + p.nonblock;
  return p;
}

namespace {

// Query-key pairs computed per sequence by the attention kernels.
double attention_pairs(const Arch& a, double seq) {
  if (!a.loco_kernels) return seq * seq;
  const int64_t S = int64_t(seq), block = 64;
  double pairs = 0;
  for (int64_t i0 = 0; i0 < S; i0 += block) {
    const int64_t i1 = std::min(S, i0 + block);
    pairs += double(i1 - i0) * double(i1);
  }
  return pairs;
}

}  // namespace

Flops step_flops(const Arch& a, double B, double S, const Slicing& s) {
  validate_slicing(a, s);
  const double H = a.d, V = a.vocab, F = a.ff, m = a.mlp_matrices, L = a.layers, K = a.kv_width();
  const double rho = 1.0 / s.slices, rho_heads = s.strategy == "mlp+heads" ? rho : 1.0;
  const double tokens = B * S, pairs = B * attention_pairs(a, S);
  Flops f;
  // Forward: projections 8 B S H^2 (q, k, v, o; 4 B S H (H + K) with k and v of width K under
  // grouped-query attention), scores and weighted sum 2 x 2 x pairs x H, MLP 2 m B S H F; head
  // 2 B S H V. Embedding lookup B S H and softmax/cross-entropy 3 B S V are counted as in the
  // paper but are not matrix products.
  const double proj = 4 * tokens * H * (H + K);
  const double fwd_layer = proj + 4 * pairs * H + 2 * m * tokens * H * F;
  f.matmul_forward = L * fwd_layer + 2 * tokens * H * V;
  f.forward = f.matmul_forward + tokens * H + 3 * tokens * V;
  // Backward to activations: every product's input gradient (same cost as its forward), the
  // attention score terms twice (loco's kernel also recomputes the scores: one more forward).
  const double attn_back = (a.loco_kernels ? 10.0 : 8.0) * pairs * H;
  const double in_layer = proj + attn_back + 2 * m * tokens * H * F;
  // Parameter gradients: q, k, v scaled by the trained fraction of heads, o never, MLP by 1/N.
  const double par_layer =
      2 * tokens * H * (H + 2 * K) * rho_heads + 2 * tokens * H * H + 2 * m * tokens * H * F * rho;
  f.matmul_backward = L * (in_layer + par_layer) + 4 * tokens * H * V;
  f.backward_input = L * in_layer + 2 * tokens * H * V + tokens * V + tokens * H;
  f.backward_params = L * par_layer + 2 * tokens * H * V;
  return f;
}

const std::vector<std::pair<MemoryMethod, std::string>>& memory_methods() {
  static const std::vector<std::pair<MemoryMethod, std::string>> rows = {
      {MemoryMethod::Ddp, "ddp"}, {MemoryMethod::Diloco, "diloco"}, {MemoryMethod::Streaming, "streaming"},
      {MemoryMethod::Partial, "partial"}};
  return rows;
}

Memory memory_per_node(const Arch& a, MemoryMethod method, double batch, double seq, int fragment_layers,
                       const Slicing& s) {
  check(fragment_layers >= 1, "fragment_layers must be >= 1");
  const ParamCounts p = param_counts(a, method == MemoryMethod::Partial ? s : Slicing{});
  Memory m;
  m.weights = 2 * p.total;
  m.grads = 2 * p.trainable;
  m.master = 4 * p.trainable;
  m.adam = 8 * p.trainable;
  const double fragment = std::max(std::min(double(fragment_layers), a.layers) * p.per_block, p.nonblock);
  if (method == MemoryMethod::Diloco) m.outer = 8 * p.total;
  if (method == MemoryMethod::Streaming || method == MemoryMethod::Partial) m.outer = 8 * fragment;
  // Checkpointed block inputs (bf16) plus one block's recomputed activations: x, norms, q, k,
  // v, attention output, o input (5 H + 2 K), m F for the MLP, and one head's score block.
  const double tokens = batch * seq;
  m.activations = 2 * (a.layers * tokens * a.d + tokens * (5 * a.d + 2 * a.kv_width() + a.mlp_matrices * a.ff) +
                       batch * seq * seq);
  return m;
}

double ring_allreduce_seconds(double bytes, int k, double bits_per_s) {
  check(k >= 1 && bits_per_s > 0, "ring all-reduce needs k >= 1 and a positive bandwidth");
  return 2.0 * double(k - 1) / double(k) * bytes * 8.0 / bits_per_s;
}

}  // namespace loco::sim
