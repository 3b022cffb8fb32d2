// What screening and the robust aggregates (algo/robust.h) cost one member per DiLoCo round:
//   - compute, measured on one core: the outer-gradient norms of the M contributions and the
//     rule over them (for the mean with screening, only its own norm; for the plain mean, the
//     average of M vectors, as a ring all-reduce adds them), best of REPEATS;
//   - bytes each member sends: the ring all-reduce's 2 (M - 1) / M of the model (plus 8 bytes to
//     each other member for the screened mean's norm), or the all-gather's M - 1 copies;
//   - their transfer time over a link of BANDWIDTH (ideal pipe: 8 bytes / bandwidth; the link model
//     of comm/link.h without latency), and the sum, against the plain mean's.
// Members on real hosts each compute on their own cores, so compute is not divided among them.
//   loco_robust_bench [FLOATS] [M] [BANDWIDTH] [REPEATS]    (defaults 920192 8 1Gbit 5)
//   --json prints one JSON object instead of the table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algo/robust.h"
#include "comm/communicator.h"
#include "comm/link.h"
#include "core/rng.h"

using namespace loco;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0)
      json = true;
    else
      pos.push_back(argv[i]);
  }
  const int64_t n = pos.size() > 0 ? std::atoll(pos[0].c_str()) : 920192;
  const int M = pos.size() > 1 ? std::atoi(pos[1].c_str()) : 8;
  const std::string bw_text = pos.size() > 2 ? pos[2] : "1Gbit";
  const int repeats = pos.size() > 3 ? std::atoi(pos[3].c_str()) : 5;
  if (n < 1 || M < 2 || repeats < 1) {
    std::fprintf(stderr, "usage: loco_robust_bench [FLOATS >= 1] [M >= 2] [BANDWIDTH] [REPEATS >= 1] [--json]\n");
    return 2;
  }
  const double bw = parse_bandwidth(bw_text, "BANDWIDTH");
  Rng rng(1);
  std::vector<float> theta(static_cast<size_t>(n));
  for (auto& x : theta) x = float(rng.normal());
  std::vector<std::vector<float>> p(static_cast<size_t>(M), theta);
  for (auto& x : p)
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] -= float(0.01 * rng.normal());
  std::vector<const float*> ptr;
  for (const auto& x : p) ptr.push_back(x.data());
  std::vector<int> members(static_cast<size_t>(M));
  for (int m = 0; m < M; ++m) members[size_t(m)] = m;
  std::vector<float> out(static_cast<size_t>(n));

  struct Row {
    std::string rule;
    double compute, bytes;
  };
  std::vector<Row> rows;
  const double ring = 4.0 * double(ring_all_reduce_floats_sent(n, M, 0));
  const double gather = 4.0 * double(M - 1) * double(n);
  for (const std::string rule : {"mean", "mean, screened", "trimmed-mean", "median", "centered-clip"}) {
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const double t = now();
      if (rule == "mean") {  // what the ring all-reduce computes: the sum, then the division
        AggregateOptions o;
        robust_aggregate(ptr, members, n, o, out.data());
      } else if (rule == "mean, screened") {
        volatile double own = outer_gradient_norm(theta.data(), ptr[0], n);
        (void)own;
        AggregateOptions o;
        robust_aggregate(ptr, members, n, o, out.data());
      } else {
        std::vector<double> norms;
        for (int m = 0; m < M; ++m) norms.push_back(outer_gradient_norm(theta.data(), ptr[size_t(m)], n));
        const auto s = screen_norms(norms, 3);
        AggregateOptions o;
        o.rule = rule;
        robust_aggregate(ptr, s.accepted(), n, o, out.data());
      }
      best = std::min(best, now() - t);
    }
    const double bytes = rule == "mean" ? ring : rule == "mean, screened" ? ring + 8.0 * (M - 1) : gather;
    rows.push_back({rule, best, bytes});
  }
  const double base = rows[0].compute + (bw > 0 ? rows[0].bytes * 8 / bw : 0);
  if (json) {
    std::printf("{\"floats\": %lld, \"members\": %d, \"bandwidth\": \"%s\", \"rules\": [", (long long)n, M,
                bw_text.c_str());
    for (size_t i = 0; i < rows.size(); ++i) {
      const double transfer = bw > 0 ? rows[i].bytes * 8 / bw : 0;
      std::printf("%s{\"rule\": \"%s\", \"compute_s\": %.6f, \"bytes_sent\": %.0f, \"transfer_s\": %.6f}", i ? ", " : "",
                  rows[i].rule.c_str(), rows[i].compute, rows[i].bytes, transfer);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("%lld floats, M = %d, link %s; compute on one core, best of %d\n", (long long)n, M, bw_text.c_str(),
              repeats);
  std::printf("%-16s %12s %14s %12s %12s %10s\n", "rule", "compute s", "bytes sent", "transfer s", "total s",
              "vs mean");
  for (const auto& r : rows) {
    const double transfer = bw > 0 ? r.bytes * 8 / bw : 0;
    std::printf("%-16s %12.4f %14.0f %12.4f %12.4f %9.2fx\n", r.rule.c_str(), r.compute, r.bytes, transfer,
                r.compute + transfer, (r.compute + transfer) / base);
  }
  return 0;
}
