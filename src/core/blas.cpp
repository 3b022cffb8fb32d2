#include "core/blas.h"

#include <algorithm>

#include "core/gemm_onednn.h"
#include "core/parallel.h"
#include "core/precision.h"

namespace loco {

namespace {

template <class T>
void gemm_split(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb,
                T beta, T* c, int ldc) {
  split_product(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                [&](int rows, int cols, const T* a0, const T* b0, T* c0) {
                  gemm(trans_a, trans_b, rows, cols, k, alpha, a0, lda, b0, ldb, beta, c0, ldc);
                });
}

}  // namespace

void gemm_mt(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
             int ldb, float beta, float* c, int ldc) {
  if (matmul_precision() == Precision::bf16)
    gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else if (fp32_library() == Fp32Library::onednn)
    gemm_onednn_f32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    gemm_split(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_mt(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
             const double* b, int ldb, double beta, double* c, int ldc) {
  gemm_split(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {
// OpenBLAS runs on one thread inside loco's own (core/parallel.h shares products among them),
// whatever OPENBLAS_NUM_THREADS says: set once, when the library is loaded.
[[maybe_unused]] const bool one_blas_thread = (openblas_set_num_threads(1), true);
}  // namespace

void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace loco
