#include "model/protocol.h"

#include <cmath>
#include <cstring>

#include "core/blas.h"
#include "core/error.h"
#include "core/rng.h"

namespace loco {

std::vector<double> orthonormalise(std::vector<double> a, int rows, int cols) {
  check(rows >= cols && cols > 0, "internal: orthonormalise needs rows >= cols > 0");
  auto col_dot = [&](int i, int j) {
    double s = 0;
    for (int r = 0; r < rows; ++r) s += a[size_t(r) * cols + i] * a[size_t(r) * cols + j];
    return s;
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (int j = 0; j < cols; ++j) {
      for (int i = 0; i < j; ++i) {
        const double p = col_dot(i, j);
        for (int r = 0; r < rows; ++r) a[size_t(r) * cols + j] -= p * a[size_t(r) * cols + i];
      }
      const double norm = std::sqrt(col_dot(j, j));
      if (!(norm > 1e-12)) fail("subspace: the basis lost rank (column " + std::to_string(j) + ")");
      for (int r = 0; r < rows; ++r) a[size_t(r) * cols + j] /= norm;
    }
  }
  return a;
}

Subspace::Subspace(const ModelConfig& model, int k, uint64_t seed, double fixed_std)
    : d_(model.hidden_size), k_(k), vocab_(model.vocab_size) {
  check(k > 0 && k < d_, "protocol.rank must be in 1.." + std::to_string(d_ - 1));
  Rng basis_rng(mix_seed(seed, name_hash("protocol.basis")));
  std::vector<double> g(size_t(d_) * k_);
  for (auto& x : g) x = basis_rng.normal();
  const auto q = orthonormalise(std::move(g), d_, k_);
  u_.assign(q.begin(), q.end());
  Rng fixed_rng(mix_seed(seed, name_hash("protocol.embed_fixed")));
  fixed_.resize(size_t(vocab_) * d_);
  for (auto& x : fixed_) x = float(fixed_std * fixed_rng.normal());
}

void Subspace::set_basis(const std::vector<float>& u, const std::string& source) {
  if (u.size() != u_.size())
    fail(source + ": a subspace basis of " + std::to_string(u.size()) + " values, expected " +
         std::to_string(u_.size()) + " (d x k)");
  for (int i = 0; i < k_; ++i)
    for (int j = 0; j <= i; ++j) {
      double s = 0;
      for (int r = 0; r < d_; ++r) s += double(u[size_t(r) * k_ + i]) * u[size_t(r) * k_ + j];
      if (!(std::abs(s - (i == j ? 1.0 : 0.0)) < 1e-4))
        fail(source + ": the subspace basis is not orthonormal (column " + std::to_string(i) + " . column " +
             std::to_string(j) + " = " + std::to_string(s) + ")");
    }
  u_ = u;
}

void Subspace::check_tokens(const int32_t* tokens, int64_t n) const {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_)
      fail("protocol: token id " + std::to_string(tokens[i]) + " is outside the vocabulary (" +
           std::to_string(vocab_) + ")");
}

void Subspace::compress(const float* h, const int32_t* tokens, int64_t n, float* c) const {
  if (!tokens) return gemm_mt(false, false, int(n), k_, d_, 1.0f, h, d_, u_.data(), k_, 0.0f, c, k_);
  check_tokens(tokens, n);
  std::vector<float> tmp(size_t(n) * d_);
  for (int64_t i = 0; i < n; ++i) {
    const float* e = fixed_.data() + int64_t(tokens[i]) * d_;
    for (int j = 0; j < d_; ++j) tmp[size_t(i * d_ + j)] = h[i * d_ + j] - e[j];
  }
  gemm_mt(false, false, int(n), k_, d_, 1.0f, tmp.data(), d_, u_.data(), k_, 0.0f, c, k_);
}

