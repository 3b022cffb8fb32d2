#include "algo/run_config.h"

#include "comm/link.h"
#include "core/error.h"
#include "pipeline/grid.h"

namespace loco {

ConfigSchema run_config_schema(RunConfig& cfg) {
  ConfigSchema s;
  s.add("algorithm", &cfg.algorithm,
        "training method: ddp (gradient all-reduce every step), diloco, streaming (Streaming DiLoCo), noloco "
        "(random-group outer steps, no collective)",
        method_names());
  auto& m = cfg.model;
  s.add("model.vocab_size", &m.vocab_size, "vocabulary size V (must cover the data's token ids)", 2);
  s.add("model.hidden_size", &m.hidden_size, "model width d", 2);
  s.add("model.num_layers", &m.num_layers, "number of transformer blocks L", 1);
  s.add("model.num_heads", &m.num_heads, "attention heads (head size d / heads, even)", 1);
  s.add("model.num_kv_heads", &m.num_kv_heads,
        "key/value heads, each shared by num_heads / num_kv_heads query heads (grouped-query attention); 0: "
        "num_heads",
        0);
  s.add("model.intermediate_size", &m.intermediate_size, "SwiGLU hidden size f", 1);
  s.add("model.max_seq_len", &m.max_seq_len, "longest sequence the model accepts", 1);
  s.add("model.tie_embeddings", &m.tie_embeddings, "output head shares the token embedding matrix");
  s.add("model.qk_norm", &m.qk_norm, "RMSNorm over each head's q and k before RoPE");
  s.add("model.rms_eps", &m.rms_eps, "RMSNorm epsilon", 1e-12, 0.1);
  s.add("model.rope_theta", &m.rope_theta, "RoPE base", 1.0001, 1e9);
  s.add("model.z_loss", &m.z_loss, "z-loss coefficient c in c * mean(logsumexp^2); 0 disables", 0.0, 1.0);
  s.add("model.init_std", &m.init_std, "std of the normal init of matrices", 1e-6, 1.0);
  s.add("model.scale_residual_init", &m.scale_residual_init, "scale o_proj/down_proj init by 1/sqrt(2L)");

  auto& d = cfg.data;
  s.add("data.train", &d.train, "training token file (LOCOTOKS, from loco data prepare)");
  s.add("data.val", &d.val, "validation token file (\"\": no evaluation)");
  s.add("data.seq_len", &d.seq_len, "tokens per window", 1);
  s.add("data.batch_size", &d.batch_size, "windows per replica per step", 1);
  s.add("data.seed", &d.seed, "seed of the data order", 0);

  auto& o = cfg.optim;
  s.add("optimizer.lr", &o.lr, "peak learning rate (after warmup)", 0.0, 10.0);
  s.add("optimizer.min_lr", &o.min_lr, "learning rate at the end of the cosine decay", 0.0, 10.0);
  s.add("optimizer.warmup_steps", &o.warmup_steps, "linear warmup steps", 0);
  s.add("optimizer.beta1", &o.adamw.beta1, "AdamW beta1", 0.0, 0.999999);
  s.add("optimizer.beta2", &o.adamw.beta2, "AdamW beta2", 0.0, 0.999999);
  s.add("optimizer.eps", &o.adamw.eps, "AdamW epsilon", 1e-30, 1.0);
  s.add("optimizer.weight_decay", &o.adamw.weight_decay, "decoupled weight decay", 0.0, 10.0);
  s.add("optimizer.decay_embeddings", &o.adamw.decay_embeddings, "apply weight decay to embeddings and lm_head");
  s.add("optimizer.decay_norms", &o.adamw.decay_norms, "apply weight decay to norm weights");
  s.add("optimizer.clip", &o.clip, "global gradient-norm clipping threshold (0: off)", 0.0, 1e9);
  s.add("optimizer.clip_scope", &o.clip_scope,
        "norm that clipping uses with pipeline stages: model (over all stages, one small exchange) or stage (each "
        "stage its own, as the NoLoCo paper's code)", {"model", "stage"});

  auto& t = cfg.train;
  s.add("train.steps", &t.steps, "optimizer steps to train for", 1);
  s.add("train.seed", &t.seed, "seed of the parameter initialization", 0);
  s.add("train.log_interval", &t.log_interval, "steps between metric lines", 1);
  s.add("train.eval_interval", &t.eval_interval, "steps between validation evaluations (0: only at the end)", 0);
  s.add("train.eval_windows", &t.eval_windows, "validation windows evaluated (from the start of data.val)", 1);
  s.add("train.checkpoint_interval", &t.checkpoint_interval,
        "steps between checkpoints (0: only at the end; a multiple of log_interval)", 0);
  s.add("train.keep_checkpoints", &t.keep_checkpoints, "newest checkpoints kept in the run directory (0: all)", 0);
  s.add("train.out_dir", &t.out_dir, "run directory: config, metrics, checkpoints");
  s.add("train.tensorboard", &t.tensorboard,
        "also write TensorBoard event files (loss, lr, grad norm, tokens/s, bytes sent, CU) into the run directory");
  s.add("train.threads", &t.threads, "compute threads per worker (0: cores / workers on this host)", 0, 1024);
  s.add("train.precision", &t.precision,
        "matrix products: fp32 (through train.matmul_library), bf16 (bf16 operands, fp32 accumulation, "
        "through oneDNN; weights, optimizer state, norms, softmax and losses stay fp32), or auto (bf16 where the "
        "CPU has AVX512-BF16 or AMX-BF16, else fp32)",
        {"fp32", "bf16", "auto"});
  s.add("train.matmul_library", &t.matmul_library,
        "library of the model's fp32 matrix products: openblas, onednn, or auto (oneDNN where the CPU has "
        "AVX-512, where it measured faster, else OpenBLAS); bf16 products always run through oneDNN",
        {"auto", "openblas", "onednn"});
  s.add("train.micro_batch_size", &t.micro_batch_size,
        "gradient accumulation: windows per forward/backward, dividing data.batch_size (0: the whole batch)", 0);

  auto& dc = cfg.distributed;
  s.add("distributed.replicas", &dc.replicas, "data-parallel replicas M (in-process workers; MPI: the world size)", 1,
        4096);
  s.add("distributed.backend", &dc.backend,
        "transport: auto (mpi under mpirun, elastic with --join, else inprocess), inprocess, mpi, elastic",
        {"auto", "inprocess", "mpi", "elastic"});
  auto& el = cfg.elastic;
  s.add("elastic.min_workers", &el.min_workers, "elastic: members the first outer round waits for", 1, 4096);
  s.add("elastic.timeout", &el.timeout,
        "elastic: a member silent this long (heartbeat, or a wait on it during a sync) is dropped, e.g. \"5s\"");
  s.add("elastic.start_timeout", &el.start_timeout,
        "elastic: longest wait for elastic.min_workers at the start, or for a joiner to be taken in");
  s.add("elastic.straggler_timeout", &el.straggler_timeout,
        "elastic: longest wait for a live member to reach an outer round before it is dropped");
  s.add("elastic.coordinator_timeout", &el.coordinator_timeout,
        "elastic: how long workers retry while Redis is unreachable before stopping");
  s.add("elastic.address", &el.address,
        "elastic: the address other workers reach this one at (\"\": the host name)");
  s.add("elastic.password_file", &el.password_file,
        "elastic: file holding the Redis password (\"\": $LOCO_REDIS_PASSWORD, or no password)");
  s.add("elastic.secret_file", &el.secret_file,
        "elastic: file holding the run secret that authenticates and encrypts the members' traffic "
        "(\"\": $LOCO_RUN_SECRET)");
  s.add("elastic.exclude_after", &el.exclude_after,
        "elastic: a member blamed by its peers for this many failed attempts of a round in a row, more than any "
        "other, is excluded from the run (a joiner whose transfer fails is refused at once)",
        1, 1000);
  s.add("elastic.fault", &el.fault,
        "elastic, for robustness tests: this member corrupts its DiLoCo and Streaming DiLoCo contributions: \"\" (none), \"nan\", "
        "\"inf\", \"noise\" (Gaussian, the outer gradient's norm) or \"scale:X\" (its outer gradient times X)");

  auto& n = cfg.network;
  s.add("network.bandwidth", &n.bandwidth, "emulated outgoing link per worker, e.g. \"100Mbit\" (\"inf\": none)");
  s.add("network.latency", &n.latency, "emulated one-way latency, e.g. \"30ms\"");
  s.add("network.tcp", &n.tcp,
        "emulate TCP on the link: header overhead, slow start per connection, restart after idle (false: an ideal "
        "pipe of the given bandwidth)");
  s.add("network.timeout", &n.timeout, "longest wait on a peer before the run fails, e.g. \"60s\"");
  s.add("network.peak_window", &n.peak_window, "window over which the peak send rate is measured");
  s.add("network.compute_jitter", &n.compute_jitter,
        "sigma: emulated stragglers; each worker's every inner step takes exp(sigma |Z|) times its compute, Z ~ "
        "N(0, 1) drawn per worker and step, at most 20 times (0: off)", 0.0, 2.0);

  // Each method's sections, declared by the method (diloco.cpp, streaming.cpp, partial.cpp, noloco.cpp).
  add_outer_keys(s, cfg.outer);
  add_streaming_keys(s, cfg.streaming);
  add_partial_keys(s, cfg.partial);
  add_noloco_keys(s, cfg.noloco);
  auto& pp = cfg.pipeline;
  s.add("pipeline.stages", &pp.stages,
        "S: pipeline stages, each a contiguous group of blocks on its own worker (S x replicas workers)", 1, 1024);
  s.add("pipeline.microbatches", &pp.microbatches,
        "m: microbatches per step, dividing data.batch_size (0: from train.micro_batch_size, else 1)", 0);
  s.add("pipeline.schedule", &pp.schedule, "microbatch schedule: 1f1b (at most S in flight) or gpipe (all m)",
        {"1f1b", "gpipe"});
  s.add("pipeline.split", &pp.split, "blocks per stage, e.g. \"2,4\" (\"\": balanced by parameter count)");
  auto& pr = cfg.protocol;
  s.add("protocol.rank", &pr.rank,
        "k: protocol models, every write into the residual stream before the last stage boundary is kept in a "
        "k-dimensional subspace and boundaries carry k numbers per token (0: off)", 0, 1 << 20);
  s.add("protocol.seed", &pr.seed, "seed of the subspace U and the frozen embedding E_fixed (shared by every worker)");
  s.add("protocol.constraint", &pr.constraint,
        "how weights stay in the subspace: project (W <- U U^T W after every optimizer step) or subspace-adamw "
        "(second moment shared along the output dimension, no projection)", {"project", "subspace-adamw"});
  s.add("protocol.compress", &pr.compress,
        "send the k subspace coordinates across boundaries (false: the full d, same results; for checking)");
  s.add("protocol.fixed_std", &pr.fixed_std, "standard deviation of the frozen embedding part E_fixed", 0.0, 1e6);
  s.add("protocol.grassmann_interval", &pr.grassmann_interval,
        "T_U: optimizer steps between Grassmann updates of the subspace (0: U stays fixed)", 0);
  s.add("protocol.grassmann_lr", &pr.grassmann_lr, "eta: Grassmann step size on A normalised to unit trace", 0.0,
        1e6);
  return s;
}

int RunConfig::microbatches() const {
  if (pipeline.microbatches > 0) return pipeline.microbatches;
  if (train.micro_batch_size > 0) return data.batch_size / train.micro_batch_size;
  return 1;
}

void validate_run_config(const RunConfig& c, const std::string& source) {
  c.model.validate(source);
  const ConfigCheck need{source};
  need(c.data.seq_len <= c.model.max_seq_len, "data.seq_len (" + std::to_string(c.data.seq_len) +
                                                  ") exceeds model.max_seq_len (" +
                                                  std::to_string(c.model.max_seq_len) + ")");
  need(c.optim.min_lr <= c.optim.lr, "optimizer.min_lr must be <= optimizer.lr");
  need(c.train.checkpoint_interval % c.train.log_interval == 0,
       "train.checkpoint_interval must be a multiple of train.log_interval");
  need(!c.train.out_dir.empty(), "train.out_dir must not be empty");
  need(c.train.micro_batch_size == 0 || c.data.batch_size % c.train.micro_batch_size == 0,
       "train.micro_batch_size (" + std::to_string(c.train.micro_batch_size) + ") must divide data.batch_size (" +
           std::to_string(c.data.batch_size) + ")");
  need(c.pipeline.microbatches == 0 || c.data.batch_size % c.pipeline.microbatches == 0,
       "pipeline.microbatches (" + std::to_string(c.pipeline.microbatches) + ") must divide data.batch_size (" +
           std::to_string(c.data.batch_size) + ")");
  need(c.pipeline.microbatches == 0 || c.train.micro_batch_size == 0 ||
           c.train.micro_batch_size * c.pipeline.microbatches == c.data.batch_size,
       "train.micro_batch_size and pipeline.microbatches disagree (set one of them)");
  need(c.pipeline.stages <= c.model.num_layers, "pipeline.stages (" + std::to_string(c.pipeline.stages) +
                                                    ") exceeds model.num_layers (" +
                                                    std::to_string(c.model.num_layers) +
                                                    "): every stage needs at least one block");
  if (!c.pipeline.split.empty()) parse_split(c.pipeline.split, c.pipeline.stages, c.model.num_layers, source + ": pipeline.split");
  parse_bandwidth(c.network.bandwidth, source + ": network.bandwidth");
  parse_latency(c.network.latency, source + ": network.latency");
  parse_timeout(c.network.timeout, source + ": network.timeout");
  parse_timeout(c.network.peak_window, source + ": network.peak_window");
  need(c.optim.clip_scope == "model" || !c.model.tie_embeddings || c.pipeline.stages == 1,
       "optimizer.clip_scope = \"stage\" with a tied embedding on two stages would scale its two copies "
       "differently: untie it (model.tie_embeddings = false) or clip over the model");
  for (const auto* k : {&c.elastic.timeout, &c.elastic.start_timeout, &c.elastic.straggler_timeout,
                        &c.elastic.coordinator_timeout})
    parse_timeout(*k, source + ": elastic timeouts");
  // What elastic runs cannot do is said by the methods and the session (elastic_options).
  if (c.protocol.rank > 0) {
    const auto& p = c.protocol;
    need(p.rank < c.model.hidden_size, "protocol.rank (" + std::to_string(p.rank) + ") must be below model.hidden_size (" +
                                           std::to_string(c.model.hidden_size) + ")");
    need(c.pipeline.stages >= 2, "protocol.rank needs pipeline.stages >= 2 (it compresses stage boundaries)");
    need(!c.model.tie_embeddings, "protocol.rank needs an untied head (model.tie_embeddings = false): a head tied to "
                                  "E = E_fixed + E_s U^T would be mostly the frozen random E_fixed");
    need(c.partial.slices == 1, "protocol.rank with partial.slices > 1 is not supported");
    need(c.method() != MethodId::Streaming || c.outer.codec == "fp32",
         "protocol.rank with a quantized outer.codec is not supported (quantized outer updates leave the subspace)");
    need(p.grassmann_interval == 0 || c.method() == MethodId::Ddp,
         "protocol.grassmann_interval > 0 needs algorithm = \"ddp\" (the outer state of " + c.algorithm +
             " is not moved to a new subspace)");
  }
  // Each method's sections, checked by the method.
  check_outer_config(c, need);
  check_streaming_config(c, need);
  check_partial_config(c, need);
  check_noloco_config(c, need);
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  RunConfig cfg;
  auto schema = run_config_schema(cfg);
  if (!path.empty()) schema.load_toml_file(path);
  for (const auto& o : overrides) schema.apply_override(o);
  validate_run_config(cfg, config_source(path, overrides));
  return cfg;
}

std::string config_source(const std::string& path, const std::vector<std::string>& overrides) {
  std::string s = path.empty() ? "config" : path;
  for (size_t i = 0; i < overrides.size(); ++i) s += (i == 0 ? " with --set " : ", ") + overrides[i];
  return s;
}

std::string run_config_to_toml(RunConfig cfg) { return run_config_schema(cfg).print(); }

ModelConfig read_model_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    if (!overrides.empty()) fail("--set applies to TOML configs only");
    return read_hf_config_file(path);
  }
  RunConfig cfg;
  auto schema = run_config_schema(cfg);
  schema.load_toml_file(path);
  for (const auto& o : overrides) schema.apply_override(o);
  cfg.model.validate(path);
  return cfg.model;
}

}  // namespace loco
