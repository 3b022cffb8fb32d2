// Protocol models in the training loop (spec 05): keeping the constrained matrices in the
// subspace, and Grassmann updates of the subspace itself. The boundary compression is in
// pipeline/stage_model.cpp, the subspace algebra in model/protocol.cpp.
#include <cmath>
#include <cstring>

#include "algo/run.h"
#include "core/blas.h"
#include "core/error.h"

namespace loco {

namespace {

bool projecting(const WorkerRun& run) { return run.cfg.protocol.constraint == "project"; }

// A quantized streaming sync adds an outer update that is not in the subspace.
bool lossy_outer_updates(const WorkerRun& run) {
  return run.cfg.algorithm == "streaming" && run.cfg.outer.codec != "fp32";
}

// Moves every worker to the basis `u_new`: the embedding coordinates and their first moment
// rotated by U_old^T U_new (so E_s U^T is unchanged wherever it lies in both subspaces), the
// constrained matrices and their first moments projected onto the new subspace. The second
// moments are kept as they are (they cannot be rotated exactly).
void move_to_basis(WorkerRun& run, const std::vector<float>& u_new) {
  Subspace& sub = *run.subspace;
  const int d = sub.d(), k = sub.k();
  const auto& layout = run.w.model.layout();
  if (run.first_stage) {
    std::vector<float> rot(size_t(k) * k);
    gemm(true, false, k, k, d, 1.0f, sub.basis().data(), k, u_new.data(), k, 0.0f, rot.data(), k);
    const auto& e = layout.get(TensorKind::Embedding);
    std::vector<float> tmp(size_t(e.numel()));
    for (std::vector<float>* buf : {&run.w.params, &run.w.adamw.m()}) {
      float* es = buf->data() + e.offset;  // full trainable set: compact offsets are the layout's
      gemm_mt(false, false, int(e.rows), k, k, 1.0f, es, k, rot.data(), k, 0.0f, tmp.data(), k);
      std::memcpy(es, tmp.data(), tmp.size() * sizeof(float));
    }
  }
  sub.set_basis(u_new, "Grassmann update");
  sub.project_constrained(layout, run.w.params.data());
  sub.project_constrained(layout, run.w.adamw.m().data());
}

// One Grassmann step on the last stage: A normalised to unit trace, Riemannian gradient
// R = (I - U U^T)(-2 A U), U_new = qr(U - eta R).Q with positive diag(R). Returns U_new and
// the subspace loss 1 - tr(U^T A U) before and after.
std::vector<float> grassmann_step(const Subspace& sub, const std::vector<double>& a_sum, double eta, double& before,
                                  double& after) {
  const int d = sub.d(), k = sub.k();
  std::vector<double> u(sub.basis().begin(), sub.basis().end());
  double trace = 0;
  for (int i = 0; i < d; ++i) trace += a_sum[size_t(i) * d + i];
  if (!(trace > 0)) {  // no gradient seen: keep U
    before = after = -1;
    return sub.basis();
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

void grassmann_update(WorkerRun& run) {
  const Clock& clock = run.world.clock();
  const double t0 = clock.now();
  std::string bytes;
  const int root = run.grid.stages - 1;  // the chain's rank of the last stage
  if (run.last_stage) {
    std::vector<double> a = run.grassmann_a;
    if (run.grid.replicas > 1) a = run.dp.sum_doubles(a, "grassmann_A");
    const auto u_new = grassmann_step(*run.subspace, a, run.cfg.protocol.grassmann_lr, run.grassmann_loss_before,
                                      run.grassmann_loss_after);
    std::fill(run.grassmann_a.begin(), run.grassmann_a.end(), 0.0);  // A restarts after every update
    bytes.assign(reinterpret_cast<const char*>(u_new.data()), u_new.size() * sizeof(float));
  }
  auto h = run.chain.broadcast_start(&bytes, root, "grassmann_U");
  run.chain.wait(h);
  std::vector<float> u_new(bytes.size() / sizeof(float));
  if (!u_new.empty()) std::memcpy(u_new.data(), bytes.data(), u_new.size() * sizeof(float));
  move_to_basis(run, u_new);
  ++run.grassmann_updates;
  run.grassmann_seconds += clock.now() - t0;
}

}  // namespace

void protocol_init(WorkerRun& run) {
  if (!run.subspace) return;
  const auto& sub = *run.subspace;
  const auto& layout = run.w.model.layout();
  // Projection keeps about k/d of a Gaussian matrix's squared norm: scale back by sqrt(d/k).
  const float scale = float(std::sqrt(double(sub.d()) / sub.k()));
  for (const auto& t : layout.tensors())
    if (is_constrained(layout.stage(), t)) sub.project(t, run.w.params.data() + t.offset, scale);
}

void protocol_after_backward(WorkerRun& run) {
  if (run.subspace) run.subspace->project_constrained(run.w.model.layout(), run.w.grads.data());
}

void protocol_after_optimizer(WorkerRun& run) {
  if (run.subspace && projecting(run)) run.subspace->project_constrained(run.w.model.layout(), run.w.params.data());
}

void protocol_after_step(WorkerRun& run, int64_t done) {
  if (!run.subspace) return;
  if ((projecting(run) && run.cfg.algorithm != "ddp") || lossy_outer_updates(run))
    run.subspace->project_constrained(run.w.model.layout(), run.w.params.data());
  const int64_t interval = run.cfg.protocol.grassmann_interval;
  if (interval > 0 && done % interval == 0) grassmann_update(run);
}

void protocol_save(const WorkerRun& run, TrainingState& st) {
  if (!run.subspace) return;
  st.tensors["protocol.U"] = run.subspace->basis();
  st.meta["protocol.rank"] = std::to_string(run.cfg.protocol.rank);
  st.meta["protocol.seed"] = std::to_string(run.cfg.protocol.seed);
  st.meta["protocol.grassmann_updates"] = std::to_string(run.grassmann_updates);
  if (!run.grassmann_a.empty()) {  // doubles kept bit for bit as pairs of float32 words
    std::vector<float> words(run.grassmann_a.size() * 2);
    std::memcpy(words.data(), run.grassmann_a.data(), words.size() * sizeof(float));
    st.tensors["protocol.A_f64"] = std::move(words);
  }
}

void protocol_load(WorkerRun& run, const TrainingState& st, const std::string& source) {
  if (!run.subspace) {
    if (st.tensors.count("protocol.U")) fail(source + ": written by a protocol run, resuming without protocol.rank");
    return;
  }
  if (!st.meta.count("protocol.rank") || st.get_int("protocol.rank") != run.cfg.protocol.rank ||
      st.get_int("protocol.seed") != run.cfg.protocol.seed)
    fail(source + ": written with another protocol.rank or protocol.seed than this run's");
  std::vector<float> u(run.subspace->basis().size());
  st.take("protocol.U", u);
  run.subspace->set_basis(u, source);
  run.grassmann_updates = st.get_int("protocol.grassmann_updates");
  if (!run.grassmann_a.empty()) {
    std::vector<float> words(run.grassmann_a.size() * 2);
    st.take("protocol.A_f64", words);
    std::memcpy(run.grassmann_a.data(), words.data(), words.size() * sizeof(float));
  }
}

}  // namespace loco
