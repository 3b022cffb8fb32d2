#pragma once
// The methods of the elastic backend (distributed.backend = "elastic", docs/elastic.md): DiLoCo
// and NoLoCo (algo/diloco.cpp, algo/noloco.cpp over an ElasticSession, the SyncGroup of
// session.h) and Streaming DiLoCo (elastic_streaming.cpp, an ElasticMethod): their outer
// synchronizations are rounds among the live members of their moment.
#include <memory>

#include "algo/algorithm.h"
#include "comm/stats.h"
#include "elastic/membership.h"

namespace loco {

// The method of cfg.algorithm (the config's checks admit only these three in elastic mode).
std::unique_ptr<Algorithm> make_elastic_algorithm(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                                                  std::shared_ptr<TrafficStats> traffic,
                                                  std::shared_ptr<TraceRecorder> trace);

std::unique_ptr<Algorithm> make_elastic_streaming(const RunConfig& cfg, const Worker& w,
                                                  const ElasticOptions& options,
                                                  std::shared_ptr<TrafficStats> traffic,
                                                  std::shared_ptr<TraceRecorder> trace);

}  // namespace loco
