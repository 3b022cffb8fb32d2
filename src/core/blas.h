#pragma once
// Row-major GEMM through OpenBLAS for float and double (double is used by the gradient tests).
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/parallel.h"

namespace loco {

// Floating-point operations (2 m n k per product) of every GEMM issued through gemm(), for
// checking the FLOPs estimators against what the kernels really do. Relaxed atomic: cheap.
inline std::atomic<int64_t>& gemm_flop_counter() {
  static std::atomic<int64_t> counter{0};
  return counter;
}

// C (m x n) = alpha * op(A) op(B) + beta * C, row-major, op = transpose if trans_*.
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_flop_counter().fetch_add(2 * int64_t(m) * n * k, std::memory_order_relaxed);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  gemm_flop_counter().fetch_add(2 * int64_t(m) * n * k, std::memory_order_relaxed);
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}

// As gemm, with the rows (or, when there are few rows, the columns) of C split across the
// compute threads of core/parallel.h, each chunk a single-threaded BLAS call. loco keeps BLAS
// itself at one thread: its idle threads spin and would compete with the pool for the cores.
// The float version runs with bf16 operands (core/gemm_onednn.h) when matmul_precision() is bf16
// (core/precision.h), and through oneDNN in fp32 when fp32_library() is oneDNN: the model's
// linear layers, not attention's per-head products.
void gemm_mt(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
             int ldb, float beta, float* c, int ldc);
void gemm_mt(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
             const double* b, int ldb, double beta, double* c, int ldc);

void set_blas_threads(int n);

// How gemm_mt shares a product among the compute threads: the whole of it on the calling thread
// when it is small or there is one thread, else chunks of rows of C (or of columns, when there
// are few rows) in multiples of 16 across the pool. Calls part(rows, cols, a, b, c) for each
// share, with its operands and output (leading dimensions unchanged). Used by both libraries.
template <class In, class Out, class Part>
void split_product(bool trans_a, bool trans_b, int m, int n, int k, const In* a, int lda, const In* b, int ldb, Out* c,
                   int ldc, const Part& part) {
  const int threads = compute_threads();
  if (threads == 1 || int64_t(m) * n * k < (int64_t(1) << 20)) {
    part(m, n, a, b, c);
    return;
  }
  const bool split_rows = m >= n || m >= 16 * threads;
  const int extent = split_rows ? m : n;
  const int chunk = std::max(16, (extent / threads + 15) / 16 * 16);
  parallel_for((extent + chunk - 1) / chunk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t ci = begin; ci < end; ++ci) {
      const int i0 = int(ci) * chunk, len = std::min(extent, i0 + chunk) - i0;
      if (split_rows)
        part(len, n, trans_a ? a + i0 : a + int64_t(i0) * lda, b, c + int64_t(i0) * ldc);
      else
        part(m, len, a, trans_b ? b + int64_t(i0) * ldb : b + i0, c + i0);
    }
  });
}

}  // namespace loco
