#include "comm/inprocess.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "core/error.h"

namespace loco {

class InProcessHub {
 public:
  explicit InProcessHub(int size) : size_(size), queues_(size_t(size) * size * kNumChannels) {}

  void push(int from, int to, int channel, std::string msg) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queues_[index(from, to, channel)].push_back(std::move(msg));
    }
    cv_.notify_all();
  }

  std::string pop(int from, int to, int channel, double timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& q = queues_[index(from, to, channel)];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    if (!cv_.wait_until(lock, deadline, [&] { return !q.empty() || !abort_reason_.empty(); }))
      fail("worker " + std::to_string(from) + " did not answer worker " + std::to_string(to) + " within " +
           std::to_string(int(timeout)) + " s (network.timeout)");
    if (!abort_reason_.empty()) fail(abort_reason_);
    std::string msg = std::move(q.front());
    q.pop_front();
    return msg;
  }

  void abort(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (abort_reason_.empty()) abort_reason_ = reason;
    }
    cv_.notify_all();
  }

  int size() const { return size_; }

 private:
  size_t index(int from, int to, int channel) const {
    check(channel >= 0 && channel < kNumChannels, "internal: message channel out of range");
    return (size_t(from) * size_t(size_) + size_t(to)) * kNumChannels + size_t(channel);
  }
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<std::string>> queues_;
  std::string abort_reason_;
};

namespace {

class InProcessTransport : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  SendTiming send(int peer, int channel, std::string message) override {
    const double t = clock().now();
    hub_->push(rank_, peer, channel, std::move(message));
    return {t, t};
  }
  std::string recv(int peer, int channel, double timeout) override {
    return hub_->pop(peer, rank_, channel, timeout);
  }
  void abort(const std::string& reason) override { hub_->abort(reason); }
  std::string name() const override { return "inprocess"; }
  const Clock& clock() const override { return *real_clock(); }

 private:
  std::shared_ptr<InProcessHub> hub_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Transport>> make_inprocess_transports(int size) {
  check(size >= 1, "the number of workers must be >= 1");
  auto hub = std::make_shared<InProcessHub>(size);
  std::vector<std::unique_ptr<Transport>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<InProcessTransport>(hub, r));
  return out;
}

}  // namespace loco
