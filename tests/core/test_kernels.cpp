// Finite-difference checks of every kernel's backward, in double precision.
// f = <forward(inputs), g> for a random upstream gradient g; every gradient buffer is
// prefilled with a sentinel and the kernel must ADD its gradient to it (accumulate, not
// overwrite), so (buffer - sentinel) is compared with central differences of f.
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/fast_math.h"
#include "core/kernels.h"
#include "core/rng.h"

using namespace loco;
using Vec = std::vector<double>;

namespace {

constexpr double kSentinel = 0.375;

Vec randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Vec v(n);
  for (auto& x : v) x = scale * rng.normal();
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

Vec sentinel(size_t n) { return Vec(n, kSentinel); }

// Compares (accumulated - sentinel) with central differences of f with respect to x.
void expect_grad(const char* what, Vec& x, const Vec& accumulated, const std::function<double()>& f,
                 double tol = 1e-6) {
  ASSERT_EQ(x.size(), accumulated.size());
  const double h = 1e-6;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double fp = f();
    x[i] = saved - h;
    const double fm = f();
    x[i] = saved;
    const double numeric = (fp - fm) / (2 * h);
    const double analytic = accumulated[i] - kSentinel;
    const double err = std::abs(numeric - analytic) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, err);
    if (err > tol) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic << " vs numeric " << numeric;
      return;
    }
  }
  EXPECT_LE(worst, tol) << what;
}

}  // namespace

TEST(Kernels, RmsNorm) {
  const int n = 5, c = 12;
  Vec in = randn(n * c, 1), w = randn(c, 2), g = randn(n * c, 3);
  Vec out(n * c), rstd(n);
  auto f = [&] {
    rmsnorm_forward(out.data(), rstd.data(), in.data(), w.data(), n, c, 1e-5);
    return dot(out, g);
  };
  f();
  Vec din = sentinel(n * c), dw = sentinel(c);
  rmsnorm_backward(din.data(), dw.data(), g.data(), in.data(), w.data(), rstd.data(), n, c);
  expect_grad("rmsnorm din", in, din, f);
  expect_grad("rmsnorm dw", w, dw, f);
}

TEST(Kernels, Linear) {
  const int n = 7, in_dim = 6, out_dim = 5;
  Vec in = randn(n * in_dim, 1), w = randn(out_dim * in_dim, 2), g = randn(n * out_dim, 3), out(n * out_dim);
  auto f = [&] {
    linear_forward(out.data(), in.data(), w.data(), n, in_dim, out_dim);
    return dot(out, g);
  };
  f();
  Vec din = sentinel(in.size()), dw = sentinel(w.size());
  linear_backward(din.data(), dw.data(), g.data(), in.data(), w.data(), n, in_dim, out_dim);
  expect_grad("linear din", in, din, f);
  expect_grad("linear dw", w, dw, f);
}

TEST(Kernels, LinearTransposedStorage) {
  const int n = 7, in_dim = 6, out_dim = 5;
  Vec in = randn(n * in_dim, 1), wt = randn(in_dim * out_dim, 2), g = randn(n * out_dim, 3), out(n * out_dim);
  auto f = [&] {
    linear_t_forward(out.data(), in.data(), wt.data(), n, in_dim, out_dim);
    return dot(out, g);
  };
  f();
  Vec din = sentinel(in.size()), dwt = sentinel(wt.size());
  linear_t_backward(din.data(), dwt.data(), g.data(), in.data(), wt.data(), n, in_dim, out_dim);
  expect_grad("linear_t din", in, din, f);
  expect_grad("linear_t dwt", wt, dwt, f);
  // Same function as linear_forward with the transposed weight.
  f();
  Vec w(out_dim * in_dim), out2(n * out_dim);
  for (int i = 0; i < in_dim; ++i)
    for (int o = 0; o < out_dim; ++o) w[o * in_dim + i] = wt[i * out_dim + o];
  linear_forward(out2.data(), in.data(), w.data(), n, in_dim, out_dim);
  for (size_t i = 0; i < out.size(); ++i) LOCO_EXPECT_NEAR(out[i], out2[i], 1e-12);
}

