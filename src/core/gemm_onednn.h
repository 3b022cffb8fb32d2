#pragma once
// Matrix products through oneDNN: with bf16 operands and fp32 accumulation (train.precision =
// bf16; the operands are rounded to bf16, nearest even, into per-thread scratch), and fp32 ones
// (train.matmul_library = onednn). The result is fp32, with the same alpha/beta contract as
// gemm() in core/blas.h.
#include <cstdint>

namespace loco {

// fp32 -> bf16, round to nearest even (NaN stays NaN).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
// n values, vectorized where the CPU has AVX512-BF16.
void to_bf16(const float* in, uint16_t* out, int64_t n);

// C (m x n) = alpha * op(A) op(B) + beta * C, row-major, A and B fp32 rounded to bf16 first.
// Threads: compute_threads() (core/parallel.h), each running a share of the product with one
// oneDNN thread, as gemm_mt does with OpenBLAS.
void gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
               int ldb, float beta, float* c, int ldc);
// The same in fp32: operands read in place, products split over the pool as gemm_bf16's.
void gemm_onednn_f32(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                     const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace loco
