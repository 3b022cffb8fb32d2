#pragma once
// Row-major GEMM through OpenBLAS for float and double (double is used by the gradient tests).
#include <cblas.h>

namespace loco {

// C (m x n) = alpha * op(A) op(B) + beta * C, row-major, op = transpose if trans_*.
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}

// Number of threads BLAS uses for one call (set to 1 per worker when workers share cores).
void set_blas_threads(int n);
int blas_threads();

}  // namespace loco
