// One optimizer step of one worker. Its forward and backward passes run as this stage's
// microbatch schedule (with one stage: gradient accumulation); then, in this order:
//   1. the algorithm's gradient hook (DDP averages among the stage's replicas);
//   2. a tied embedding held by the first and last stage: the two add each other's gradient
//      (one exchange; a + b == b + a, so both copies stay bitwise identical);
//   3. the global gradient norm over all stages: each stage sums the squares of each of its
//      tensors, the sums are exchanged along the pipeline and added in the full model's tensor
//      order, so every stage (and a single worker) clips with the same coefficient;
//   4. AdamW at this step's learning rate, then the algorithm's after-step hook.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "run/run.h"
#include "core/error.h"
#include "core/rng.h"
#include "sim/latency.h"

namespace loco {

namespace {

// Sum of squares of each tensor's gradient in the (compact) gradient buffer, by the tensor's
// index in the full model's layout; a tied embedding on the last of several stages is left to
// the first stage.
std::vector<double> tensor_square_sums(const WorkerRun& run) {
  const auto& layout = run.w.layout();
  const ParamLayout full(run.cfg.model);
  std::vector<double> out;  // pairs (full index, sum)
  for (size_t i = 0; i < layout.tensors().size(); ++i) {
    const auto& t = layout.tensors()[i];
    if (t.kind == TensorKind::Embedding && !run.first_stage) continue;
    const auto& rows = run.w.trainable.rows(i);
    const float* g = run.w.grads.data() + rows.compact;
    const int64_t n = (rows.end - rows.begin) * t.cols;
    double ss = 0;
    for (int64_t k = 0; k < n; ++k) ss += double(g[k]) * g[k];
    out.push_back(double(full.find(t.name) - full.tensors().data()));
    out.push_back(ss);
  }
  return out;
}

double global_grad_norm(WorkerRun& run) {
  const std::vector<double> mine = tensor_square_sums(run);
  std::string payload(mine.size() * sizeof(double), '\0');
  std::memcpy(payload.data(), mine.data(), payload.size());
  if (run.grid.stages == 1 || run.cfg.optim.clip_scope == "stage")
    return std::sqrt(combine_square_sums({payload}, int64_t(run.full_tensors)));
  std::vector<std::string> all;
  const double t0 = run.chain.clock().now();
  auto h = run.chain.all_gather_direct_start(std::move(payload), &all, "grad_norm");
  run.chain.wait(h);
  run.chain_wait_seconds += run.chain.clock().now() - t0;
  return std::sqrt(combine_square_sums(all, int64_t(run.full_tensors)));
}

// A tied embedding on the first and the last stage: each adds the other's gradient.
void exchange_tied_embedding(WorkerRun& run) {
  auto& w = run.w;
  const auto& layout = w.layout();
  const auto& t = layout.get(TensorKind::Embedding);
  float* g = w.grads.data() + w.trainable.rows(size_t(&t - layout.tensors().data())).compact;
  const size_t bytes = size_t(t.numel()) * sizeof(float);
  std::string mine(reinterpret_cast<const char*>(g), bytes), theirs;
  const int peer = run.first_stage ? run.grid.stages - 1 : 0;
  const double t0 = run.chain.clock().now();
  auto h = run.chain.exchange_start(peer, std::move(mine), &theirs, "tied_embedding");
  run.chain.wait(h);
  run.chain_wait_seconds += run.chain.clock().now() - t0;
  if (theirs.size() != bytes) fail("pipeline: the tied embedding gradient from the other end has the wrong size");
  std::vector<float> other(size_t(t.numel()));
  std::memcpy(other.data(), theirs.data(), bytes);
  for (int64_t i = 0; i < t.numel(); ++i) g[i] += other[size_t(i)];
}

}  // namespace

double combine_square_sums(const std::vector<std::string>& payloads, int64_t tensors) {
  std::map<int64_t, double> by_tensor;
  for (const auto& p : payloads) {
    if (p.size() % (2 * sizeof(double)) != 0) fail("grad_norm: a malformed partial-sum message");
    std::vector<double> pairs(p.size() / sizeof(double));
    if (!p.empty()) std::memcpy(pairs.data(), p.data(), p.size());
    for (size_t k = 0; k < pairs.size(); k += 2) {
      const double index = pairs[k], sum = pairs[k + 1];
      if (!(index >= 0 && index < double(tensors) && index == std::floor(index)) || sum < 0)
        fail("grad_norm: a malformed partial sum (tensor " + std::to_string(index) + ", sum " + std::to_string(sum) + ")");
      if (!by_tensor.emplace(int64_t(index), sum).second) fail("grad_norm: tensor " + std::to_string(int64_t(index)) + " reported twice");
    }
  }
  double ss = 0;
  for (const auto& [index, sum] : by_tensor) ss += sum;
  return ss;
}

namespace {
// Testing the failure paths: LOCO_INJECT_FAILURE="WORKER:STEP" makes that worker fail when it
// starts step STEP (1-based), with whatever communication its earlier steps started still in
// flight (docs/testing.md).
void maybe_inject_failure(const WorkerRun& run, int64_t step) {
  static const char* spec = std::getenv("LOCO_INJECT_FAILURE");
  if (!spec) return;
  int worker = -1;
  long long at = -1;
  if (std::sscanf(spec, "%d:%lld", &worker, &at) == 2 && worker == run.rank && at == step)
    fail("injected failure (LOCO_INJECT_FAILURE=" + std::string(spec) + ")");
}

// network.compute_jitter = sigma: this step's compute c (so far) is stretched to c exp(sigma |Z|),
// Z ~ N(0, 1) drawn from (train.seed, world rank, step), by idling for the difference (the
// factor capped at 20, so that a tail draw cannot stall the run). The idle time counts as
// compute: it emulates a slower machine.
void emulate_straggling(WorkerRun& run, int64_t step, double compute) {
  const double sigma = run.cfg.network.compute_jitter;
  if (sigma <= 0) return;
  Rng rng(mix_seed(uint64_t(run.cfg.train.seed) ^ 0x6a6974746572ULL, uint64_t(run.rank), uint64_t(step)));
  const double extra = compute * (std::min(sim::kJitterCap, std::exp(sigma * std::abs(rng.normal()))) - 1);
  const double t0 = run.world.clock().now();
  std::this_thread::sleep_for(std::chrono::duration<double>(extra));
  const double slept = run.world.clock().now() - t0;
  run.jitter_seconds += slept;  // inside the step's optimizer-to-outer-step span: counted as compute there
  run.trace->span("straggling", "compute", 0, t0, t0 + slept);
}
}  // namespace

StepResult train_step(WorkerRun& run, int64_t step, double lr) {
  maybe_inject_failure(run, step + 1);
  auto& w = run.w;
  w.step = step;
  const Clock& clock = run.world.clock();
  const double t0 = clock.now();
  std::fill(w.grads.begin(), w.grads.end(), 0.0f);
  if (run.first_stage) w.loader->next(run.inputs, run.targets);
  run.stage_model.begin_step(step + 1, w.params.data(), w.grads.data(), &w.trainable, &run.inputs, &run.targets);
  const double compute_before = run.pipe.compute_seconds();
  run.route_step = step + 1;
  run.pipe.run(run.ops, run.stage_model, run.train_route);
  const double pipeline_compute = run.pipe.compute_seconds() - compute_before;
  w.compute_seconds += pipeline_compute;
  ++run.steps_run;
  protocol_after_backward(run);

  run.algo->on_gradients(w);
  if (run.cfg.model.tie_embeddings && run.grid.stages > 1 && (run.first_stage || run.last_stage))
    exchange_tied_embedding(run);
  StepResult result;
  result.loss = run.stage_model.loss();
  result.grad_norm = global_grad_norm(run);
  if (!std::isfinite(result.grad_norm)) fail("non-finite gradient norm at step " + std::to_string(step + 1));

  const double t2 = clock.now();
  scale_to_norm(w.grads.data(), int64_t(w.grads.size()), result.grad_norm, run.cfg.optim.clip);
  w.adamw->step(w.params.data(), w.grads.data(), lr);
  protocol_after_optimizer(run);
  run.trace->span("optimizer", "compute", 0, t2, clock.now());
  emulate_straggling(run, step, pipeline_compute + (clock.now() - t2));
  const double t3 = clock.now();
  const int64_t done = step + 1;
  const double wait_before = run.comm_wait_seconds();
  run.algo->after_step(w, done, done == run.cfg.train.steps);
  protocol_after_step(run, done);
  const double t4 = clock.now();
  // Outer updates are compute; time blocked on the network inside after_step is not.
  w.compute_seconds += (t3 - t2) + std::max(0.0, (t4 - t3) - (run.comm_wait_seconds() - wait_before));
  run.trace->span("step " + std::to_string(done), "step", 0, t0, t4);
  return result;
}

}  // namespace loco
