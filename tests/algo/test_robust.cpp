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

TEST(Screening, TheWreckRuleRejectsWhateverTheOthersDo) {
  NormHistory none;
  const ScreenBounds b = none.bounds(3, 2.0);  // outer parameters of norm 2: bound 20
  EXPECT_EQ(b.factor, 0);                      // no history yet
  auto s = screen_norms({0.5, 25}, 3, "outer gradient", "round", b);
  EXPECT_EQ(s.rejected, std::vector<int>{1});
  EXPECT_NE(s.why[0].find("25 > 10 x the outer parameters' norm 2 (a wreck)"), std::string::npos) << s.why[0];
  EXPECT_EQ(screen_norms({21, 25}, 3, "outer gradient", "round", b).rejected, (std::vector<int>{0, 1}));
  EXPECT_TRUE(screen_norms({0.5, 20}, 3, "outer gradient", "round", b).rejected.empty());  // at the bound: kept
  EXPECT_EQ(none.bounds(3, 0).absolute, HUGE_VAL);  // outer parameters all zero: no wreck rule
}

TEST(Screening, TheRunsHistoryTellsTheBadOfTwoMembers) {
  NormHistory h;
  Screening round;
  round.norms = {1.0, 0.8};
  h.record(round);
  EXPECT_EQ(h.bounds(3, 0).factor, 0);  // fewer than kHistoryMinRounds rounds
  round.norms = {0.9, 1.2, kNan};
  round.rejected = {2};
  h.record(round);
  round = Screening{};
  round.norms = {0.7, 5.0};
  round.rejected = {1};  // a rejected norm is not recorded
  h.record(round);
  EXPECT_EQ(h.recent, (std::vector<double>{1.0, 1.2, 0.7}));
  const ScreenBounds b = h.bounds(3, 0);
  EXPECT_DOUBLE_EQ(b.hi, 3.6);
  EXPECT_DOUBLE_EQ(b.lo, 0.7 / 3);
  // Two members: the median rule cannot tell 1.1 from 12 (their median is 6.55); the history can.
  EXPECT_TRUE(screen_norms({1.1, 12}, 3).rejected.empty());
  auto s = screen_norms({1.1, 12}, 3, "outer gradient", "round", b);
  EXPECT_EQ(s.rejected, std::vector<int>{1});
  EXPECT_NE(s.why[0].find("12 > 3 x the largest accepted in the last 3 rounds 1.2"), std::string::npos) << s.why[0];
  // Within the range, the larger of two is rejected above 3 x the smaller when the smaller lies in
  // the range (norms that shrink faster than the history forgets them) ...
  s = screen_norms({0.3, 3.3, kNan}, 3, "outer gradient", "round", b);
  EXPECT_EQ(s.rejected, (std::vector<int>{1, 2}));
  EXPECT_NE(s.why[0].find("3.3 > 3 x the other's 0.3, which lies within the run's history"), std::string::npos)
      << s.why[0];
  EXPECT_TRUE(screen_norms({0.3, 0.85}, 3, "outer gradient", "round", b).rejected.empty());
  // ... but not when the smaller lies below the range (a member that sends next to nothing does
  // not get the other rejected).
  EXPECT_TRUE(screen_norms({0.2, 3.3}, 3, "outer gradient", "round", b).rejected.empty());
  // With three, the median rule decides.
  EXPECT_TRUE(screen_norms({0.3, 0.9, 1.0}, 3, "outer gradient", "round", b).rejected.empty());
  // A jump every member makes is the training's own: nobody is rejected.
  EXPECT_TRUE(screen_norms({4, 5}, 3, "outer gradient", "round", b).rejected.empty());
  // ... while a member the other rules reject does not count as staying within the bound.
  EXPECT_EQ(screen_norms({4, kNan}, 3, "outer gradient", "round", b).rejected, std::vector<int>{1});
  // reject_norm 0 turns the history rules off too.
  EXPECT_EQ(h.bounds(0, 0).factor, 0);
  // The record keeps the last kHistoryRounds rounds.
  for (int k = 0; k < 10; ++k) {
    Screening r;
    r.norms = {double(k)};
    h.record(r);
  }
  EXPECT_EQ(h.recent, (std::vector<double>{2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(Screening, HistoriesRoundTripExactlyAndHostileTextIsRefused) {
  std::vector<NormHistory> h(3);
  h[0].recent = {0.1, 1.0 / 3, 12345.678901234567};
  h[2].recent = {5e-300};
  const auto back = parse_norm_history(norm_history_text(h), 3, "state");
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(back[k].recent, h[k].recent);
  EXPECT_EQ(parse_norm_history("", 2, "state").size(), 2u);  // a state from before the history
  for (const char* bad : {"{", "{}", "[[1],[2]]", "[[1],[2],3]", "[[1],[2],[-1]]", "[[1],[2],[\"x\"]]",
                          "[[1],[2],[1,1,1,1,1,1,1,1,1]]", "[[1],[2],[1e999]]", "[[1],[2],[null]]"}) {
    try {
      parse_norm_history(bad, 3, "state");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("state: the screening history"), std::string::npos) << e.what();
    }
  }
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
                      const AggregateOptions& o, int64_t short_member = -1, const NormHistory& history = {}) {
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
            reduce_outer(comm, theta.data(), contributions[size_t(m)].data(), len, o, r.out[size_t(m)].data(), "outer",
                         history);
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
      if (std::string(rule) != "mean") {
        EXPECT_EQ(r.out[size_t(m)], want) << rule << " member " << m;
      }
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

TEST(ReduceOuter, TwoMembersTheHistoryLeavesOutTheOneThatWentBad) {
  const int64_t n = 300;
  std::vector<float> theta(n);
  Rng rng(5);
  for (auto& x : theta) x = float(rng.normal());
  auto p = honest(2, n, theta, 8);
  const double own = outer_gradient_norm(theta.data(), p[0].data(), n);
  for (int64_t i = 0; i < n; ++i) p[1][size_t(i)] = theta[size_t(i)] + 10 * (theta[size_t(i)] - p[1][size_t(i)]);
  NormHistory h;
  h.recent = {own, own, own};
  for (const char* rule : {"mean", "median"}) {
    AggregateOptions o;
    o.rule = rule;
    o.screen = true;
    const auto unscreened = run_round(theta, p, o);  // no history: both averaged in
    const auto r = run_round(theta, p, o, -1, h);
    for (int m = 0; m < 2; ++m) {
      EXPECT_TRUE(unscreened.screening[size_t(m)].rejected.empty()) << rule;
      EXPECT_EQ(r.errors[size_t(m)], "") << rule;
      EXPECT_EQ(r.screening[size_t(m)].rejected, std::vector<int>{1}) << rule;
      EXPECT_EQ(r.out[size_t(m)], p[0]) << rule << " member " << m;  // the honest member's alone
    }
  }
}

TEST(Fault, FromAStepOn) {
  std::vector<float> theta(4, 1.0f), p(4, 0.5f), q = p;
  const Fault f = parse_fault("scale:-10@40");
  EXPECT_EQ(f.from_step, 40);
  apply_fault(f, 39, theta, q, 1);
  EXPECT_EQ(q, p);
  apply_fault(f, 40, theta, q, 1);
  EXPECT_EQ(q, std::vector<float>(4, 6.0f));  // theta - (-10)(theta - p) = 1 + 10 x 0.5
  for (const char* bad : {"scale:-10@", "scale:-10@x", "scale:-10@-1", "nan@4@5", "@3"}) {
    EXPECT_THROW(parse_fault(bad, "outer.fault"), Error) << bad;
  }
}

TEST(Fault, NoiseKeepsTheOuterGradientsNormAndDependsOnTheSeed) {
  const int64_t n = 500;
  std::vector<float> theta(n, 1.0f);
  auto p = honest(1, n, theta, 4)[0];
  auto a = p, b = p, c = p;
  const Fault f = parse_fault("noise");
  apply_fault(f, 0, theta, a, 1);
  apply_fault(f, 0, theta, b, 1);
  apply_fault(f, 0, theta, c, 2);
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