void Subspace::expand(const float* c, const int32_t* tokens, int64_t n, float* h) const {
  if (tokens) check_tokens(tokens, n);  // ids may come from a peer
  gemm_mt(false, true, int(n), d_, k_, 1.0f, c, k_, u_.data(), k_, 0.0f, h, d_);
  if (!tokens) return;
  for (int64_t i = 0; i < n; ++i) {
    const float* e = fixed_.data() + int64_t(tokens[i]) * d_;
    for (int j = 0; j < d_; ++j) h[i * d_ + j] += e[j];
  }
}

void Subspace::embed_forward(float* x, const int32_t* tokens, const float* e_s, int64_t n) const {
  check_tokens(tokens, n);
  std::vector<float> rows(size_t(n) * k_);
  for (int64_t i = 0; i < n; ++i) std::memcpy(&rows[size_t(i * k_)], e_s + int64_t(tokens[i]) * k_, sizeof(float) * k_);
  expand(rows.data(), tokens, n, x);
}

void Subspace::embed_backward(float* de_s, const float* dx, const int32_t* tokens, int64_t n) const {
  std::vector<float> rows(size_t(n) * k_);
  compress(dx, nullptr, n, rows.data());
  for (int64_t i = 0; i < n; ++i) {
    float* dst = de_s + int64_t(tokens[i]) * k_;
    for (int j = 0; j < k_; ++j) dst[j] += rows[size_t(i * k_ + j)];
  }
}

void Subspace::project(const TensorInfo& t, float* w, float scale) const {
  check(writes_residual(t), "internal: " + t.name + " is not a constrained matrix");
  const int rows = int(t.rows), cols = int(t.cols);
  if (!t.transposed) {  // (d, in): W <- U (U^T W)
    check(rows == d_, "internal: " + t.name + " has " + std::to_string(rows) + " output rows");
    std::vector<float> m(size_t(k_) * cols);
    gemm_mt(true, false, k_, cols, d_, 1.0f, u_.data(), k_, w, cols, 0.0f, m.data(), cols);
    gemm_mt(false, false, d_, cols, k_, scale, u_.data(), k_, m.data(), cols, 0.0f, w, cols);
  } else {  // stored (f, d): every row is an output vector: W <- (W U) U^T
    check(cols == d_, "internal: " + t.name + " has " + std::to_string(cols) + " output columns");
    std::vector<float> m(size_t(rows) * k_);
    gemm_mt(false, false, rows, k_, d_, 1.0f, w, d_, u_.data(), k_, 0.0f, m.data(), k_);
    gemm_mt(false, true, rows, d_, k_, scale, m.data(), k_, u_.data(), k_, 0.0f, w, d_);
  }
}

void Subspace::init_constrained(const ParamLayout& layout, float* params) const {
  const float scale = float(std::sqrt(double(d_) / k_));
  for (const auto& t : layout.tensors())
    if (is_constrained(layout.stage(), t)) project(t, params + t.offset, scale);
}

void Subspace::project_constrained(const ParamLayout& layout, float* buffer) const {
  for (const auto& t : layout.tensors())
    if (is_constrained(layout.stage(), t)) project(t, buffer + t.offset);
}

