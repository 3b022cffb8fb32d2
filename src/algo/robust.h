#pragma once
// Screening and robust aggregation of DiLoCo's outer contributions (outer.aggregate,
// outer.screen; docs/security.md); Streaming DiLoCo applies the same rules to each fragment's
// sync (algo/streaming.cpp). Member m contributes its parameters p_m after a round; its
// outer gradient is Delta_m = theta - p_m (theta: the outer parameters, the same on every member).
//
// Screening: a contribution is rejected, and its sender left out of the round's aggregate, when
// its outer-gradient norm is not finite (NaN or Inf anywhere), exceeds kWreckFactor times the
// norm of the outer parameters it would move (no training step moves a model that far: the
// wreck rule), or exceeds outer.reject_norm times the median of the round's finite norms (0: no
// norm rule). With M = 2 the median rule cannot reject (neither norm exceeds twice their median),
// so the run's own history also counts (NormHistory, with the same factor f = outer.reject_norm).
// Once kHistoryMinRounds rounds were accepted, the history holds a range [lo, hi] = [smallest
// accepted / f, f x largest accepted] over the largest accepted norm of each of the last
// kHistoryRounds rounds; a norm above hi is rejected as long as another contribution of the round
// stays within it (a jump every member makes is the training's own), and with two finite norms
// left, the larger is rejected when it exceeds f times the smaller and the smaller lies in
// [lo, hi] (the one the run's past agrees with).
//
// Aggregates over the accepted members' p_m, per coordinate unless said otherwise:
//   mean           the plain mean (with nobody rejected: the ring all-reduce of every run, bit for bit);
//   trimmed-mean   the mean after dropping the floor(outer.trim x count) largest and as many
//                  smallest values;
//   median         the median (the mean of the two middle values for an even count);
//   centered-clip  whole vectors (Karimireddy, He and Jaggi, 2021): from v = the coordinate-wise
//                  median, kRobustClipIterations times v += mean_m (p_m - v) min(1, tau / ||p_m - v||),
//                  tau the median of ||p_m - v|| at the start (a member far from the others moves v
//                  by at most tau / count per iteration).
//
// Where the contributions travel: with the mean, members see only the all-reduce's sum, so the
// screening rests on the norm each member states of itself (sent to all before the all-reduce,
// 8 bytes): it catches a member whose numbers went bad, not one that lies. The other rules
// have each member send its p_m straight to every other ((M - 1) x 4n bytes sent per worker
// instead of about 2 (M - 1) / M x 4n; no member forwards another's), and every member screens
// and aggregates the same inputs, in member order, with the same code: all reach the same bits,
// and nothing rests on what a member says of itself. Not caught: a member that sends different
// contributions (or, with the mean, different norms) to different members; the members then
// disagree on the aggregate.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "algo/run_config.h"

