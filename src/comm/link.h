#pragma once
// Link model: emulates a slow network on top of any transport. Each worker has one outgoing
// link of `bandwidth_bps` bits/s and `latency_s` one-way latency. A message of b bytes handed
// over at time t starts when the link is free (transfers on one link share it first come,
// first served), occupies it for its transfer time T(b), and can be received latency later:
//   arrival = max(t, link_free) + T(b) + latency.
// With `tcp` off, T(b) = 8b / bandwidth (an ideal pipe). With `tcp` on, T(b)
// follows what TCP over such a link does (checked against real TCP through scripts/netlab.sh,
// docs/results/network.md):
//   - payload moves at bandwidth x 1448/1514 (TCP/IP and Ethernet headers of full segments);
//   - each (sender, receiver) connection has a congestion window, starting at 10 segments and
//     doubling every round trip (2 x latency) while it is below the link's bandwidth-delay
//     product: a round that sends a window smaller than that product takes a whole round trip;
//   - after an idle time longer than the retransmission timeout (round trip + 200 ms, Linux's
//     minimum), the window is halved once per timeout elapsed, down to 10 segments (Linux's
//     tcp_slow_start_after_idle);
//   - a connection's messages go in order, and its slow-start round trips hold that connection
//     only: connections to other peers send meanwhile, sharing the link's rate (first come,
//     first served), so arrival = max(start + T(b), link_free + wire time) + latency with start
//     the later of t and the end of the connection's previous message.
// The receiver waits until the arrival time. The arrival time travels in an 8-byte header
// that is not counted as payload.
#include <memory>

#include "comm/transport.h"

namespace loco {

struct LinkConfig {
  double bandwidth_bps = 0;  // 0: unlimited
  double latency_s = 0;
  bool tcp = false;          // TCP's headers, slow start and restart after idle (above)
  bool enabled() const { return bandwidth_bps > 0 || latency_s > 0; }
};

// TCP's view of one connection for the link model: its congestion window and when it last sent.
struct TcpConnection {
  double window = 0;      // bytes; 0: a new connection (initial window)
  double last_end = -1;   // end of its last transfer (-1: none)
};
// The time a transfer of `bytes` over `conn` takes from time `start`, slow start included
// (updates conn).
double link_transfer_time(const LinkConfig& link, TcpConnection& conn, double start, double bytes);
// The time `bytes` of payload occupy the link itself (with TCP, headers included).
double link_wire_time(const LinkConfig& link, double bytes);

std::unique_ptr<Transport> wrap_with_link(std::unique_ptr<Transport> inner, LinkConfig link,
                                          std::shared_ptr<Clock> clock);

// "100Mbit", "1Gbit", "2.5 Gbit/s", "500kbit", "inf" -> bits/s (0 for unlimited); at least 1 kbit/s.
double parse_bandwidth(const std::string& text, const std::string& key);
// "30ms", "0.5s", "100us", "0" -> seconds.
double parse_duration(const std::string& text, const std::string& key);
// The longest wait on a peer loco takes (a week: a deadline much further off overflows the
// clock's integer nanoseconds) and the longest emulated latency (an hour: a receiver refuses a
// message said to arrive more than 1e6 s later).
constexpr double kMaxTimeoutSeconds = 7 * 86400.0, kMaxLatencySeconds = 3600.0;
// A timeout: a duration in (0, kMaxTimeoutSeconds].
double parse_timeout(const std::string& text, const std::string& key);
// An emulated latency: a duration in [0, kMaxLatencySeconds].
double parse_latency(const std::string& text, const std::string& key);

}  // namespace loco
