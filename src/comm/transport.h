#pragma once
// Point-to-point message transport between the workers of a run. Backends (in-process threads,
// MPI processes) implement only ordered, reliable messages between ranks; every collective is
// built once on top of them (communicator.h), so all backends reduce in the same order and give
// bitwise identical results, and traffic is counted in one place.
#include <cstdint>
#include <memory>
#include <string>

namespace loco {

// Time source for the link model: real monotonic time, or a manual clock in tests.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double now() const = 0;              // seconds
  virtual void sleep_until(double t) const = 0;
};
std::shared_ptr<Clock> real_clock();

// When a sent message occupied the sender's link (seconds on the transport's clock).
struct SendTiming {
  double start, end;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Hands a message to the transport (buffered: never waits for the receiver). Messages between
  // one pair of ranks arrive in the order they were sent.
  virtual SendTiming send(int peer, std::string message) = 0;
  // The next message from `peer`; fails with an error naming the peer if none arrives within
  // `timeout_seconds`, or if the run was aborted.
  virtual std::string recv(int peer, double timeout_seconds) = 0;
  // Stops the whole run: every worker blocked in recv fails with `reason`.
  virtual void abort(const std::string& reason) = 0;
  virtual std::string name() const = 0;
  virtual const Clock& clock() const = 0;
};

}  // namespace loco
