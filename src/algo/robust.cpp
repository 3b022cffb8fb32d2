#include "algo/robust.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loco {

std::vector<int> Screening::accepted() const {
  std::vector<int> out;
  for (int m = 0; m < int(norms.size()); ++m)
    if (!std::binary_search(rejected.begin(), rejected.end(), m)) out.push_back(m);
  return out;
}

AggregateOptions aggregate_options(const OuterConfig& o, bool elastic) {
  AggregateOptions a;
  a.rule = o.aggregate;
  a.trim = o.trim;
  a.reject_norm = o.reject_norm;
  a.screen = o.screen == "on" || (o.screen == "auto" && (elastic || o.aggregate != "mean"));
  return a;
}

double vector_norm(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return std::sqrt(s);
}

double outer_gradient_norm(const float* theta, const float* p, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(theta[i]) - double(p[i]);
    s += d * d;
  }
  return std::sqrt(s);
}

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t c = v.size();
  return c % 2 ? v[c / 2] : 0.5 * (v[c / 2 - 1] + v[c / 2]);
}

std::string fixed(double x) {
  std::ostringstream o;
  o.precision(4);
  o << x;
  return o.str();
}

}  // namespace

Screening screen_norms(const std::vector<double>& norms, double reject_norm, const std::string& what,
                       const std::string& scope, const ScreenBounds& bounds) {
  Screening s;
  s.norms = norms;
  std::vector<double> finite;
  for (double x : norms)
    if (std::isfinite(x)) finite.push_back(x);
  const double med = finite.empty() ? 0 : median_of(finite);
  std::vector<std::string> why(norms.size());
  for (size_t m = 0; m < norms.size(); ++m) {
    const double x = norms[m];
    if (!std::isfinite(x))
      why[m] = "non-finite " + what;
    else if (x > bounds.absolute)
      why[m] = what + " norm " + fixed(x) + " > " + bounds.absolute_why;
    else if (reject_norm > 0 && med > 0 && x > reject_norm * med)
      why[m] = what + " norm " + fixed(x) + " > " + fixed(reject_norm) + " x the " + scope + "'s median " + fixed(med);
  }
  // The history's rules: above its range while another contribution stays within it; then, with
  // two left, the larger when it exceeds f times a smaller one that lies in the range.
  const auto kept = [&] {
    std::vector<size_t> k;
    for (size_t m = 0; m < norms.size(); ++m)
      if (why[m].empty()) k.push_back(m);
    return k;
  };
  if (bounds.factor > 0) {
    const auto k = kept();
    bool within = false;
    for (size_t m : k) within = within || norms[m] <= bounds.hi;
    for (size_t m : k)
      if (within && norms[m] > bounds.hi)
        why[m] = what + " norm " + fixed(norms[m]) + " > " + fixed(bounds.factor) + " x " + bounds.history_why;
    const auto two = kept();
    if (two.size() == 2) {
      const size_t a = norms[two[0]] <= norms[two[1]] ? two[0] : two[1], b = a == two[0] ? two[1] : two[0];
      if (norms[a] >= bounds.lo && norms[a] <= bounds.hi && norms[b] > bounds.factor * norms[a])
        why[b] = what + " norm " + fixed(norms[b]) + " > " + fixed(bounds.factor) + " x the other's " + fixed(norms[a]) +
                 ", which lies within the run's history (" + bounds.history_why + ")";
    }
  }
  for (size_t m = 0; m < norms.size(); ++m)
    if (!why[m].empty()) {
      s.rejected.push_back(int(m));
      s.why.push_back(why[m]);
    }
  return s;
}

