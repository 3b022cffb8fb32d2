// Clocks and group views: the parts of the transport layer shared by every backend.
#include "comm/transport.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/error.h"

namespace loco {

namespace {

class RealClock : public Clock {
 public:
  double now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void sleep_until(double t) const override {
    const double dt = t - now();
    if (dt > 0) std::this_thread::sleep_for(std::chrono::duration<double>(dt));
  }
};

}  // namespace

std::shared_ptr<Clock> real_clock() {
  static auto c = std::make_shared<RealClock>();
  return c;
}

double VirtualClock::now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return t_;
}

void VirtualClock::sleep_until(double t) const {
  std::lock_guard<std::mutex> lock(mu_);
  t_ = std::max(t_, t);
}

void VirtualClock::advance(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  t_ += seconds;
}

namespace {

class GroupView : public Transport {
 public:
  GroupView(std::shared_ptr<Transport> base, std::vector<int> members)
      : base_(std::move(base)), members_(std::move(members)) {
    check(!members_.empty() && std::is_sorted(members_.begin(), members_.end()),
          "internal: group members must be ascending");
    const auto it = std::find(members_.begin(), members_.end(), base_->rank());
    check(it != members_.end(), "internal: worker " + std::to_string(base_->rank()) + " is not in its group");
    rank_ = int(it - members_.begin());
  }
  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  SendTiming send(int peer, int channel, std::string message) override {
    return base_->send(member(peer), channel, std::move(message));
  }
  std::string recv(int peer, int channel, double timeout) override {
    return base_->recv(member(peer), channel, timeout);
  }
  void abort(const std::string& reason) override { base_->abort(reason); }
  std::string name() const override { return base_->name(); }
  const Clock& clock() const override { return base_->clock(); }

 private:
  int member(int peer) const {
    check(peer >= 0 && peer < int(members_.size()), "internal: group peer out of range");
    return members_[size_t(peer)];
  }
  std::shared_ptr<Transport> base_;
  std::vector<int> members_;
  int rank_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_group_view(std::shared_ptr<Transport> base, std::vector<int> members) {
  return std::make_unique<GroupView>(std::move(base), std::move(members));
}

}  // namespace loco
