#include "core/kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/blas.h"
#include "core/error.h"
#include "core/fast_math.h"
#include "core/parallel.h"

namespace loco {

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* w, int64_t n, int c, T eps) {
  parallel_for(n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* x = in + i * c;
      T* y = out + i * c;
      T ss = 0;
      for (int j = 0; j < c; ++j) ss += x[j] * x[j];
      const T r = T(1) / std::sqrt(ss / T(c) + eps);
      rstd[i] = r;
      for (int j = 0; j < c; ++j) y[j] = x[j] * r * w[j];
    }
  });
}

template <class T>
void rmsnorm_backward(T* din, T* dw, const T* dout, const T* in, const T* w, const T* rstd, int64_t n, int c) {
  if (din) {
    parallel_for(n, 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T* x = in + i * c;
        const T* dy = dout + i * c;
        T* dx = din + i * c;
        const T r = rstd[i];
        T dot = 0;  // sum_j dy_j w_j x_j
        for (int j = 0; j < c; ++j) dot += dy[j] * w[j] * x[j];
        const T k = dot * r * r * r / T(c);
        for (int j = 0; j < c; ++j) dx[j] += dy[j] * w[j] * r - x[j] * k;
      }
    });
  }
  if (dw) {
    // A reduction over rows: split by columns so the summation order does not depend on threads.
    parallel_for(c, 16, [&](int64_t j0, int64_t j1) {
      for (int64_t i = 0; i < n; ++i) {
        const T* x = in + i * c;
        const T* dy = dout + i * c;
        const T r = rstd[i];
        for (int64_t j = j0; j < j1; ++j) dw[j] += dy[j] * x[j] * r;
      }
    });
  }
}

template <class T>
void linear_forward(T* out, const T* in, const T* w, int64_t n, int in_dim, int out_dim) {
  gemm_mt(false, true, int(n), out_dim, in_dim, T(1), in, in_dim, w, in_dim, T(0), out, out_dim);
}

template <class T>
void linear_backward(T* din, T* dw, const T* dout, const T* in, const T* w, int64_t n, int in_dim, int out_dim) {
  if (din) gemm_mt(false, false, int(n), in_dim, out_dim, T(1), dout, out_dim, w, in_dim, T(1), din, in_dim);
  if (dw) gemm_mt(true, false, out_dim, in_dim, int(n), T(1), dout, out_dim, in, in_dim, T(1), dw, in_dim);
}

template <class T>
void linear_backward_weight_rows(T* dw_rows, const T* dout, const T* in, int64_t n, int in_dim, int out_dim, int r0,
                                 int r1) {
  gemm_mt(true, false, r1 - r0, in_dim, int(n), T(1), dout + r0, out_dim, in, in_dim, T(1), dw_rows, in_dim);
}

template <class T>
void linear_t_forward(T* out, const T* in, const T* wt, int64_t n, int in_dim, int out_dim) {
  gemm_mt(false, false, int(n), out_dim, in_dim, T(1), in, in_dim, wt, out_dim, T(0), out, out_dim);
}

template <class T>
void linear_t_backward(T* din, T* dwt, const T* dout, const T* in, const T* wt, int64_t n, int in_dim, int out_dim) {
  if (din) gemm_mt(false, true, int(n), in_dim, out_dim, T(1), dout, out_dim, wt, out_dim, T(1), din, in_dim);
  if (dwt) gemm_mt(true, false, in_dim, out_dim, int(n), T(1), in, in_dim, dout, out_dim, T(1), dwt, out_dim);
}

template <class T>
void linear_t_backward_weight_rows(T* dwt_rows, const T* dout, const T* in, int64_t n, int in_dim, int out_dim,
                                   int r0, int r1) {
  gemm_mt(true, false, r1 - r0, out_dim, int(n), T(1), in + r0, in_dim, dout, out_dim, T(1), dwt_rows, out_dim);
}

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* e, int64_t n, int c) {
  for (int64_t i = 0; i < n; ++i) std::copy_n(e + int64_t(tokens[i]) * c, c, out + i * c);
}

