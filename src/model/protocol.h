#pragma once
// Protocol models (docs/protocol.md): one global k-dimensional subspace S = span(U) of the
// residual stream, U (d x k) with orthonormal columns, and a frozen, seeded embedding part
// E_fixed (V x d). The token embedding is E = E_fixed + E_s U^T with E_s (V x k) trainable, and
// every o_proj / down_proj before the last stage boundary writes only into S, so every
// residual-stream state there is E_fixed[tokens] + (a vector in S): a boundary carries its k
// coordinates, c = (h - E_fixed[tokens]) U, and the receiver rebuilds h = c U^T + E_fixed[tokens]
// exactly (to rounding). Backward, a boundary carries g U.
//
// Layouts: U is row-major (d, k); projections are computed as U (U^T W), never with U U^T.
// A constrained matrix's output dimension is d: the rows of o_proj (d, d) and the columns of
// down_proj as loco stores it (f, d).
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layout.h"

namespace loco {

class Subspace {
 public:
  // U from a seeded Gaussian (d x k) orthonormalised (Gram-Schmidt in double, twice: the Q of a
  // QR with positive diag(R)); E_fixed ~ N(0, fixed_std^2), seeded. Identical on every worker.
  Subspace(const ModelConfig& model, int k, uint64_t seed, double fixed_std);

  int d() const { return d_; }
  int k() const { return k_; }
  const std::vector<float>& basis() const { return u_; }
  // Replaces U (d x k; checked orthonormal to 1e-4, else an error naming `source`).
  void set_basis(const std::vector<float>& u, const std::string& source);
  const std::vector<float>& fixed_embedding() const { return fixed_; }

  // Token ids are checked against the vocabulary (they may come from a peer).
  // c (n x k) = (h - E_fixed[tokens]) U; with tokens == nullptr, c = h U (gradients).
  void compress(const float* h, const int32_t* tokens, int64_t n, float* c) const;
  // h (n x d) = c U^T + E_fixed[tokens]; with tokens == nullptr, h = c U^T.
  void expand(const float* c, const int32_t* tokens, int64_t n, float* h) const;
  // The embedding: x (n x d) = E_fixed[tokens] + E_s[tokens] U^T, and its backward
  // dE_s[tokens] += dx U.
  void embed_forward(float* x, const int32_t* tokens, const float* e_s, int64_t n) const;
  void embed_backward(float* de_s, const float* dx, const int32_t* tokens, int64_t n) const;

  // W <- scale * U U^T W along the output dimension of a constrained matrix `t` stored at w.
  void project(const TensorInfo& t, float* w, float scale = 1.0f) const;
  // Initialisation: every constrained matrix of `layout` in `params` projected and scaled by
  // sqrt(d/k) (projection keeps about k/d of a Gaussian matrix's squared norm).
  void init_constrained(const ParamLayout& layout, float* params) const;
  // Every constrained matrix of `layout` in `buffer` (parameters, gradients or first moments,
  // all at the layout's offsets).
  void project_constrained(const ParamLayout& layout, float* buffer) const;
  // max over the constrained matrices of ||W - U U^T W|| / ||W|| (0 when there are none).
  double max_residual(const ParamLayout& layout, const float* params) const;

  // Moves to the basis u_new (orthonormal, d x k): in each buffer (parameters or another
  // quantity linear in them, at the layout's offsets) the embedding coordinates are rotated,
  // E_s <- E_s (U_old^T U_new), and the constrained matrices projected onto the new subspace;
  // then U = u_new. Where E_s U_old^T and the constrained matrices lie in both subspaces, the
  // model's function is unchanged.
  void change_basis(const std::vector<float>& u_new, const ParamLayout& layout, const std::vector<float*>& buffers);

  // The plain stage layout's parameters (embedding E materialised, V x d) from a protocol
  // stage's (E_s, V x k); the other tensors are copied.
  std::vector<float> materialise(const ParamLayout& layout, const float* params) const;

 private:
  void check_tokens(const int32_t* tokens, int64_t n) const;
  int d_, k_, vocab_;
  std::vector<float> u_;      // (d, k)
  std::vector<float> fixed_;  // (V, d)
};

// One Grassmann step (docs/protocol.md): with A (d x d, a sum of g^T g) normalised to unit trace,
// R = (I - U U^T)(-2 A U) and U_new = qr(U - eta R).Q with positive diag(R), in double. `before`
// and `after` receive the subspace loss L(U) = 1 - tr(U^T A U) of U and U_new (-1 and U kept
// when A is zero).
std::vector<float> grassmann_step(const std::vector<float>& u, const std::vector<double>& a_sum, int d, int k,
                                  double eta, double& before, double& after);

// Q of the thin QR of a (rows x cols, row-major, rows >= cols) with diag(R) > 0, in double:
// modified Gram-Schmidt applied twice. Fails on a rank-deficient input.
std::vector<double> orthonormalise(std::vector<double> a, int rows, int cols);

}  // namespace loco
