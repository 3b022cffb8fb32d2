#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/blas.h"

namespace loco {

namespace {

class Pool {
 public:
  ~Pool() { resize(0); }

  void resize(int workers) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    stop_ = false;
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
  }

  int workers() const { return int(threads_.size()); }

  void run(int64_t chunks, const std::function<void(int64_t)>& chunk_fn) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      job_ = &chunk_fn;
      chunks_ = chunks;
      next_.store(0);
      pending_ = chunks;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    for (;;) {
      const int64_t i = next_.fetch_add(1);
      if (i >= chunks_) return;
      try {
        (*job_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
        if (stop_) return;
        seen = generation_;
      }
      work();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t chunks_ = 0, pending_ = 0;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p;
  return p;
}

int g_threads = 0;  // 0: not yet set (all cores)

}  // namespace

void set_compute_threads(int n) {
  n = std::max(1, n);
  g_threads = n;
  pool().resize(n - 1);
  set_blas_threads(1);
}

int compute_threads() {
  if (g_threads == 0) set_compute_threads(int(std::max(1u, std::thread::hardware_concurrency())));
  return g_threads;
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int threads = compute_threads();
  grain = std::max<int64_t>(1, grain);
  if (threads == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  // A few chunks per thread balance uneven work (causal attention rows) without much overhead.
  const int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(threads) * 4);
  const int64_t per = (n + chunks - 1) / chunks;
  const std::function<void(int64_t)> chunk_fn = [&](int64_t c) {
    const int64_t b = c * per, e = std::min(n, b + per);
    if (b < e) fn(b, e);
  };
  pool().run(chunks, chunk_fn);
}

}  // namespace loco
