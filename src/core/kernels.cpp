#include "core/kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/blas.h"

namespace loco {

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* w, int64_t n, int c, T eps) {
  for (int64_t i = 0; i < n; ++i) {
    const T* x = in + i * c;
    T* y = out + i * c;
    T ss = 0;
    for (int j = 0; j < c; ++j) ss += x[j] * x[j];
    const T r = T(1) / std::sqrt(ss / T(c) + eps);
    rstd[i] = r;
    for (int j = 0; j < c; ++j) y[j] = x[j] * r * w[j];
  }
}

template <class T>
void rmsnorm_backward(T* din, T* dw, const T* dout, const T* in, const T* w, const T* rstd, int64_t n, int c) {
  for (int64_t i = 0; i < n; ++i) {
    const T* x = in + i * c;
    const T* dy = dout + i * c;
    const T r = rstd[i];
    T dot = 0;  // sum_j dy_j w_j x_j
    for (int j = 0; j < c; ++j) dot += dy[j] * w[j] * x[j];
    if (din) {
      T* dx = din + i * c;
      const T k = dot * r * r * r / T(c);
      for (int j = 0; j < c; ++j) dx[j] += dy[j] * w[j] * r - x[j] * k;
    }
    if (dw) {
      for (int j = 0; j < c; ++j) dw[j] += dy[j] * x[j] * r;
    }
  }
}

template <class T>
void linear_forward(T* out, const T* in, const T* w, int64_t n, int in_dim, int out_dim) {
  gemm(false, true, int(n), out_dim, in_dim, T(1), in, in_dim, w, in_dim, T(0), out, out_dim);
}

template <class T>
void linear_backward(T* din, T* dw, const T* dout, const T* in, const T* w, int64_t n, int in_dim, int out_dim) {
  if (din) gemm(false, false, int(n), in_dim, out_dim, T(1), dout, out_dim, w, in_dim, T(1), din, in_dim);
  if (dw) gemm(true, false, out_dim, in_dim, int(n), T(1), dout, out_dim, in, in_dim, T(1), dw, in_dim);
}

template <class T>
void linear_t_forward(T* out, const T* in, const T* wt, int64_t n, int in_dim, int out_dim) {
  gemm(false, false, int(n), out_dim, in_dim, T(1), in, in_dim, wt, out_dim, T(0), out, out_dim);
}

template <class T>
void linear_t_backward(T* din, T* dwt, const T* dout, const T* in, const T* wt, int64_t n, int in_dim, int out_dim) {
  if (din) gemm(false, true, int(n), in_dim, out_dim, T(1), dout, out_dim, wt, out_dim, T(1), din, in_dim);
  if (dwt) gemm(true, false, in_dim, out_dim, int(n), T(1), in, in_dim, dout, out_dim, T(1), dwt, out_dim);
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
  const int64_t rows = batch * seq;
  for (int64_t r = 0; r < rows; ++r) {
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
}

template <class T>
void rope_backward(T* din, const T* dout, const T* cos_table, const T* sin_table, int64_t batch, int seq, int heads,
                   int head_dim) {
  const int half = head_dim / 2;
  const int64_t rows = batch * seq;
  for (int64_t r = 0; r < rows; ++r) {
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
}

int64_t attention_scratch_size(int seq) { return 2 * int64_t(seq) * seq; }

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int64_t batch, int seq, int heads,
                       int head_dim, T* scratch) {
  const int ld = heads * head_dim;
  const T scale = T(1) / std::sqrt(T(head_dim));
  T* s = scratch;  // (S, S) scores, then probabilities
  for (int64_t b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      const int64_t base = b * seq * ld + h * head_dim;
      const T* qh = q + base;
      const T* kh = k + base;
      const T* vh = v + base;
      T* oh = out + base;
      T* lh = lse + (b * heads + h) * seq;
      gemm(false, true, seq, seq, head_dim, scale, qh, ld, kh, ld, T(0), s, seq);
      for (int i = 0; i < seq; ++i) {
        T* row = s + int64_t(i) * seq;
        T m = row[0];
        for (int j = 1; j <= i; ++j) m = std::max(m, row[j]);
        T sum = 0;
        for (int j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - m);
          sum += row[j];
        }
        const T inv = T(1) / sum;
        for (int j = 0; j <= i; ++j) row[j] *= inv;
        std::fill(row + i + 1, row + seq, T(0));
        lh[i] = m + std::log(sum);
      }
      gemm(false, false, seq, head_dim, seq, T(1), s, seq, vh, ld, T(0), oh, ld);
    }
  }
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, int64_t batch, int seq, int heads, int head_dim, T* scratch) {
  const int ld = heads * head_dim;
  const T scale = T(1) / std::sqrt(T(head_dim));
  T* p = scratch;                       // (S, S) probabilities
  T* dp = scratch + int64_t(seq) * seq;  // (S, S) dP, then dS
  for (int64_t b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      const int64_t base = b * seq * ld + h * head_dim;
      const T* qh = q + base;
      const T* kh = k + base;
      const T* vh = v + base;
      const T* oh = out + base;
      const T* doh = dout + base;
      const T* lh = lse + (b * heads + h) * seq;
      gemm(false, true, seq, seq, head_dim, scale, qh, ld, kh, ld, T(0), p, seq);
      for (int i = 0; i < seq; ++i) {
        T* row = p + int64_t(i) * seq;
        for (int j = 0; j <= i; ++j) row[j] = std::exp(row[j] - lh[i]);
        std::fill(row + i + 1, row + seq, T(0));
      }
      // dV += P^T dO
      gemm(true, false, seq, head_dim, seq, T(1), p, seq, doh, ld, T(1), dv + base, ld);
      // dP = dO V^T
      gemm(false, true, seq, seq, head_dim, T(1), doh, ld, vh, ld, T(0), dp, seq);
      // dS = P * (dP - rowsum(dO * O)), scaled by the softmax temperature
      for (int i = 0; i < seq; ++i) {
        const T* o_row = oh + int64_t(i) * ld;
        const T* do_row = doh + int64_t(i) * ld;
        T d = 0;
        for (int j = 0; j < head_dim; ++j) d += o_row[j] * do_row[j];
        T* prow = p + int64_t(i) * seq;
        T* drow = dp + int64_t(i) * seq;
        for (int j = 0; j <= i; ++j) drow[j] = prow[j] * (drow[j] - d) * scale;
        std::fill(drow + i + 1, drow + seq, T(0));
      }
      // dQ += dS K ; dK += dS^T Q
      gemm(false, false, seq, head_dim, seq, T(1), dp, seq, kh, ld, T(1), dq + base, ld);
      gemm(true, false, seq, head_dim, seq, T(1), dp, seq, qh, ld, T(1), dk + base, ld);
    }
  }
}