TEST(Kernels, Embedding) {
  const int n = 9, c = 4, vocab = 5;
  std::vector<int32_t> tokens = {0, 3, 3, 1, 4, 0, 2, 3, 1};
  Vec e = randn(vocab * c, 1), g = randn(n * c, 2), out(n * c);
  auto f = [&] {
    embedding_forward(out.data(), tokens.data(), e.data(), n, c);
    return dot(out, g);
  };
  f();
  Vec de = sentinel(e.size());
  embedding_backward(de.data(), g.data(), tokens.data(), n, c);
  expect_grad("embedding de", e, de, f);
}

TEST(Kernels, Rope) {
  const int batch = 2, seq = 5, heads = 3, hd = 8;
  const size_t size = size_t(batch) * seq * heads * hd;
  Vec cs(seq * hd / 2), sn(seq * hd / 2);
  rope_tables(cs.data(), sn.data(), seq, hd, 10000.0);
  Vec in = randn(size, 1), g = randn(size, 2), out(size);
  auto f = [&] {
    rope_forward(out.data(), in.data(), cs.data(), sn.data(), batch, seq, heads, hd);
    return dot(out, g);
  };
  f();
  Vec din = sentinel(size);
  rope_backward(din.data(), g.data(), cs.data(), sn.data(), batch, seq, heads, hd);
  expect_grad("rope din", in, din, f);
  // Position 0 is the identity; rotations preserve norms per pair.
  for (int i = 0; i < heads * hd; ++i) EXPECT_DOUBLE_EQ(out[i], in[i]);
}

// Random q, k, v and upstream gradient g for attention (kv_heads key/value heads, 0: heads),
// f = <attention(q, k, v), g>, and the backward into sentinel-filled gradients.
struct AttentionCase {
  AttentionCase(int batch, int seq, int heads, int hd, int kv_heads_in = 0)
      : batch(batch), seq(seq), heads(heads), kv_heads(kv_heads_in > 0 ? kv_heads_in : heads), hd(hd),
        size(size_t(batch) * seq * heads * hd), kv_size(size_t(batch) * seq * kv_heads * hd), q(randn(size, 1)),
        k(randn(kv_size, 2)), v(randn(kv_size, 3)), g(randn(size, 4)), out(size), lse(size_t(batch) * heads * seq),
        dq(sentinel(size)), dk(sentinel(kv_size)), dv(sentinel(kv_size)) {
    f();
    attention_backward(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(), v.data(), out.data(),
                       lse.data(), batch, seq, heads, kv_heads, hd);
  }
  double f() {
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), batch, seq, heads, kv_heads, hd);
    return dot(out, g);
  }
  int batch, seq, heads, kv_heads, hd;
  size_t size, kv_size;
  Vec q, k, v, g, out, lse, dq, dk, dv;
};

TEST(Kernels, Attention) {
  AttentionCase c(2, 6, 2, 4);
  auto f = [&] { return c.f(); };
  expect_grad("attention dq", c.q, c.dq, f);
  expect_grad("attention dk", c.k, c.dk, f);
  expect_grad("attention dv", c.v, c.dv, f);
}

