#include "core/blas.h"

#include <algorithm>

#include "core/gemm_bf16.h"
#include "core/parallel.h"
#include "core/precision.h"

namespace loco {

namespace {

template <class T>
void gemm_split(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb,
                T beta, T* c, int ldc) {
  const int threads = compute_threads();
  const int64_t work = int64_t(m) * n * k;
  if (threads == 1 || work < (int64_t(1) << 20)) {
    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Chunks are multiples of 16 rows/columns so that BLAS's packed panels stay whole.
  const bool split_rows = m >= n || m >= 16 * threads;
  const int extent = split_rows ? m : n;
  const int chunk = std::max(16, (extent / threads + 15) / 16 * 16);
  parallel_for((extent + chunk - 1) / chunk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t ci = begin; ci < end; ++ci) {
      const int i0 = int(ci) * chunk, len = std::min(extent, i0 + chunk) - i0;
      if (split_rows) {
        const T* a0 = trans_a ? a + i0 : a + int64_t(i0) * lda;
        gemm(trans_a, trans_b, len, n, k, alpha, a0, lda, b, ldb, beta, c + int64_t(i0) * ldc, ldc);
      } else {
        const T* b0 = trans_b ? b + int64_t(i0) * ldb : b + i0;
        gemm(trans_a, trans_b, m, len, k, alpha, a, lda, b0, ldb, beta, c + i0, ldc);
      }
    }
  });
}

}  // namespace

void gemm_mt(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
             int ldb, float beta, float* c, int ldc) {
  if (matmul_precision() == Precision::bf16)
    gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    gemm_split(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_mt(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda,
             const double* b, int ldb, double beta, double* c, int ldc) {
  gemm_split(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace loco