template <class T>
static inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const T g = gate[i];
    const T sg = sigmoid(g);
    const T silu = g * sg;
    dgate[i] += dout[i] * up[i] * sg * (T(1) + g * (T(1) - sg));
    dup[i] += dout[i] * silu;
  }
}

template <class T>
static double row_logsumexp(const T* row, int vocab) {
  T m = row[0];
  for (int j = 1; j < vocab; ++j) m = std::max(m, row[j]);
  double sum = 0;
  for (int j = 0; j < vocab; ++j) sum += std::exp(double(row[j] - m));
  return double(m) + std::log(sum);
}

template <class T>
double cross_entropy_forward(const T* logits, const int32_t* targets, int64_t n, int vocab, double z_loss) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * vocab;
    const double lse = row_logsumexp(row, vocab);
    total += lse - double(row[targets[i]]) + z_loss * lse * lse;
  }
  return total / double(n);
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, int64_t n, int vocab, double z_loss,
                            double dloss) {
  const double scale = dloss / double(n);
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * vocab;
    T* drow = dlogits + i * vocab;
    const double lse = row_logsumexp(row, vocab);
    // d/dlogit_j [lse - logit_t + z lse^2] = p_j (1 + 2 z lse) - [j == t]
    const double coef = scale * (1.0 + 2.0 * z_loss * lse);
    const int t = targets[i];
    for (int j = 0; j < vocab; ++j) drow[j] = T(std::exp(double(row[j]) - lse) * coef);
    drow[t] -= T(scale);
  }
}

#define LOCO_INSTANTIATE(T)                                                                                       \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int, T);                                  \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int);                \
  template void linear_forward<T>(T*, const T*, const T*, int64_t, int, int);                                     \
  template void linear_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int);                      \
  template void linear_t_forward<T>(T*, const T*, const T*, int64_t, int, int);                                   \
  template void linear_t_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int);                    \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int);                                 \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int);                                \
  template void rope_tables<T>(T*, T*, int, int, double);                                                         \
  template void rope_forward<T>(T*, const T*, const T*, const T*, int64_t, int, int, int);                        \
  template void rope_backward<T>(T*, const T*, const T*, const T*, int64_t, int, int, int);                       \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int, int, T*);           \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,     \
                                      int64_t, int, int, int, T*);                                                \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);                                               \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);                                \
  template double cross_entropy_forward<T>(const T*, const int32_t*, int64_t, int, double);                       \
  template void cross_entropy_backward<T>(T*, const T*, const int32_t*, int64_t, int, double, double);

LOCO_INSTANTIATE(float)
LOCO_INSTANTIATE(double)

}  // namespace loco
