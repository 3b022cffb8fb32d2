#pragma once
// Row-major GEMM through OpenBLAS for float and double (double is used by the gradient tests).
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/gemm_split.h"

namespace loco {

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

// OpenBLAS's own threads (1 from the library's loading on: loco shares products among its compute
// threads; bench/step_bench.cpp compares with OpenBLAS's threading).
void set_blas_threads(int n);


}  // namespace loco
