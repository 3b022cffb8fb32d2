#include "comm/mpi_transport.h"

#define OMPI_SKIP_MPICXX 1  // C API only: the deprecated C++ bindings need another library
#include <mpi.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace loco {

namespace {

constexpr int kTagBase = 7400;  // tag = kTagBase + channel
// Pause between the progress thread's passes: kPollMin after a pass that posted or completed a
// message, doubling up to kPollMax while nothing happens (see MpiTransport::loop).
constexpr std::chrono::microseconds kPollMin{250}, kPollMax{1000};
bool g_initialized = false;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

// Every MPI call after initialization is made by one progress thread, which posts the queued
// sends and a receive for every arriving message, completes them without blocking, and
// delivers what arrived into a queue per (peer, channel).
// So transfers advance while the workers compute (Open MPI's TCP transport moves data only
// inside MPI calls), send() and recv() may be called from any thread, and the library only needs
// MPI_THREAD_SERIALIZED.
class MpiTransport : public Transport {
 public:
  MpiTransport() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    inbox_.resize(size_t(size_) * kNumChannels);
    progress_ = std::thread([this] { loop(); });
  }
  ~MpiTransport() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    progress_.join();
    MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  SendTiming send(int peer, int channel, std::string message) override {
    check(peer >= 0 && peer < size_ && channel >= 0 && channel < kNumChannels, "internal: MPI send out of range");
    if (message.size() > size_t(INT32_MAX))
      fail("MPI: a message of " + std::to_string(message.size()) + " bytes exceeds MPI's 2 GiB count limit");
    const double t = clock().now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      outgoing_.push_back({peer, channel, std::move(message), MPI_REQUEST_NULL});
    }
    wake_.notify_one();
    return {t, t};
  }

  std::string recv(int peer, int channel, double timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto& q = inbox_[size_t(peer) * kNumChannels + size_t(channel)];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    if (!cv_.wait_until(lock, deadline, [&] { return !q.empty() || !error_.empty(); }))
      fail("worker " + std::to_string(peer) + " did not answer worker " + std::to_string(rank_) + " within " +
           std::to_string(int(timeout)) + " s (network.timeout); it may have died");
    if (q.empty()) fail(error_);
    std::string msg = std::move(q.front());
    q.pop_front();
    return msg;
  }

  void abort(const std::string& reason) override {
    std::fprintf(stderr, "loco: error: worker %d: %s\n", rank_, reason.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::string name() const override { return "mpi"; }
  const Clock& clock() const override { return *real_clock(); }

 private:
  struct Outgoing {
    int peer, channel;
    std::string data;
    MPI_Request request;
  };

  struct Incoming {
    int peer, tag;
    std::string data;
    MPI_Request request;  // MPI_REQUEST_NULL once complete
  };

  // Completes what has completed of a list's requests (their handles become MPI_REQUEST_NULL).
  template <class List>
  void test_some(List& list) {
    requests_.clear();
    for (auto& e : list) requests_.push_back(e.request);
    if (requests_.empty()) return;
    indices_.resize(requests_.size());
    int count = 0;
    MPI_Testsome(int(requests_.size()), requests_.data(), &count, indices_.data(), MPI_STATUSES_IGNORE);
    if (count == MPI_UNDEFINED) return;  // every handle was already null
    size_t i = 0;
    for (auto& e : list) e.request = requests_[i++];
  }

  void loop() {
    using Clock = std::chrono::steady_clock;
    Clock::time_point stop_deadline{};
    std::list<Outgoing> in_flight;
    std::list<Incoming> receiving;
    auto idle = kPollMin;
    for (;;) {
      bool active = false, stopping;
      std::deque<Outgoing> to_post;
      {
        std::lock_guard<std::mutex> lock(mu_);
        to_post.swap(outgoing_);
        stopping = stop_;
      }
      for (auto& o : to_post) {
        in_flight.push_back(std::move(o));
        auto& f = in_flight.back();
        MPI_Isend(f.data.data(), int(f.data.size()), MPI_BYTE, f.peer, kTagBase + f.channel, comm_, &f.request);
        active = true;
      }
      // One MPI_Testsome per list, not one MPI_Test per request: every test call runs Open MPI's
      // progress engine (a poll() over its sockets), and a large ring all-reduce has a hundred
      // pieces in flight: profiled in the lab at 1 Gbit/s, this thread took 44% of a core when it
      // tested them one by one, 24% with one test per list.
      test_some(in_flight);
      in_flight.remove_if([](const Outgoing& o) { return o.request == MPI_REQUEST_NULL; });
      // Receives are posted without blocking (a matched probe takes the message out of
      // matching, then MPI_Imrecv): a blocking MPI_Recv of a large message over a slow link
      // would spin a core for its whole duration and hold back the next sends.
      for (;;) {
        int flag = 0;
        MPI_Message handle;
        MPI_Status st;
        MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &handle, &st);
        if (!flag) break;
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        receiving.push_back({st.MPI_SOURCE, st.MPI_TAG, std::string(size_t(count), '\0'), MPI_REQUEST_NULL});
        auto& r = receiving.back();
        MPI_Imrecv(r.data.data(), count, MPI_BYTE, &handle, &r.request);
        active = true;
      }
      // Delivered in arrival order per (sender, channel): a completed message waits for the
      // earlier ones of its queue.
      test_some(receiving);
      std::vector<uint64_t> waiting;  // queues with an earlier receive still in progress
      for (auto it = receiving.begin(); it != receiving.end();) {
        const uint64_t key = uint64_t(it->peer) << 32 | uint32_t(it->tag);
        const bool blocked = std::find(waiting.begin(), waiting.end(), key) != waiting.end();
        if (it->request != MPI_REQUEST_NULL || blocked) {
          if (!blocked) waiting.push_back(key);  // it holds back the later ones of its queue
          ++it;
          continue;
        }
        const int channel = it->tag - kTagBase;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (channel >= 0 && channel < kNumChannels)
            inbox_[size_t(it->peer) * kNumChannels + size_t(channel)].push_back(std::move(it->data));
          else if (error_.empty())
            error_ = "worker " + std::to_string(it->peer) + " sent a message with unknown tag " + std::to_string(it->tag);
        }
        cv_.notify_all();
        active = true;
        it = receiving.erase(it);
      }
      // Stop once every send has left and every receive MPI writes into has completed
      // (receivers hold what they have not read), or give up after a bound if a peer is gone.
      if (stopping) {
        if (stop_deadline == Clock::time_point{}) stop_deadline = Clock::now() + std::chrono::seconds(30);
        std::lock_guard<std::mutex> lock(mu_);
        if (in_flight.empty() && outgoing_.empty() && receiving.empty()) return;
        if (Clock::now() > stop_deadline) {
          std::fprintf(stderr, "loco: warning: worker %d: %zu messages not delivered, %zu not received at exit\n",
                       rank_, in_flight.size(), receiving.size());
          // MPI may still write into these buffers: they are never freed.
          static auto* abandoned = new std::list<Incoming>();
          abandoned->splice(abandoned->end(), receiving);
          return;
        }
      }
      // Polling costs CPU the link needs: every pass is a few system calls, and on a machine with
      // few cores the ranks share them with the network stack. Measured in the network lab at
      // 1 Gbit/s (docs/results/network.md), with freed memory kept as set up below: polling
      // without pause while messages completed, and at most 200 us apart otherwise, took 2.8-3.4
      // ms of CPU per MB an all-reduce sent; pauses of 0.5-2 ms, 1.8-2.2 ms. The kernel's socket
      // buffers hold milliseconds of a slow link's traffic, so a pause of 250 us to 1 ms between
      // passes leaves it no less busy. A queued send wakes the thread at once.
      idle = active ? kPollMin : std::min(idle * 2, kPollMax);
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, idle, [&] { return !outgoing_.empty(); });
    }
  }

  std::vector<MPI_Request> requests_;  // test_some's arrays, kept to avoid an allocation per poll
  std::vector<int> indices_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;    // a message arrived (or an error): receivers wait on it
  std::condition_variable wake_;  // a send was queued: the progress thread waits on it
  std::deque<Outgoing> outgoing_;
  std::vector<std::deque<std::string>> inbox_;
  std::string error_;
  bool stop_ = false;
  std::thread progress_;
};

}  // namespace

