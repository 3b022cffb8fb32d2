// A worker's accounting for the run summary: traffic per operation, compute, waiting (on the
// data-parallel group, and as pipeline bubble), compute utilization, and what it holds.
#include <sys/resource.h>

#include "run/run.h"
#include "sim/estimate.h"

namespace loco {

namespace {

// Peak resident set of the process (all in-process workers together), from getrusage.
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

bool is_pipeline_traffic(const std::string& op) {
  return op == "activations" || op == "tokens" || op == "activation_grads";
}

}  // namespace

nlohmann::json worker_report(WorkerRun& run, double wall) {
  const auto& cfg = run.cfg;
  auto& w = run.w;
  const double busy = std::max(1e-9, wall - run.eval_seconds - run.checkpoint_seconds);
  const auto totals = worker_counters(run, wall);
  nlohmann::json me = run.traffic->to_json();
  me["rank"] = run.rank;
  me["stage"] = run.stage;
  me["replica"] = run.replica;
  me["compute_s"] = totals.compute;
  me["comm_wait_s"] = totals.wait;
  me["bubble_s"] = totals.bubble;
  me["eval_s"] = run.eval_seconds;
  me["checkpoint_s"] = run.checkpoint_seconds;
  me["wall_s"] = wall;
  me["compute_utilization"] = w.compute_seconds / busy;
  me["bubble_share"] = me["bubble_s"].get<double>() / busy;
  // What this worker holds and computes (partial updates shrink all but the parameters).
  const auto flops = sim::step_flops(sim::arch_of(cfg.model), cfg.data.batch_size, cfg.data.seq_len,
                                     {cfg.partial.slices, cfg.partial.strategy});
  me["trainable_params"] = w.trainable.size();
  me["param_bytes"] = int64_t(w.params.size() * sizeof(float));
  me["grad_bytes"] = int64_t(w.grads.size() * sizeof(float));
  me["optimizer_bytes"] = int64_t((w.adamw->m().size() + w.adamw->v().size()) * sizeof(float));
  me["activation_bytes"] = run.stage_model.activation_bytes();
  me["microbatches_in_flight"] = run.stage_model.in_flight();
  me["blocks"] = {run.s.stages[size_t(run.stage)].first_block, run.s.stages[size_t(run.stage)].last_block};
  if (run.grid.stages == 1) me["backward_flops_per_step"] = flops.backward();
  // Per step: forward and backward passes (all microbatches), and the rest of the compute
  // (optimizer, outer updates); `loco simulate pipeline --calibrate` reads them.
  const double steps = std::max<double>(1, double(run.steps_run));
  me["steps_run"] = run.steps_run;
  me["forward_s_per_step"] = (run.pipe.compute_seconds() - run.pipe.backward_seconds()) / steps;
  me["backward_s_per_step"] = run.pipe.backward_seconds() / steps;
  me["optimizer_s_per_step"] = (w.compute_seconds - run.jitter_seconds - run.pipe.compute_seconds()) / steps;
  me["jitter_s"] = run.jitter_seconds;
  me["peak_rss_bytes"] = peak_rss_bytes();
  int64_t train_bytes = 0, pipeline_bytes = 0;
  for (const auto& [op, v] : me["by_operation"].items()) {
    if (is_training_traffic(op)) train_bytes += v["bytes_sent"].get<int64_t>();
    if (is_pipeline_traffic(op)) pipeline_bytes += v["bytes_sent"].get<int64_t>();
  }
  me["train_bytes_sent"] = train_bytes;
  me["pipeline_bytes_sent"] = pipeline_bytes;
  if (run.subspace) {
    const auto& layout = w.layout();
    me["protocol"] = {{"rank", run.subspace->k()},
                      {"boundary_floats_per_token", run.cfg.protocol.compress ? run.subspace->k() : run.subspace->d()},
                      {"max_residual", run.subspace->max_residual(layout, w.params.data())},
                      {"grassmann_updates", run.grassmann_updates},
                      {"grassmann_s", run.grassmann_seconds}};
    if (run.grassmann_loss_before >= 0) {  // the accumulating stage: the subspace loss of the last update
      me["protocol"]["subspace_loss_before"] = run.grassmann_loss_before;
      me["protocol"]["subspace_loss_after"] = run.grassmann_loss_after;
    }
  }
  me["series"] = run.series;
  run.algo->report(me);
  return me;
}

WorkerRun::Counters worker_counters(const WorkerRun& run, double now) {
  WorkerRun::Counters c;
  c.time = now;
  c.compute = run.w.compute_seconds;
  // The algorithm's own waits: elastic rounds (on transports of their own).
  c.wait = run.dp.wait_seconds() + run.world.wait_seconds() + (run.algo ? run.algo->wait_seconds() : 0.0);
  // Idle waiting for a neighbouring stage: inputs not yet there, and the per-step exchanges
  // along the pipeline (they wait for the slowest stage).
  c.bubble = run.pipe.bubble_seconds() + run.chain_wait_seconds;
  c.eval = run.eval_seconds;
  c.checkpoint = run.checkpoint_seconds;
  c.sent = run.traffic->bytes_sent();
  c.received = run.traffic->bytes_received();
  return c;
}

const nlohmann::json& record_interval(WorkerRun& run, int64_t step, double now, double elapsed) {
  const auto c = worker_counters(run, now);
  const auto& p = run.at_last_record;
  const double dt = c.time - p.time;
  const double busy = std::max(1e-9, dt - (c.eval - p.eval) - (c.checkpoint - p.checkpoint));
  run.series.push_back({{"step", step},
                        {"time", elapsed},
                        {"interval_s", dt},
                        {"compute_s", c.compute - p.compute},
                        {"comm_wait_s", c.wait - p.wait},
                        {"bubble_s", c.bubble - p.bubble},
                        {"bytes_sent", c.sent - p.sent},
                        {"bytes_received", c.received - p.received},
                        {"compute_utilization", (c.compute - p.compute) / busy}});
  run.at_last_record = c;
  return run.series.back();
}

}  // namespace loco
