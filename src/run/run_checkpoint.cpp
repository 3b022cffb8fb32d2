// Checkpoints of a run: every worker writes its own state file (its stage's parameters,
// optimizer moments, data position, algorithm state); the model file is assembled by the
// reporter from replica 0's stages (their evaluation parameters), so a pipelined run writes the
// same single Hugging Face checkpoint as one worker would. Resuming reads each worker's own file.
#include <cmath>
#include <cstring>

#include "run/run.h"
#include "core/error.h"
#include "core/finite.h"
#include "io/checkpoint.h"
#include "core/fs.h"
#include "io/run_dir.h"
#include "io/train_state.h"

namespace loco {

namespace {

std::string split_text(const std::vector<StageSpec>& stages) {
  std::string out;
  for (const auto& s : stages) out += (out.empty() ? "" : ",") + std::to_string(s.last_block - s.first_block);
  return out;
}

// Copies every tensor of `stage_layout` from `stage_params` into the full model buffer.
void place_stage(const ParamLayout& full, const ParamLayout& stage_layout, const float* stage_params, float* out) {
  for (const auto& t : stage_layout.tensors()) {
    const TensorInfo* f = full.find(t.name);
    check(f && f->numel() == t.numel(), "internal: stage tensor " + t.name + " is not in the full model");
    std::memcpy(out + f->offset, stage_params + t.offset, size_t(t.numel()) * sizeof(float));
  }
}

// The full model's evaluation parameters, on the reporter (empty elsewhere): replica 0's other
// stages send theirs along the pipeline.
std::vector<float> assemble_model(WorkerRun& run, const std::vector<float>& stage_params) {
  if (run.replica != 0) return {};
  // Protocol models: the first stage's embedding E = E_fixed + E_s U^T materialised, so the model
  // is an ordinary Llama.
  std::vector<float> materialised;
  if (run.subspace && run.first_stage) materialised = run.subspace->materialise(run.w.layout(), stage_params.data());
  const std::vector<float>& eval_params = materialised.empty() ? stage_params : materialised;
  if (!run.reporter) {
    auto h = run.chain.send_start(run.grid.stages - 1,
                                  std::string(reinterpret_cast<const char*>(eval_params.data()),
                                              eval_params.size() * sizeof(float)),
                                  "checkpoint");
    run.chain.wait(h);
    return {};
  }
  const ParamLayout full(run.cfg.model);
  std::vector<float> model(size_t(full.size()), 0.0f);
  for (int s = 0; s < run.grid.stages; ++s) {
    StageSpec plain = run.s.stages[size_t(s)];
    plain.embedding_rank = 0;
    const ParamLayout layout(run.cfg.model, plain);
    if (s == run.stage) {
      place_stage(full, layout, eval_params.data(), model.data());
      continue;
    }
    std::string bytes;
    auto h = run.chain.recv_start(s, &bytes, "checkpoint");
    run.chain.wait(h);
    if (bytes.size() != size_t(layout.size()) * sizeof(float))
      fail("checkpoint: stage " + std::to_string(s) + " sent " + std::to_string(bytes.size()) + " bytes of parameters");
    std::vector<float> params(size_t(layout.size()));
    std::memcpy(params.data(), bytes.data(), bytes.size());
    place_stage(full, layout, params.data(), model.data());
  }
  return model;
}

// Each worker's traffic counters, beside its state file (so that they are cumulative over
// resumes without making the state files of a resumed run differ from an uninterrupted one's).
std::string traffic_path(const std::string& checkpoint, const WorkerRun& run) {
  std::string p = worker_state_path(checkpoint, run.stage, run.replica, run.grid.stages);
  return p.substr(0, p.size() - std::string(".safetensors").size()) + ".traffic.json";
}

}  // namespace

void check_resumed_data(const RunSetup& s) {
  const std::string ck = latest_checkpoint(s.run_dir);
  const auto run_state = read_state_file(ck + "/state.safetensors");
  if (!run_state.meta.count("data")) return;  // written before loco recorded the data
  const std::string& was = run_state.meta.at("data");
  if (was == s.data_digest) return;
  std::string why = ck + ": the run's data changed since this checkpoint (it trained on ";
  why += was;
  why += "; the files now hold ";
  why += s.data_digest;
  why += "): a resume continues the same data stream. Put the original files back, or start a new run";
  fail(why);
}

std::pair<int64_t, double> restore_worker(WorkerRun& run) {
  auto& w = run.w;
  const std::string ck = latest_checkpoint(run.s.run_dir);
  if (model_config_to_hf_json(read_hf_config_file(ck + "/config.json")) != model_config_to_hf_json(run.cfg.model))
    fail(ck + ": the checkpoint's model does not match " + run.s.config_path);
  const auto run_state = read_state_file(ck + "/state.safetensors");
  if (run_state.get_int("replicas") != run.grid.replicas)
    fail(ck + ": written by " + std::to_string(run_state.get_int("replicas")) + " replicas, resuming with " +
         std::to_string(run.grid.replicas));
  const int64_t stages = run_state.meta.count("stages") ? run_state.get_int("stages") : 1;
  const std::string split = run_state.meta.count("stages") ? run_state.meta.at("split") : "";
  if (stages != run.grid.stages || (stages > 1 && split != split_text(run.s.stages)))
    fail(ck + ": written by a pipeline of " + std::to_string(stages) + " stage(s) (split " + split +
         "), resuming with " + std::to_string(run.grid.stages) + " (split " + split_text(run.s.stages) + ")");
  // Counters must be in range: a corrupt or hand-edited checkpoint is refused, not trusted.
  const int64_t step = run_state.get_int("step");
  const double elapsed = run_state.get_double("elapsed_seconds");
  if (step < 1 || step > run.cfg.train.steps)
    fail(ck + ": step " + std::to_string(step) + " is outside this run's 1.." + std::to_string(run.cfg.train.steps));
  if (!(elapsed >= 0 && elapsed < 1e10)) fail(ck + ": elapsed_seconds out of range");
  const std::string state_path = worker_state_path(ck, run.stage, run.replica, run.grid.stages);
  const auto rep = read_state_file(state_path);
  rep.take("params", w.params);
  rep.take("optimizer.m", w.adamw->m());
  rep.take("optimizer.v", w.adamw->v());
  if (rep.get_int("optimizer.steps") != step)
    fail(state_path + ": optimizer.steps " + std::to_string(rep.get_int("optimizer.steps")) + " differs from step " +
         std::to_string(step));
  w.adamw->set_steps(step);
  if (run.first_stage)
    w.loader->set_position({rep.get_int("data.epoch"), rep.get_int("data.taken"),
                           rep.meta.count("data.offset") ? rep.get_int("data.offset") : 0});
  run.algo->load_state(rep);
  protocol_load(run, rep, state_path);
  rep.check_all_taken(state_path);
  const std::string traffic = traffic_path(ck, run);
  if (file_exists(traffic)) run.traffic->restore(read_json_file(traffic), traffic);
  return {step, elapsed};
}

namespace {

bool all_finite(const std::vector<float>& v) { return first_non_finite(v.data(), int64_t(v.size())) < 0; }

}  // namespace

void save_checkpoint(WorkerRun& run, int64_t step, double elapsed) {
  auto& w = run.w;
  const Clock& clock = run.world.clock();
  const double t0 = clock.now();
  // A model with a non-finite value is never checkpointed (every worker checks its part and
  // they agree), so `latest` always points at a finite model the run can be resumed from.
  const std::vector<float>& eval_params = run.algo->eval_params(w);
  const double bad = all_finite(w.params) && all_finite(eval_params) ? 0 : 1;
  if ((run.grid.size() == 1 ? bad : run.world.sum_doubles({bad}, "finite")[0]) > 0) {
    const std::string latest = latest_checkpoint(run.s.run_dir);
    fail("step " + std::to_string(step) + ": the model holds non-finite values (NaN or Inf); no checkpoint written" +
         (latest.empty() ? std::string(" (there is none yet)") : ", the latest stays " + latest));
  }
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld.tmp", (long long)step);
  const std::string tmp = run.s.run_dir + "/checkpoints/" + name;
  if (run.reporter) begin_checkpoint(run.s.run_dir, step);
  run.world.barrier();
  TrainingState rep;
  rep.tensors["params"] = w.params;
  rep.tensors["optimizer.m"] = w.adamw->m();
  rep.tensors["optimizer.v"] = w.adamw->v();
  const auto pos = w.loader->position();
  rep.meta = {{"optimizer.steps", std::to_string(w.adamw->steps())},
              {"data.epoch", std::to_string(pos.epoch)},
              {"data.taken", std::to_string(pos.taken)}};
  if (pos.offset != 0) rep.meta["data.offset"] = std::to_string(pos.offset);
  // An elastic worker's slice is its own (not its replica index): resumed, it trains it again.
  if (run.s.backend == "elastic" && run.cfg.partial.slices > 1) rep.meta["partial.slice"] = std::to_string(w.slice);
  run.algo->save_state(rep);
  protocol_save(run, rep);
  write_state_file(worker_state_path(tmp, run.stage, run.replica, run.grid.stages), rep);
  write_file_atomic(traffic_path(tmp, run), run.traffic->to_json().dump() + "\n");
  const std::vector<float> model = assemble_model(run, eval_params);
  run.world.barrier();
  if (run.reporter) {
    TrainingState run_state;
    run_state.meta = {{"step", std::to_string(step)},
                      {"elapsed_seconds", [&] {
                         char buf[64];
                         std::snprintf(buf, sizeof buf, "%.17g", elapsed);
                         return std::string(buf);
                       }()},
                      {"replicas", std::to_string(run.grid.replicas)},
                      {"stages", std::to_string(run.grid.stages)},
                      {"split", split_text(run.s.stages)},
                      {"algorithm", run.cfg.algorithm},
                      {"data", run.s.data_digest}};
    run.checkpoint = commit_checkpoint(run.s.run_dir, step, run.cfg.model, ParamLayout(run.cfg.model), model.data(),
                                       run_state);
    prune_checkpoints(run.s.run_dir, run.cfg.train.keep_checkpoints);
  }
  run.checkpoint_seconds += clock.now() - t0;
}

double evaluate(WorkerRun& run) {
  const Clock& clock = run.world.clock();
  const double t0 = clock.now();
  const std::vector<float>& params = run.algo->eval_params(run.w);
  // Replica r's pipeline evaluates a contiguous block of the validation windows.
  const int64_t W = run.s.val_windows, R = run.grid.replicas;
  const int64_t first = W * run.replica / R, count = W * (run.replica + 1) / R - first;
  double local = 0;
  if (count > 0)
    local = run.stage_model.eval_loss_sum(params.data(), run.pipe, run.route, *run.s.val_tokens, first, count,
                                          run.cfg.data.batch_size);
  const double loss = (run.grid.size() == 1 ? local : run.world.sum_doubles({local}, "eval")[0]) / double(W);
  run.eval_seconds += clock.now() - t0;
  return loss;
}

double replica_spread(WorkerRun& run) {
  const Clock& clock = run.world.clock();
  const double t0 = clock.now();
  const std::vector<double> terms = run.algo->spread_terms(run.w);
  if (terms.empty()) return -1;
  const std::vector<double> sum = run.grid.size() == 1 ? terms : run.world.sum_doubles(terms, "spread");
  run.eval_seconds += clock.now() - t0;
  return sum[1] > 0 ? std::sqrt(sum[0] / sum[1]) : 0.0;
}

}  // namespace loco
