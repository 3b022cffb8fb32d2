#pragma once
// Internals of `loco train` shared by trainer.cpp (set-up and the loop), train_step.cpp (one
// optimizer step), run_checkpoint.cpp (save and resume) and run_report.cpp (accounting): what
// the workers of a run share, and everything one worker holds.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algo/algorithm.h"
#include "run/stop.h"
#include "algo/run_config.h"
#include "run/options.h"
#include "algo/worker.h"
#include "comm/communicator.h"
#include "comm/link.h"
#include "core/precision.h"
#include "elastic/membership.h"
#include "pipeline/executor.h"
#include "pipeline/grid.h"
#include "pipeline/schedule.h"
#include "model/protocol.h"
#include "model/transformer.h"
#include "pipeline/stage_model.h"

namespace loco {

// Everything the workers of one run share (read-only while they run, except first_error).
struct RunSetup {
  RunConfig cfg;
  TrainOptions opt;
  bool resuming = false;
  bool restoring = false;  // resuming from a checkpoint (an elastic worker may resume without one)
  std::string run_dir, config_path;
  std::shared_ptr<const std::vector<int32_t>> train_tokens, val_tokens;
  int64_t val_windows = 0;
  CommOptions comm;
  LinkConfig link;
  std::string backend;
  ElasticOptions elastic;  // backend "elastic"
  double unigram_entropy = 0;
  std::string data_digest;  // the tokens trained and evaluated on (token_digest of each): a resume checks them
  Grid grid;
  std::vector<StageSpec> stages;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int reporter_rank = 0;  // the last stage of replica 0: it has the loss and writes the run's files
  Precision precision = Precision::fp32;  // of the matrix products (train.precision, resolved)
  std::string precision_note;             // what was chosen and why, said at start
  Fp32Library library = Fp32Library::openblas;  // of the fp32 products (train.matmul_library, resolved)
  std::mutex error_mu;
  std::string first_error;  // the failure that stopped the run (in-process)
  StopAgreement stop;       // in-process workers' step to stop after, on SIGTERM/SIGINT
};

// One worker: its communicators (all workers; its stage's replicas; its replica's stages), its
// pipeline link, model stage, optimizer, algorithm and accounting.
struct WorkerRun {
  WorkerRun(RunSetup& setup, std::shared_ptr<Transport> transport, std::shared_ptr<TraceRecorder> trace);
  // Communication ends before the algorithm's and the worker's buffers it may write into are
  // destroyed (on an error, the caller aborts the transport first so that it ends at once).
  ~WorkerRun() { stop_communication(); }
  void stop_communication() {
    dp.shutdown();
    chain.shutdown();
    world.shutdown();
  }

  RunSetup& s;
  const RunConfig& cfg;
  const Grid grid;
  const int rank, stage, replica;
  const bool reporter, first_stage, last_stage;
  std::shared_ptr<TraceRecorder> trace;
  std::shared_ptr<TrafficStats> traffic;
  Communicator world, dp, chain;
  PipelineExecutor pipe;
  std::unique_ptr<Subspace> subspace;  // protocol models (protocol.rank > 0), else null
  Transformer model;  // loco's CPU engine: this worker's stage, computed over w.params and w.grads
  Worker w;
  std::unique_ptr<Algorithm> algo;
  TransformerStage stage_model;
  std::vector<PipeOp> ops;  // this stage's schedule of every step
  Route route;        // fixed pipelines: evaluation, and training unless routes are random
  Route train_route;  // training: fixed, or NoLoCo's random paths (per step, microbatch, boundary)
  int64_t route_step = 0;  // the step train_route serves (1-based)
  std::vector<int32_t> inputs, targets;  // the step's batch (first stage)
  size_t full_tensors = 0;                // tensors of the whole model (for the norm exchange)
  // Protocol models: A = sum g^T g of the last boundary's full gradients since the last
  // Grassmann update (last stage, protocol.grassmann_interval > 0), and the updates' account.
  std::vector<double> grassmann_a;
  int64_t grassmann_updates = 0;
  double grassmann_loss_before = -1, grassmann_loss_after = -1, grassmann_seconds = 0;

