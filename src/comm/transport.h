#pragma once
// Point-to-point message transport between the workers of a run. Backends (in-process threads,
// MPI processes) implement only ordered, reliable messages between ranks; every collective is
// built once on top of them (communicator.h), so all backends reduce in the same order and give
// bitwise identical results, and traffic is counted in one place.
//
// Messages travel on channels: independent ordered streams between each pair of ranks, so that
// one kind of traffic never queues behind another (a pipeline activation behind a long
// reduction). Every method of a transport may be called from several threads at once.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

namespace loco {

// A failure the transport attributes to particular peers (ranks): one that did not answer,
// closed its end, or sent what breaks the protocol. The elastic session blames them for the
// failed attempt (elastic/session.h).
class PeerError : public Error {
 public:
  PeerError(const std::string& msg, std::vector<int> peers) : Error(msg), peers_(std::move(peers)) {}
  const std::vector<int>& peers() const { return peers_; }

 private:
  std::vector<int> peers_;
};

// Time source for the link model: real monotonic time, or a manual clock in tests.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double now() const = 0;              // seconds
  virtual void sleep_until(double t) const = 0;
};
std::shared_ptr<Clock> real_clock();

// A worker's own simulated time (tests and predictions): now() moves only when the worker
// "computes" (advance) or waits for a message (sleep_until), so a run of many threads gives
// exactly the times of an ideal machine whatever the real scheduling was.
class VirtualClock : public Clock {
 public:
  double now() const override;
  void sleep_until(double t) const override;
  void advance(double seconds);

 private:
  mutable std::mutex mu_;
  mutable double t_ = 0;
};

// When a sent message occupied the sender's link (seconds on the transport's clock).
struct SendTiming {
  double start, end;
};

// The channels loco uses; a transport carries kNumChannels of them.
enum Channel : int {
  kControlChannel = 0,   // run-wide: evaluation sums, reports, checkpoint barriers
  kDataChannel = 1,      // data-parallel methods among the replicas of a stage
  kPipelineChannel = 2,  // activations and activation gradients between stages
  kChainChannel = 3,     // among the stages of one replica: gradient norm, tied embedding
  kNumChannels = 4
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Hands a message to the transport (buffered: never waits for the receiver). Messages between
  // one pair of ranks on one channel arrive in the order they were sent.
  virtual SendTiming send(int peer, int channel, std::string message) = 0;
  // The next message from `peer` on `channel`; fails with an error naming the peer if none
  // arrives within `timeout_seconds`, or if the run was aborted.
  virtual std::string recv(int peer, int channel, double timeout_seconds) = 0;
  // Stops the whole run: every worker blocked in recv fails with `reason`.
  virtual void abort(const std::string& reason) = 0;
  virtual std::string name() const = 0;
  virtual const Clock& clock() const = 0;
};

// A subset of a transport's ranks seen as a transport of its own: rank i of the view is
// members[i] of `base` (members ascending). Channels pass through unchanged; abort stops the
// whole base transport.
std::unique_ptr<Transport> make_group_view(std::shared_ptr<Transport> base, std::vector<int> members);

}  // namespace loco