ScreenBounds NormHistory::bounds(double reject_norm, double theta_norm) const {
  ScreenBounds b;
  if (theta_norm > 0 && std::isfinite(theta_norm)) {
    b.absolute = kWreckFactor * theta_norm;
    b.absolute_why = fixed(kWreckFactor) + " x the outer parameters' norm " + fixed(theta_norm) + " (a wreck)";
  }
  if (reject_norm > 0 && recent.size() >= kHistoryMinRounds) {
    const double largest = *std::max_element(recent.begin(), recent.end());
    b.factor = reject_norm;
    b.lo = *std::min_element(recent.begin(), recent.end()) / reject_norm;
    b.hi = reject_norm * largest;
    b.history_why = "the largest accepted in the last " + std::to_string(recent.size()) + " rounds " + fixed(largest);
  }
  return b;
}

void NormHistory::record(const Screening& s) {
  double largest = -1;
  for (int m : s.accepted())
    if (std::isfinite(s.norms[size_t(m)])) largest = std::max(largest, s.norms[size_t(m)]);
  if (largest < 0) return;
  recent.push_back(largest);
  if (recent.size() > kHistoryRounds) recent.erase(recent.begin());
}

std::string norm_history_text(const std::vector<NormHistory>& h) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& x : h) j.push_back(x.recent);
  return j.dump();
}

std::vector<NormHistory> parse_norm_history(const std::string& text, size_t count, const std::string& what) {
  std::vector<NormHistory> out(count);
  if (text.empty()) return out;
  const auto bad = [&](const std::string& why) { fail(what + ": the screening history " + why); };
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_array()) bad("is not a JSON array");
  if (j.size() != count) bad("has " + std::to_string(j.size()) + " entries, expected " + std::to_string(count));
  for (size_t k = 0; k < count; ++k) {
    const auto& a = j[k];
    if (!a.is_array() || a.size() > kHistoryRounds) bad("entry " + std::to_string(k) + " is not a list of at most " +
                                                        std::to_string(kHistoryRounds) + " norms");
    for (const auto& x : a) {
      if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0)
        bad("entry " + std::to_string(k) + " holds " + x.dump() + ", not a finite non-negative norm");
      out[k].recent.push_back(x.get<double>());
    }
  }
  return out;
}

namespace {

constexpr int64_t kBlock = 64;  // coordinates sorted together, one SIMD lane each

// Calls fn(i0, len, v) for each block of coordinates [i0, i0 + len): v[k * kBlock + j] is the
// k-th smallest of the members' values at coordinate i0 + j (k < members). The values are
// sorted by odd-even transposition, each comparator a min and a max over the block's lanes.
template <class Fn>
void for_sorted_blocks(const std::vector<const float*>& p, const std::vector<int>& members, int64_t n, Fn fn) {
  const int c = int(members.size());
  std::vector<float> v(static_cast<size_t>(c * kBlock));
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t len = std::min(kBlock, n - i0);
    for (int k = 0; k < c; ++k) {
      const float* src = p[size_t(members[size_t(k)])] + i0;
      float* dst = v.data() + k * kBlock;
      for (int64_t j = 0; j < len; ++j) dst[j] = src[j];
      for (int64_t j = len; j < kBlock; ++j) dst[j] = 0;
    }
    for (int round = 0; round < c; ++round)
      for (int k = round % 2; k + 1 < c; k += 2) {
        float* a = v.data() + k * kBlock;
        float* b = a + kBlock;
        for (int64_t j = 0; j < kBlock; ++j) {
          const float lo = std::min(a[j], b[j]), hi = std::max(a[j], b[j]);
          a[j] = lo;
          b[j] = hi;
        }
      }
    fn(i0, len, v.data());
  }
}

// out[i0 + j] = the mean of sorted ranks [from, to) at each coordinate of a block.
void mean_of_ranks(const float* v, int from, int to, int64_t i0, int64_t len, float* out) {
  double acc[kBlock] = {};
  for (int k = from; k < to; ++k)
    for (int64_t j = 0; j < kBlock; ++j) acc[j] += v[k * kBlock + j];
  for (int64_t j = 0; j < len; ++j) out[i0 + j] = float(acc[j] / (to - from));
}

}  // namespace