template <class T>
void embedding_backward(T* de, const T* dout, const int32_t* tokens, int64_t n, int c) {
  for (int64_t i = 0; i < n; ++i) {
    T* row = de + int64_t(tokens[i]) * c;
    const T* g = dout + i * c;
    for (int j = 0; j < c; ++j) row[j] += g[j];
  }
}

template <class T>
void rope_tables(T* cos_table, T* sin_table, int seq, int head_dim, double theta) {
  const int half = head_dim / 2;
  for (int p = 0; p < seq; ++p) {
    for (int i = 0; i < half; ++i) {
      const double inv_freq = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
      const double a = double(p) * inv_freq;
      cos_table[p * half + i] = T(std::cos(a));
      sin_table[p * half + i] = T(std::sin(a));
    }
  }
}

template <class T>
void rope_forward(T* out, const T* in, const T* cos_table, const T* sin_table, int64_t batch, int seq, int heads,
                  int head_dim) {
  const int half = head_dim / 2;
  parallel_for(batch * seq, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int p = int(r % seq);
      const T* cs = cos_table + p * half;
      const T* sn = sin_table + p * half;
      for (int h = 0; h < heads; ++h) {
        const T* x = in + (r * heads + h) * head_dim;
        T* y = out + (r * heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const T x1 = x[i], x2 = x[i + half];
          y[i] = x1 * cs[i] - x2 * sn[i];
          y[i + half] = x2 * cs[i] + x1 * sn[i];
        }
      }
    }
  });
}

template <class T>
void rope_backward(T* din, const T* dout, const T* cos_table, const T* sin_table, int64_t batch, int seq, int heads,
                   int head_dim) {
  const int half = head_dim / 2;
  parallel_for(batch * seq, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int p = int(r % seq);
      const T* cs = cos_table + p * half;
      const T* sn = sin_table + p * half;
      for (int h = 0; h < heads; ++h) {
        const T* dy = dout + (r * heads + h) * head_dim;
        T* dx = din + (r * heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const T d1 = dy[i], d2 = dy[i + half];
          dx[i] += d1 * cs[i] + d2 * sn[i];
          dx[i + half] += d2 * cs[i] - d1 * sn[i];
        }
      }
    }
  });
}

