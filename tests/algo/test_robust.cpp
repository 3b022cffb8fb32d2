// Screening and robust aggregation of DiLoCo's contributions (algo/robust.h): the rules against
// values worked out by hand, and one round over in-process communicators with a bad member.
#include <gtest/gtest.h>

#include "../tolerance.h"

#include <cmath>
#include <limits>
#include <thread>

#include "comm/fault.h"
#include "algo/robust.h"
#include "comm/inprocess.h"
#include "core/error.h"
#include "core/rng.h"

using namespace loco;

namespace {

const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

std::vector<const float*> pointers(const std::vector<std::vector<float>>& p) {
  std::vector<const float*> out;
  for (const auto& x : p) out.push_back(x.data());
  return out;
}

std::vector<float> aggregate(const std::vector<std::vector<float>>& p, const std::vector<int>& members,
                             const std::string& rule, double trim = 0.25) {
  AggregateOptions o;
  o.rule = rule;
  o.trim = trim;
  std::vector<float> out(p[0].size());
  robust_aggregate(pointers(p), members, int64_t(out.size()), o, out.data());
  return out;
}

}  // namespace

TEST(Screening, RejectsNonFiniteAndOutlyingNorms) {
  auto s = screen_norms({1.0, kNan, 1.2, 0.9, 3.5, kInf}, 3);
  // Finite norms 1.0, 1.2, 0.9, 3.5: median 1.1; 3.5 > 3.3 is rejected, NaN and Inf always.
  EXPECT_EQ(s.rejected, (std::vector<int>{1, 4, 5}));
  EXPECT_EQ(s.accepted(), (std::vector<int>{0, 2, 3}));
  EXPECT_NE(s.why[0].find("non-finite"), std::string::npos);
  EXPECT_NE(s.why[1].find("3.5 > 3 x the round's median 1.1"), std::string::npos) << s.why[1];
  EXPECT_EQ(describe_rejections(s, "replica").substr(0, 10), "replica 1:");
  // Just at the bound is kept; 0 turns the norm rule off; two members cannot outvote each other.
  EXPECT_TRUE(screen_norms({1, 1, 3}, 3).rejected.empty());
  EXPECT_EQ(screen_norms({1, 1, 3.0001}, 3).rejected, std::vector<int>{2});
  EXPECT_EQ(screen_norms({1, 1, 1e9, kNan}, 0).rejected, std::vector<int>{3});
  EXPECT_TRUE(screen_norms({1, 1e9}, 3).rejected.empty());
  EXPECT_TRUE(screen_norms({0, 0, 0}, 3).rejected.empty());
}

TEST(RobustAggregate, RulesPerCoordinate) {
  // Five members, two coordinates; member 4 is far off in the first.
  const std::vector<std::vector<float>> p = {{1, 10}, {2, 20}, {3, 30}, {4, 40}, {100, 50}};
  const std::vector<int> all = {0, 1, 2, 3, 4};
  EXPECT_EQ(aggregate(p, all, "mean"), (std::vector<float>{22, 30}));
  EXPECT_EQ(aggregate(p, all, "median"), (std::vector<float>{3, 30}));
  // trim 0.25 of 5: one value dropped at each end.
  EXPECT_EQ(aggregate(p, all, "trimmed-mean"), (std::vector<float>{3, 30}));
  EXPECT_EQ(aggregate(p, all, "trimmed-mean", 0.4), (std::vector<float>{3, 30}));  // floor(2.0) = 2: the median
  EXPECT_EQ(aggregate(p, all, "trimmed-mean", 0.1), (std::vector<float>{22, 30}));  // floor(0.5) = 0: the mean
  // Even count: the mean of the two middle values; members outside the list do not count.
  EXPECT_EQ(aggregate(p, {0, 1, 2, 4}, "median"), (std::vector<float>{2.5f, 25}));
  EXPECT_EQ(aggregate(p, {1, 3}, "mean"), (std::vector<float>{3, 30}));
  AggregateOptions bad;
  bad.rule = "mode";
  std::vector<float> out(2);
  EXPECT_THROW(robust_aggregate(pointers(p), all, 2, bad, out.data()), Error);
}