TEST(Kernels, GroupedQueryAttention) {
  // 6 query heads reading 2 key/value heads (groups of 3), over more rows than one row block.
  AttentionCase c(2, 70, 6, 4, 2);
  auto f = [&] { return c.f(); };
  expect_grad("gqa dq", c.q, c.dq, f);
  expect_grad("gqa dk", c.k, c.dk, f);
  expect_grad("gqa dv", c.v, c.dv, f);
  // The definition: multi-head attention with each key/value head repeated for its group; the
  // shared heads' gradients are the sums over the group.
  AttentionCase full(2, 70, 6, 4);
  const int group = c.heads / c.kv_heads;
  auto spread = [&](const Vec& kv, Vec& out) {
    for (size_t r = 0; r < size_t(c.batch) * c.seq; ++r)
      for (int h = 0; h < c.heads; ++h)
        for (int j = 0; j < c.hd; ++j)
          out[(r * c.heads + h) * c.hd + j] = kv[(r * c.kv_heads + h / group) * c.hd + j];
  };
  full.q = c.q;
  full.g = c.g;
  spread(c.k, full.k);
  spread(c.v, full.v);
  full.f();
  c.f();  // the checks above left the output of a perturbed input
  full.dq = sentinel(full.size), full.dk = sentinel(full.size), full.dv = sentinel(full.size);
  attention_backward(full.dq.data(), full.dk.data(), full.dv.data(), full.g.data(), full.q.data(), full.k.data(),
                     full.v.data(), full.out.data(), full.lse.data(), full.batch, full.seq, full.heads, full.heads,
                     full.hd);
  for (size_t i = 0; i < c.size; ++i) {
    LOCO_ASSERT_NEAR(c.out[i], full.out[i], 1e-12) << i;
    LOCO_ASSERT_NEAR(c.dq[i], full.dq[i], 1e-12) << i;
  }
  for (size_t r = 0; r < size_t(c.batch) * c.seq; ++r)
    for (int hk = 0; hk < c.kv_heads; ++hk)
      for (int j = 0; j < c.hd; ++j) {
        double dk = 0, dv = 0;
        for (int h = hk * group; h < (hk + 1) * group; ++h) {
          dk += full.dk[(r * c.heads + h) * c.hd + j] - kSentinel;
          dv += full.dv[(r * c.heads + h) * c.hd + j] - kSentinel;
        }
        const size_t i = (r * c.kv_heads + hk) * c.hd + j;
        LOCO_ASSERT_NEAR(c.dk[i] - kSentinel, dk, 1e-10) << i;
        LOCO_ASSERT_NEAR(c.dv[i] - kSentinel, dv, 1e-10) << i;
      }
}

TEST(Kernels, AttentionIsCausal) {
  // Changing a later key/value must not change earlier outputs.
  const int batch = 1, seq = 5, heads = 1, hd = 4;
  const size_t size = size_t(seq) * hd;
  Vec q = randn(size, 1), k = randn(size, 2), v = randn(size, 3), out1(size), out2(size), lse(seq);
  attention_forward(out1.data(), lse.data(), q.data(), k.data(), v.data(), batch, seq, heads, heads, hd);
  for (int j = 0; j < hd; ++j) {
    k[4 * hd + j] += 1.0;
    v[4 * hd + j] -= 2.0;
  }
  attention_forward(out2.data(), lse.data(), q.data(), k.data(), v.data(), batch, seq, heads, heads, hd);
  for (size_t i = 0; i < 4 * size_t(hd); ++i) EXPECT_DOUBLE_EQ(out1[i], out2[i]);
  bool last_changed = false;
  for (int j = 0; j < hd; ++j) last_changed |= out1[4 * hd + j] != out2[4 * hd + j];
  EXPECT_TRUE(last_changed);
}

TEST(Kernels, SwiGlu) {
  const int n = 40;
  Vec gate = randn(n, 1, 2.0), up = randn(n, 2), g = randn(n, 3), out(n);
  auto f = [&] {
    swiglu_forward(out.data(), gate.data(), up.data(), n);
    return dot(out, g);
  };
  f();
  Vec dgate = sentinel(n), dup = sentinel(n);
  swiglu_backward(dgate.data(), dup.data(), g.data(), gate.data(), up.data(), n);
  expect_grad("swiglu dgate", gate, dgate, f);
  expect_grad("swiglu dup", up, dup, f);
}

TEST(Kernels, CrossEntropyWithZLoss) {
  const int n = 6, vocab = 7;
  std::vector<int32_t> targets = {0, 6, 3, 3, 1, 5};
  Vec logits = randn(n * vocab, 1, 3.0);
  for (double z : {0.0, 0.1}) {
    Vec lse(n);
    auto f = [&] { return cross_entropy_forward(lse.data(), logits.data(), targets.data(), n, vocab, z); };
    f();
    // The one overwriting kernel: fill with NaN to catch entries never written.
    Vec dlogits(n * vocab, std::nan(""));
    cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), n, vocab, z, 1.0);
    for (auto& x : dlogits) {
      ASSERT_FALSE(std::isnan(x));
      x += kSentinel;  // expect_grad subtracts the sentinel
    }
    expect_grad("cross-entropy dlogits", logits, dlogits, f);
  }
  // Aliased in-place use gives the same gradient.
  Vec a = logits, b(n * vocab), lse(n);
  cross_entropy_forward(lse.data(), logits.data(), targets.data(), n, vocab, 0.1);
  cross_entropy_backward(b.data(), logits.data(), lse.data(), targets.data(), n, vocab, 0.1, 0.5);
  cross_entropy_backward(a.data(), a.data(), lse.data(), targets.data(), n, vocab, 0.1, 0.5);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(a[i], b[i]);
}

