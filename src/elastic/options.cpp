#include "elastic/options.h"

#include <cctype>
#include <cstdlib>

#include "algo/algorithm.h"
#include "core/error.h"
#include "core/fs.h"
#include "elastic/redis.h"

namespace loco {

namespace {

// Elastic workers' secrets come from a file or the environment, never from the command line
// (where other users of the machine could read them): the file named by config key `key`
// (trailing newlines dropped), else $`env`; false if neither is set.
bool read_secret(const std::string& key, const std::string& file, const char* env, std::string& out) {
  if (!file.empty()) {
    if (!file_exists(file)) fail(key + ": " + file + " does not exist");
    out = read_file(file);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return true;
  }
  if (const char* v = std::getenv(env)) {
    out = v;
    return true;
  }
  return false;
}

// The Redis password ("": none).
std::string redis_password(const ElasticConfig& e) {
  std::string pw;
  read_secret("elastic.password_file", e.password_file, "LOCO_REDIS_PASSWORD", pw);
  return pw;
}

// The run secret, shared by every member: without it nothing reaches the data plane.
std::string run_secret(const ElasticConfig& e) {
  std::string secret;
  if (!read_secret("elastic.secret_file", e.secret_file, "LOCO_RUN_SECRET", secret))
    fail("elastic: the run needs a secret shared by its members, in elastic.secret_file or $LOCO_RUN_SECRET "
         "(create one with: head -c 32 /dev/urandom | base64 > run.secret; see docs/security.md)");
  return secret;
}

}  // namespace

void check_worker_name(const std::string& name) {
  if (name.empty()) fail("--join needs --worker NAME (this worker's name; its run directory is train.out_dir/NAME)");
  if (name.size() > kMaxElasticName)
    fail("--worker " + name.substr(0, 20) + "...: at most " + std::to_string(kMaxElasticName) + " characters, got " +
         std::to_string(name.size()));
  for (const char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') || name == "." || name == "..")
      fail("--worker " + name + ": use letters, digits, '-', '_' and '.' only");
}

ElasticOptions elastic_options(const RunConfig& cfg, const std::string& join_url, const std::string& worker_name) {
  // What elastic runs cannot do: the session's (no pipeline of stages across members that come
  // and go, hence no protocol models), then the method's own (algo/algorithm.h).
  if (cfg.pipeline.stages != 1) fail("distributed.backend = \"elastic\" does not run pipelines (pipeline.stages = 1)");
  if (cfg.protocol.rank != 0) fail("distributed.backend = \"elastic\" does not run protocol models");
  if (const std::string why = elastic_refusal(cfg); !why.empty()) fail(why);
  check_worker_name(worker_name);
  ElasticOptions e;
  e.where = parse_join_url(join_url);
  e.password = redis_password(cfg.elastic);
  e.run_key = derive_run_key(run_secret(cfg.elastic), e.where.run);
  e.fault = parse_fault(cfg.elastic.fault);
  e.exclude_after = cfg.elastic.exclude_after;
  if (e.fault.kind != Fault::Kind::None && cfg.method() != MethodId::Diloco && cfg.method() != MethodId::Streaming)
    fail("elastic.fault is implemented for algorithm = \"diloco\" and \"streaming\" only");
  e.name = worker_name;
  e.address = cfg.elastic.address;
  e.min_workers = cfg.elastic.min_workers;
  e.timeout_s = parse_duration(cfg.elastic.timeout, "elastic.timeout");
  e.start_timeout_s = parse_duration(cfg.elastic.start_timeout, "elastic.start_timeout");
  e.straggler_timeout_s = parse_duration(cfg.elastic.straggler_timeout, "elastic.straggler_timeout");
  e.coordinator_timeout_s = parse_duration(cfg.elastic.coordinator_timeout, "elastic.coordinator_timeout");
  if (cfg.distributed.replicas != 1)
    fail("distributed.backend = \"elastic\": the members are the workers started with --join; leave "
         "distributed.replicas at 1");
  return e;
}

}  // namespace loco
