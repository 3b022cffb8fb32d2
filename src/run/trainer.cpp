// `loco train`: set-up, the workers (threads in-process, or one MPI process each) and the
// training loop of one worker: step, evaluate, log, checkpoint. What a step does is in
// train_step.cpp, checkpoints in run_checkpoint.cpp, accounting in run_report.cpp.
#include "run/trainer.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include <toml++/toml.h>

#include "run/regime.h"
#include "run/run.h"
#include "comm/inprocess.h"
#include "comm/mpi_transport.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/precision.h"
#include "core/stop_signal.h"
#include "core/version.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "elastic/fingerprint.h"
#include "elastic/methods.h"
#include "elastic/options.h"
#include "core/fs.h"
#include "io/metrics.h"
#include "io/tensorboard.h"
#include "io/progress.h"
#include "io/run_dir.h"
#include "io/train_state.h"
#include "optim/schedule.h"

namespace loco {

namespace {

std::shared_ptr<const std::vector<int32_t>> load_tokens(const std::string& path, const ModelConfig& m,
                                                        const std::string& key) {
  if (path.empty()) fail("config: " + key + " is not set");
  if (!std::filesystem::exists(path))
    fail(key + " = \"" + path + "\": no such file" +
         (std::filesystem::path(path).is_relative()
              ? " (relative paths are from the directory loco runs in, " + std::filesystem::current_path().string() +
                    "; --resume reads them from the run's config.toml)"
              : ""));
  auto tf = read_token_file(path);
  if (tf.vocab_size > uint64_t(m.vocab_size))
    fail(path + ": vocabulary size " + std::to_string(tf.vocab_size) + " exceeds model.vocab_size " +
         std::to_string(m.vocab_size) + " (set model.vocab_size to at least " + std::to_string(tf.vocab_size) +
         ", or prepare the data with a smaller --vocab-size)");
  return std::make_shared<const std::vector<int32_t>>(std::move(tf.tokens));
}

// Copies the tokenizer description next to the data (if any) into the run, for `loco generate`.
void copy_tokenizer(const std::string& train_path, const std::string& run_dir) {
  const auto dir = std::filesystem::path(train_path).parent_path();
  for (const char* f : {"tokenizer.json", "tokenizer.model"}) {
    const auto src = dir / f;
    if (std::filesystem::exists(src)) write_file_atomic(run_dir + "/" + f, read_file(src.string()));
  }
}

std::string fmt(double v, const char* f = "%.4f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return fmt(b, u ? "%.1f" : "%.0f") + " " + units[u];
}

// The run's layout, printed at start: who is which worker, which blocks each stage holds.
std::string describe_layout(const RunSetup& s) {
  const auto& g = s.grid;
  const int m = s.cfg.microbatches();
  std::string out = "pipeline: " + std::to_string(g.stages) + " stages x " + std::to_string(g.replicas) +
                    " replica(s) = " + std::to_string(g.size()) + " workers; worker k is stage k mod " +
                    std::to_string(g.stages) + " of replica k / " + std::to_string(g.stages) + "; " +
                    s.cfg.pipeline.schedule + ", " + std::to_string(m) + " microbatch(es) of " +
                    std::to_string(s.cfg.micro_windows()) + " windows (ideal bubble " +
                    fmt(100.0 * (g.stages - 1) / (m + g.stages - 1), "%.0f") + "%)";
  const auto sizes = stage_param_counts(s.cfg.model, s.stages);
  for (int i = 0; i < g.stages; ++i) {
    const auto& st = s.stages[size_t(i)];
    out += "\n  stage " + std::to_string(i) + ": blocks " + std::to_string(st.first_block) + "-" +
           std::to_string(st.last_block - 1) + (st.embedding ? " + embedding" : "") +
           (st.head ? (s.cfg.model.tie_embeddings ? " + final norm + tied head" : " + final norm + head") : "") +
           ", " + std::to_string(sizes[size_t(i)]) + " parameters";
  }
  return out;
}

// Before anything large is allocated: the memory the workers of this process will need
// (estimated from the config alone), against the machine and the address-space limit.
void check_memory(const RunSetup& s, int local_workers) {
  const auto& c = s.cfg;
  const auto& m = c.model;
  const double d = m.hidden_size, f = m.intermediate_size, V = m.vocab_size, h = m.num_heads;
  const double tokens = double(c.micro_windows()) * c.data.seq_len;
  const bool outer = c.method() != MethodId::Ddp && !(c.method() == MethodId::Streaming && c.streaming.offload_outer);
  const int in_flight = c.pipeline.schedule == "gpipe" ? c.microbatches() : std::min(c.pipeline.stages, c.microbatches());
  double resident = 0, largest = 0;
  for (const auto& st : s.stages) {
    const double blocks = st.last_block - st.first_block;
    const double params = m.stage_parameter_count(blocks, st.embedding, st.head);
    // Parameters, gradients, AdamW moments, outer parameters and momentum with their buffers.
    double state = params * (4 + 4 + 8 + (outer ? 12 : 0));
    if (c.protocol.rank > 0) state += 4 * V * d + (st.head && c.protocol.grassmann_interval > 0 ? 8 * d * d : 0);  // E_fixed, A
    const double per_token = blocks * (12 * d + 3 * f + 4 * h) + d + (st.head ? 2 * d + V + 2 : 0);
    const double activations = 4 * tokens * (in_flight * per_token + 8 * d + 3 * f);
    largest = std::max(largest, state + activations);
    resident += (state + activations) * (local_workers == 1 ? 1.0 / double(s.stages.size()) : s.grid.replicas);
  }
  if (local_workers == 1) resident = largest;
  resident += 4.0 * double(s.train_tokens->size() + (s.val_tokens ? s.val_tokens->size() : 0));
  // Address space reserved beyond the data, fitted from above to measured peaks (VmPeak of 1, 2,
  // 4, 8, 16 in-process workers of a tiny model: 0.55, 0.70, 0.89, 1.12, 1.33 GB): the program,
  // its libraries and malloc arenas; per worker its threads' stacks; and OpenBLAS's 128 MB
  // buffer for each thread inside a matrix product at once (at most about two per core).
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = c.train.threads > 0 ? c.train.threads : std::max(1, cores / local_workers);
  const double mb = 1 << 20;
  const double reserved = 400 * mb + local_workers * 32 * mb + std::min(local_workers * threads, 2 * cores) * 128 * mb;
  require_memory(resident, reserved,
                 "training " + std::to_string(local_workers) + " worker(s) of " +
                     std::to_string(int64_t(std::min(9e18, m.parameter_count()))) + " parameters",
                 "lower distributed.replicas, pipeline.stages, data.batch_size or the model size");
}

std::unique_ptr<Algorithm> make_run_algorithm(const RunSetup& s, Worker& w, std::shared_ptr<TrafficStats> traffic,
                                              std::shared_ptr<TraceRecorder> trace) {
  if (s.backend == "elastic") return make_elastic_algorithm(s.cfg, w, s.elastic, std::move(traffic), std::move(trace));
  return make_algorithm(s.cfg, w);
}

}  // namespace

WorkerRun::WorkerRun(RunSetup& setup, std::shared_ptr<Transport> transport, std::shared_ptr<TraceRecorder> trace_in)
    : s(setup),
      cfg(setup.cfg),
      grid(setup.grid),
      rank(transport->rank()),
      stage(grid.stage_of(rank)),
      replica(grid.replica_of(rank)),
      reporter(rank == setup.reporter_rank),
      first_stage(stage == 0),
      last_stage(stage == grid.stages - 1),
      trace(std::move(trace_in)),
      traffic(std::make_shared<TrafficStats>(setup.comm.peak_window_s)),
      world(transport, setup.comm, trace, kControlChannel, traffic),
      dp(make_group_view(transport, grid.stage_group(stage)), setup.comm, trace, kDataChannel, traffic),
      chain(make_group_view(transport, grid.replica_chain(replica)), setup.comm, trace, kChainChannel, traffic),
      pipe(transport, grid, rank, setup.comm.timeout_s, traffic, trace),
      subspace(cfg.protocol.rank > 0 ? std::make_unique<Subspace>(cfg.model, cfg.protocol.rank,
                                                                  uint64_t(cfg.protocol.seed), cfg.protocol.fixed_std)
                                     : nullptr),
      model(cfg.model, setup.stages[size_t(stage)]),
      w(cfg, dp, setup.train_tokens, setup.stages[size_t(stage)], rank),
      algo(make_run_algorithm(setup, w, traffic, trace)),
      stage_model(model, cfg.micro_windows(), cfg.data.seq_len, cfg.microbatches(),
                  max_in_flight(stage_schedule(setup.schedule, grid.stages, stage, cfg.microbatches()))),
      ops(stage_schedule(setup.schedule, grid.stages, stage, cfg.microbatches())),
      route(fixed_route(grid, rank)),
      train_route(cfg.method() == MethodId::Noloco && cfg.noloco.routing == "random" && grid.stages > 1
                      ? random_route(grid, rank, uint64_t(cfg.noloco.seed), &route_step)
                      : route),
      full_tensors(ParamLayout(cfg.model).tensors().size()) {
  if (subspace) {
    model.set_protocol(subspace.get());
    const bool accumulate = last_stage && cfg.protocol.grassmann_interval > 0;
    stage_model.set_protocol(subspace.get(), cfg.protocol.compress, accumulate ? &grassmann_a : nullptr);
  }
}

namespace {

// TensorBoard scalars of one metric record; rates over the interval since the previous one.
void write_board(TensorBoardWriter& board, const nlohmann::json& rec, const nlohmann::json& point, double tokens_per_s,
                 int64_t steps) {
  const int64_t step = rec["step"].get<int64_t>();
  board.scalar(step, "loss/train", rec["train_loss"].get<double>());
  if (rec.contains("val_loss")) board.scalar(step, "loss/val", rec["val_loss"].get<double>());
  board.scalar(step, "optimizer/lr", rec["lr"].get<double>());
  board.scalar(step, "optimizer/grad_norm", rec["grad_norm"].get<double>());
  board.scalar(step, "throughput/tokens_per_s", tokens_per_s);
  board.scalar(step, "network/bytes_sent_per_step", point["bytes_sent"].get<double>() / double(std::max<int64_t>(1, steps)));
  board.scalar(step, "network/compute_utilization", point["compute_utilization"].get<double>());
  if (rec.contains("replica_spread")) board.scalar(step, "replicas/spread", rec["replica_spread"].get<double>());
  board.flush();
}

// A resumed run's summary keeps every worker's series up to the step it resumed from, taken
// from the previous segment's summary (when that segment ended with one).
void keep_earlier_series(const std::string& path, int64_t start_step, nlohmann::json& workers) {
  if (!file_exists(path)) return;
  nlohmann::json old;
  try {
    old = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception&) {
    return;  // not ours to repair: the new summary replaces it
  }
  if (!old.contains("workers") || !old["workers"].is_array() || old["workers"].size() != workers.size()) return;
  for (size_t k = 0; k < workers.size(); ++k) {
    const auto& before = old["workers"][k];
    if (!before.contains("series") || !before["series"].is_array()) continue;
    nlohmann::json merged = nlohmann::json::array();
    for (const auto& p : before["series"])
      if (p.value("step", int64_t(0)) <= start_step) merged.push_back(p);
    for (auto& p : workers[k]["series"]) merged.push_back(std::move(p));
    workers[k]["series"] = std::move(merged);
  }
}

// Whether this worker stops after step `done` because SIGTERM or SIGINT asked for it, agreed by
// every worker of the run: in one process through shared memory after every step; between MPI
// processes by a one-float all-reduce at each logged step (a signal waits for the next one). An
// elastic member stops alone: the others carry on without it, as when it leaves.
bool stop_requested(RunSetup& s, WorkerRun& run, int64_t done, bool logged) {
  if (s.backend != "mpi") return s.stop.stop_after(run.rank, done, stop_signal() != 0);
  if (!logged) return false;
  float asked = stop_signal() != 0 ? 1.0f : 0.0f;
  run.world.all_reduce(&asked, 1, ReduceOp::Sum, "control");
  return asked > 0;
}

TrainSummary run_worker(RunSetup& s, std::shared_ptr<Transport> transport, std::shared_ptr<TraceRecorder> trace) {
  std::unique_ptr<WorkerRun> run_ptr;
  try {
    run_ptr = std::make_unique<WorkerRun>(s, transport, trace);
    WorkerRun& run = *run_ptr;
    const auto& cfg = s.cfg;
    auto& w = run.w;
    const Clock& clock = run.world.clock();
    int64_t start_step = 0;
    double elapsed_before = 0;
    if (s.restoring) {
      std::tie(start_step, elapsed_before) = restore_worker(run);
      w.restored = true;
    } else {
      run.model.init_params(w.params.data(), uint64_t(cfg.train.seed));  // same seed: identical replicas
      protocol_init(run);
    }
    run.algo->start(w, s.resuming);
    start_step = run.algo->continue_from(start_step);  // an elastic joiner continues from the run's step

    const LrSchedule schedule{cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};
    std::unique_ptr<MetricsLog> metrics;
    if (run.reporter) metrics = std::make_unique<MetricsLog>(s.run_dir + "/metrics.jsonl", s.resuming ? start_step : -1);
    Progress progress(cfg.train.steps, s.opt.quiet || !run.reporter);
    const int64_t tokens_per_step = int64_t(cfg.data.batch_size) * cfg.data.seq_len * s.grid.replicas;

    TrainSummary sum;
    sum.run_dir = s.run_dir;
    sum.algorithm = cfg.algorithm;
    sum.backend = s.backend;
    sum.replicas = s.grid.replicas;
    sum.stages = s.grid.stages;
    sum.unigram_entropy = s.unigram_entropy;
    sum.is_reporter = run.reporter;
    progress.note(s.resuming ? "resuming " + s.run_dir + " at step " + std::to_string(start_step)
                             : cfg.algorithm + ", " + std::to_string(s.grid.replicas) + " replica(s) (" + s.backend +
                                   "), " + std::to_string(ParamLayout(cfg.model).size()) + " parameters, " +
                                   std::to_string(cfg.train.steps) + " steps of " + std::to_string(tokens_per_step) +
                                   " tokens; unigram entropy of the training tokens " + fmt(s.unigram_entropy) +
                                   " nats");
    if (s.grid.stages > 1 && !s.resuming) progress.note(describe_layout(s));
    progress.note(s.precision_note);
    if (run.reporter && !s.resuming) {
      // An elastic run counts the members its first round waits for (at least 2 make it distributed).
      const int replicas = s.backend == "elastic" ? std::max(2, cfg.elastic.min_workers) : s.grid.replicas;
      for (const auto& line : regime_warnings(cfg, replicas, ParamLayout(cfg.model).size()))
        std::fprintf(stderr, "loco: warning: %s\n", line.c_str());
    }

    std::unique_ptr<TensorBoardWriter> board;
    if (run.reporter && cfg.train.tensorboard)
      board = std::make_unique<TensorBoardWriter>(s.run_dir, s.resuming ? start_step : -1);
    const double t_start = clock.now();
    auto elapsed = [&] { return elapsed_before + clock.now() - t_start; };
    run.at_last_record = worker_counters(run, t_start);
    double loss_sum = 0, last_loss = 0, last_log_time = t_start;
    int64_t loss_count = 0;
    // One step per pass, top to bottom: train, evaluate, record, checkpoint. The next step is the
    // one after it, except for an elastic member that (re)joined the run: the run's step then.
    int64_t step = start_step;
    while (step < cfg.train.steps) {
      const double lr = schedule.at(step);
      const StepResult r = train_step(run, step, lr);
      const int64_t done = run.algo->continue_from(step + 1);
      const bool last = done == cfg.train.steps;
      loss_sum += r.loss;
      ++loss_count;
      const bool do_eval =
          s.val_windows > 0 && (last || (cfg.train.eval_interval > 0 && done % cfg.train.eval_interval == 0));
      double val_loss = -1, spread = -1;
      std::string val_note;
      if (do_eval) {
        val_loss = evaluate(run);
        val_note = run.algo->eval_note(done);
        sum.final_val_loss = val_loss;
        spread = replica_spread(run);
      }
      const bool log = done % cfg.train.log_interval == 0 || last || do_eval;
      const nlohmann::json* point = log ? &record_interval(run, done, clock.now(), elapsed()) : nullptr;
      if (run.reporter && log) {
        const double now = clock.now();
        const double dt = now - last_log_time;
        last_log_time = now;
        last_loss = loss_sum / double(loss_count);
        nlohmann::json rec = {{"step", done},
                              {"tokens", done * tokens_per_step},
                              {"train_loss", last_loss},
                              {"lr", lr},
                              {"grad_norm", r.grad_norm},
                              {"time", elapsed()},
                              {"bytes_sent", run.traffic->bytes_sent()},
                              {"comm_wait", run.comm_wait_seconds()}};
        if (do_eval) rec["val_loss"] = val_loss;
        if (spread >= 0) rec["replica_spread"] = spread;
        if (!val_note.empty()) rec["val_note"] = val_note;
        run.algo->annotate(rec);
        metrics->write(rec);
        const double tps = double(loss_count * tokens_per_step) / std::max(dt, 1e-9);
        if (board) write_board(*board, rec, *point, tps, loss_count);
        progress.update(done, last_loss, tps, double(cfg.train.steps - done) * dt / double(loss_count),
                        "sent " + human_bytes(double(run.traffic->bytes_sent())) +
                            (do_eval ? " | val " + fmt(val_loss) : ""));
        if (do_eval)
          progress.note("step " + std::to_string(done) + ": train loss " + fmt(last_loss) + ", val loss " +
                        fmt(val_loss) + (val_note.empty() ? "" : " (" + val_note + ")"));
      }
      if (log) {
        loss_sum = 0;
        loss_count = 0;
      }
      const bool signalled = !last && stop_requested(s, run, done, log);
      const bool pause = done == s.opt.until || signalled;
      const bool due = last || (cfg.train.checkpoint_interval > 0 && done % cfg.train.checkpoint_interval == 0);
      if (pause || (due && run.algo->writes_checkpoints())) save_checkpoint(run, done, elapsed());
      if (pause) {
        if (signalled) {
          sum.stopped_by = stop_signal();
          sum.steps = done;
        }
        progress.note("stopped after step " + std::to_string(done) + " (" +
                      (signalled ? std::string(signal_name(stop_signal())) : "--until") + "); continue with --resume " +
                      s.run_dir);
        break;
      }
      step = done;
    }
    progress.finish();
    const double wall = clock.now() - t_start;

    // Accounting snapshot, taken before the (small) exchange that reports it.
    const nlohmann::json me = worker_report(run, wall);
    const auto all = run.world.all_gather(me.dump(), "report");
    if (trace->enabled()) {
      const auto traces = run.world.all_gather(trace->events().dump(), "report");
      if (run.reporter) {
        nlohmann::json events = nlohmann::json::array();
        for (int k = 0; k < int(traces.size()); ++k) {
          // Perfetto shows each worker as a process named after its place in the grid.
          events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", k}, {"args", {{"name", s.grid.describe(k)}}}});
          for (auto& e : nlohmann::json::parse(traces[size_t(k)])) events.push_back(std::move(e));
        }
        write_file_atomic(s.opt.trace_path, nlohmann::json{{"traceEvents", events}}.dump() + "\n");
      }
    }
    sum.workers = nlohmann::json::array();
    for (const auto& a : all) sum.workers.push_back(nlohmann::json::parse(a));
    if (run.reporter && s.resuming) keep_earlier_series(s.run_dir + "/summary.json", start_step, sum.workers);
    sum.checkpoint = run.checkpoint;
    if (sum.checkpoint.empty() && run.reporter && file_exists(s.run_dir + "/checkpoints/latest"))
      sum.checkpoint = latest_checkpoint(s.run_dir);
    if (!sum.stopped_by) sum.steps = s.opt.until > 0 ? std::min(s.opt.until, cfg.train.steps) : cfg.train.steps;
    sum.tokens = sum.steps * tokens_per_step;
    sum.final_train_loss = last_loss;
    sum.seconds = elapsed();
    if (run.reporter)
      write_file_atomic(s.run_dir + "/summary.json", nlohmann::json{{"workers", sum.workers},
                                                                    {"steps", sum.steps},
                                                                    {"tokens", sum.tokens},
                                                                    {"final_val_loss", sum.final_val_loss},
                                                                    {"final_train_loss", last_loss},
                                                                    {"algorithm", cfg.algorithm},
                                                                    {"replicas", s.grid.replicas},
                                                                    {"stages", s.grid.stages},
                                                                    {"backend", s.backend},
                                                                    {"unigram_entropy", s.unigram_entropy},
                                                                    {"train_data_tokens", int64_t(s.train_tokens->size())},
                                                                    {"precision", precision_name(s.precision)},
                                                                    {"matmul_library", library_name(s.library)},
                                                                    {"seconds", sum.seconds}}
                                                         .dump(2) + "\n");
    return sum;
  } catch (const std::exception& e) {
    // Stop every worker before this one's state (which the communication threads write into)
    // is destroyed: they fail fast instead of waiting for the timeout.
    const std::string reason = s.grid.describe(transport->rank()) + " failed: " + e.what();
    {
      std::lock_guard<std::mutex> lock(s.error_mu);
      if (s.first_error.empty()) s.first_error = e.what();
    }
    transport->abort(reason);
    if (run_ptr) run_ptr->stop_communication();
    throw;
  }
}

// One line per invocation that trains the run (its start and every resume) in
// RUN/invocations.jsonl: what produced it, for the report and for anyone reading the run later.
void record_invocation(const RunSetup& s) {
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const nlohmann::json rec = {{"time", when},
                              {"loco", loco_version()},
                              {"command", command_line()},
                              {"cwd", std::filesystem::current_path().string()},
                              {"host", host_name()},
                              {"cpu", describe_cpu()},
                              {"cores", int(std::thread::hardware_concurrency())},
                              {"threads", compute_threads()},
                              {"precision", precision_name(s.precision)},
                              {"matmul_library", library_name(s.library)},
                              {"backend", s.backend},
                              {"resume", s.resuming}};
  append_line(s.run_dir + "/invocations.jsonl", rec.dump());
}

}  // namespace

TrainSummary run_training(const TrainOptions& opt) {
  auto s = std::make_unique<RunSetup>();
  s->opt = opt;
  s->resuming = !opt.resume_dir.empty();
  if (s->resuming && !opt.config_path.empty()) fail("give either --config or --resume, not both");
  if (!s->resuming && opt.config_path.empty()) fail("--config is required (or --resume RUN_DIR)");
  if (opt.until == 0 || opt.until < -1) fail("--until must be >= 1");
  s->config_path = s->resuming ? opt.resume_dir + "/config.toml" : opt.config_path;
  if (s->resuming && !file_exists(s->config_path)) fail(opt.resume_dir + ": not a run directory (no config.toml)");
  if (s->resuming && !opt.overrides.empty()) {
    std::string given;
    for (const auto& o : opt.overrides) given.append(given.empty() ? "--set " : " --set ").append(o);
    fail("--resume " + opt.resume_dir + " continues the run as its config.toml defines it; " + given +
         " would change it mid-run (the schedule, data order or state would no longer match): start a new run with "
         "--config " + s->config_path + " and the --set instead");
  }
  s->cfg = load_run_config(s->config_path, opt.overrides);
  // A run started before train.matmul_library existed ran its fp32 products through OpenBLAS:
  // it continues there (auto could pick another library and round differently mid-run).
  if (s->resuming && !toml::parse_file(s->config_path)["train"]["matmul_library"])
    s->cfg.train.matmul_library = "openblas";
  // An elastic worker resumed without a checkpoint of its own (another member wrote the model)
  // rejoins from a peer's state like a new one; any other resume needs a checkpoint.
  const bool elastic_resume = s->resuming && s->cfg.distributed.backend == "elastic";
  s->restoring = s->resuming && (!elastic_resume || file_exists(opt.resume_dir + "/checkpoints/latest"));
  if (s->restoring) {
    // Fails at once if there is nothing to resume; a run that already reached its last step is
    // left exactly as it is.
    const auto run_state = read_state_file(latest_checkpoint(opt.resume_dir) + "/state.safetensors");
    if (run_state.get_int("step") == s->cfg.train.steps) {
      TrainSummary done;
      done.run_dir = opt.resume_dir;
      done.steps = run_state.get_int("step");
      done.already_complete = true;
      return done;
    }
  }
  const auto& cfg = s->cfg;
  s->run_dir = s->resuming ? opt.resume_dir : cfg.train.out_dir;

  std::string backend = cfg.distributed.backend;
  if (backend == "auto") backend = !opt.join_url.empty() ? "elastic" : launched_by_mpi() ? "mpi" : "inprocess";
  if (!opt.join_url.empty() && backend != "elastic")
    fail("--join needs distributed.backend = \"elastic\" (or \"auto\"), not \"" + backend + "\"");
  if (backend == "elastic") {
    if (opt.join_url.empty()) fail("distributed.backend = \"elastic\" needs --join redis://HOST:PORT/RUN and --worker NAME");
    s->cfg.distributed.backend = "elastic";  // recorded in config.toml; its checks apply
    validate_run_config(s->cfg, config_source(s->config_path, opt.overrides));
    s->elastic = elastic_options(cfg, opt.join_url, opt.worker_name);
    if (!s->resuming) s->run_dir = cfg.train.out_dir + "/" + opt.worker_name;
    if (s->restoring && cfg.partial.slices > 1) {  // the slice whose optimizer state the checkpoint holds
      const std::string path = worker_state_path(latest_checkpoint(opt.resume_dir), 0, 0, 1);
      const auto rep = read_state_file(path);
      const int64_t slice = rep.meta.count("partial.slice") ? rep.get_int("partial.slice") : -1;
      if (slice < 0 || slice >= cfg.partial.slices)
        fail(path + ": partial.slice missing or outside 0.." + std::to_string(cfg.partial.slices - 1) +
             " (the slice this elastic worker trained)");
      s->elastic.slice = int(slice);
    }
  } else if (!opt.worker_name.empty()) {
    fail("--worker is for elastic workers (with --join)");
  }
  if (backend == "mpi" && !launched_by_mpi()) fail("distributed.backend = \"mpi\" needs a launcher: mpirun -np N loco train ...");
  const int S = cfg.pipeline.stages;
  int R = cfg.distributed.replicas;
  if (backend == "mpi") {
    const int N = mpi_env_size();
    if (N % S != 0)
      fail("mpirun started " + std::to_string(N) + " processes, not a multiple of pipeline.stages (" +
           std::to_string(S) + ")");
    if (R != 1 && R * S != N)
      fail("distributed.replicas (" + std::to_string(R) + ") x pipeline.stages (" + std::to_string(S) + ") is " +
           std::to_string(R * S) + " but mpirun started " + std::to_string(N) + " processes");
    R = N / S;
  }
  s->grid = {S, R};
  s->stages = partition_stages(cfg.model, S, cfg.pipeline.split);
  if (cfg.protocol.rank > 0) {  // E_s on the first stage; every block before the last boundary constrained
    s->stages.front().embedding_rank = cfg.protocol.rank;
    for (auto& st : s->stages) st.constrained_end = s->stages.back().first_block;
  }
  s->schedule = parse_schedule(cfg.pipeline.schedule);
  s->reporter_rank = s->grid.rank(S - 1, 0);
  s->backend = backend;
  const int local_workers = backend == "mpi" ? mpi_env_local_size() : backend == "elastic" ? 1 : s->grid.size();
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  set_compute_threads(cfg.train.threads > 0 ? cfg.train.threads : std::max(1, cores / local_workers));
  s->library = resolve_fp32_library(cfg.train.matmul_library);
  set_fp32_library(s->library);
  s->precision = resolve_precision(cfg.train.precision, s->library, &s->precision_note);
  set_matmul_precision(s->precision);

  s->comm.timeout_s = parse_duration(cfg.network.timeout, "network.timeout");
  s->comm.peak_window_s = parse_duration(cfg.network.peak_window, "network.peak_window");
  s->link = {parse_bandwidth(cfg.network.bandwidth, "network.bandwidth"),
             parse_duration(cfg.network.latency, "network.latency"), cfg.network.tcp};
  s->elastic.link = s->link;
  s->train_tokens = load_tokens(cfg.data.train, cfg.model, "data.train");
  if (!cfg.data.val.empty()) s->val_tokens = load_tokens(cfg.data.val, cfg.model, "data.val");
  // The data's digests, hashed once: the elastic members compare them when they register, and a
  // checkpoint records them for a resume to check (on other data it would continue another
  // data stream, and its validation loss would measure another set).
  const std::string train_digest = token_digest(*s->train_tokens);
  const std::string val_digest = s->val_tokens ? token_digest(*s->val_tokens) : "none";
  s->data_digest = "data.train " + train_digest + "; data.val " + val_digest;
  if (backend == "elastic") s->elastic.fingerprint = run_fingerprint(cfg, train_digest, val_digest).dump();
  s->val_windows =
      s->val_tokens ? std::min<int64_t>(cfg.train.eval_windows, int64_t(s->val_tokens->size() - 1) / cfg.data.seq_len)
                    : 0;
  if (s->val_tokens && s->val_windows == 0)
    fail(cfg.data.val + ": " + std::to_string(s->val_tokens->size()) + " tokens, fewer than one window of " +
         std::to_string(cfg.data.seq_len + 1) + " (data.seq_len + 1); use more validation text or set data.val = \"\"");
  if (backend == "inprocess" && s->grid.size() > 1 && cfg.train.threads > 1)
    fail("train.threads = " + std::to_string(cfg.train.threads) + " with " + std::to_string(s->grid.size()) +
         " in-process workers: they share one pool of compute threads, so each must use 1 (set train.threads = 0 "
         "or 1)");
  check_memory(*s, backend == "mpi" ? 1 : s->grid.size());
  s->unigram_entropy = unigram_entropy(*s->train_tokens);
  if (s->restoring) check_resumed_data(*s);  // before the resume is recorded or anything is written
  // The reporter holds the run directory's lock for the whole run; a new run never reuses an old
  // run's files unless told to.
  const bool reporter = backend != "mpi" || mpi_env_rank() == s->reporter_rank;
  std::unique_ptr<RunDirLock> lock;
  if (reporter) {
    lock = std::make_unique<RunDirLock>(s->run_dir);
    if (!s->resuming) {
      prepare_new_run_dir(s->run_dir, opt.overwrite);
      write_file_atomic(s->run_dir + "/config.toml", run_config_to_toml(cfg));
      copy_tokenizer(cfg.data.train, s->run_dir);
    }
    record_invocation(*s);
  }
  auto wrap = [&](std::unique_ptr<Transport> t) -> std::shared_ptr<Transport> {
    if (s->link.enabled()) return wrap_with_link(std::move(t), s->link, real_clock());
    return t;
  };
  auto trace = [&](int rank) { return std::make_shared<TraceRecorder>(!opt.trace_path.empty(), rank); };

  if (backend == "mpi") {
    auto t = make_mpi_transport();
    if (t->size() != s->grid.size()) fail("MPI world size differs from the launcher's environment");
    // Other ranks touch the run directory only inside checkpoints, after a barrier.
    const int rank = t->rank();
    TrainSummary sum = run_worker(*s, wrap(std::move(t)), trace(rank));
    finalize_mpi();
    return sum;
  }

  std::vector<std::shared_ptr<Transport>> transports;
  for (auto& t : make_inprocess_transports(s->grid.size())) transports.push_back(wrap(std::move(t)));
  const int N = s->grid.size();
  std::vector<TrainSummary> results(static_cast<size_t>(N));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(N));
  std::vector<std::thread> threads;
  std::string start_error;
  for (int r = 0; r < N; ++r) {
    try {
      threads.emplace_back([&, r] {
        try {
          results[size_t(r)] = run_worker(*s, transports[size_t(r)], trace(r));
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
    } catch (const std::exception& e) {
      // Out of threads (or memory for their stacks): stop the workers already running.
      start_error = "cannot start worker " + std::to_string(r) + " of " + std::to_string(N) + " (" + e.what() +
                    "); lower distributed.replicas or pipeline.stages, or raise the process limits";
      transports[0]->abort(start_error);
      break;
    }
  }
  for (auto& t : threads) t.join();
  if (!start_error.empty()) fail(start_error);
  if (!s->first_error.empty()) fail(s->first_error);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return results[size_t(s->reporter_rank)];
}

}  // namespace loco
