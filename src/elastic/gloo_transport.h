#pragma once
// The elastic backend's data plane: a Transport over a Gloo TCP context (gloo::rendezvous::
// Context, full mesh) among the members of one quorum, rendezvoused through the run's Redis.
// Messages become Gloo unbound-buffer sends: an 8-byte length on one slot, then the payload on
// another, per channel, so loco's own collectives (communicator.h) run on it unchanged and
// reduce in the same order as on every other backend. A Gloo context does not survive a failed
// peer: after any error or timeout the transport fails every later call, and the quorum is
// formed again with a new one.
#include <memory>
#include <string>

#include "comm/transport.h"

namespace loco {

class Redis;

struct GlooTransportOptions {
  std::string address;    // this host's address peers connect to ("" : Gloo's default, the host name)
  double timeout_s = 5;   // connecting, and any wait on a peer
};

// Connects to the other `size` members of the quorum whose rendezvous keys start with
// `key_prefix` (this process is `rank`); throws if they do not all connect within the timeout.
std::unique_ptr<Transport> make_gloo_transport(Redis& redis, const std::string& key_prefix, int rank, int size,
                                               const GlooTransportOptions& options);

}  // namespace loco