void robust_aggregate(const std::vector<const float*>& p, const std::vector<int>& members, int64_t n,
                      const AggregateOptions& o, float* out) {
  check(!members.empty(), "internal: robust_aggregate without members");
  const int c = int(members.size());
  // The median's middle ranks: one for an odd count, the mean of two for an even one.
  const int mid_from = (c - 1) / 2, mid_to = c / 2 + 1;
  if (o.rule == "mean") {
    for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
      const int64_t len = std::min(kBlock, n - i0);
      double acc[kBlock] = {};
      for (int m : members)
        for (int64_t j = 0; j < len; ++j) acc[j] += p[size_t(m)][i0 + j];
      for (int64_t j = 0; j < len; ++j) out[i0 + j] = float(acc[j] / c);
    }
  } else if (o.rule == "trimmed-mean") {
    const int b = int(std::floor(o.trim * c));  // trim < 0.5: at least one value is left
    for_sorted_blocks(p, members, n, [&](int64_t i0, int64_t len, const float* v) {
      mean_of_ranks(v, b, c - b, i0, len, out);
    });
  } else if (o.rule == "median") {
    for_sorted_blocks(p, members, n, [&](int64_t i0, int64_t len, const float* v) {
      mean_of_ranks(v, mid_from, mid_to, i0, len, out);
    });
  } else if (o.rule == "centered-clip") {
    std::vector<double> center(static_cast<size_t>(n)), step(static_cast<size_t>(n));
    for_sorted_blocks(p, members, n, [&](int64_t i0, int64_t len, const float* v) {
      for (int64_t j = 0; j < len; ++j) {
        double acc = 0;
        for (int k = mid_from; k < mid_to; ++k) acc += v[k * kBlock + j];
        center[size_t(i0 + j)] = acc / (mid_to - mid_from);
      }
    });
    auto distance = [&](int m) {  // one partial sum per lane of a block, then the lanes in order
      double lanes[kBlock] = {};
      const float* x = p[size_t(m)];
      int64_t i0 = 0;
      for (; i0 + kBlock <= n; i0 += kBlock)
        for (int64_t j = 0; j < kBlock; ++j) {
          const double d = x[i0 + j] - center[size_t(i0 + j)];
          lanes[j] += d * d;
        }
      for (int64_t j = 0; i0 + j < n; ++j) {
        const double d = x[i0 + j] - center[size_t(i0 + j)];
        lanes[j] += d * d;
      }
      double s = 0;
      for (double l : lanes) s += l;
      return std::sqrt(s);
    };
    std::vector<double> d0;
    for (int m : members) d0.push_back(distance(m));
    const double tau = median_of(d0);
    for (int it = 0; it < kRobustClipIterations && tau > 0; ++it) {
      std::fill(step.begin(), step.end(), 0.0);
      for (int m : members) {
        const double d = distance(m), w = d > tau ? tau / d : 1.0;
        for (int64_t i = 0; i < n; ++i) step[size_t(i)] += w * (p[size_t(m)][i] - center[size_t(i)]);
      }
      for (int64_t i = 0; i < n; ++i) center[size_t(i)] += step[size_t(i)] / c;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = float(center[size_t(i)]);
  } else {
    fail("outer.aggregate = \"" + o.rule + "\": use mean, trimmed-mean, median or centered-clip");
  }
}

void check_payloads(const std::vector<std::string>& all, size_t size, const std::string& label,
                    const std::string& what) {
  for (int m = 0; m < int(all.size()); ++m)
    if (all[size_t(m)].size() != size)
      throw PeerError(label + ": member " + std::to_string(m) + " sent " + std::to_string(all[size_t(m)].size()) +
                          " bytes (" + std::to_string(size) + " expected) as " + what,
                      {m});
}

namespace {

// Every member's payload, each sent straight by its member; a payload whose size differs from
// this member's own fails the round blaming its sender (WHAT names it in the message).
std::vector<std::string> gather_checked(Communicator& comm, std::string payload, const std::string& label,
                                       const std::string& what) {
  const size_t size = payload.size();
  std::vector<std::string> all;
  auto h = comm.all_gather_direct_start(std::move(payload), &all, label);
  comm.wait(h);
  check_payloads(all, size, label, what);
  return all;
}

}  // namespace

