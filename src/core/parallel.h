#pragma once
// A persistent pool of compute threads for the loops that are not matrix products
// (attention over (batch, head), row-wise norms, softmax, elementwise activations).
// BLAS runs single-threaded inside the chunks (see gemm_mt), so the pool is the only source of
// parallelism and never competes with BLAS's own threads for the cores.
#include <cstdint>
#include <functional>

namespace loco {

// Threads used by parallel_for (default: all cores). A process running several workers as
// threads sets 1 per worker.
void set_compute_threads(int n);
int compute_threads();

// Calls fn(begin, end) on disjoint chunks covering [0, n), from the calling thread and the pool.
// Chunks hold at least `grain` indices. Blocks until all are done. Safe to call from several
// threads (their jobs take turns on the pool); a call from inside a chunk runs inline.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// f(i) for every i in [0, n) on the compute threads, in chunks of at least 65,536: for
// elementwise loops, each element computed on its own, so the same bits whatever the threads.
template <class F>
void each_index(int64_t n, F f) {
  parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(i);
  });
}

}  // namespace loco