TEST(RobustAggregate, CenteredClipBoundsAnOutlierAndKeepsAgreement) {
  const int n = 64, M = 8;
  Rng rng(7);
  std::vector<std::vector<float>> p(M, std::vector<float>(n));
  std::vector<double> honest_mean(n, 0.0);
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < n; ++i) {
      p[size_t(m)][size_t(i)] = float(1 + 0.01 * rng.normal());
      if (m < M - 1) honest_mean[size_t(i)] += p[size_t(m)][size_t(i)] / (M - 1);
    }
  std::vector<int> all(M);
  for (int m = 0; m < M; ++m) all[size_t(m)] = m;
  // Member 7 sends a vector 1e4 away: the mean moves by about 1e4 / 8 per coordinate, centered
  // clipping by at most 3 tau / 8 in all (tau: the honest spread, about 0.01 sqrt(n)).
  for (int i = 0; i < n; ++i) p[M - 1][size_t(i)] = 1e4f;
  const auto mean = aggregate(p, all, "mean"), cc = aggregate(p, all, "centered-clip");
  double far_mean = 0, far_cc = 0;
  for (int i = 0; i < n; ++i) {
    far_mean = std::max(far_mean, std::abs(mean[size_t(i)] - honest_mean[size_t(i)]));
    far_cc = std::max(far_cc, std::abs(cc[size_t(i)] - honest_mean[size_t(i)]));
  }
  EXPECT_GT(far_mean, 1000);
  EXPECT_LT(far_cc, 0.03) << "centered clipping let the outlier through";
  // Identical members: every rule returns them exactly.
  std::vector<std::vector<float>> same(5, p[0]);
  for (const char* rule : {"mean", "median", "trimmed-mean", "centered-clip"})
    EXPECT_EQ(aggregate(same, {0, 1, 2, 3, 4}, rule), p[0]) << rule;
}

namespace {

// One reduce_outer round among M in-process members; member m contributes contributions[m].
struct RoundResult {
  std::vector<std::vector<float>> out;
  std::vector<Screening> screening;
  std::vector<std::string> errors;
  int64_t bytes_sent0 = 0;
};

RoundResult run_round(const std::vector<float>& theta, const std::vector<std::vector<float>>& contributions,
                      const AggregateOptions& o, int64_t short_member = -1) {
  const int M = int(contributions.size());
  const int64_t n = int64_t(theta.size());
  RoundResult r;
  r.out.assign(size_t(M), std::vector<float>(size_t(n)));
  r.screening.resize(size_t(M));
  r.errors.resize(size_t(M));
  auto transports = make_inprocess_transports(M);
  std::vector<std::thread> threads;
  for (int m = 0; m < M; ++m)
    threads.emplace_back([&, m] {
      CommOptions co;
      co.timeout_s = 5;
      Communicator comm(std::move(transports[size_t(m)]), co, nullptr);
      try {
        // A member whose payload is one float short (a peer lying about the size of what it sends).
        const int64_t len = m == short_member ? n - 1 : n;
        r.screening[size_t(m)] =
            reduce_outer(comm, theta.data(), contributions[size_t(m)].data(), len, o, r.out[size_t(m)].data(), "outer");
      } catch (const std::exception& e) {
        r.errors[size_t(m)] = e.what();
        comm.abort(e.what());
      }
      if (m == 0) r.bytes_sent0 = comm.traffic().bytes_sent();
    });
  for (auto& t : threads) t.join();
  return r;
}

std::vector<std::vector<float>> honest(int M, int64_t n, const std::vector<float>& theta, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<float>> p(static_cast<size_t>(M), std::vector<float>(static_cast<size_t>(n)));
  for (auto& x : p)
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(theta[size_t(i)] - 0.01 * (1 + rng.normal()));
  return p;
}

}  // namespace

TEST(ReduceOuter, MeanWithScreeningLeavesOutANanMemberAndMatchesTheAllReduceOtherwise) {
  const int M = 4;
  const int64_t n = 1000;
  std::vector<float> theta(n);
  Rng rng(3);
  for (auto& x : theta) x = float(rng.normal());
  auto p = honest(M, n, theta, 11);
  AggregateOptions plain, screened;
  screened.screen = true;
  // Nobody rejected: the same bits as the plain all-reduce.
  const auto a = run_round(theta, p, plain), b = run_round(theta, p, screened);
  for (int m = 0; m < M; ++m) {
    EXPECT_EQ(a.out[size_t(m)], b.out[size_t(m)]);
    EXPECT_TRUE(b.screening[size_t(m)].rejected.empty());
  }
  // Member 2 sends NaN in one entry: left out by every member, the others' mean on all.
  p[2][5] = std::numeric_limits<float>::quiet_NaN();
  const auto c = run_round(theta, p, screened);
  for (int m = 0; m < M; ++m) {
    EXPECT_EQ(c.errors[size_t(m)], "");
    EXPECT_EQ(c.screening[size_t(m)].rejected, std::vector<int>{2});
    EXPECT_EQ(c.out[size_t(m)], c.out[0]);
  }
  for (int64_t i = 0; i < n; ++i) {
    const double want = (double(p[0][size_t(i)]) + p[1][size_t(i)] + p[3][size_t(i)]) / 3;
    LOCO_ASSERT_NEAR(c.out[0][size_t(i)], want, 1e-6 * (1 + std::abs(want))) << i;
  }
  // Without screening the NaN reaches everyone.
  const auto d = run_round(theta, p, plain);
  EXPECT_TRUE(std::isnan(d.out[1][5]));
}

