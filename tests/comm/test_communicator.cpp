// Collectives over the in-process transport: results, determinism across ranks, exact traffic
// counts, bounded waits and abort propagation. The link model against a manual clock.
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/communicator.h"
#include "comm/inprocess.h"
#include "comm/link.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/rng.h"

using namespace loco;

namespace {

// Runs fn(comm) on M in-process workers, each in its own thread; rethrows the first failure.
void run_workers(int M, const std::function<void(Communicator&)>& fn, CommOptions opt = {}) {
  auto transports = make_inprocess_transports(M);
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr err;
  for (int r = 0; r < M; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm(std::move(transports[size_t(r)]), opt, nullptr);
        fn(comm);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!err) err = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (err) std::rethrow_exception(err);
}

std::vector<float> rank_data(int rank, int64_t n) {
  Rng rng(uint64_t(rank) + 100);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(rng.normal());
  return v;
}

class ManualClock : public Clock {
 public:
  double now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return t_;
  }
  void sleep_until(double t) const override {
    std::lock_guard<std::mutex> lock(mu_);
    t_ = std::max(t_, t);
  }

 private:
  mutable std::mutex mu_;
  mutable double t_ = 0;
};

}  // namespace

TEST(Communicator, AllReduceSumAndMean) {
  for (int M : {1, 2, 3, 5}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000)}) {
      std::vector<std::vector<float>> results(static_cast<size_t>(M));
      run_workers(M, [&](Communicator& c) {
        auto v = rank_data(c.rank(), n);
        c.all_reduce(v.data(), n, ReduceOp::Sum);
        auto m = rank_data(c.rank(), n);
        c.all_reduce(m.data(), n, ReduceOp::Mean);
        for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(m[size_t(i)], v[size_t(i)] / float(M));
        results[size_t(c.rank())] = v;
      });
      for (int64_t i = 0; i < n; ++i) {
        double expect = 0;
        for (int r = 0; r < M; ++r) expect += rank_data(r, n)[size_t(i)];
        LOCO_EXPECT_NEAR(results[0][size_t(i)], expect, 1e-5);
      }
      for (int r = 1; r < M; ++r) EXPECT_EQ(results[size_t(r)], results[0]) << "ranks disagree bitwise";
    }
  }
}

TEST(Communicator, AllReduceOrderIsFixed) {
  // Chunk c (blocks of 256 floats with index = c mod M) is summed as ((x_c + x_{c+1}) + ...)
  // in ring order: check every element against that exact order.
  const int M = 3;
  const int64_t Q = 256, n = 5 * Q + 17;  // chunk 0: blocks 0, 3; chunk 1: 1, 4; chunk 2: 2, 5
  auto x = [](int r, int64_t i) {
    const float big = (i % 2 ? -1e8f : 1e8f) * float(r + 1);
    return i % 3 == 0 ? big : 0.3f + float(r) + float(i) * 1e-3f;
  };
  std::vector<float> out(static_cast<size_t>(n));
  run_workers(M, [&](Communicator& c) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = x(c.rank(), i);
    c.all_reduce(v.data(), n, ReduceOp::Sum);
    if (c.rank() == 0) out = v;
  });
  for (int64_t i = 0; i < n; ++i) {
    const int c = int((i / Q) % M);
    float acc = x(c, i);
    for (int k = 1; k < M; ++k) acc = acc + x((c + k) % M, i);
    ASSERT_EQ(out[size_t(i)], acc) << "element " << i;
  }
}

TEST(Communicator, AllReduceInPiecesKeepsTheOrderAndCountsMessages) {
  // Chunks above 256 blocks (256 KiB) travel in pieces, forwarded as they arrive: the same
  // summation order as one message per chunk, one message per piece.
  const int M = 3;
  const int64_t Q = 256, n = 3 * 256 * Q * 2 + 5 * Q + 3;  // chunks of 513 or 514 blocks: 3 pieces each
  auto x = [](int r, int64_t i) { return (i % 7 == 0 ? 1e7f : 0.1f) * float(r + 1) + float(i % 1000) * 1e-3f; };
  std::vector<std::vector<float>> sum(M), mean(M);
  std::vector<int64_t> messages(M);
  run_workers(M, [&](Communicator& c) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = x(c.rank(), i);
    std::vector<float> m = v;
    c.all_reduce(v.data(), n, ReduceOp::Sum, "sum");
    c.all_reduce(m.data(), n, ReduceOp::Mean, "mean");
    sum[size_t(c.rank())] = v;
    mean[size_t(c.rank())] = m;
    messages[size_t(c.rank())] = c.traffic().to_json()["by_operation"]["sum"]["messages_sent"].get<int64_t>();
  });
  for (int64_t i = 0; i < n; ++i) {
    const int c = int((i / Q) % M);
    float acc = x(c, i);
    for (int k = 1; k < M; ++k) acc = acc + x((c + k) % M, i);
    ASSERT_EQ(sum[0][size_t(i)], acc) << "element " << i;
    ASSERT_EQ(mean[0][size_t(i)], acc / float(M)) << "element " << i;
  }
  for (int r = 1; r < M; ++r) {
    EXPECT_EQ(sum[size_t(r)], sum[0]);
    EXPECT_EQ(mean[size_t(r)], mean[0]);
  }
  for (int r = 0; r < M; ++r) EXPECT_EQ(messages[size_t(r)], 2 * (M - 1) * 3) << "worker " << r;
}

