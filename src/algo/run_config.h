#pragma once
// The run configuration (TOML): every key is declared once with its type, range and meaning;
// `loco train --print-config` lists them all. The sections of the whole run (model, data,
// optimizer, train, distributed, elastic, network, pipeline, protocol) are declared and checked
// in run_config.cpp; each method's own sections live with the method: DiLoCo's outer.*
// (diloco_config.h, which Streaming DiLoCo and NoLoCo's screening read too), streaming.*
// (streaming_config.h), noloco.* (noloco_config.h), and partial.* (partial_config.h), each with
// its keys and checks in the method's .cpp.
#include <string>
#include <vector>

#include "algo/diloco_config.h"
#include "algo/methods.h"
#include "algo/noloco_config.h"
#include "algo/partial_config.h"
#include "algo/streaming_config.h"
#include "io/config_schema.h"
#include "model/config.h"
#include "optim/adamw.h"

namespace loco {

struct DataConfig {
  std::string train;         // LOCOTOKS file
  std::string val;           // LOCOTOKS file ("" for none)
  int seq_len = 256;
  int batch_size = 8;        // windows per replica per step
  int64_t seed = 1234;       // data order
};

struct OptimConfig {
  AdamWConfig adamw;
  double lr = 3e-4;          // peak
  double min_lr = 3e-5;
  int64_t warmup_steps = 100;
  double clip = 1.0;         // global-norm clipping, 0 disables
  std::string clip_scope = "model";  // norm over the whole model, or over each stage's own part
};

struct TrainConfig {
  int64_t steps = 1000;
  int64_t seed = 0;          // parameter init
  int64_t log_interval = 10;
  int64_t eval_interval = 100;
  int64_t eval_windows = 64;  // validation windows (from the start of data.val)
  int64_t checkpoint_interval = 500;  // 0: only at the end
  int keep_checkpoints = 3;  // newest checkpoints kept (0: all)
  std::string out_dir = "runs/run";
  bool tensorboard = false;  // event files beside metrics.jsonl
  int threads = 0;           // compute threads (0: all cores)
  int micro_batch_size = 0;  // gradient accumulation: windows per forward/backward (0: the whole batch)
  std::string precision = "fp32";  // matrix products: fp32, bf16, auto (core/precision.h)
  std::string matmul_library = "auto";  // fp32 products: auto, openblas, onednn (core/precision.h)
};

struct DistributedConfig {
  int replicas = 1;                 // M data-parallel replicas (workers)
  std::string backend = "auto";     // auto (mpi when launched by mpirun; elastic with --join), inprocess, mpi, elastic
};

// distributed.backend = "elastic" (docs/elastic.md): workers started on their own with --join.
struct ElasticConfig {
  int min_workers = 1;                     // members the first round waits for
  std::string timeout = "5s";              // heartbeat lifetime; longest wait on a peer in a sync
  std::string start_timeout = "300s";      // waiting for the first quorum, or for a joiner's state
  std::string straggler_timeout = "60s";   // waiting for a live member to reach a sync
  std::string coordinator_timeout = "60s"; // retrying while Redis is unreachable
  std::string address;                     // address peers reach this worker at ("": the host name)
  std::string password_file;               // Redis password ("": $LOCO_REDIS_PASSWORD, or none)
  std::string secret_file;                 // the run secret ("": $LOCO_RUN_SECRET; required)
  std::string fault;                       // a member that misbehaves on purpose (comm/fault.h)
  int exclude_after = 3;                   // attempts in a row a member may be blamed for before exclusion
};

struct NetworkConfig {
  std::string bandwidth = "inf";    // per-worker outgoing link, e.g. "100Mbit"
  std::string latency = "0ms";      // one-way latency, e.g. "30ms"
  bool tcp = false;                 // link model: TCP headers, slow start, restart after idle
  std::string timeout = "60s";      // longest wait on a peer before failing
  std::string peak_window = "1s";   // window of the peak send rate
  double compute_jitter = 0;        // sigma: each inner step slowed by exp(sigma |Z|), Z ~ N(0, 1)
};

struct ProtocolConfig {
  int rank = 0;                       // k: subspace dimension (0: off)
  int64_t seed = 0;                   // U and E_fixed (shared by every worker)
  std::string constraint = "project"; // project or subspace-adamw
  bool compress = true;               // send k numbers per token (false: d, for checking exactness)
  double fixed_std = 1.0;             // std of the frozen embedding E_fixed (reference code: 1)
  int64_t grassmann_interval = 0;     // T_U: steps between subspace updates (0: U fixed)
  double grassmann_lr = 0.1;          // eta, on A normalised to unit trace
};

struct PipelineConfig {
  int stages = 1;                   // S: pipeline stages (contiguous groups of blocks)
  int microbatches = 0;             // m per step (0: data.batch_size / train.micro_batch_size, or 1)
  std::string schedule = "1f1b";    // 1f1b or gpipe
  std::string split;                // blocks per stage, e.g. "2,4" ("": balanced by parameters)
};

struct RunConfig {
  std::string algorithm = "ddp";    // ddp, diloco, streaming, noloco (algo/methods.h)
  MethodId method() const { return method_id(algorithm); }
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  DistributedConfig distributed;
  ElasticConfig elastic;
  NetworkConfig network;
  OuterConfig outer;
  StreamingConfig streaming;
  PartialConfig partial;
  NolocoConfig noloco;
  PipelineConfig pipeline;
  ProtocolConfig protocol;
  // Microbatches per step and windows in each (from pipeline.microbatches or
  // train.micro_batch_size; one of the whole batch when neither is set).
  int microbatches() const;
  int micro_windows() const { return data.batch_size / microbatches(); }
};

// Binds every key of `cfg` into a schema (keep `cfg` alive while the schema is used).
ConfigSchema run_config_schema(RunConfig& cfg);
// Loads a TOML run config (only defaults if path is empty), applies "key=value" overrides and
// validates the whole configuration (errors name the key).
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
// How errors name a configuration: "PATH", or "PATH with --set k=v, ..." when overrides were
// applied (a cross-key error may come from either).
std::string config_source(const std::string& path, const std::vector<std::string>& overrides);
// Cross-key checks not expressible as ranges of single keys.
void validate_run_config(const RunConfig& cfg, const std::string& source);
// The effective configuration as TOML (loadable by load_run_config).
std::string run_config_to_toml(RunConfig cfg);
// A model config from either a TOML run config (with optional "key=value" overrides; only the
// model section is validated) or a Hugging Face config.json.
ModelConfig read_model_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace loco