namespace loco {

constexpr int kRobustClipIterations = 3;
constexpr double kWreckFactor = 10;  // the wreck rule: ||Delta_m|| > 10 ||theta||
constexpr size_t kHistoryRounds = 8, kHistoryMinRounds = 3;

struct AggregateOptions {
  std::string rule = "mean";  // mean, trimmed-mean, median, centered-clip
  double trim = 0.25;         // trimmed-mean: fraction of the accepted members dropped at each end
  bool screen = false;        // reject non-finite and outlying contributions
  double reject_norm = 3;     // the norm rule's factor over the median (0: off)
};

struct Screening {
  std::vector<double> norms;     // ||Delta_m|| in member order (non-finite when a value is)
  std::vector<int> rejected;     // member indices, ascending
  std::vector<std::string> why;  // one reason per rejected member
  std::vector<int> accepted() const;
};

// The bounds of the wreck and history rules for one round (infinite or 0: off), with the words
// that name them in a rejection's reason.
struct ScreenBounds {
  double absolute = HUGE_VAL;  // the wreck rule: rejects whatever the others do
  std::string absolute_why;
  double lo = 0, hi = HUGE_VAL;  // the history's range (hi: rejects while another stays within)
  double factor = 0;             // outer.reject_norm (0: no history rules)
  std::string history_why;       // "the largest accepted in the last N rounds Y"
};

// The history rule's record of one sync (DiLoCo's rounds, or one Streaming DiLoCo fragment's):
// the largest accepted norm of each of its last kHistoryRounds rounds, oldest first. It is part
// of the outer state: saved in checkpoints and handed to joiners, so that every member screens
// with the same bounds.
struct NormHistory {
  std::vector<double> recent;
  // The round's bounds: the wreck rule over theta_norm (the outer parameters' norm; 0: off) and
  // the history rule with factor reject_norm (0: off).
  ScreenBounds bounds(double reject_norm, double theta_norm) const;
  // Records the largest accepted finite norm of a round (nothing when none was accepted).
  void record(const Screening& s);
};
// Histories as JSON text (an array of arrays of numbers; checkpoints' meta, a joiner's state) and
// back; parse fails naming WHAT unless it holds `count` histories of at most kHistoryRounds
// finite, non-negative numbers each ("" gives `count` empty ones: a checkpoint from before).
std::string norm_history_text(const std::vector<NormHistory>& h);
std::vector<NormHistory> parse_norm_history(const std::string& text, size_t count, const std::string& what);

// The options of a DiLoCo run's outer config; outer.screen = auto is on in elastic runs and with
// the aggregates other than mean.
AggregateOptions aggregate_options(const OuterConfig& o, bool elastic);

// ||theta - p|| in double: NaN or Inf when an entry of p (or theta) is.
double outer_gradient_norm(const float* theta, const float* p, int64_t n);
// ||x|| in double (non-finite when an entry is).
double vector_norm(const float* x, int64_t n);
// The screening rules above over the members' norms of `what` (named in the reasons: "non-finite
// WHAT", "WHAT norm X > K x the SCOPE's median Y"); `bounds` adds the wreck and history rules.
Screening screen_norms(const std::vector<double>& norms, double reject_norm,
                       const std::string& what = "outer gradient", const std::string& scope = "round",
                       const ScreenBounds& bounds = {});
// out[i] = the rule over p[m][i] for m in `members` (not empty, ascending).
void robust_aggregate(const std::vector<const float*>& p, const std::vector<int>& members, int64_t n,
                      const AggregateOptions& o, float* out);

// Fails the round, blaming the sender (PeerError), when a payload of `all` (member order) is not
// `size` bytes; WHAT names the payload in the message.
void check_payloads(const std::vector<std::string>& all, size_t size, const std::string& label,
                    const std::string& what);
// The screened mean's first half: every member sends its own outer-gradient norm `own` (8 bytes)
// to every other, and all screen the same norms (the norm rule with factor reject_norm, and
// `bounds`). Fails when every contribution is rejected.
Screening exchange_norms(Communicator& comm, double own, double reject_norm, const std::string& label,
                         const ScreenBounds& bounds = {});
// The robust rules' second half, once every member's contribution p[m] (n floats, member order)
// and its norm are at hand: screens (the norm rule and `bounds` only with o.screen; non-finite
// always) and writes the rule over the accepted members into `out`. Fails when every one is
// rejected.
Screening screen_and_aggregate(const std::vector<const float*>& p, int64_t n, const std::vector<double>& norms,
                               const AggregateOptions& o, float* out, const std::string& label,
                               const ScreenBounds& bounds = {});

// One round's reduction on `comm`: this member contributes `contribution` (n floats; theta the
// outer parameters); `out` receives the aggregate of the accepted contributions (parameters, as
// outer_sgd_step takes them). Without screening and with the mean: the plain all-reduce. Fails
// when every contribution is rejected, or blaming the peer (PeerError) whose payload has the
// wrong size. With screening, `history` gives the wreck and history rules' bounds.
Screening reduce_outer(Communicator& comm, const float* theta, const float* contribution, int64_t n,
                       const AggregateOptions& o, float* out, const std::string& label,
                       const NormHistory& history = {});

// A one-line account of a round's rejections ("" when none), each named "NOUN index: reason".
std::string describe_rejections(const Screening& s, const std::string& noun = "member");

}  // namespace loco