TEST(Communicator, AllReduceResultDependsOnlyOnTheOffset) {
  // Buffers of different lengths with the same values at the same offsets reduce to the same
  // bits there (a tied embedding on two pipeline stages holding different other tensors).
  const int M = 5;
  const int64_t shared = 3000;
  std::vector<std::vector<float>> a(M), b(M);
  run_workers(M, [&](Communicator& c) {
    auto v = rank_data(c.rank(), shared + 1234), w = rank_data(c.rank(), shared + 77);
    std::copy_n(v.begin(), shared, w.begin());
    c.all_reduce(v.data(), int64_t(v.size()), ReduceOp::Mean);
    c.all_reduce(w.data(), int64_t(w.size()), ReduceOp::Mean);
    a[size_t(c.rank())] = v;
    b[size_t(c.rank())] = w;
  });
  for (int r = 0; r < M; ++r)
    for (int64_t i = 0; i < shared; ++i) ASSERT_EQ(a[size_t(r)][size_t(i)], b[size_t(r)][size_t(i)]) << i;
}

TEST(Communicator, TrafficCountsArePayloadBytes) {
  const int M = 4;
  const int64_t n = 2001;  // chunks of 512, 512, 512, 465
  run_workers(M, [&](Communicator& c) {
    std::vector<float> v(static_cast<size_t>(n), 1.0f);
    c.all_reduce(v.data(), n, ReduceOp::Sum, "ar");
    auto chunk = [&](int i) {  // blocks of 256 with index = i mod M
      int64_t size = 0;
      for (int64_t b = 256 * i; b < n; b += 256 * M) size += std::min<int64_t>(256, n - b);
      return size;
    };
    const int r = c.rank();
    const int64_t floats = 2 * n - chunk((r + 1) % M) - chunk((r + 2) % M);
    EXPECT_EQ(ring_all_reduce_floats_sent(n, M, r), floats);
    auto j = c.traffic().to_json();
    EXPECT_EQ(j["by_operation"]["ar"]["bytes_sent"].get<int64_t>(), floats * 4);
    EXPECT_EQ(j["by_operation"]["ar"]["messages_sent"].get<int64_t>(), 2 * (M - 1));
    // All-gather of variable payloads: rank r sends every payload but its successor's.
    const auto all = c.all_gather(std::string(size_t(10 * (r + 1)), 'x'), "ag");
    for (int p = 0; p < M; ++p) EXPECT_EQ(all[size_t(p)], std::string(size_t(10 * (p + 1)), 'x'));
    j = c.traffic().to_json();
    EXPECT_EQ(j["by_operation"]["ag"]["bytes_sent"].get<int64_t>(), 10 * (1 + 2 + 3 + 4) - 10 * ((r + 1) % M + 1));
    EXPECT_EQ(j["by_operation"]["ag"]["bytes_received"].get<int64_t>(), 10 * (1 + 2 + 3 + 4) - 10 * (r + 1));
  });
}

TEST(Communicator, PointToPointBroadcastBarrierAndOverlap) {
  run_workers(3, [&](Communicator& c) {
    std::string b = c.rank() == 1 ? std::string("hello") : std::string();
    auto h = c.broadcast_start(&b, 1);
    c.wait(h);
    EXPECT_EQ(b, "hello");
    if (c.rank() < 2) {
      std::string got;
      const int peer = 1 - c.rank();
      auto e = c.exchange_start(peer, "from" + std::to_string(c.rank()), &got);
      c.wait(e);
      EXPECT_EQ(got, "from" + std::to_string(peer));
    }
    // Non-blocking: start an all-reduce, compute meanwhile, then wait.
    std::vector<float> v(100000, float(c.rank()));
    auto ar = c.all_reduce_start(v.data(), int64_t(v.size()), ReduceOp::Sum);
    double busy = 0;
    for (int i = 0; i < 1000; ++i) busy += std::sqrt(double(i));
    EXPECT_GT(busy, 0);
    c.wait(ar);
    EXPECT_EQ(v[99999], 3.0f);
    c.barrier();
  });
}