namespace {

constexpr int kAttnRowBlock = 64;

template <class T>
T* thread_scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int64_t batch, int seq, int heads,
                       int kv_heads, int head_dim) {
  check(kv_heads >= 1 && heads % kv_heads == 0, "internal: key/value heads must divide the query heads");
  const int ld = heads * head_dim, ld_kv = kv_heads * head_dim, group = heads / kv_heads;
  const T scale = T(1) / std::sqrt(T(head_dim));
  parallel_for(batch * heads, 1, [&](int64_t begin, int64_t end) {
    T* s = thread_scratch<T>(size_t(kAttnRowBlock) * seq);  // (rows, keys) scores, then probabilities
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      const int64_t base = b * seq * ld + h * head_dim, base_kv = b * seq * ld_kv + (h / group) * head_dim;
      T* lh = lse + bh * seq;
      for (int i0 = 0; i0 < seq; i0 += kAttnRowBlock) {
        const int i1 = std::min(seq, i0 + kAttnRowBlock), rows = i1 - i0, keys = i1;
        gemm(false, true, rows, keys, head_dim, scale, q + base + int64_t(i0) * ld, ld, k + base_kv, ld_kv, T(0), s,
             keys);
        for (int r = 0; r < rows; ++r) {
          const int i = i0 + r;
          T* row = s + int64_t(r) * keys;
          T m = row[0];
          for (int j = 1; j <= i; ++j) m = std::max(m, row[j]);
          T sum = 0;
          for (int j = 0; j <= i; ++j) {
            row[j] = fast_exp(row[j] - m);
            sum += row[j];
          }
          const T inv = T(1) / sum;
          for (int j = 0; j <= i; ++j) row[j] *= inv;
          std::fill(row + i + 1, row + keys, T(0));
          lh[i] = m + std::log(sum);
        }
        gemm(false, false, rows, head_dim, keys, T(1), s, keys, v + base_kv, ld_kv, T(0),
             out + base + int64_t(i0) * ld, ld);
      }
    }
  });
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, int64_t batch, int seq, int heads, int kv_heads, int head_dim) {
  check(kv_heads >= 1 && heads % kv_heads == 0, "internal: key/value heads must divide the query heads");
  const int ld = heads * head_dim, ld_kv = kv_heads * head_dim, group = heads / kv_heads;
  const T scale = T(1) / std::sqrt(T(head_dim));
  // One (batch, key/value head) pair per task: its query heads all add into the same dk, dv.
  parallel_for(batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    T* p = thread_scratch<T>(2 * size_t(kAttnRowBlock) * seq);  // probabilities (rows, keys)
    T* dp = p + size_t(kAttnRowBlock) * seq;                     // dP, then dS
    for (int64_t bkv = begin; bkv < end; ++bkv) {
      const int64_t b = bkv / kv_heads, hkv = bkv % kv_heads;
      const int64_t base_kv = b * seq * ld_kv + hkv * head_dim;
      for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h) {
        const int64_t base = b * seq * ld + h * head_dim;
        const T* lh = lse + (b * heads + h) * seq;
        for (int i0 = 0; i0 < seq; i0 += kAttnRowBlock) {
          const int i1 = std::min(seq, i0 + kAttnRowBlock), rows = i1 - i0, keys = i1;
          const int64_t row0 = base + int64_t(i0) * ld;
          gemm(false, true, rows, keys, head_dim, scale, q + row0, ld, k + base_kv, ld_kv, T(0), p, keys);
          for (int r = 0; r < rows; ++r) {
            const int i = i0 + r;
            T* row = p + int64_t(r) * keys;
            for (int j = 0; j <= i; ++j) row[j] = fast_exp(row[j] - lh[i]);
            std::fill(row + i + 1, row + keys, T(0));
          }
          // dV[keys] += P^T dO[rows]
          gemm(true, false, keys, head_dim, rows, T(1), p, keys, dout + row0, ld, T(1), dv + base_kv, ld_kv);
          // dP = dO[rows] V[keys]^T
          gemm(false, true, rows, keys, head_dim, T(1), dout + row0, ld, v + base_kv, ld_kv, T(0), dp, keys);
          // dS = P * (dP - rowsum(dO * O)), times the softmax scale
          for (int r = 0; r < rows; ++r) {
            const int i = i0 + r;
            const T* o_row = out + row0 + int64_t(r) * ld;
            const T* do_row = dout + row0 + int64_t(r) * ld;
            T d = 0;
            for (int j = 0; j < head_dim; ++j) d += o_row[j] * do_row[j];
            const T* prow = p + int64_t(r) * keys;
            T* drow = dp + int64_t(r) * keys;
            for (int j = 0; j <= i; ++j) drow[j] = prow[j] * (drow[j] - d) * scale;
            std::fill(drow + i + 1, drow + keys, T(0));
          }
          // dQ[rows] += dS K[keys]; dK[keys] += dS^T Q[rows]
          gemm(false, false, rows, head_dim, keys, T(1), dp, keys, k + base_kv, ld_kv, T(1), dq + row0, ld);
          gemm(true, false, keys, head_dim, rows, T(1), dp, keys, q + row0, ld, T(1), dk + base_kv, ld_kv);
        }
      }
    }
  });
}

template <class T>
static inline T sigmoid(T x) {
  return T(1) / (T(1) + fast_exp(-x));
}

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t count) {
  parallel_for(count, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
  });
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t count) {
  parallel_for(count, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T g = gate[i];
      const T sg = sigmoid(g);
      dgate[i] += dout[i] * up[i] * sg * (T(1) + g * (T(1) - sg));
      dup[i] += dout[i] * g * sg;
    }
  });
}

