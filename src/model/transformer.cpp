#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "core/kernels.h"
#include "core/rng.h"
#include "model/protocol.h"

namespace loco {

namespace {

void zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }


}  // namespace

BackwardScratch::BackwardScratch(const ModelConfig& c, int batch, int seq) {
  const int64_t n = int64_t(batch) * seq, d = c.hidden_size, f = c.intermediate_size, kv = c.kv_dim();
  for (auto* v : {&dx, &dln, &dq, &dq2, &datt}) v->resize(n * d);
  for (auto* v : {&dk, &dv, &dk2}) v->resize(n * kv);
  for (auto* v : {&dgate, &dup, &dact}) v->resize(n * f);
}

int64_t BackwardScratch::floats() const {
  int64_t total = 0;
  for (const auto* v : {&dx, &dln, &dq, &dk, &dv, &dq2, &dk2, &datt, &dgate, &dup, &dact}) total += int64_t(v->size());
  return total;
}

int64_t BackwardScratch::floats_for(const ModelConfig& c, int batch, int seq) {
  const int64_t n = int64_t(batch) * seq;
  return 5 * n * c.hidden_size + 3 * n * c.kv_dim() + 3 * n * c.intermediate_size;
}

Workspace::Workspace(const ModelConfig& c, const StageSpec& stage_in, int batch_, int seq_,
                     std::shared_ptr<BackwardScratch> scratch_in)
    : batch(batch_), seq(seq_), scratch(std::move(scratch_in)) {
  check(batch >= 1 && seq >= 1, "batch and sequence length must be >= 1");
  check(seq <= c.max_seq_len, "sequence length " + std::to_string(seq) + " exceeds model.max_seq_len " +
                                  std::to_string(c.max_seq_len));
  StageSpec stage = stage_in;
  if (stage.last_block < 0) stage.last_block = c.num_layers;
  const int64_t n = rows(), d = c.hidden_size, f = c.intermediate_size, h = c.num_heads, kv = c.kv_dim(),
                kvh = c.kv_heads();
  blocks.resize(size_t(stage.last_block - stage.first_block));
  for (auto& b : blocks) {
    b.x_in.resize(n * d);
    b.ln1.resize(n * d);
    b.rstd1.resize(n);
    b.q_lin.resize(n * d);
    b.k_lin.resize(n * kv);
    b.v.resize(n * kv);
    if (c.qk_norm) {
      b.q_normed.resize(n * d);
      b.k_normed.resize(n * kv);
      b.rstd_q.resize(n * h);
      b.rstd_k.resize(n * kvh);
    }
    b.q.resize(n * d);
    b.k.resize(n * kv);
    b.att.resize(n * d);
    b.lse.resize(n * h);
    b.x_mid.resize(n * d);
    b.ln2.resize(n * d);
    b.rstd2.resize(n);
    b.gate.resize(n * f);
    b.up.resize(n * f);
    b.act.resize(n * f);
  }
  x_out.resize(n * d);
  if (stage.head) {
    final_ln.resize(n * d);
    rstd_f.resize(n);
    logits.resize(n * c.vocab_size);
    logits_lse.resize(n);
    target_logits.resize(n);
  }
  rope_cos.resize(size_t(seq) * c.head_dim() / 2);
  rope_sin.resize(rope_cos.size());
  rope_tables(rope_cos.data(), rope_sin.data(), seq, c.head_dim(), c.rope_theta);
  if (!scratch) scratch = std::make_shared<BackwardScratch>(c, batch, seq);
  check(int64_t(scratch->dx.size()) == n * d, "internal: backward scratch of another shape");
}

int64_t Workspace::activation_floats() const {
  int64_t total = 0;
  auto add = [&](const std::vector<float>& v) { total += int64_t(v.size()); };
  for (const auto& b : blocks)
    for (const auto* v : {&b.x_in, &b.ln1, &b.rstd1, &b.q_lin, &b.k_lin, &b.v, &b.q_normed, &b.rstd_q, &b.k_normed,
                          &b.rstd_k, &b.q, &b.k, &b.att, &b.lse, &b.x_mid, &b.ln2, &b.rstd2, &b.gate, &b.up, &b.act})
      add(*v);
  for (const auto* v : {&x_out, &final_ln, &rstd_f, &logits, &logits_lse, &target_logits, &rope_cos, &rope_sin})
    add(*v);
  return total;
}

int64_t Workspace::activation_floats_for(const ModelConfig& c, const StageSpec& stage_in, int batch, int seq) {
  StageSpec stage = stage_in;
  if (stage.last_block < 0) stage.last_block = c.num_layers;
  const int64_t n = int64_t(batch) * seq, d = c.hidden_size, f = c.intermediate_size, h = c.num_heads,
                kv = c.kv_dim(), kvh = c.kv_heads();
  int64_t per_block = 7 * n * d + 3 * n * kv + 2 * n + n * h + 3 * n * f;
  if (c.qk_norm) per_block += n * d + n * kv + n * h + n * kvh;
  int64_t total = per_block * (stage.last_block - stage.first_block) + n * d;
  if (stage.head) total += n * d + n + n * c.vocab_size + 2 * n;
  total += int64_t(seq) * (c.head_dim() / 2) * 2;
  return total;
}