double Subspace::max_residual(const ParamLayout& layout, const float* params) const {
  double worst = 0;
  std::vector<float> w;
  for (const auto& t : layout.tensors()) {
    if (!is_constrained(layout.stage(), t)) continue;
    const float* p = params + t.offset;
    w.assign(p, p + t.numel());
    project(t, w.data());
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      diff += (double(p[i]) - w[size_t(i)]) * (double(p[i]) - w[size_t(i)]);
      norm += double(p[i]) * p[i];
    }
    if (norm > 0) worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

void Subspace::change_basis(const std::vector<float>& u_new, const ParamLayout& layout,
                            const std::vector<float*>& buffers) {
  if (u_new.size() != u_.size()) fail("subspace: a new basis of the wrong size");
  std::vector<float> rot(size_t(k_) * k_);
  gemm(true, false, k_, k_, d_, 1.0f, u_.data(), k_, u_new.data(), k_, 0.0f, rot.data(), k_);
  const bool coordinates = layout.stage().embedding && layout.stage().embedding_rank > 0;
  const auto* e = coordinates ? &layout.get(TensorKind::Embedding) : nullptr;
  std::vector<float> tmp(e ? size_t(e->numel()) : 0);
  set_basis(u_new, "subspace update");
  for (float* buf : buffers) {
    if (e) {
      gemm_mt(false, false, int(e->rows), k_, k_, 1.0f, buf + e->offset, k_, rot.data(), k_, 0.0f, tmp.data(), k_);
      std::memcpy(buf + e->offset, tmp.data(), tmp.size() * sizeof(float));
    }
    project_constrained(layout, buf);
  }
}

std::vector<float> Subspace::materialise(const ParamLayout& layout, const float* params) const {
  StageSpec plain_stage = layout.stage();
  plain_stage.embedding_rank = 0;
  plain_stage.constrained_end = 0;
  const ParamLayout plain(ModelConfig(layout.config()), plain_stage);
  std::vector<float> out(size_t(plain.size()));
  for (const auto& t : plain.tensors()) {
    const TensorInfo* src = layout.find(t.name);
    check(src != nullptr, "internal: " + t.name + " missing from the protocol stage");
    float* dst = out.data() + t.offset;
    if (t.kind == TensorKind::Embedding && layout.stage().embedding_rank > 0) {
      check(src->cols == k_ && src->rows == vocab_, "internal: the protocol embedding is not V x k");
      gemm_mt(false, true, vocab_, d_, k_, 1.0f, params + src->offset, k_, u_.data(), k_, 0.0f, dst, d_);
      for (size_t i = 0; i < fixed_.size(); ++i) dst[i] += fixed_[i];
    } else {
      check(src->numel() == t.numel(), "internal: " + t.name + " differs in size");
      std::memcpy(dst, params + src->offset, sizeof(float) * size_t(t.numel()));
    }
  }
  return out;
}

std::vector<float> grassmann_step(const std::vector<float>& u_in, const std::vector<double>& a_sum, int d, int k,
                                  double eta, double& before, double& after) {
  check(u_in.size() == size_t(d) * k && a_sum.size() == size_t(d) * d, "internal: grassmann_step sizes");
  std::vector<double> u(u_in.begin(), u_in.end());
  double trace = 0;
  for (int i = 0; i < d; ++i) trace += a_sum[size_t(i) * d + i];
  if (!(trace > 0)) {  // no gradient seen: keep U
    before = after = -1;
    return u_in;
  }
  std::vector<double> a(a_sum.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = a_sum[i] / trace;
  auto loss = [&](const std::vector<double>& basis) {
    std::vector<double> au(size_t(d) * k);
    gemm(false, false, d, k, d, 1.0, a.data(), d, basis.data(), k, 0.0, au.data(), k);
    double captured = 0;
    for (size_t i = 0; i < au.size(); ++i) captured += basis[i] * au[i];
    return std::pair{1.0 - captured, au};
  };
  auto [l0, au] = loss(u);
  before = l0;
  // G = -2 A U; R = G - U (U^T G); X = U - eta R.
  std::vector<double> g(au.size()), utg(size_t(k) * k), r(au.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = -2.0 * au[i];
  gemm(true, false, k, k, d, 1.0, u.data(), k, g.data(), k, 0.0, utg.data(), k);
  r = g;
  gemm(false, false, d, k, k, -1.0, u.data(), k, utg.data(), k, 1.0, r.data(), k);
  std::vector<double> x(u.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = u[i] - eta * r[i];
  const auto q = orthonormalise(std::move(x), d, k);
  after = loss(q).first;
  return std::vector<float>(q.begin(), q.end());
}

}  // namespace loco
