#pragma once
// The methods of the elastic backend (distributed.backend = "elastic", docs/elastic.md): DiLoCo,
// Streaming DiLoCo and NoLoCo, each the one implementation in src/algo/ over an ElasticSession
// (session.h), the SyncGroup whose rounds are among the live members of their moment.
#include <memory>

#include "algo/algorithm.h"
#include "comm/stats.h"
#include "elastic/membership.h"

namespace loco {

// The method of cfg.algorithm (the config's checks admit only these three in elastic mode). The
// worker registers here (with partial updates its slice is then set: Worker::set_slice).
std::unique_ptr<Algorithm> make_elastic_algorithm(const RunConfig& cfg, Worker& w, const ElasticOptions& options,
                                                  std::shared_ptr<TrafficStats> traffic,
                                                  std::shared_ptr<TraceRecorder> trace);

}  // namespace loco
