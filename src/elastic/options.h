#pragma once
// An elastic worker's options (ElasticOptions, membership.h) from the run config, the run's
// address (--join redis://HOST:PORT/RUN) and the worker's name (--worker): what `loco train
// --join` and the Python layer's `loco.init("redis://...")` both start from.
#include <string>

#include "elastic/membership.h"
#include "algo/run_config.h"

namespace loco {

// Refuses a worker name that is empty or not a plain file name (it names a run directory).
void check_worker_name(const std::string& name);

// Everything but the fingerprint and the link (the caller's: they depend on its data and
// network settings). Reads the Redis password and the run secret (files or environment; never
// the command line) and checks the elastic keys. Fails first, saying why, for a run that cannot
// be elastic (the session's limits and the method's: elastic_refusal).
ElasticOptions elastic_options(const RunConfig& cfg, const std::string& join_url, const std::string& worker_name);

}  // namespace loco
