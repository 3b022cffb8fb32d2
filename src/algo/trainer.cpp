#include "algo/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/parallel.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/metrics.h"
#include "io/progress.h"
#include "io/train_state.h"
#include "model/evaluate.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

namespace loco {

namespace {

using Clock = std::chrono::steady_clock;

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

}  // namespace

TrainSummary run_training(const TrainOptions& opt) {
  const bool resuming = !opt.resume_dir.empty();
  if (resuming && !opt.config_path.empty()) fail("give either --config or --resume, not both");
  if (!resuming && opt.config_path.empty()) fail("--config is required (or --resume RUN_DIR)");
  if (opt.until < 0) fail("--until must be >= 1");
  const std::string config_path = resuming ? opt.resume_dir + "/config.toml" : opt.config_path;
  if (resuming && !file_exists(config_path)) fail(opt.resume_dir + ": not a run directory (no config.toml)");
  RunConfig cfg = load_run_config(config_path, opt.overrides);
  const std::string run_dir = resuming ? opt.resume_dir : cfg.train.out_dir;
  if (cfg.train.threads > 0) set_compute_threads(cfg.train.threads);

  Transformer model(cfg.model);
  const auto& layout = model.layout();
  auto train_tokens = load_tokens(cfg.data.train, cfg.model, "data.train");
  std::shared_ptr<const std::vector<int32_t>> val_tokens;
  if (!cfg.data.val.empty()) val_tokens = load_tokens(cfg.data.val, cfg.model, "data.val");
  const int64_t val_windows =
      val_tokens ? std::min<int64_t>(cfg.train.eval_windows, int64_t(val_tokens->size() - 1) / cfg.data.seq_len) : 0;

  std::vector<float> params(size_t(layout.size())), grads(params.size());
  AdamW adamw(cfg.optim.adamw, layout);
  DataLoader loader(train_tokens, cfg.data.seq_len, cfg.data.batch_size, 0, 1, uint64_t(cfg.data.seed));
  int64_t start_step = 0;
  double elapsed_before = 0;

  if (resuming) {
    const std::string ck = latest_checkpoint(run_dir);
    const auto loaded = load_model_checkpoint(ck);
    if (model_config_to_hf_json(loaded.config) != model_config_to_hf_json(cfg.model))
      fail(ck + ": the checkpoint's model does not match " + config_path);
    params = loaded.params;
    auto st = read_training_state(ck);
    start_step = st.get_int("step");
    adamw.set_steps(st.get_int("optimizer.steps"));
    loader.set_position({st.get_int("data.epoch"), st.get_int("data.taken")});
    elapsed_before = st.get_double("elapsed_seconds");
    const std::pair<const char*, std::vector<float>*> moments[] = {{"optimizer.m", &adamw.m()},
                                                                   {"optimizer.v", &adamw.v()}};
    for (const auto& [name, buf] : moments) {
      auto it = st.tensors.find(name);
      if (it == st.tensors.end() || it->second.size() != buf->size())
        fail(ck + "/state.safetensors: missing or wrong-size tensor " + name);
      *buf = it->second;
    }
  } else {
    make_dirs(run_dir);
    write_file_atomic(run_dir + "/config.toml", run_config_to_toml(cfg));
    copy_tokenizer(cfg.data.train, run_dir);
    model.init_params(params.data(), uint64_t(cfg.train.seed));
  }

  const LrSchedule schedule{cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};
  MetricsLog metrics(run_dir + "/metrics.jsonl", resuming ? start_step : -1);
  Progress progress(cfg.train.steps, opt.quiet);
  Workspace ws(cfg.model, model.stage(), cfg.data.batch_size, cfg.data.seq_len);
  std::vector<int32_t> inputs, targets;
  const int64_t tokens_per_step = int64_t(cfg.data.batch_size) * cfg.data.seq_len;

  TrainSummary sum;
  sum.run_dir = run_dir;
  sum.unigram_entropy = unigram_entropy(*train_tokens, cfg.model.vocab_size);
  if (!resuming)
    progress.note("training " + std::to_string(layout.size()) + " parameters for " +
                  std::to_string(cfg.train.steps) + " steps of " + std::to_string(tokens_per_step) +
                  " tokens; unigram entropy of the training tokens " + fmt(sum.unigram_entropy) + " nats");
  else
    progress.note("resuming " + run_dir + " at step " + std::to_string(start_step));

  auto evaluate = [&] {
    return windows_loss(model, params.data(), *val_tokens, cfg.data.seq_len, val_windows, cfg.data.batch_size,
                        nullptr);
  };
  auto save = [&](int64_t step, double elapsed) {
    TrainingState st;
    st.tensors["optimizer.m"] = adamw.m();
    st.tensors["optimizer.v"] = adamw.v();
    const auto pos = loader.position();
    st.meta = {{"step", std::to_string(step)},
               {"optimizer.steps", std::to_string(adamw.steps())},
               {"data.epoch", std::to_string(pos.epoch)},
               {"data.taken", std::to_string(pos.taken)},
               {"elapsed_seconds", fmt(elapsed, "%.17g")}};
    return write_training_checkpoint(run_dir, step, cfg.model, layout, params.data(), st);
  };

  const auto t0 = Clock::now();
  auto elapsed = [&] { return elapsed_before + std::chrono::duration<double>(Clock::now() - t0).count(); };
  double loss_sum = 0, last_loss = 0;
  int64_t loss_count = 0;
  auto last_log_time = Clock::now();
  for (int64_t step = start_step; step < cfg.train.steps; ++step) {
    const double lr = schedule.at(step);
    std::fill(grads.begin(), grads.end(), 0.0f);
    loader.next(inputs, targets);
    const double loss = model.forward(params.data(), inputs.data(), nullptr, targets.data(), ws);
    if (!std::isfinite(loss))
      fail("non-finite training loss at step " + std::to_string(step + 1) + " (lower optimizer.lr?); stopped before "
           "the update, the last checkpoint is intact");
    model.backward(params.data(), grads.data(), inputs.data(), targets.data(), 1.0, nullptr, nullptr, ws);
    const double grad_norm = clip_grad_norm(grads.data(), int64_t(grads.size()), cfg.optim.clip);
    if (!std::isfinite(grad_norm)) fail("non-finite gradient norm at step " + std::to_string(step + 1));
    adamw.step(params.data(), grads.data(), lr);
    loss_sum += loss;
    ++loss_count;
    const int64_t done = step + 1;
    const bool last = done == cfg.train.steps;
    const bool do_eval = val_windows > 0 && (last || (cfg.train.eval_interval > 0 && done % cfg.train.eval_interval == 0));
    if (done % cfg.train.log_interval == 0 || last || do_eval) {
      const double now = elapsed();
      const double dt = std::chrono::duration<double>(Clock::now() - last_log_time).count();
      last_log_time = Clock::now();
      last_loss = loss_sum / double(loss_count);
      nlohmann::json rec = {{"step", done},          {"tokens", done * tokens_per_step},
                            {"train_loss", last_loss}, {"lr", lr},
                            {"grad_norm", grad_norm},  {"time", now}};
      std::string extra;
      if (do_eval) {
        const double vl = evaluate();
        rec["val_loss"] = vl;
        sum.final_val_loss = vl;
        extra = "val " + fmt(vl);
      }
      metrics.write(rec);
      const double tps = double(loss_count * tokens_per_step) / std::max(dt, 1e-9);
      progress.update(done, last_loss, tps, double(cfg.train.steps - done) * dt / double(loss_count), extra);
      if (do_eval)
        progress.note("step " + std::to_string(done) + ": train loss " + fmt(last_loss) + ", val loss " + fmt(sum.final_val_loss));
      loss_sum = 0;
      loss_count = 0;
    }
    const bool pause = done == opt.until;
    if (last || pause || (cfg.train.checkpoint_interval > 0 && done % cfg.train.checkpoint_interval == 0))
      sum.checkpoint = save(done, elapsed());
    if (pause) {
      progress.note("stopped after step " + std::to_string(done) + " (--until); continue with --resume " + run_dir);
      break;
    }
  }
  progress.finish();
  if (sum.checkpoint.empty()) sum.checkpoint = latest_checkpoint(run_dir);
  sum.steps = opt.until > 0 ? std::min(opt.until, cfg.train.steps) : cfg.train.steps;
  sum.tokens = sum.steps * tokens_per_step;
  sum.final_train_loss = last_loss;
  sum.seconds = elapsed();
  return sum;
}

}  // namespace loco
