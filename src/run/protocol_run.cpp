// Protocol models in the training loop (docs/protocol.md): keeping the constrained matrices in the
// subspace, and Grassmann updates of the subspace itself. The boundary compression is in
// pipeline/stage_model.cpp, the subspace algebra in model/protocol.cpp.
#include <cstring>

#include "run/run.h"
#include "core/error.h"

namespace loco {

namespace {

bool projecting(const WorkerRun& run) { return run.cfg.protocol.constraint == "project"; }

void grassmann_update(WorkerRun& run) {
  const Clock& clock = run.world.clock();
  const double t0 = clock.now();
  std::string bytes;
  const int root = run.grid.stages - 1;  // the chain's rank of the last stage
  if (run.last_stage) {
    std::vector<double> a = run.grassmann_a;
    if (run.grid.replicas > 1) a = run.dp.sum_doubles(a, "grassmann_A");
    const auto u_new = grassmann_step(run.subspace->basis(), a, run.subspace->d(), run.subspace->k(),
                                      run.cfg.protocol.grassmann_lr, run.grassmann_loss_before, run.grassmann_loss_after);
    std::fill(run.grassmann_a.begin(), run.grassmann_a.end(), 0.0);  // A restarts after every update
    bytes.assign(reinterpret_cast<const char*>(u_new.data()), u_new.size() * sizeof(float));
  }
  auto h = run.chain.broadcast_start(&bytes, root, "grassmann_U");
  run.chain.wait(h);
  std::vector<float> u_new(bytes.size() / sizeof(float));
  if (!u_new.empty()) std::memcpy(u_new.data(), bytes.data(), u_new.size() * sizeof(float));
  // Every linear per-parameter quantity moves with the basis: the parameters and AdamW's first
  // moments (the second moments stay: they cannot be rotated exactly).
  run.subspace->change_basis(u_new, run.w.layout(), {run.w.params.data(), run.w.adamw->m().data()});
  ++run.grassmann_updates;
  run.grassmann_seconds += clock.now() - t0;
}

}  // namespace

void protocol_init(WorkerRun& run) {
  if (run.subspace) run.subspace->init_constrained(run.w.layout(), run.w.params.data());
}

void protocol_after_backward(WorkerRun& run) {
  if (run.subspace) run.subspace->project_constrained(run.w.layout(), run.w.grads.data());
}

void protocol_after_optimizer(WorkerRun& run) {
  if (run.subspace && projecting(run)) run.subspace->project_constrained(run.w.layout(), run.w.params.data());
}

void protocol_after_step(WorkerRun& run, int64_t done) {
  // Outer steps (fp32) combine parameters linearly: they stay in the subspace to rounding.
  if (!run.subspace) return;
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