  // Accounting.
  double eval_seconds = 0, checkpoint_seconds = 0, backward_seconds = 0, chain_wait_seconds = 0;
  double jitter_seconds = 0;  // emulated straggling (network.compute_jitter), counted as compute
  int64_t steps_run = 0;
  std::string checkpoint;  // latest committed (reporter)
  // Counters at the previous metric record, and one point per record since (the summary's
  // per-worker "series", docs/metrics.md).
  struct Counters {
    double time = 0, compute = 0, wait = 0, bubble = 0, eval = 0, checkpoint = 0;
    int64_t sent = 0, received = 0;
  } at_last_record;
  nlohmann::json series = nlohmann::json::array();

  double comm_wait_seconds() const {
    return dp.wait_seconds() + chain.wait_seconds() + world.wait_seconds() + (algo ? algo->wait_seconds() : 0.0);
  }
};

struct StepResult {
  double loss = 0;       // mean over the microbatches (last stage)
  double grad_norm = 0;  // global norm before clipping, over all stages
};
// The squared global gradient norm from every stage's (tensor index, square sum) pairs, added
// in tensor order; fails on a malformed message (an index out of [0, tensors), twice, or a
// negative sum). A non-finite sum is kept: the caller stops the run on a non-finite norm.
double combine_square_sums(const std::vector<std::string>& payloads, int64_t tensors);

// One optimizer step (0-based `step`) at learning rate `lr`: the pipeline schedule, the
// data-parallel hooks, the tied-embedding exchange, global clipping and AdamW.
StepResult train_step(WorkerRun& run, int64_t step, double lr);

// Mean validation loss of the algorithm's evaluation parameters (every worker calls it).
double evaluate(WorkerRun& run);
// The spread between replicas (docs/noloco.md), pooled over stages; -1 when the algorithm keeps its
// replicas identical. Every worker calls it at the same step (diagnostic traffic "spread").
double replica_spread(WorkerRun& run);

// Protocol models (docs/protocol.md; protocol_run.cpp), no-ops when protocol.rank = 0:
// constrained matrices projected into the subspace at initialisation (scaled by sqrt(d/k) to
// keep their norm); their gradients projected after backward; the weights projected after every
// optimizer step with "project"; every protocol.grassmann_interval steps the subspace moved
// (Grassmann update).
void protocol_init(WorkerRun& run);
void protocol_after_backward(WorkerRun& run);
void protocol_after_optimizer(WorkerRun& run);
void protocol_after_step(WorkerRun& run, int64_t done);
// The subspace state in a worker's checkpoint (U everywhere, A on the accumulating stage).
void protocol_save(const WorkerRun& run, TrainingState& st);
void protocol_load(WorkerRun& run, const TrainingState& st, const std::string& source);

// Fails, naming both, when the latest checkpoint trained on other tokens than the run's data
// files hold now (s.data_digest): a resume would continue another data stream.
void check_resumed_data(const RunSetup& s);
// Restores a worker from the run's latest checkpoint; returns (step, elapsed seconds).
std::pair<int64_t, double> restore_worker(WorkerRun& run);
// Writes a checkpoint of every worker and the assembled model (every worker calls it).
void save_checkpoint(WorkerRun& run, int64_t step, double elapsed);

// This worker's accounting as JSON, gathered from every worker into the run summary (written by
// the reporter); `wall` is the training loop's wall time.
nlohmann::json worker_report(WorkerRun& run, double wall);
// The worker's counters now (time: the clock's `now`).
WorkerRun::Counters worker_counters(const WorkerRun& run, double now);
// Appends to run.series the point for the interval since the previous record (or since
// `run.at_last_record` was first set) and returns it: step, elapsed time, and over the interval
// its length, compute, waiting, bubble, bytes sent and received, and compute utilization.
const nlohmann::json& record_interval(WorkerRun& run, int64_t step, double now, double elapsed);

}  // namespace loco
