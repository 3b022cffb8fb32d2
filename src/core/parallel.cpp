#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>


namespace loco {

namespace {

// One parallel_for call. It lives on the caller's stack; the caller returns only when every
// chunk has run and no worker still holds the job, so a worker never reads a job that has been
// replaced or destroyed.
struct Job {
  const std::function<void(int64_t)>* fn;
  int64_t chunks;
  std::atomic<int64_t> next{0};
  int64_t pending;     // chunks not yet finished (under the pool's mutex)
  int holders = 0;     // workers inside work() for this job (under the pool's mutex)
  std::exception_ptr error;
};

class Pool {
 public:
  ~Pool() { resize(0); }

  void resize(int workers) {
    std::lock_guard<std::mutex> caller(caller_mu_);
    {
      std::unique_lock<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    stop_ = false;
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
  }

  int workers() const { return int(threads_.size()); }

  // Callers from several threads take turns; a call from inside a chunk runs inline (the pool's
  // threads are all busy with the outer job, and waiting for them would deadlock).
  void run(int64_t chunks, const std::function<void(int64_t)>& chunk_fn) {
    if (t_inside_chunk) {
      for (int64_t i = 0; i < chunks; ++i) chunk_fn(i);
      return;
    }
    std::lock_guard<std::mutex> caller(caller_mu_);
    Job job;
    job.fn = &chunk_fn;
    job.chunks = chunks;
    job.pending = chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      job_ = &job;
      ++generation_;
    }
    cv_.notify_all();
    work(job);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return job.pending == 0 && job.holders == 0; });
    job_ = nullptr;
    lock.unlock();
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  void work(Job& job) {
    for (;;) {
      const int64_t i = job.next.fetch_add(1);
      if (i >= job.chunks) return;
      std::exception_ptr error;
      t_inside_chunk = true;
      try {
        (*job.fn)(i);
      } catch (...) {
        error = std::current_exception();
      }
      t_inside_chunk = false;
      std::lock_guard<std::mutex> lock(mu_);
      if (error && !job.error) job.error = error;
      if (--job.pending == 0) done_cv_.notify_all();
    }
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      Job* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
        if (stop_) return;
        seen = generation_;
        job = job_;
        ++job->holders;
      }
      work(*job);
      std::lock_guard<std::mutex> lock(mu_);
      if (--job->holders == 0) done_cv_.notify_all();
    }
  }

  static thread_local bool t_inside_chunk;
  std::vector<std::thread> threads_;
  std::mutex caller_mu_;  // one run() or resize() at a time
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  Job* job_ = nullptr;  // the running job, if any (under mu_)
  uint64_t generation_ = 0;
  bool stop_ = false;
};

thread_local bool Pool::t_inside_chunk = false;

Pool& pool() {
  static Pool p;
  return p;
}

std::atomic<int> g_threads{0};  // 0: not yet set (all cores)

}  // namespace

void set_compute_threads(int n) {
  n = std::max(1, n);
  g_threads = n;
  pool().resize(n - 1);
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
