#include "algo/trainer.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "algo/algorithm.h"
#include "comm/inprocess.h"
#include "comm/link.h"
#include "comm/mpi_transport.h"
#include "core/error.h"
#include "core/parallel.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/metrics.h"
#include "io/progress.h"
#include "model/evaluate.h"
#include "optim/schedule.h"
#include "sim/estimate.h"

namespace loco {

namespace {
// Peak resident set of the process (all in-process workers together), from getrusage.
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}
}  // namespace

namespace {

std::shared_ptr<const std::vector<int32_t>> load_tokens(const std::string& path, const ModelConfig& m,
                                                        const std::string& key) {
  if (path.empty()) fail("config: " + key + " is not set");
  auto tf = read_token_file(path);
  if (tf.vocab_size > uint64_t(m.vocab_size))
    fail(path + ": vocabulary size " + std::to_string(tf.vocab_size) + " exceeds model.vocab_size " +
         std::to_string(m.vocab_size));
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

// Everything the workers of one run share (read-only while they run, except first_error).
struct RunSetup {
  RunConfig cfg;
  TrainOptions opt;
  bool resuming = false;
  std::string run_dir, config_path;
  std::shared_ptr<const std::vector<int32_t>> train_tokens, val_tokens;
  int64_t val_windows = 0;
  CommOptions comm;
  LinkConfig link;
  std::string backend;
  double unigram_entropy = 0;
  std::mutex error_mu;
  std::string first_error;  // the failure that stopped the run (in-process)
};

// Evaluation on the algorithm's evaluation parameters, split over the workers (each takes a
// contiguous block of the validation windows); returns the mean loss over all windows.
double distributed_eval(RunSetup& s, Worker& w, const std::vector<float>& params) {
  const int64_t W = s.val_windows, M = w.replicas;
  const int64_t first = W * w.rank / M, count = W * (w.rank + 1) / M - first;
  double local = 0;
  if (count > 0) {
    const int S = s.cfg.data.seq_len;
    const std::vector<int32_t> slice(s.val_tokens->begin() + first * S, s.val_tokens->begin() + (first + count) * S + 1);
    local = windows_loss(w.model, params.data(), slice, S, count, s.cfg.data.batch_size, nullptr) * double(count);
  }
  if (M == 1) return local / double(W);
  return w.comm.sum_doubles({local}, "eval")[0] / double(W);
}

TrainSummary run_worker(RunSetup& s, std::unique_ptr<Transport> transport, std::shared_ptr<TraceRecorder> trace) {
  Communicator comm(std::move(transport), s.comm, trace);
  try {
    const auto& cfg = s.cfg;
    const bool reporter = comm.rank() == 0;
    Worker w(cfg, comm, s.train_tokens);
    auto algo = make_algorithm(cfg, w);
    const auto& layout = w.model.layout();
    const Clock& clock = comm.clock();
    int64_t start_step = 0;
    double elapsed_before = 0;
    if (s.resuming) {
      const std::string ck = latest_checkpoint(s.run_dir);
      if (model_config_to_hf_json(read_hf_config_file(ck + "/config.json")) != model_config_to_hf_json(cfg.model))
        fail(ck + ": the checkpoint's model does not match " + s.config_path);
      const auto run_state = read_state_file(ck + "/state.safetensors");
      if (run_state.get_int("replicas") != w.replicas)
        fail(ck + ": written by " + std::to_string(run_state.get_int("replicas")) + " replicas, resuming with " +
             std::to_string(w.replicas));
      start_step = run_state.get_int("step");
      elapsed_before = run_state.get_double("elapsed_seconds");
      const auto rep = read_state_file(replica_state_path(ck, w.rank));
      rep.take("params", w.params);
      rep.take("optimizer.m", w.adamw.m());
      rep.take("optimizer.v", w.adamw.v());
      w.adamw.set_steps(rep.get_int("optimizer.steps"));
      w.loader.set_position({rep.get_int("data.epoch"), rep.get_int("data.taken")});
      algo->load_state(rep);
    } else {
      w.model.init_params(w.params.data(), uint64_t(cfg.train.seed));  // same seed: identical replicas
    }
    algo->start(w, s.resuming);

    const LrSchedule schedule{cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};
    std::unique_ptr<MetricsLog> metrics;
    if (reporter) metrics = std::make_unique<MetricsLog>(s.run_dir + "/metrics.jsonl", s.resuming ? start_step : -1);
    Progress progress(cfg.train.steps, s.opt.quiet || !reporter);
    // Gradient accumulation: the batch runs as micro-batches through a workspace sized for one.
    const int micro = cfg.train.micro_batch_size > 0 ? cfg.train.micro_batch_size : cfg.data.batch_size;
    const int micro_batches = cfg.data.batch_size / micro;
    Workspace ws(cfg.model, w.model.stage(), micro, cfg.data.seq_len);
    std::vector<int32_t> inputs, targets;
    const int64_t tokens_per_step = int64_t(cfg.data.batch_size) * cfg.data.seq_len * w.replicas;

    TrainSummary sum;
    sum.run_dir = s.run_dir;
    sum.algorithm = cfg.algorithm;
    sum.backend = s.backend;
    sum.replicas = w.replicas;
    sum.unigram_entropy = s.unigram_entropy;
    sum.is_reporter = reporter;
    progress.note(s.resuming ? "resuming " + s.run_dir + " at step " + std::to_string(start_step)
                             : cfg.algorithm + ", " + std::to_string(w.replicas) + " replica(s) (" + s.backend +
                                   "), " + std::to_string(layout.size()) + " parameters, " +
                                   std::to_string(cfg.train.steps) + " steps of " + std::to_string(tokens_per_step) +
                                   " tokens; unigram entropy of the training tokens " + fmt(s.unigram_entropy) +
                                   " nats");

    double eval_seconds = 0, checkpoint_seconds = 0;
    auto save = [&](int64_t step, double elapsed) {
      const double t0 = clock.now();
      if (reporter) begin_checkpoint(s.run_dir, step);
      comm.barrier();
      TrainingState rep;
      rep.tensors["params"] = w.params;
      rep.tensors["optimizer.m"] = w.adamw.m();
      rep.tensors["optimizer.v"] = w.adamw.v();
      const auto pos = w.loader.position();
      rep.meta = {{"optimizer.steps", std::to_string(w.adamw.steps())},
                  {"data.epoch", std::to_string(pos.epoch)},
                  {"data.taken", std::to_string(pos.taken)}};
      algo->save_state(rep);
      const std::vector<float>& eval_params = algo->eval_params(w);
      char name[32];
      std::snprintf(name, sizeof name, "step_%08lld.tmp", (long long)step);
      write_state_file(replica_state_path(s.run_dir + "/checkpoints/" + name, w.rank), rep);
      comm.barrier();
      if (reporter) {
        TrainingState run_state;
        run_state.meta = {{"step", std::to_string(step)},
                          {"elapsed_seconds", fmt(elapsed, "%.17g")},
                          {"replicas", std::to_string(w.replicas)},
                          {"algorithm", cfg.algorithm}};
        sum.checkpoint = commit_checkpoint(s.run_dir, step, cfg.model, layout, eval_params.data(), run_state);
      }
      checkpoint_seconds += clock.now() - t0;
    };

    const double t_start = clock.now();
    auto elapsed = [&] { return elapsed_before + clock.now() - t_start; };
    double loss_sum = 0, last_loss = 0, last_log_time = t_start, backward_seconds = 0;
    int64_t steps_run = 0;
    int64_t loss_count = 0;
    for (int64_t step = start_step; step < cfg.train.steps; ++step) {
      const double lr = schedule.at(step);
      const double t0 = clock.now();
      std::fill(w.grads.begin(), w.grads.end(), 0.0f);
      w.loader.next(inputs, targets);
      double loss = 0;
      const int64_t window_tokens = int64_t(micro) * cfg.data.seq_len;
      for (int mb = 0; mb < micro_batches; ++mb) {
        const int32_t* in = inputs.data() + mb * window_tokens;
        const int32_t* tg = targets.data() + mb * window_tokens;
        const double mb_loss = w.model.forward(w.params.data(), in, nullptr, tg, ws);
        if (!std::isfinite(mb_loss))
          fail("non-finite training loss at step " + std::to_string(step + 1) + " on replica " +
               std::to_string(w.rank) + " (lower optimizer.lr?); stopped before the update");
        loss += mb_loss / micro_batches;
        const double tb = clock.now();
        w.model.backward(w.params.data(), w.grads.data(), in, tg, 1.0 / micro_batches, nullptr, nullptr, ws,
                         &w.trainable);
        backward_seconds += clock.now() - tb;
      }
      const double t1 = clock.now();
      ++steps_run;
      trace->span("forward+backward", "compute", w.rank, 0, t0, t1);
      algo->on_gradients(w);
      const double t2 = clock.now();
      const double grad_norm = clip_grad_norm(w.grads.data(), int64_t(w.grads.size()), cfg.optim.clip);
      if (!std::isfinite(grad_norm)) fail("non-finite gradient norm at step " + std::to_string(step + 1));
      w.adamw.step(w.params.data(), w.grads.data(), lr);
      const double t3 = clock.now();
      trace->span("optimizer", "compute", w.rank, 0, t2, t3);
      const int64_t done = step + 1;
      const bool last = done == cfg.train.steps;
      const double wait_before = comm.wait_seconds();
      algo->after_step(w, done, last);
      const double t4 = clock.now();
      // Outer updates are compute; time blocked on the network inside after_step is not.
      w.compute_seconds += (t1 - t0) + (t3 - t2) + std::max(0.0, (t4 - t3) - (comm.wait_seconds() - wait_before));

      loss_sum += loss;
      ++loss_count;
      const bool do_eval =
          s.val_windows > 0 && (last || (cfg.train.eval_interval > 0 && done % cfg.train.eval_interval == 0));
      double val_loss = -1;
      if (do_eval) {
        const double e0 = clock.now();
        val_loss = distributed_eval(s, w, algo->eval_params(w));
        eval_seconds += clock.now() - e0;
        sum.final_val_loss = val_loss;
      }
      if (reporter && (done % cfg.train.log_interval == 0 || last || do_eval)) {
        const double now = clock.now();
        const double dt = now - last_log_time;
        last_log_time = now;
        last_loss = loss_sum / double(loss_count);
        nlohmann::json rec = {{"step", done},
                              {"tokens", done * tokens_per_step},
                              {"train_loss", last_loss},
                              {"lr", lr},
                              {"grad_norm", grad_norm},
                              {"time", elapsed()},
                              {"bytes_sent", comm.traffic().bytes_sent()},
                              {"comm_wait", comm.wait_seconds()}};
        if (do_eval) rec["val_loss"] = val_loss;
        metrics->write(rec);
        const double tps = double(loss_count * tokens_per_step) / std::max(dt, 1e-9);
        progress.update(done, last_loss, tps, double(cfg.train.steps - done) * dt / double(loss_count),
                        "sent " + human_bytes(double(comm.traffic().bytes_sent())) +
                            (do_eval ? " | val " + fmt(val_loss) : ""));
        if (do_eval)
          progress.note("step " + std::to_string(done) + ": train loss " + fmt(last_loss) + ", val loss " +
                        fmt(val_loss));
      }
      if (done % cfg.train.log_interval == 0 || last || do_eval) {
        loss_sum = 0;
        loss_count = 0;
      }
      const bool pause = done == s.opt.until;
      if (last || pause || (cfg.train.checkpoint_interval > 0 && done % cfg.train.checkpoint_interval == 0))
        save(done, elapsed());
      if (pause) {
        progress.note("stopped after step " + std::to_string(done) + " (--until); continue with --resume " +
                      s.run_dir);
        break;
      }
    }
    progress.finish();
    const double wall = clock.now() - t_start;

    // Accounting snapshot, taken before the (small) exchange that reports it.
    const double busy = std::max(1e-9, wall - eval_seconds - checkpoint_seconds);
    nlohmann::json me = comm.traffic().to_json();
    me["rank"] = w.rank;
    me["compute_s"] = w.compute_seconds;
    me["comm_wait_s"] = comm.wait_seconds();
    me["eval_s"] = eval_seconds;
    me["checkpoint_s"] = checkpoint_seconds;
    me["wall_s"] = wall;
    me["compute_utilization"] = w.compute_seconds / busy;
    // What this replica holds and computes (partial updates shrink all but the parameters).
    const auto flops = sim::step_flops(sim::arch_of(cfg.model), cfg.data.batch_size, cfg.data.seq_len,
                                       {cfg.partial.slices, cfg.partial.strategy});
    me["trainable_params"] = w.trainable.size();
    me["param_bytes"] = int64_t(w.params.size() * sizeof(float));
    me["grad_bytes"] = int64_t(w.grads.size() * sizeof(float));
    me["optimizer_bytes"] = int64_t((w.adamw.m().size() + w.adamw.v().size()) * sizeof(float));
    me["backward_flops_per_step"] = flops.backward();
    me["backward_s_per_step"] = steps_run > 0 ? backward_seconds / double(steps_run) : 0.0;
    me["peak_rss_bytes"] = peak_rss_bytes();
    // Bytes of the training method itself (not evaluation, checkpoint barriers or this report).
    int64_t train_bytes = 0;
    for (const auto& [op, v] : me["by_operation"].items())
      if (op == "gradients" || op == "outer_gradients") train_bytes += v["bytes_sent"].get<int64_t>();
    me["train_bytes_sent"] = train_bytes;
    algo->report(me);
    const auto all = comm.all_gather(me.dump(), "report");
    if (trace->enabled()) {
      const auto traces = comm.all_gather(trace->events().dump(), "report");
      if (reporter) {
        nlohmann::json events = nlohmann::json::array();
        for (const auto& t : traces)
          for (auto& e : nlohmann::json::parse(t)) events.push_back(std::move(e));
        write_file_atomic(s.opt.trace_path, nlohmann::json{{"traceEvents", events}}.dump() + "\n");
      }
    }
    sum.workers = nlohmann::json::array();
    for (const auto& a : all) sum.workers.push_back(nlohmann::json::parse(a));
    if (sum.checkpoint.empty() && reporter) sum.checkpoint = latest_checkpoint(s.run_dir);
    sum.steps = s.opt.until > 0 ? std::min(s.opt.until, cfg.train.steps) : cfg.train.steps;
    sum.tokens = sum.steps * tokens_per_step;
    sum.final_train_loss = last_loss;
    sum.seconds = elapsed();
    if (reporter) write_file_atomic(s.run_dir + "/summary.json", nlohmann::json{{"workers", sum.workers},
                                                                                 {"steps", sum.steps},
                                                                                 {"tokens", sum.tokens},
                                                                                 {"final_val_loss", sum.final_val_loss},
                                                                                 {"final_train_loss", last_loss},
                                                                                 {"algorithm", cfg.algorithm},
                                                                                 {"replicas", w.replicas},
                                                                                 {"backend", s.backend},
                                                                                 {"seconds", sum.seconds}}
                                                                          .dump(2) + "\n");
    return sum;
  } catch (const std::exception& e) {
    const std::string reason = "worker " + std::to_string(comm.rank()) + " failed: " + e.what();
    {
      std::lock_guard<std::mutex> lock(s.error_mu);
      if (s.first_error.empty()) s.first_error = e.what();
    }
    comm.abort(reason);
    throw;
  }
}

}  // namespace

TrainSummary run_training(const TrainOptions& opt) {
  auto s = std::make_unique<RunSetup>();
  s->opt = opt;
  s->resuming = !opt.resume_dir.empty();
  if (s->resuming && !opt.config_path.empty()) fail("give either --config or --resume, not both");
  if (!s->resuming && opt.config_path.empty()) fail("--config is required (or --resume RUN_DIR)");
  if (opt.until < 0) fail("--until must be >= 1");
  s->config_path = s->resuming ? opt.resume_dir + "/config.toml" : opt.config_path;
  if (s->resuming && !file_exists(s->config_path)) fail(opt.resume_dir + ": not a run directory (no config.toml)");
  s->cfg = load_run_config(s->config_path, opt.overrides);
  const auto& cfg = s->cfg;
  s->run_dir = s->resuming ? opt.resume_dir : cfg.train.out_dir;

  std::string backend = cfg.distributed.backend;
  if (backend == "auto") backend = launched_by_mpi() ? "mpi" : "inprocess";
  if (backend == "mpi" && !launched_by_mpi()) fail("distributed.backend = \"mpi\" needs a launcher: mpirun -np M loco train ...");
  const int M = backend == "mpi" ? mpi_env_size() : cfg.distributed.replicas;
  if (backend == "mpi" && cfg.distributed.replicas != 1 && cfg.distributed.replicas != M)
    fail("distributed.replicas is " + std::to_string(cfg.distributed.replicas) + " but mpirun started " +
         std::to_string(M) + " processes");
  s->backend = backend;
  const int local_workers = backend == "mpi" ? mpi_env_local_size() : M;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  set_compute_threads(cfg.train.threads > 0 ? cfg.train.threads : std::max(1, cores / local_workers));

  s->comm.timeout_s = parse_duration(cfg.network.timeout, "network.timeout");
  s->comm.peak_window_s = parse_duration(cfg.network.peak_window, "network.peak_window");
  s->link = {parse_bandwidth(cfg.network.bandwidth, "network.bandwidth"),
             parse_duration(cfg.network.latency, "network.latency")};
  s->train_tokens = load_tokens(cfg.data.train, cfg.model, "data.train");
  if (!cfg.data.val.empty()) s->val_tokens = load_tokens(cfg.data.val, cfg.model, "data.val");
  s->val_windows =
      s->val_tokens ? std::min<int64_t>(cfg.train.eval_windows, int64_t(s->val_tokens->size() - 1) / cfg.data.seq_len)
                    : 0;
  s->unigram_entropy = unigram_entropy(*s->train_tokens, cfg.model.vocab_size);
  const bool reporter = backend != "mpi" || mpi_env_rank() == 0;
  if (!s->resuming && reporter) {
    make_dirs(s->run_dir);
    write_file_atomic(s->run_dir + "/config.toml", run_config_to_toml(cfg));
    copy_tokenizer(cfg.data.train, s->run_dir);
  }
  auto wrap = [&](std::unique_ptr<Transport> t) {
    return s->link.enabled() ? wrap_with_link(std::move(t), s->link, real_clock()) : std::move(t);
  };
  auto trace = [&] { return std::make_shared<TraceRecorder>(!opt.trace_path.empty()); };

  if (backend == "mpi") {
    auto t = make_mpi_transport();
    if (t->size() != M) fail("MPI world size differs from the launcher's environment");
    // Ranks other than 0 touch the run directory only inside checkpoints, after a barrier.
    TrainSummary sum = run_worker(*s, wrap(std::move(t)), trace());
    finalize_mpi();
    return sum;
  }

  auto transports = make_inprocess_transports(M);
  std::vector<TrainSummary> results(static_cast<size_t>(M));
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(M));
  for (int r = 0; r < M; ++r) {
    threads.emplace_back([&, r] {
      try {
        results[size_t(r)] = run_worker(*s, wrap(std::move(transports[size_t(r)])), trace());
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!s->first_error.empty()) fail(s->first_error);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return results[0];
}

}  // namespace loco