Transformer::Transformer(const ModelConfig& config, StageSpec stage) : config_(config), layout_(config, stage) {
  config_.validate("model config");
}

void Transformer::set_protocol(const Subspace* subspace) {
  check(!subspace || subspace->k() == layout_.stage().embedding_rank || !layout_.stage().embedding,
        "internal: the subspace's rank differs from the stage's embedding rank");
  subspace_ = subspace;
}

const Subspace* Transformer::protocol() const {
  check(subspace_ != nullptr, "internal: a protocol stage without its subspace");
  return subspace_;
}

void Transformer::init_params(float* params, uint64_t seed) const {
  const double residual_scale = config_.scale_residual_init ? 1.0 / std::sqrt(2.0 * config_.num_layers) : 1.0;
  for (const auto& t : layout_.tensors()) {
    float* p = params + t.offset;
    if (!t.is_matrix()) {
      std::fill(p, p + t.numel(), 1.0f);
      continue;
    }
    double std = config_.init_std;
    if (t.kind == TensorKind::O || t.kind == TensorKind::Down) std *= residual_scale;
    Rng rng(mix_seed(seed, name_hash(t.name)));
    if (!t.transposed) {
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(std * rng.normal());
    } else {
      // Draw in Hugging Face (cols, rows) order, store transposed.
      for (int64_t r = 0; r < t.cols; ++r)
        for (int64_t c = 0; c < t.rows; ++c) p[c * t.cols + r] = float(std * rng.normal());
    }
  }
}

double Transformer::forward(const float* params, const int32_t* tokens, const float* x_in, const int32_t* targets,
                            Workspace& ws, double dloss) const {
  const auto& c = config_;
  const auto& st = layout_.stage();
  const int64_t n = ws.rows();
  const int d = c.hidden_size, f = c.intermediate_size, h = c.num_heads, hd = c.head_dim(), kvh = c.kv_heads(),
            kv = c.kv_dim();
  auto P = [&](TensorKind k, int block = -1) { return params + layout_.get(k, block).offset; };

  float* x = ws.blocks.empty() ? ws.x_out.data() : ws.blocks[0].x_in.data();
  if (st.embedding) {
    for (int64_t i = 0; i < n; ++i)
      if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
        fail("input token id " + std::to_string(tokens[i]) + " is outside the vocabulary (" +
             std::to_string(c.vocab_size) + ")");
    if (st.embedding_rank > 0)
      protocol()->embed_forward(x, tokens, P(TensorKind::Embedding), n);
    else
      embedding_forward(x, tokens, P(TensorKind::Embedding), n, d);
  } else {
    std::copy_n(x_in, n * d, x);
  }

  for (size_t i = 0; i < ws.blocks.size(); ++i) {
    const int l = st.first_block + int(i);
    auto& b = ws.blocks[i];
    float* x_next = i + 1 < ws.blocks.size() ? ws.blocks[i + 1].x_in.data() : ws.x_out.data();
    // Attention sub-block: x_mid = x_in + o(attn(rope(q), rope(k), v)).
    rmsnorm_forward(b.ln1.data(), b.rstd1.data(), b.x_in.data(), P(TensorKind::InputNorm, l), n, d,
                    float(c.rms_eps));
    linear_forward(b.q_lin.data(), b.ln1.data(), P(TensorKind::Q, l), n, d, d);
    linear_forward(b.k_lin.data(), b.ln1.data(), P(TensorKind::K, l), n, d, kv);
    linear_forward(b.v.data(), b.ln1.data(), P(TensorKind::V, l), n, d, kv);
    const float* q_pre = b.q_lin.data();
    const float* k_pre = b.k_lin.data();
    if (c.qk_norm) {
      rmsnorm_forward(b.q_normed.data(), b.rstd_q.data(), b.q_lin.data(), P(TensorKind::QNorm, l), n * h, hd,
                      float(c.rms_eps));
      rmsnorm_forward(b.k_normed.data(), b.rstd_k.data(), b.k_lin.data(), P(TensorKind::KNorm, l), n * kvh, hd,
                      float(c.rms_eps));
      q_pre = b.q_normed.data();
      k_pre = b.k_normed.data();
    }
    rope_forward(b.q.data(), q_pre, ws.rope_cos.data(), ws.rope_sin.data(), ws.batch, ws.seq, h, hd);
    rope_forward(b.k.data(), k_pre, ws.rope_cos.data(), ws.rope_sin.data(), ws.batch, ws.seq, kvh, hd);
    attention_forward(b.att.data(), b.lse.data(), b.q.data(), b.k.data(), b.v.data(), ws.batch, ws.seq, h, kvh, hd);
    linear_forward(b.x_mid.data(), b.att.data(), P(TensorKind::O, l), n, d, d);
    for (int64_t j = 0; j < n * d; ++j) b.x_mid[j] += b.x_in[j];
    // MLP sub-block: x_next = x_mid + down(silu(gate) * up).
    rmsnorm_forward(b.ln2.data(), b.rstd2.data(), b.x_mid.data(), P(TensorKind::PostNorm, l), n, d,
                    float(c.rms_eps));
    linear_forward(b.gate.data(), b.ln2.data(), P(TensorKind::Gate, l), n, d, f);
    linear_forward(b.up.data(), b.ln2.data(), P(TensorKind::Up, l), n, d, f);
    swiglu_forward(b.act.data(), b.gate.data(), b.up.data(), n * f);
    linear_t_forward(x_next, b.act.data(), P(TensorKind::Down, l), n, f, d);
    for (int64_t j = 0; j < n * d; ++j) x_next[j] += b.x_mid[j];
  }

  if (!st.head) return 0.0;
  for (int64_t i = 0; i < n; ++i)
    if (targets[i] < 0 || targets[i] >= c.vocab_size)
      fail("target token id " + std::to_string(targets[i]) + " is outside the vocabulary (" +
           std::to_string(c.vocab_size) + ")");
  rmsnorm_forward(ws.final_ln.data(), ws.rstd_f.data(), ws.x_out.data(), P(TensorKind::FinalNorm), n, d,
                  float(c.rms_eps));
  const float* head = c.tie_embeddings ? P(TensorKind::Embedding) : P(TensorKind::LmHead);
  linear_forward(ws.logits.data(), ws.final_ln.data(), head, n, d, c.vocab_size);
  ws.fused_dloss = dloss;
  if (dloss > 0)
    return cross_entropy_fused(ws.logits.data(), ws.logits_lse.data(), ws.target_logits.data(), targets, n,
                               c.vocab_size, c.z_loss, dloss);
  return cross_entropy_forward(ws.logits_lse.data(), ws.logits.data(), targets, n, c.vocab_size, c.z_loss);
}

