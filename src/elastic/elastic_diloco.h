#pragma once
// DiLoCo over the elastic backend (distributed.backend = "elastic"): every worker is its own
// process with its own run directory; each outer synchronization is one round among the live
// members of that moment (elastic/membership.h), reduced with loco's ring all-reduce over a Gloo
// transport made for that round's roster (elastic/gloo_transport.h). A round that fails (a
// member died or hung) is redone by the survivors from the parameters they still hold; a
// worker that joins receives the outer state and a member's inner AdamW state from a live peer
// (checksummed) and trains from the next round on; a dropped worker rejoins as a new member.
// Data: each round's members take disjoint rows of the data permutation (DataLoader::assign),
// continuing where the previous round's members stopped, so no window is trained twice by
// members whose work counts; with a fixed membership the assignment, the reductions and so the
// parameters equal the in-process run's bit for bit.
#include <memory>

#include "algo/algorithm.h"
#include "comm/stats.h"
#include "elastic/membership.h"

namespace loco {

// NoLoCo over the elastic backend (elastic_noloco.cpp).
std::unique_ptr<Algorithm> make_elastic_noloco(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                                               std::shared_ptr<TrafficStats> traffic,
                                               std::shared_ptr<TraceRecorder> trace);
// Streaming DiLoCo over the elastic backend (elastic_streaming.cpp).
std::unique_ptr<Algorithm> make_elastic_streaming(const RunConfig& cfg, const Worker& w,
                                                  const ElasticOptions& options,
                                                  std::shared_ptr<TrafficStats> traffic,
                                                  std::shared_ptr<TraceRecorder> trace);

std::unique_ptr<Algorithm> make_elastic_diloco(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                                               std::shared_ptr<TrafficStats> traffic,
                                               std::shared_ptr<TraceRecorder> trace);

}  // namespace loco