TEST(ReduceOuter, RobustRulesSeeEveryContributionAndAgreeBitwise) {
  const int M = 5;
  const int64_t n = 777;
  std::vector<float> theta(n, 0.5f);
  auto p = honest(M, n, theta, 5);
  // Member 4: a sign-flipped outer gradient ten times too large (norm rule), member 1: Inf.
  for (int64_t i = 0; i < n; ++i) p[4][size_t(i)] = float(theta[size_t(i)] + 10 * (theta[size_t(i)] - p[4][size_t(i)]));
  p[1][0] = std::numeric_limits<float>::infinity();
  for (const char* rule : {"mean", "median", "trimmed-mean", "centered-clip"}) {
    AggregateOptions o;
    o.rule = rule;
    o.screen = true;
    const auto r = run_round(theta, p, o);
    const auto want = aggregate(p, {0, 2, 3}, rule);
    for (int m = 0; m < M; ++m) {
      EXPECT_EQ(r.errors[size_t(m)], "") << rule;
      EXPECT_EQ(r.screening[size_t(m)].rejected, (std::vector<int>{1, 4})) << rule;
      if (std::string(rule) != "mean") EXPECT_EQ(r.out[size_t(m)], want) << rule << " member " << m;
    }
    if (std::string(rule) != "mean") {
      // The all-gather: each member sends the others' payloads on around the ring, M - 1 of n floats.
      EXPECT_EQ(r.bytes_sent0, int64_t(M - 1) * n * 4) << rule;
    }
  }
  // A robust rule without the norm rule still rejects the non-finite member (it cannot be ordered).
  AggregateOptions median;
  median.rule = "median";
  const auto r = run_round(theta, p, median);
  EXPECT_EQ(r.screening[0].rejected, std::vector<int>{1});
}

TEST(ReduceOuter, AWrongSizedContributionIsAnErrorNotACrash) {
  const int M = 3;
  const int64_t n = 100;
  std::vector<float> theta(n, 0.0f);
  auto p = honest(M, n, theta, 9);
  AggregateOptions o;
  o.rule = "median";
  const auto r = run_round(theta, p, o, /*short_member=*/1);
  // Every member fails the round with the mismatch; which member's message reaches which first is
  // a race (a member that detects it aborts the others), so each states one side of it.
  for (int m = 0; m < M; ++m)
    EXPECT_TRUE(r.errors[size_t(m)].find("sent 396 bytes (400 expected)") != std::string::npos ||
                r.errors[size_t(m)].find("sent 400 bytes (396 expected)") != std::string::npos)
        << "member " << m << ": " << r.errors[size_t(m)];
  // The check itself blames the sender of the odd payload.
  const std::vector<std::string> all{std::string(400, 'a'), std::string(396, 'b'), std::string(400, 'c')};
  try {
    check_payloads(all, 400, "outer", "its contribution");
    ADD_FAILURE() << "a 396-byte payload among 400-byte ones was accepted";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peers(), std::vector<int>{1});
    EXPECT_NE(std::string(e.what()).find("member 1 sent 396 bytes (400 expected)"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_payloads({all[0], all[2]}, 400, "outer", "its contribution"));
}

TEST(ReduceOuter, EveryContributionRejectedFails) {
  const int M = 3;
  std::vector<float> theta(10, 0.0f);
  auto p = honest(M, 10, theta, 1);
  for (auto& x : p) x[0] = std::numeric_limits<float>::quiet_NaN();
  AggregateOptions o;
  o.screen = true;
  const auto r = run_round(theta, p, o);
  for (int m = 0; m < M; ++m) EXPECT_NE(r.errors[size_t(m)].find("every member's contribution was rejected"),
                                        std::string::npos) << r.errors[size_t(m)];
}

TEST(Fault, NoiseKeepsTheOuterGradientsNormAndDependsOnTheSeed) {
  const int64_t n = 500;
  std::vector<float> theta(n, 1.0f);
  auto p = honest(1, n, theta, 4)[0];
  auto a = p, b = p, c = p;
  const Fault f = parse_fault("noise");
  apply_fault(f, theta, a, 1);
  apply_fault(f, theta, b, 1);
  apply_fault(f, theta, c, 2);
  const double want = outer_gradient_norm(theta.data(), p.data(), n);
  LOCO_EXPECT_NEAR(outer_gradient_norm(theta.data(), a.data(), n), want, 1e-5 * want);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Noise, not the gradient: about orthogonal to it.
  double dot = 0;
  for (int64_t i = 0; i < n; ++i) dot += double(theta[size_t(i)] - p[size_t(i)]) * (theta[size_t(i)] - a[size_t(i)]);
  EXPECT_LT(std::abs(dot) / (want * want), 0.2);
  EXPECT_THROW(parse_fault("noise:2", "outer.fault"), Error);
}
