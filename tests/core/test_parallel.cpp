// The compute pool under load: many short jobs back to back, from several threads at once, with
// uneven chunks, exceptions and nested calls. Each job counts the visits of every index in a
// buffer that lives only for that job; a worker still running a chunk of a finished job (the race
// the pool had: a worker of the previous job read the next job's state) shows up as a count other
// than 1, a visit after the job returned, or a ThreadSanitizer report (this test runs under TSan
// in scripts/sanitize.sh).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel.h"

using namespace loco;

namespace {

// Runs `jobs` parallel_for calls of varying size; returns the number of failed checks.
int hammer(int jobs, uint64_t seed) {
  int failures = 0;
  uint64_t state = seed;
  for (int j = 0; j < jobs; ++j) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t n = 1 + int64_t(state >> 33) % 97;
    auto visits = std::make_unique<std::vector<std::atomic<int>>>(size_t(n));
    auto closed = std::make_shared<std::atomic<bool>>(false);
    std::atomic<int> late{0};
    parallel_for(n, 1, [&, closed](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) (*visits)[size_t(i)].fetch_add(1);
      // Uneven chunks: some finish at once, some yield, so workers straddle job boundaries.
      if ((b + j) % 3 == 0) std::this_thread::yield();
      if (closed->load()) late.fetch_add(1);
    });
    closed->store(true);
    for (int64_t i = 0; i < n; ++i) failures += (*visits)[size_t(i)].load() != 1;
    failures += late.load();
  }
  return failures;
}

}  // namespace

TEST(Parallel, EveryIndexOnceAcrossManyJobs) {
  set_compute_threads(4);  // more threads than cores: workers get preempted mid-job
  EXPECT_EQ(hammer(3000, 1), 0);
  set_compute_threads(2);
  EXPECT_EQ(hammer(3000, 2), 0);
}

TEST(Parallel, SeveralCallingThreadsTakeTurns) {
  set_compute_threads(3);
  std::vector<std::thread> callers;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([t, &failures] { failures[size_t(t)] = hammer(800, 10 + uint64_t(t)); });
  for (auto& c : callers) c.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[size_t(t)], 0) << "caller " << t;
}

TEST(Parallel, ExceptionReachesTheCallerAfterEveryChunkEnded) {
  set_compute_threads(3);
  for (int round = 0; round < 200; ++round) {
    std::atomic<int> running{0};
    bool thrown = false;
    try {
      parallel_for(64, 1, [&](int64_t b, int64_t e) {
        running.fetch_add(1);
        if (b <= 5 && 5 < e) {
          running.fetch_sub(1);
          throw std::runtime_error("chunk failed");
        }
        std::this_thread::yield();
        running.fetch_sub(1);
      });
    } catch (const std::runtime_error& e) {
      thrown = std::string(e.what()) == "chunk failed";
    }
    ASSERT_TRUE(thrown) << "round " << round;
    ASSERT_EQ(running.load(), 0) << "a chunk was still running when parallel_for returned";
  }
  EXPECT_EQ(hammer(50, 3), 0);  // the pool still works after failed jobs
}

TEST(Parallel, NestedCallRunsInline) {
  set_compute_threads(2);
  std::vector<std::atomic<int>> visits(32 * 16);
  parallel_for(32, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(16, 1, [&](int64_t ib, int64_t ie) {
        for (int64_t k = ib; k < ie; ++k) visits[size_t(i * 16 + k)].fetch_add(1);
      });
  });
  int wrong = 0;
  for (auto& v : visits) wrong += v.load() != 1;
  EXPECT_EQ(wrong, 0);
}