TEST(Communicator, SilentPeerTimesOutNamingIt) {
  CommOptions opt;
  opt.timeout_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_workers(2, [&](Communicator& c) {
      if (c.rank() == 0) {
        std::string got;
        auto h = c.recv_start(1, &got);
        c.wait(h);  // worker 1 never sends
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
      }
    }, opt);
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("worker 1 did not answer worker 0"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(Communicator, AbortStopsBlockedWorkersAtOnce) {
  CommOptions opt;
  opt.timeout_s = 30;  // far longer than the test may take
  const auto t0 = std::chrono::steady_clock::now();
  std::string seen;
  std::mutex mu;
  auto transports = make_inprocess_transports(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      Communicator c(std::move(transports[size_t(r)]), opt, nullptr);
      if (r == 2) {
        c.abort("worker 2 failed: boom");
        return;
      }
      try {
        std::vector<float> v(10, 1.0f);
        c.all_reduce(v.data(), 10, ReduceOp::Sum);
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        seen += e.what();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_NE(seen.find("worker 2 failed: boom"), std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

// The embedding process's interrupt check (core/interrupt.h) says yes on one thread only: that
// worker's wait aborts the run's communication, joins its operation and throws Interrupted; the
// peer learns why; neither waits for the 30 s timeout.
std::atomic<std::thread::id> g_interrupted_thread{};
bool interrupted_here() { return std::this_thread::get_id() == g_interrupted_thread.load(); }

TEST(Communicator, AnInterruptEndsAWaitAndTellsThePeers) {
  CommOptions opt;
  opt.timeout_s = 30;  // far longer than the test may take
  const auto t0 = std::chrono::steady_clock::now();
  std::string said[2];
  bool interrupted_type = false;
  auto transports = make_inprocess_transports(2);
  set_interrupt_check(interrupted_here);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Communicator c(std::move(transports[size_t(r)]), opt, nullptr);
      std::vector<float> v(10, 1.0f);
      if (r == 0) g_interrupted_thread.store(std::this_thread::get_id());
      else std::this_thread::sleep_for(std::chrono::milliseconds(500));  // worker 0 waits for it meanwhile
      try {
        c.all_reduce(v.data(), 10, ReduceOp::Sum);
        said[r] = "returned";
      } catch (const Interrupted& e) {
        interrupted_type = r == 0;
        said[r] = e.what();
      } catch (const Error& e) {
        said[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  set_interrupt_check(nullptr);
  EXPECT_TRUE(interrupted_type) << said[0];
  EXPECT_NE(said[0].find("interrupted while waiting for the peers (all_reduce)"), std::string::npos) << said[0];
  EXPECT_NE(said[1].find("member 0 was interrupted"), std::string::npos) << said[1];
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST(LinkModel, TransferTimeIsLatencyPlusSizeOverBandwidth) {
  auto clock = std::make_shared<ManualClock>();
  auto ts = make_inprocess_transports(2);
  const LinkConfig link{100e6, 0.030};  // 100 Mbit/s, 30 ms
  auto a = wrap_with_link(std::move(ts[0]), link, clock);
  auto b = wrap_with_link(std::move(ts[1]), link, clock);
  const size_t bytes = 1250000;  // 10 Mbit -> 0.1 s on the wire
  const SendTiming t1 = a->send(1, 0, std::string(bytes, 'a'));
  EXPECT_DOUBLE_EQ(t1.start, 0.0);
  EXPECT_DOUBLE_EQ(t1.end, 0.1);
  // A second transfer on the same link starts when the first has left it.
  const SendTiming t2 = a->send(1, 0, std::string(bytes, 'b'));
  EXPECT_DOUBLE_EQ(t2.start, 0.1);
  EXPECT_DOUBLE_EQ(t2.end, 0.2);
  EXPECT_EQ(b->recv(0, 0, 1.0), std::string(bytes, 'a'));
  EXPECT_DOUBLE_EQ(clock->now(), 0.1 + 0.030);
  EXPECT_EQ(b->recv(0, 0, 1.0), std::string(bytes, 'b'));
  EXPECT_DOUBLE_EQ(clock->now(), 0.2 + 0.030);
  // The other direction is a different link: free, so a transfer starts now.
  const SendTiming t3 = b->send(0, 0, std::string(125, 'c'));
  EXPECT_DOUBLE_EQ(t3.start, 0.23);
  EXPECT_DOUBLE_EQ(t3.end, 0.23 + 1000.0 / 100e6);
}

TEST(LinkModel, TcpSlowStartAndRestartAfterIdle) {
  LinkConfig link{100e6, 0.030, true};
  const double rate = 12.5e6 * 1448 / 1514, rtt = 0.06, iw = 14480;
  TcpConnection conn;
  // 1 MB on a new connection: rounds of 1, 2, 4, 8, 16, 32 initial windows (each a round trip,
  // all below the 717 KB bandwidth-delay product), then the rest at the link's payload rate.
  const double first = link_transfer_time(link, conn, 0.0, 1e6);
  LOCO_EXPECT_NEAR(first, 6 * rtt + (1e6 - 63 * iw) / rate, 1e-12);
  EXPECT_DOUBLE_EQ(conn.window, 64 * iw);
  // At once after: the window is open, the payload rate alone.
  LOCO_EXPECT_NEAR(link_transfer_time(link, conn, first, 1e6), 1e6 / rate, 1e-12);
  // After 1 s idle: (1 - rto) / rto with rto = 0.26 s -> halved three times.
  const double end = conn.last_end;
  link_transfer_time(link, conn, end + 1.0, 1.0);
  EXPECT_DOUBLE_EQ(conn.window, 8 * iw);
  // Without TCP the link is an ideal pipe.
  link.tcp = false;
  EXPECT_DOUBLE_EQ(link_transfer_time(link, conn, 0.0, 1.25e6), 0.1);
}

TEST(LinkModel, TcpConnectionsToSeveralPeersSlowStartSideBySide) {
  auto clock = std::make_shared<ManualClock>();
  auto ts = make_inprocess_transports(3);
  const LinkConfig link{100e6, 0.030, true};
  const double rate = 12.5e6 * 1448 / 1514, rtt = 0.06, iw = 14480;
  auto a = wrap_with_link(std::move(ts[0]), link, clock);
  // 100 KB to each of two peers on new connections: rounds of 1 and 2 initial windows (a round
  // trip each), then the remaining 56,560 bytes. The link is idle during those round trips, so
  // the second connection's slow start runs beside the first's, not after it.
  const double slow_start = 2 * rtt + (1e5 - 3 * iw) / rate;
  const SendTiming t1 = a->send(1, 0, std::string(100000, 'a'));
  const SendTiming t2 = a->send(2, 0, std::string(100000, 'b'));
  EXPECT_DOUBLE_EQ(t1.start, 0.0);
  LOCO_EXPECT_NEAR(t1.end, slow_start, 1e-12);
  EXPECT_DOUBLE_EQ(t2.start, 0.0);
  LOCO_EXPECT_NEAR(t2.end, slow_start, 1e-12);
  // A connection's next message waits for its previous one.
  const SendTiming t3 = a->send(1, 0, std::string(10, 'c'));
  LOCO_EXPECT_NEAR(t3.start, t1.end, 1e-12);
  // The link's rate is still shared: without latency there is no slow start, and 1.25 MB to
  // each of two peers at once ends after the wire time of one, then of both.
  auto ts2 = make_inprocess_transports(3);
  auto b = wrap_with_link(std::move(ts2[0]), LinkConfig{100e6, 0.0, true}, clock);
  const double now = clock->now(), wire = 1.25e6 / rate;
  const SendTiming t4 = b->send(1, 0, std::string(1250000, 'd'));
  const SendTiming t5 = b->send(2, 0, std::string(1250000, 'e'));
  LOCO_EXPECT_NEAR(t4.end, now + wire, 1e-12);
  EXPECT_DOUBLE_EQ(t5.start, now);
  LOCO_EXPECT_NEAR(t5.end, now + 2 * wire, 1e-12);
}

TEST(LinkModel, PeakRateAndParsing) {
  TrafficStats s(1.0);
  s.record_send("x", 1000, 0.0, 2.0);  // 500 B/s over two windows
  s.record_send("x", 300, 0.5, 0.5);   // instantaneous, in window 0
  EXPECT_DOUBLE_EQ(s.peak_send_rate(), 800.0);
  EXPECT_EQ(s.bytes_sent(), 1300);
  EXPECT_DOUBLE_EQ(parse_bandwidth("100Mbit", "k"), 100e6);
  EXPECT_DOUBLE_EQ(parse_bandwidth("2.5 Gbit/s", "k"), 2.5e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("inf", "k"), 0);
  EXPECT_DOUBLE_EQ(parse_duration("30ms", "k"), 0.030);
  EXPECT_DOUBLE_EQ(parse_duration("1.5s", "k"), 1.5);
  EXPECT_THROW(parse_bandwidth("100 furlongs", "k"), Error);
  EXPECT_THROW(parse_duration("-3ms", "k"), Error);
}

TEST(Communicator, GroupCollectivesInvolveOnlyTheirMembers) {
  // Groups {0, 2} and {1, 3} reduce; then columns {0, 1} and {2, 3} gather the group results.
  const int M = 4;
  const int64_t n = 7;
  std::vector<std::vector<float>> reduced(M);
  std::vector<std::vector<float>> gathered(M);
  std::vector<int64_t> sent(M);
  run_workers(M, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> data = rank_data(r, n);
    auto h1 = comm.all_reduce_group_start(data.data(), n, ReduceOp::Mean, {r % 2, r % 2 + 2});
    std::vector<float> out;
    auto h2 = comm.all_gather_floats_group_start(data.data(), {n, n}, &out, {r / 2 * 2, r / 2 * 2 + 1});
    comm.wait(h1);
    comm.wait(h2);
    reduced[size_t(r)] = data;
    gathered[size_t(r)] = out;
    sent[size_t(r)] = comm.traffic().to_json()["bytes_sent"].get<int64_t>();
    EXPECT_THROW(comm.all_reduce_group_start(data.data(), n, ReduceOp::Sum, {(r + 1) % 4}), Error);
  });
  for (int r = 0; r < M; ++r) {
    const auto a = rank_data(r % 2, n), b = rank_data(r % 2 + 2, n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(reduced[size_t(r)][size_t(i)], (a[size_t(i)] + b[size_t(i)]) / 2);
    EXPECT_EQ(reduced[size_t(r)], reduced[size_t(r % 2)]) << "the same bits in a group";
    ASSERT_EQ(gathered[size_t(r)].size(), size_t(2 * n));
    for (int k = 0; k < 2; ++k) {  // column member k's reduced data, read after the reduction
      const int from = r / 2 * 2 + k;
      const std::vector<float> got(gathered[size_t(r)].begin() + k * n, gathered[size_t(r)].begin() + (k + 1) * n);
      EXPECT_EQ(got, reduced[size_t(from)]);
    }
    // Group of 2: all of the buffer once (two chunks); column of 2: one payload.
    EXPECT_EQ(sent[size_t(r)], 4 * n + 4 * n);
  }
}

TEST(Communicator, GatheredFloatsTravelInPiecesOfTheirCounts) {
  // 3 members: one sends two full pieces (65,536 floats each) and a bit, one nothing, one 3
  // floats; every member ends with all of them in member order, twice (the second time into
  // the buffer the first call sized: no new allocation); a worker that sends another count than
  // the others expect is refused by the worker it sends to, and blamed.
  const int M = 3;
  const std::vector<int64_t> counts{2 * 65536 + 5, 0, 3};
  std::vector<float> want;
  for (int m = 0; m < M; ++m) {
    const auto d = rank_data(m, counts[size_t(m)]);
    want.insert(want.end(), d.begin(), d.end());
  }
  std::vector<std::vector<float>> got(M);
  std::vector<int> kept(M, 0);
  run_workers(M, [&](Communicator& comm) {
    const int r = comm.rank();
    const std::vector<float> data = rank_data(r, counts[size_t(r)]);
    std::vector<float> out;
    auto h = comm.all_gather_floats_group_start(data.data(), counts, &out, {0, 1, 2});
    comm.wait(h);
    const float* first = out.data();
    out.clear();
    h = comm.all_gather_floats_group_start(data.data(), counts, &out, {0, 1, 2});
    comm.wait(h);
    kept[size_t(r)] = out.data() == first;
    got[size_t(r)] = out;
  });
  for (int r = 0; r < M; ++r) {
    EXPECT_EQ(got[size_t(r)], want) << "member " << r;
    EXPECT_TRUE(kept[size_t(r)]) << "member " << r << ": the second call allocated anew";
  }
  std::string why;
  std::vector<int> blamed;
  run_workers(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const std::vector<int64_t> told = r == 0 ? std::vector<int64_t>{5, 3} : std::vector<int64_t>{4, 3};
    const std::vector<float> data = rank_data(r, told[size_t(r)]);
    std::vector<float> out;
    auto h = comm.all_gather_floats_group_start(data.data(), told, &out, {0, 1});
    try {
      comm.wait(h);
    } catch (const PeerError& e) {
      why = e.what();
      blamed = e.peers();
    }
  });
  EXPECT_NE(why.find("sent 20 bytes, expected 16"), std::string::npos) << why;
  EXPECT_EQ(blamed, std::vector<int>{0});
}