void Transformer::backward(const float* params, float* grads, const int32_t* tokens, const int32_t* targets,
                           double dloss, const float* dy, float* dx_in, Workspace& ws,
                           const TrainableSet* trainable) const {
  const auto& c = config_;
  const auto& st = layout_.stage();
  const int64_t n = ws.rows();
  const int d = c.hidden_size, f = c.intermediate_size, h = c.num_heads, hd = c.head_dim(), kvh = c.kv_heads(),
            kv = c.kv_dim();
  auto P = [&](TensorKind k, int block = -1) { return params + layout_.get(k, block).offset; };
  BackwardScratch& sc = *ws.scratch;
  // Gradient of a tensor trained as a whole (norms, embeddings, o: never sliced).
  auto G = [&](TensorKind k, int block = -1) {
    const auto& t = layout_.get(k, block);
    return grads + (trainable ? trainable->rows(size_t(&t - layout_.tensors().data())).compact : t.offset);
  };
  // A linear layer whose weight may be sliced: full input gradient, weight gradient of the
  // trained rows only. transposed: the weight is stored (IN, OUT) (down_proj).
  auto linear_back = [&](float* din, TensorKind k, int l, const float* dout, const float* in, int in_dim,
                         int out_dim, bool transposed) {
    const auto& t = layout_.get(k, l);
    const float* w = params + t.offset;
    const auto backward_full = transposed ? linear_t_backward<float> : linear_backward<float>;
    if (!trainable) return backward_full(din, grads + t.offset, dout, in, w, n, in_dim, out_dim);
    const auto& r = trainable->rows(size_t(&t - layout_.tensors().data()));
    if (r.begin == 0 && r.end == t.rows) return backward_full(din, grads + r.compact, dout, in, w, n, in_dim, out_dim);
    backward_full(din, nullptr, dout, in, w, n, in_dim, out_dim);
    if (r.end > r.begin)
      (transposed ? linear_t_backward_weight_rows<float> : linear_backward_weight_rows<float>)(
          grads + r.compact, dout, in, n, in_dim, out_dim, int(r.begin), int(r.end));
  };

  // sc.dx: gradient of the loss with respect to the residual stream, walked down the blocks.
  zero(sc.dx);
  if (st.head) {
    const TensorKind head_kind = c.tie_embeddings ? TensorKind::Embedding : TensorKind::LmHead;
    if (ws.fused_dloss > 0)  // the forward wrote dlogits already
      check(ws.fused_dloss == dloss, "internal: backward's dloss differs from the one its forward fused");
    else
      cross_entropy_backward(ws.logits.data(), ws.logits.data(), ws.logits_lse.data(), targets, n, c.vocab_size,
                             c.z_loss, dloss);
    ws.fused_dloss = 0;
    zero(sc.dln);
    linear_backward(sc.dln.data(), G(head_kind), ws.logits.data(), ws.final_ln.data(), P(head_kind), n, d,
                    c.vocab_size);
    rmsnorm_backward(sc.dx.data(), G(TensorKind::FinalNorm), sc.dln.data(), ws.x_out.data(),
                     P(TensorKind::FinalNorm), ws.rstd_f.data(), n, d);
  } else {
    std::copy_n(dy, n * d, sc.dx.data());
  }

  for (size_t i = ws.blocks.size(); i-- > 0;) {
    const int l = st.first_block + int(i);
    auto& b = ws.blocks[i];
    // MLP: dx is dL/dx_next and, by the residual, already part of dL/dx_mid.
    zero(sc.dact);
    linear_back(sc.dact.data(), TensorKind::Down, l, sc.dx.data(), b.act.data(), f, d, true);
    zero(sc.dgate);
    zero(sc.dup);
    swiglu_backward(sc.dgate.data(), sc.dup.data(), sc.dact.data(), b.gate.data(), b.up.data(), n * f);
    zero(sc.dln);
    linear_back(sc.dln.data(), TensorKind::Gate, l, sc.dgate.data(), b.ln2.data(), d, f, false);
    linear_back(sc.dln.data(), TensorKind::Up, l, sc.dup.data(), b.ln2.data(), d, f, false);
    rmsnorm_backward(sc.dx.data(), G(TensorKind::PostNorm, l), sc.dln.data(), b.x_mid.data(),
                     P(TensorKind::PostNorm, l), b.rstd2.data(), n, d);
    // Attention: dx is now dL/dx_mid, and by the residual part of dL/dx_in.
    zero(sc.datt);
    linear_backward(sc.datt.data(), G(TensorKind::O, l), sc.dx.data(), b.att.data(), P(TensorKind::O, l), n, d, d);
    zero(sc.dq);
    zero(sc.dk);
    zero(sc.dv);
    attention_backward(sc.dq.data(), sc.dk.data(), sc.dv.data(), sc.datt.data(), b.q.data(), b.k.data(), b.v.data(),
                       b.att.data(), b.lse.data(), ws.batch, ws.seq, h, kvh, hd);
    zero(sc.dq2);
    zero(sc.dk2);
    rope_backward(sc.dq2.data(), sc.dq.data(), ws.rope_cos.data(), ws.rope_sin.data(), ws.batch, ws.seq, h, hd);
    rope_backward(sc.dk2.data(), sc.dk.data(), ws.rope_cos.data(), ws.rope_sin.data(), ws.batch, ws.seq, kvh, hd);
    const float* dq_lin = sc.dq2.data();
    const float* dk_lin = sc.dk2.data();
    if (c.qk_norm) {
      // dq/dk are free again: reuse them for the gradients before the QK-norm.
      zero(sc.dq);
      zero(sc.dk);
      rmsnorm_backward(sc.dq.data(), G(TensorKind::QNorm, l), sc.dq2.data(), b.q_lin.data(), P(TensorKind::QNorm, l),
                       b.rstd_q.data(), n * h, hd);
      rmsnorm_backward(sc.dk.data(), G(TensorKind::KNorm, l), sc.dk2.data(), b.k_lin.data(), P(TensorKind::KNorm, l),
                       b.rstd_k.data(), n * kvh, hd);
      dq_lin = sc.dq.data();
      dk_lin = sc.dk.data();
    }
    zero(sc.dln);
    linear_back(sc.dln.data(), TensorKind::Q, l, dq_lin, b.ln1.data(), d, d, false);
    linear_back(sc.dln.data(), TensorKind::K, l, dk_lin, b.ln1.data(), d, kv, false);
    linear_back(sc.dln.data(), TensorKind::V, l, sc.dv.data(), b.ln1.data(), d, kv, false);
    rmsnorm_backward(sc.dx.data(), G(TensorKind::InputNorm, l), sc.dln.data(), b.x_in.data(),
                     P(TensorKind::InputNorm, l), b.rstd1.data(), n, d);
  }

  if (st.embedding && st.embedding_rank > 0)
    protocol()->embed_backward(G(TensorKind::Embedding), sc.dx.data(), tokens, n);
  else if (st.embedding)
    embedding_backward(G(TensorKind::Embedding), sc.dx.data(), tokens, n, d);
  else if (dx_in)
    for (int64_t j = 0; j < n * d; ++j) dx_in[j] += sc.dx[j];
}

}  // namespace loco