template <class T>
static T row_logsumexp(const T* row, int vocab) {
  T m = row[0];
  for (int j = 1; j < vocab; ++j) m = std::max(m, row[j]);
  T sum = 0;
  for (int j = 0; j < vocab; ++j) sum += fast_exp(row[j] - m);
  return m + std::log(sum);
}

// The mean loss from each row's log-sum-exp and its target's logit (target_logit(i)), summed in
// row order in double.
template <class T, class TargetLogit>
static double cross_entropy_loss(const T* lse, int64_t n, double z_loss, TargetLogit target_logit) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double l = double(lse[i]);
    total += l - double(target_logit(i)) + z_loss * l * l;
  }
  return total / double(n);
}

template <class T>
double cross_entropy_forward(T* lse, const T* logits, const int32_t* targets, int64_t n, int vocab, double z_loss) {
  parallel_for(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) lse[i] = row_logsumexp(logits + i * vocab, vocab);
  });
  return cross_entropy_loss(lse, n, z_loss, [&](int64_t i) { return logits[i * vocab + targets[i]]; });
}

// One row of dlogits (may alias row): d/dlogit_j [lse - logit_t + z lse^2] = p_j (1 + 2 z lse) - [j == t].
template <class T>
static void cross_entropy_row_backward(T* drow, const T* row, T l, int32_t target, int vocab, double z_loss,
                                       double scale) {
  const T coef = T(scale * (1.0 + 2.0 * z_loss * double(l)));
  for (int j = 0; j < vocab; ++j) drow[j] = fast_exp(row[j] - l) * coef;
  drow[target] -= T(scale);
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int64_t n, int vocab,
                            double z_loss, double dloss) {
  const double scale = dloss / double(n);
  parallel_for(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      cross_entropy_row_backward(dlogits + i * vocab, logits + i * vocab, lse[i], targets[i], vocab, z_loss, scale);
  });
}

template <class T>
double cross_entropy_fused(T* logits, T* lse, T* target_logit, const int32_t* targets, int64_t n, int vocab,
                           double z_loss, double dloss) {
  const double scale = dloss / double(n);
  parallel_for(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* row = logits + i * vocab;
      lse[i] = row_logsumexp(row, vocab);
      target_logit[i] = row[targets[i]];
      cross_entropy_row_backward(row, row, lse[i], targets[i], vocab, z_loss, scale);
    }
  });
  return cross_entropy_loss(lse, n, z_loss, [&](int64_t i) { return target_logit[i]; });
}

#define LOCO_INSTANTIATE(T)                                                                                       \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int, T);                                  \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int);                \
  template void linear_forward<T>(T*, const T*, const T*, int64_t, int, int);                                     \
  template void linear_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int);                      \
  template void linear_backward_weight_rows<T>(T*, const T*, const T*, int64_t, int, int, int, int);              \
  template void linear_t_backward_weight_rows<T>(T*, const T*, const T*, int64_t, int, int, int, int);            \
  template void linear_t_forward<T>(T*, const T*, const T*, int64_t, int, int);                                   \
  template void linear_t_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int);                    \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int);                                 \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int);                                \
  template void rope_tables<T>(T*, T*, int, int, double);                                                         \
  template void rope_forward<T>(T*, const T*, const T*, const T*, int64_t, int, int, int);                        \
  template void rope_backward<T>(T*, const T*, const T*, const T*, int64_t, int, int, int);                       \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int, int, int);          \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,     \
                                      int64_t, int, int, int, int);                                               \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);                                               \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);                                \
  template double cross_entropy_forward<T>(T*, const T*, const int32_t*, int64_t, int, double);                   \
  template void cross_entropy_backward<T>(T*, const T*, const T*, const int32_t*, int64_t, int, double, double); \
  template double cross_entropy_fused<T>(T*, T*, T*, const int32_t*, int64_t, int, double, double);

LOCO_INSTANTIATE(float)
LOCO_INSTANTIATE(double)

}  // namespace loco
