// What the outer-gradient codecs (comm/codec.h) cost on the host: encode and decode_add of FLOATS
// values (a fragment's outer gradient) with one compute thread and with THREADS, best of REPEATS,
// in nanoseconds per value and as the ratio between the two, measured in one run. Each codec's
// bytes and decoded sums must be the same with either thread count (the run fails otherwise).
//   loco_codec_bench [FLOATS] [THREADS] [REPEATS]    (defaults 16777216, all cores, 5)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/codec.h"
#include "core/parallel.h"
#include "core/rng.h"

using namespace loco;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Timing {
  double encode_s = 1e30, decode_s = 1e30;
  std::string bytes;
  std::vector<float> sum;
};

Timing measure(const Codec& codec, const std::vector<float>& x, int threads, int repeats) {
  set_compute_threads(threads);
  Timing t;
  const int64_t n = int64_t(x.size());
  for (int r = 0; r < repeats; ++r) {
    Rng rng(7);
    double t0 = now();
    t.bytes = codec.encode(x.data(), n, rng);
    t.encode_s = std::min(t.encode_s, now() - t0);
    t.sum.assign(x.size(), 0.5f);
    t0 = now();
    codec.decode_add(t.bytes, t.sum.data(), n);
    t.decode_s = std::min(t.decode_s, now() - t0);
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : int64_t(1) << 24;
  const int threads = argc > 2 ? std::atoi(argv[2]) : int(std::max(1u, std::thread::hardware_concurrency()));
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  if (n < 1 || threads < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: loco_codec_bench [FLOATS >= 1] [THREADS >= 1] [REPEATS >= 1]\n");
    return 2;
  }
  std::vector<float> x(static_cast<size_t>(n));
  Rng rng(1);
  for (auto& v : x) v = float(rng.normal()) * 1e-3f;
  std::printf("%lld values; 1 thread against %d; best of %d; ns per value\n", static_cast<long long>(n), threads,
              repeats);
  std::printf("%-10s %10s %10s %8s %10s %10s %8s %s\n", "codec", "enc 1", "enc N", "ratio", "dec 1", "dec N", "ratio",
              "same bytes and sums");
  bool all_same = true;
  for (const std::string format : {"fp32", "bf16", "fp8", "fp4-e3m0", "fp4-e2m1", "int8"}) {
    CodecConfig c;
    c.format = format;
    const auto codec = make_codec(c);
    const Timing one = measure(*codec, x, 1, repeats), many = measure(*codec, x, threads, repeats);
    const bool same = one.bytes == many.bytes &&
                      std::memcmp(one.sum.data(), many.sum.data(), one.sum.size() * sizeof(float)) == 0;
    all_same = all_same && same;
    const double ns = 1e9 / double(n);
    std::printf("%-10s %10.3f %10.3f %8.2f %10.3f %10.3f %8.2f %s\n", format.c_str(), one.encode_s * ns,
                many.encode_s * ns, one.encode_s / many.encode_s, one.decode_s * ns, many.decode_s * ns,
                one.decode_s / many.decode_s, same ? "yes" : "NO");
  }
  return all_same ? 0 : 1;
}
