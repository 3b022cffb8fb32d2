#include "core/gemm_onednn.h"

#include <immintrin.h>

#include <algorithm>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/gemm_split.h"
#include "core/parallel.h"
#include "core/precision.h"

extern "C" void omp_set_num_threads(int);  // oneDNN's threads are OpenMP's (Debian's libdnnl)

namespace loco {

namespace {

__attribute__((target("avx512f,avx512bf16"))) void to_bf16_avx512(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), reinterpret_cast<const __m256i&>(h));
  }
  for (; i < n; ++i) out[i] = to_bf16(in[i]);
}

// A (rows x cols, leading dimension ld) into a packed bf16 copy, rows split across the pool.
void pack_bf16(const float* in, int rows, int cols, int ld, std::vector<uint16_t>& out) {
  out.resize(size_t(rows) * size_t(cols));
  uint16_t* dst = out.data();
  parallel_for(rows, std::max<int64_t>(1, 4096 / std::max(1, cols)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) to_bf16(in + r * ld, dst + r * cols, cols);
  });
}

// operand type (bf16 or f32), trans, shape, leading dimensions, alpha, beta
using Key = std::tuple<bool, bool, bool, int, int, int, int, int, int, float, float>;

struct Product {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, scratch;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// oneDNN creates a product's kernel once per shape: kept for the process (a model has a few
// dozen shapes, times the chunks a product is split into).
const Product& product(bool bf16, bool ta, bool tb, int m, int n, int k, int lda, int ldb, int ldc, float alpha,
                       float beta) {
  static std::mutex mu;
  static std::map<Key, Product> cache;
  const Key key{bf16, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  // A is m x k (stored k x m when transposed), B is k x n (stored n x k), C is m x n.
  Product p;
  const dt in = bf16 ? dt::bf16 : dt::f32;
  p.a = dnnl::memory::desc(dims{m, k}, in, ta ? dims{1, lda} : dims{lda, 1});
  p.b = dnnl::memory::desc(dims{k, n}, in, tb ? dims{1, ldb} : dims{ldb, 1});
  p.c = dnnl::memory::desc(dims{m, n}, dt::f32, dims{ldc, 1});
  dnnl::primitive_attr attr;
  // The scratchpad is the caller's: oneDNN's own is shared by the threads that run one primitive
  // at once (in-process workers), which made their results differ run to run.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.a, p.b, p.c), attr, engine());
  p.prim = dnnl::matmul(pd);
  p.scratch = pd.scratchpad_desc();
  return cache.emplace(key, std::move(p)).first->second;
}

// One product on the calling thread, with one oneDNN (OpenMP) thread: loco's pool supplies the
// parallelism, as it does for OpenBLAS, so no OpenMP team spins beside it.
// Operands are bf16 (uint16_t) or f32.
template <class In>
void run_product(bool ta, bool tb, int m, int n, int k, float alpha, const In* a, int lda, const In* b, int ldb,
                 float beta, float* c, int ldc) {
  const Product& p = product(sizeof(In) == 2, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta);
  omp_set_num_threads(1);
  thread_local dnnl::stream stream(engine());
  thread_local std::vector<uint8_t> scratch;
  scratch.resize(std::max<size_t>(1, p.scratch.get_size()));
  dnnl::memory am(p.a, engine(), const_cast<In*>(a)), bm(p.b, engine(), const_cast<In*>(b)),
      cm(p.c, engine(), c), sm(p.scratch, engine(), scratch.data());
  p.prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
  stream.wait();
}

// Counts the product's FLOPs; false when there is nothing for oneDNN to do (an empty C, or an
// empty sum, after which C = beta C as BLAS has it).
bool start_product(int m, int n, int k, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return false;
  gemm_flop_counter().fetch_add(2 * int64_t(m) * n * k, std::memory_order_relaxed);
  if (k > 0) return true;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) c[int64_t(i) * ldc + j] = beta == 0.0f ? 0.0f : beta * c[int64_t(i) * ldc + j];
  return false;
}

}  // namespace

void to_bf16(const float* in, uint16_t* out, int64_t n) {
  if (cpu_features().avx512_bf16) {
    to_bf16_avx512(in, out, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

void gemm_onednn_f32(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                     const float* b, int ldb, float beta, float* c, int ldc) {
  if (!start_product(m, n, k, beta, c, ldc)) return;
  split_product(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                [&](int rows, int cols, const float* a0, const float* b0, float* c0) {
                  run_product(trans_a, trans_b, rows, cols, k, alpha, a0, lda, b0, ldb, beta, c0, ldc);
                });
}

void gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
               int ldb, float beta, float* c, int ldc) {
  if (!start_product(m, n, k, beta, c, ldc)) return;
  thread_local std::vector<uint16_t> a16, b16;
  const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k, b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  pack_bf16(a, a_rows, a_cols, lda, a16);
  pack_bf16(b, b_rows, b_cols, ldb, b16);
  split_product(trans_a, trans_b, m, n, k, a16.data(), a_cols, b16.data(), b_cols, c, ldc,
                [&](int rows, int cols, const uint16_t* a0, const uint16_t* b0, float* c0) {
                  run_product(trans_a, trans_b, rows, cols, k, alpha, a0, a_cols, b0, b_cols, beta, c0, ldc);
                });
}

}  // namespace loco
