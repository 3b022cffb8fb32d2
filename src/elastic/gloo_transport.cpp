#include "elastic/gloo_transport.h"

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "elastic/redis.h"

namespace loco {

namespace {

using ms = std::chrono::milliseconds;

ms to_ms(double s) { return ms(int64_t(s * 1000)); }

// Gloo's rendezvous keys in the run's Redis (our client: it authenticates and bounds every
// command, which Gloo's own RedisStore does not).
class RedisRendezvous : public gloo::rendezvous::Store {
 public:
  RedisRendezvous(Redis& redis, std::string prefix, double timeout_s)
      : redis_(redis), prefix_(std::move(prefix)), timeout_s_(timeout_s) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    redis_.command({"SET", prefix_ + key, std::string(data.begin(), data.end()), "EX", "3600"});
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    bool found = false;
    const std::string v = redis_.get(prefix_ + key, &found);
    if (!found) fail("rendezvous key " + prefix_ + key + " vanished");
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, to_ms(timeout_s_)); }
  void wait(const std::vector<std::string>& keys, const ms& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + std::min(timeout, to_ms(timeout_s_));
    for (const auto& k : keys)
      while (!redis_.exists(prefix_ + k)) {
        if (std::chrono::steady_clock::now() > deadline)
          fail("a member of the quorum did not connect within " + std::to_string(timeout_s_) + " s");
        std::this_thread::sleep_for(ms(10));
      }
  }

 private:
  Redis& redis_;
  std::string prefix_;
  double timeout_s_;
};

std::shared_ptr<gloo::transport::Device> device_for(const std::string& address) {
  // One device (its event loop thread and listening socket) per address, for the process.
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<gloo::transport::Device>> devices;
  std::lock_guard<std::mutex> lock(mu);
  auto& d = devices[address];
  if (!d) {
    gloo::transport::tcp::attr attr;
    attr.hostname = address;
    d = gloo::transport::tcp::CreateDevice(attr);
  }
  return d;
}

uint64_t header_slot(int channel) { return uint64_t(channel) * 2; }
uint64_t payload_slot(int channel) { return uint64_t(channel) * 2 + 1; }

class GlooTransport : public Transport {
 public:
  GlooTransport(Redis& redis, const std::string& prefix, int rank, int size, const GlooTransportOptions& o)
      : rank_(rank), size_(size), timeout_s_(o.timeout_s), clock_(real_clock()) {
    RedisRendezvous store(redis, prefix, o.timeout_s);
    auto dev = device_for(o.address);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(to_ms(o.timeout_s));
    try {
      ctx->connectFullMesh(store, dev);
    } catch (const gloo::Exception& e) {
      fail(std::string("connecting the quorum: ") + e.what());
    }
    ctx_ = std::move(ctx);
    reaper_ = std::thread([this] { reap(); });
  }

  ~GlooTransport() override {
    abort("transport closed");
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    reaper_.join();
    // The context first: its pairs stop referring to the buffers still queued.
    ctx_.reset();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "elastic"; }
  const Clock& clock() const override { return *clock_; }

  SendTiming send(int peer, int channel, std::string message) override {
    check(peer >= 0 && peer < size_ && peer != rank_, "internal: elastic send to a bad peer");
    const double t = clock_->now();
    auto out = std::make_unique<Outgoing>();
    const uint64_t n = message.size();
    std::memcpy(out->header, &n, sizeof n);
    out->payload = std::move(message);
    throw_if_failed();
    try {
      out->hbuf = ctx_->createUnboundBuffer(out->header, sizeof out->header);
      out->hbuf->send(peer, header_slot(channel));
      if (n > 0) {
        out->pbuf = ctx_->createUnboundBuffer(out->payload.data(), n);
        out->pbuf->send(peer, payload_slot(channel));
      }
    } catch (const gloo::Exception& e) {
      set_failed(std::string("sending to member ") + std::to_string(peer) + ": " + e.what());
      throw_if_failed();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      outgoing_.push_back(std::move(out));
    }
    cv_.notify_all();
    return {t, t};
  }

