// oneDNN products (core/gemm_onednn.h). bf16: the rounding to bf16 against its definition, and every
// product shape, transpose and alpha/beta against a double-precision product of the same
// bf16-rounded operands (the only error left is fp32 accumulation). On a CPU without bf16
// instructions oneDNN may not run them: the product tests are skipped there, the rounding is not.
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/blas.h"
#include "core/gemm_onednn.h"
#include "core/parallel.h"
#include "core/precision.h"
#include "core/rng.h"

using namespace loco;

namespace {

// Round to nearest even by its definition: the two bf16 neighbours, the nearer (ties: even).
uint16_t reference_bf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  if (std::isinf(f)) return uint16_t(u >> 16);
  // Above the largest bf16 the next value up is 2^128 as if the exponent went on (IEEE rounding
  // to infinity).
  const double up = std::isinf(fhi) ? std::copysign(std::ldexp(1.0, 128), double(f)) : double(fhi);
  const double dlo = std::fabs(double(f) - double(flo)), dhi = std::fabs(up - double(f));
  if (dlo < dhi) return uint16_t(lo >> 16);
  if (dhi < dlo) return uint16_t(hi >> 16);
  return ((lo >> 16) & 1) ? uint16_t(hi >> 16) : uint16_t(lo >> 16);
}

struct Case {
  bool ta, tb;
  int m, n, k;
  float alpha, beta;
  int pad;  // extra leading-dimension entries
};

// Runs `product` (gemm's arguments) on random operands of each case and checks it against a
// double-precision product of the operands as `operand` rounds them: within a few units of fp32
// rounding relative to the sum of magnitudes, and nothing written beyond each row's n entries.
// When `repeat`, the product runs twice and must give the same bits.
template <class Product, class Operand>
void check_products(const std::vector<Case>& cases, const Product& product, const Operand& operand, bool repeat) {
  Rng rng(5);
  for (const auto& c : cases) {
    const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
    const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
    const int lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
    std::vector<float> a(size_t(a_rows) * lda), b(size_t(b_rows) * ldb), out(size_t(c.m) * ldc);
    for (auto& v : a) v = float(rng.normal());
    for (auto& v : b) v = float(rng.normal());
    for (auto& v : out) v = float(rng.normal());
    const std::vector<float> before = out;
    std::vector<float> again = out;
    product(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta, out.data(), ldc);
    if (repeat) {
      product(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta, again.data(), ldc);
      EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * 4), 0) << "differs run to run, m " << c.m;
    }
    double worst = 0;
    for (int i = 0; i < c.m; ++i)
      for (int j = 0; j < c.n; ++j) {
        double sum = 0, mag = 0;
        for (int p = 0; p < c.k; ++p) {
          const double av = operand(c.ta ? a[size_t(p) * lda + i] : a[size_t(i) * lda + p]);
          const double bv = operand(c.tb ? b[size_t(j) * ldb + p] : b[size_t(p) * ldb + j]);
          sum += av * bv;
          mag += std::fabs(av * bv);
        }
        const double want = c.alpha * sum + c.beta * before[size_t(i) * ldc + j];
        const double scale = std::fabs(c.alpha) * mag + std::fabs(c.beta * before[size_t(i) * ldc + j]) + 1e-30;
        worst = std::max(worst, std::fabs(out[size_t(i) * ldc + j] - want) / scale);
      }
    LOCO_EXPECT_BELOW(worst, 1e-5) << "ta " << c.ta << " tb " << c.tb << " m " << c.m << " n " << c.n << " k " << c.k;
    for (int i = 0; i < c.m; ++i)
      for (int j = c.n; j < ldc; ++j) ASSERT_EQ(out[size_t(i) * ldc + j], before[size_t(i) * ldc + j]);
  }
}

const std::vector<Case> kCases = {{false, true, 37, 29, 64, 1, 0, 0},    {false, false, 64, 48, 33, 1, 1, 3},
                                  {true, false, 40, 52, 70, 1, 1, 0},    {false, true, 300, 200, 96, 0.5f, 0, 5},
                                  {true, true, 17, 23, 45, 2, 0.25f, 1}, {false, false, 1, 96, 256, 1, 0, 0}};

}  // namespace

