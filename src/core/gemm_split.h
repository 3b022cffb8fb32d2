#pragma once
// What both matrix libraries (core/blas.h's OpenBLAS, core/gemm_onednn.h's oneDNN) share: the
// count of the FLOPs they run and how a product is split among the compute threads.
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
