#include "comm/mpi_transport.h"

#define OMPI_SKIP_MPICXX 1  // C API only: the deprecated C++ bindings need another library
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <thread>

#include "core/error.h"

namespace loco {

namespace {

constexpr int kTag = 7411;
bool g_initialized = false;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

class MpiTransport : public Transport {
 public:
  MpiTransport() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiTransport() override {
    // Let buffered sends complete before MPI_Finalize.
    for (auto& p : pending_) MPI_Wait(&p.second, MPI_STATUS_IGNORE);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  SendTiming send(int peer, std::string message) override {
    const double t = clock().now();
    pending_.emplace_back(std::move(message), MPI_REQUEST_NULL);
    auto& p = pending_.back();
    MPI_Isend(p.first.data(), int(p.first.size()), MPI_BYTE, peer, kTag, MPI_COMM_WORLD, &p.second);
    reap();
    return {t, t};
  }

  std::string recv(int peer, double timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    int flag = 0;
    MPI_Status st;
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      MPI_Iprobe(peer, kTag, MPI_COMM_WORLD, &flag, &st);
      if (flag) break;
      reap();
      if (std::chrono::steady_clock::now() > deadline)
        fail("worker " + std::to_string(peer) + " did not answer worker " + std::to_string(rank_) + " within " +
             std::to_string(int(timeout)) + " s (network.timeout); it may have died");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    std::string msg(size_t(count), '\0');
    MPI_Recv(msg.data(), count, MPI_BYTE, peer, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
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
  void reap() {
    while (!pending_.empty()) {
      int done = 0;
      MPI_Test(&pending_.front().second, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      pending_.pop_front();
    }
  }
  int rank_ = 0, size_ = 1;
  std::deque<std::pair<std::string, MPI_Request>> pending_;
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