TEST(Kernels, CrossEntropyFusedIsForwardThenBackwardBitForBit) {
  // Rows longer than a vector and of odd length, so both the vector body and the tail run.
  for (int vocab : {7, 37, 1000}) {
    const int n = 9;
    std::vector<int32_t> targets(n);
    for (int i = 0; i < n; ++i) targets[i] = (i * 13 + 5) % vocab;
    std::vector<float> logits(size_t(n) * vocab);
    const Vec r = randn(logits.size(), vocab, 4.0);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(r[i]);
    for (double z : {0.0, 1e-4}) {
      std::vector<float> lse(n), dlogits(logits.size()), fused = logits, fused_lse(n), target_logit(n);
      const double loss = cross_entropy_forward(lse.data(), logits.data(), targets.data(), n, vocab, z);
      cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), n, vocab, z, 0.25);
      const double fused_loss = cross_entropy_fused(fused.data(), fused_lse.data(), target_logit.data(),
                                                    targets.data(), n, vocab, z, 0.25);
      EXPECT_EQ(loss, fused_loss) << "vocab " << vocab << " z " << z;
      EXPECT_EQ(lse, fused_lse);
      EXPECT_EQ(dlogits, fused) << "vocab " << vocab << " z " << z;
      for (int i = 0; i < n; ++i) EXPECT_EQ(target_logit[i], logits[size_t(i) * vocab + targets[i]]);
    }
  }
}

TEST(Kernels, FloatMatchesDouble) {
  // The float instantiation computes the same function (to float precision).
  const int batch = 1, seq = 8, heads = 2, hd = 4;
  const size_t size = size_t(batch) * seq * heads * hd;
  Vec q = randn(size, 1), k = randn(size, 2), v = randn(size, 3), out(size), lse(heads * seq);
  std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end()), outf(size),
      lsef(heads * seq);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), batch, seq, heads, heads, hd);
  attention_forward(outf.data(), lsef.data(), qf.data(), kf.data(), vf.data(), batch, seq, heads, heads, hd);
  for (size_t i = 0; i < size; ++i) LOCO_EXPECT_NEAR(out[i], outf[i], 1e-5);
}

TEST(Kernels, FastExpAccuracy) {
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double exact = std::exp(double(x));
    worst = std::max(worst, std::abs(double(loco::fast_exp(x)) - exact) / exact);
  }
  LOCO_EXPECT_BELOW(worst, 3e-7);
  EXPECT_EQ(loco::fast_exp(-100.0f), 0.0f);
  EXPECT_TRUE(std::isnan(loco::fast_exp(std::nanf(""))));
  EXPECT_EQ(loco::fast_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(loco::fast_exp(0.0f), 1.0f);
}

TEST(Kernels, AttentionAcrossRowBlocks) {
  // A sequence longer than the 64-row block, with more (batch, head) pairs than threads:
  // gradients of a few entries still match finite differences.
  AttentionCase c(2, 150, 3, 4);
  // Check a strided subset (every entry would be slow): rows in every block, both batches.
  for (Vec* x : {&c.q, &c.k, &c.v}) {
    const Vec* acc = x == &c.q ? &c.dq : x == &c.k ? &c.dk : &c.dv;
    for (size_t i = 0; i < c.size; i += 37) {
      const double saved = (*x)[i];
      (*x)[i] = saved + 1e-6;
      const double fp = c.f();
      (*x)[i] = saved - 1e-6;
      const double fm = c.f();
      (*x)[i] = saved;
      const double numeric = (fp - fm) / 2e-6;
      LOCO_EXPECT_NEAR((*acc)[i] - kSentinel, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << i;
    }
  }
}