Screening exchange_norms(Communicator& comm, double own, double reject_norm, const std::string& label,
                         const ScreenBounds& bounds) {
  std::string payload(sizeof own, '\0');
  std::memcpy(payload.data(), &own, sizeof own);
  const auto all = gather_checked(comm, std::move(payload), label + "_norms", "a norm");
  std::vector<double> norms(all.size());
  for (size_t m = 0; m < all.size(); ++m) std::memcpy(&norms[m], all[m].data(), sizeof(double));
  Screening s = screen_norms(norms, reject_norm, "outer gradient", "round", bounds);
  if (s.rejected.size() == norms.size())
    fail(label + ": every member's contribution was rejected (" + describe_rejections(s) + ")");
  return s;
}

Screening screen_and_aggregate(const std::vector<const float*>& p, int64_t n, const std::vector<double>& norms,
                               const AggregateOptions& o, float* out, const std::string& label,
                               const ScreenBounds& bounds) {
  // Non-finite contributions cannot be ordered: the robust rules always reject them.
  Screening s = o.screen ? screen_norms(norms, o.reject_norm, "outer gradient", "round", bounds) : screen_norms(norms, 0);
  const auto members = s.accepted();
  if (members.empty()) fail(label + ": every member's contribution was rejected (" + describe_rejections(s) + ")");
  robust_aggregate(p, members, n, o, out);
  return s;
}

Screening reduce_outer(Communicator& comm, const float* theta, const float* contribution, int64_t n,
                       const AggregateOptions& o, float* out, const std::string& label,
                       const NormHistory& history) {
  const int M = comm.size();
  const ScreenBounds bounds = o.screen ? history.bounds(o.reject_norm, vector_norm(theta, n)) : ScreenBounds{};
  if (o.rule == "mean") {
    if (out != contribution) std::memcpy(out, contribution, size_t(n) * sizeof(float));
    if (!o.screen) {
      comm.all_reduce(out, n, ReduceOp::Mean, label);
      return {};
    }
    Screening s = exchange_norms(comm, outer_gradient_norm(theta, contribution, n), o.reject_norm, label, bounds);
    const int count = M - int(s.rejected.size());
    if (s.rejected.empty()) {
      comm.all_reduce(out, n, ReduceOp::Mean, label);
      return s;
    }
    if (std::binary_search(s.rejected.begin(), s.rejected.end(), comm.rank()))
      std::fill(out, out + n, 0.0f);
    comm.all_reduce(out, n, ReduceOp::Sum, label);
    for (int64_t i = 0; i < n; ++i) out[i] /= float(count);
    return s;
  }
  // Every member sees every contribution, sent by its author.
  auto all = gather_checked(comm, std::string(reinterpret_cast<const char*>(contribution), size_t(n) * sizeof(float)),
                            label, "its contribution");
  std::vector<const float*> p(static_cast<size_t>(M));
  std::vector<std::vector<float>> aligned(static_cast<size_t>(M));
  std::vector<double> norms(static_cast<size_t>(M));
  for (int m = 0; m < M; ++m) {
    const auto& b = all[size_t(m)];
    aligned[size_t(m)].resize(size_t(n));
    std::memcpy(aligned[size_t(m)].data(), b.data(), b.size());
    all[size_t(m)].clear();
    all[size_t(m)].shrink_to_fit();
    p[size_t(m)] = aligned[size_t(m)].data();
    norms[size_t(m)] = outer_gradient_norm(theta, p[size_t(m)], n);
  }
  return screen_and_aggregate(p, n, norms, o, out, label, bounds);
}

std::string describe_rejections(const Screening& s, const std::string& noun) {
  std::string out;
  for (size_t k = 0; k < s.rejected.size(); ++k)
    out += (k ? "; " : "") + noun + " " + std::to_string(s.rejected[k]) + ": " + s.why[k];
  return out;
}

}  // namespace loco
