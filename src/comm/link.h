#pragma once
// Link model: emulates a slow network on top of any transport. Each worker has one outgoing
// link of `bandwidth_bps` bits/s and `latency_s` one-way latency. A message of b bytes handed
// over at time t starts when the link is free (transfers on one link share it first come,
// first served), occupies it for 8b/bandwidth, and can be received latency later:
//   arrival = max(t, link_free) + 8b/bandwidth + latency  >=  t + latency + 8b/bandwidth.
// The receiver waits until the arrival time. The arrival time travels in an 8-byte header
// that is not counted as payload.
#include <memory>

#include "comm/transport.h"

namespace loco {

struct LinkConfig {
  double bandwidth_bps = 0;  // 0: unlimited
  double latency_s = 0;
  bool enabled() const { return bandwidth_bps > 0 || latency_s > 0; }
};

std::unique_ptr<Transport> wrap_with_link(std::unique_ptr<Transport> inner, LinkConfig link,
                                          std::shared_ptr<Clock> clock);

// "100Mbit", "1Gbit", "2.5 Gbit/s", "500kbit", "inf" -> bits/s (0 for unlimited).
double parse_bandwidth(const std::string& text, const std::string& key);
// "30ms", "0.5s", "100us", "0" -> seconds.
double parse_duration(const std::string& text, const std::string& key);

}  // namespace loco