TEST(Bf16, RoundsToNearestEvenScalarAndVector) {
  Rng rng(3);
  std::vector<float> x;
  for (int i = 0; i < 5000; ++i) x.push_back(float(rng.normal() * std::pow(10.0, rng.uniform() * 8 - 4)));
  // Ties, both parities, values that round up into the next binade, zeros, extremes.
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x3f7fffffu, 0x7f7fffffu, 0x00000001u, 0x80000000u, 0x0u,
                     0x7f800000u, 0xff800000u, 0x4049ffffu}) {
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  std::vector<uint16_t> vec(x.size());
  to_bf16(x.data(), vec.data(), int64_t(x.size()));
  int wrong = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t want = reference_bf16(x[i]);
    wrong += to_bf16(x[i]) != want;
    wrong += vec[i] != want;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(from_bf16(to_bf16(1.0f)), 1.0f);
}

TEST(Bf16, ProductsMatchDoublePrecisionOfTheRoundedOperands) {
  if (!cpu_runs_bf16()) GTEST_SKIP() << "no bf16 instructions on " << describe_cpu();
  set_compute_threads(2);
  // fp32 accumulation of k products of bf16-rounded operands.
  check_products(kCases, gemm_bf16, [](float v) { return double(from_bf16(to_bf16(v))); }, false);
}

TEST(Bf16, GemmMtFollowsThePrecisionAndIsRepeatable) {
  if (!cpu_runs_bf16()) GTEST_SKIP() << "no bf16 instructions on " << describe_cpu();
  set_compute_threads(2);
  Rng rng(9);
  const int m = 256, n = 96, k = 200;
  std::vector<float> a(size_t(m) * k), b(size_t(n) * k);
  for (auto& v : a) v = float(rng.normal());
  for (auto& v : b) v = float(rng.normal());
  std::vector<float> fp32(size_t(m) * n), bf16a(fp32.size()), bf16b(fp32.size());
  gemm_mt(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, fp32.data(), n);
  set_matmul_precision(Precision::bf16);
  gemm_mt(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, bf16a.data(), n);
  gemm_mt(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, bf16b.data(), n);
  set_matmul_precision(Precision::fp32);
  EXPECT_EQ(std::memcmp(bf16a.data(), bf16b.data(), bf16a.size() * 4), 0) << "bf16 products differ run to run";
  double diff = 0, norm = 0;
  for (size_t i = 0; i < fp32.size(); ++i) {
    diff = std::max(diff, double(std::fabs(fp32[i] - bf16a[i])));
    norm = std::max(norm, double(std::fabs(fp32[i])));
  }
  // bf16 operands (8 significant bits): about 2^-9 relative per product, averaging over k.
  EXPECT_GT(diff, 0.0) << "the bf16 setting changed nothing";
  LOCO_EXPECT_BELOW(diff / norm, 2e-2);
}

// fp32 products through oneDNN (train.matmul_library = onednn) against double precision of the
// same operands, every transpose, alpha/beta and padded leading dimensions, split over 2 threads
// and not; gemm_mt follows the library setting and repeats bit for bit. oneDNN runs fp32 on any
// x86-64 CPU, so this is never skipped.
TEST(OnednnF32, ProductsMatchDoublePrecisionAndGemmMtFollowsTheLibrary) {
  set_compute_threads(2);
  set_fp32_library(Fp32Library::onednn);
  std::vector<Case> cases = kCases;
  cases.push_back({false, true, 600, 300, 96, 0.5f, 0, 5});  // split over the 2 threads by rows
  cases.push_back({false, true, 5, 2000, 128, 1, 0, 0});     // few rows: split by columns
  check_products(cases, [](auto... args) { gemm_mt(args...); }, [](float v) { return double(v); }, true);
  Rng rng(11);
  // The same product through OpenBLAS: both right, not the same code (a few ulps apart somewhere).
  const int m = 256, n = 96, k = 200;
  std::vector<float> a(size_t(m) * k), b(size_t(n) * k), dnn(size_t(m) * n), blas(dnn.size());
  for (auto& v : a) v = float(rng.normal());
  for (auto& v : b) v = float(rng.normal());
  gemm_mt(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, dnn.data(), n);
  set_fp32_library(Fp32Library::openblas);
  gemm_mt(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, blas.data(), n);
  double diff = 0;
  for (size_t i = 0; i < dnn.size(); ++i) diff = std::max(diff, double(std::fabs(dnn[i] - blas[i])));
  LOCO_EXPECT_BELOW(diff, 1e-3);
}

TEST(OnednnF32, AutoChoosesByTheCpu) {
  EXPECT_EQ(resolve_fp32_library("openblas"), Fp32Library::openblas);
  EXPECT_EQ(resolve_fp32_library("onednn"), Fp32Library::onednn);
  EXPECT_EQ(resolve_fp32_library("auto"), cpu_features().avx512 ? Fp32Library::onednn : Fp32Library::openblas);
  EXPECT_THROW(resolve_fp32_library("mkl"), std::exception);
}