bool launched_by_mpi() { return mpi_env_size() > 0; }

int mpi_env_rank() {
  for (const char* n : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (env_int(n) >= 0) return env_int(n);
  return -1;
}

int mpi_env_size() {
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (env_int(n) > 0) return env_int(n);
  return -1;
}

int mpi_env_local_size() {
  const int v = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  return v > 0 ? v : std::max(1, mpi_env_size());
}

std::unique_ptr<Transport> make_mpi_transport() {
  if (!g_initialized) {
    // Open MPI's TCP transport, by default, moves a large message with an emulated RDMA put;
    // measured in the network lab (docs/results/network.md), two large messages crossing on one
    // connection then shared the link at half the rate each (ring all-reduce with 2 workers at
    // 100 Mbit/s: 0.47-0.51 of raw TCP, against 0.98-0.99 with plain sends). A value the user
    // gave (mpirun --mca btl_tcp_flags ..., which sets this variable) is kept.
    setenv("OMPI_MCA_btl_tcp_flags", "send,inplace", 0);
    // Message buffers (a 256 KiB ring piece, a pipeline activation) are allocated and freed at
    // the link's rate. With glibc's defaults the burst of an all-reduce step went back to the
    // kernel when freed (trimmed, or unmapped above the mmap threshold) and every new buffer
    // faulted its pages in again: measured in the network lab at 1 Gbit/s, 5.3-5.4 ms of CPU per
    // MB an all-reduce sent, against 1.8-2.2 ms with freed memory kept (docs/results/network.md).
    // So buffers up to 32 MiB come from the heap, and up to 256 MiB of freed heap stays mapped.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (provided < MPI_THREAD_SERIALIZED) fail("MPI: the library does not support MPI_THREAD_SERIALIZED");
    g_initialized = true;
  }
  return std::make_unique<MpiTransport>();
}

void finalize_mpi() {
  if (!g_initialized) return;
  MPI_Finalize();
  g_initialized = false;
}

}  // namespace loco