  std::string recv(int peer, int channel, double timeout_seconds) override {
    check(peer >= 0 && peer < size_ && peer != rank_, "internal: elastic recv from a bad peer");
    throw_if_failed();
    const ms timeout = to_ms(std::min(timeout_seconds, timeout_s_));
    uint64_t n = 0;
    auto hbuf = ctx_->createUnboundBuffer(&n, sizeof n);
    wait_recv(*hbuf, peer, header_slot(channel), timeout);
    std::string msg(n, '\0');
    if (n > 0) {
      auto pbuf = ctx_->createUnboundBuffer(msg.data(), n);
      wait_recv(*pbuf, peer, payload_slot(channel), timeout);
    }
    return msg;
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.empty()) failed_ = reason;
    for (auto* b : receiving_) b->abortWaitRecv();
    if (sending_) {
      sending_->hbuf->abortWaitSend();
      if (sending_->pbuf) sending_->pbuf->abortWaitSend();
    }
  }

 private:
  struct Outgoing {
    char header[8];
    std::string payload;
    std::unique_ptr<gloo::transport::UnboundBuffer> hbuf, pbuf;
  };

  void wait_recv(gloo::transport::UnboundBuffer& buf, int peer, uint64_t slot, ms timeout) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.empty()) fail(failed_);
      receiving_.insert(&buf);
    }
    bool ok = false;
    std::string error;
    try {
      buf.recv(peer, slot);
      ok = buf.waitRecv(nullptr, timeout);
    } catch (const gloo::Exception& e) {
      error = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      receiving_.erase(&buf);
    }
    if (!error.empty()) {
      const bool timed_out = error.find("Timed out") != std::string::npos;
      set_failed(timed_out ? "member " + std::to_string(peer) + " did not answer within " +
                                 std::to_string(int(timeout.count() / 1000)) + " s (elastic.timeout)"
                           : "member " + std::to_string(peer) + " is gone: " + error);
    }
    if (!ok) throw_if_failed();
  }

  void set_failed(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.empty()) failed_ = why;
  }
  void throw_if_failed() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.empty()) fail(failed_);
  }

  // Frees each sent message once Gloo has written it (in order); a send that cannot complete
  // (the peer died, or the transport failed) is kept until the context is destroyed.
  void reap() {
    for (;;) {
      std::unique_ptr<Outgoing> out;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !outgoing_.empty(); });
        if (outgoing_.empty() || !failed_.empty()) {
          if (stop_) return;
          cv_.wait_for(lock, ms(100));
          continue;
        }
        out = std::move(outgoing_.front());
        outgoing_.pop_front();
        sending_ = out.get();
      }
      bool sent = false;
      try {
        sent = out->hbuf->waitSend(nullptr, to_ms(timeout_s_)) &&
               (!out->pbuf || out->pbuf->waitSend(nullptr, to_ms(timeout_s_)));
      } catch (const gloo::Exception& e) {
        set_failed(std::string("sending: ") + e.what());
      }
      std::lock_guard<std::mutex> lock(mu_);
      sending_ = nullptr;
      if (!sent) kept_.push_back(std::move(out));
    }
  }

  const int rank_, size_;
  const double timeout_s_;
  std::shared_ptr<Clock> clock_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Outgoing>> outgoing_;
  std::vector<std::unique_ptr<Outgoing>> kept_;
  std::set<gloo::transport::UnboundBuffer*> receiving_;
  Outgoing* sending_ = nullptr;  // the message the reaper waits on
  std::string failed_;
  bool stop_ = false;
  std::thread reaper_;
};

}  // namespace

std::unique_ptr<Transport> make_gloo_transport(Redis& redis, const std::string& key_prefix, int rank, int size,
                                               const GlooTransportOptions& options) {
  return std::make_unique<GlooTransport>(redis, key_prefix, rank, size, options);
}

}  // namespace loco
