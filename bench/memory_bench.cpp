// What a model-sized host buffer costs to make (core/memory.h): std::vector<float>(n) (every page
// faulted in by the zeroing loop, 4 KiB at a time) against zeroed_floats(n) (huge-page advice and
// the pages made present by the kernel on the compute threads) with one compute thread and with
// THREADS, and copied_floats against a std::vector copy, measured in one run, the kinds
// alternating within each repeat in an order that rotates; median and best seconds and the ratios to the plain vector.
// Every buffer is checked to hold what it must (zeros, or the source's values).
//   loco_memory_bench [MIB] [THREADS] [REPEATS]    (defaults 1024, all cores, 5)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/memory.h"
#include "core/parallel.h"

using namespace loco;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Reads every 1024th value (one per 4 KiB page) and fails unless it is `want(i)`.
void check(const std::vector<float>& v, size_t n, const std::function<float(size_t)>& want, const char* what) {
  if (v.size() != n) {
    std::fprintf(stderr, "%s: %zu values, not %zu\n", what, v.size(), n);
    std::exit(1);
  }
  for (size_t i = 0; i < n; i += 1024)
    if (v[i] != want(i)) {
      std::fprintf(stderr, "%s: value %zu is %g, not %g\n", what, i, double(v[i]), double(want(i)));
      std::exit(1);
    }
}

struct Kind {
  std::string name;
  std::function<double()> run;  // seconds to make one buffer (checked, then freed, outside the time)
  std::vector<double> s;
};

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? size_t(std::atoll(argv[1])) : 1024;
  const int threads = argc > 2 ? std::atoi(argv[2]) : int(std::max(1u, std::thread::hardware_concurrency()));
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  if (mib < 1 || threads < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: loco_memory_bench [MIB >= 1] [THREADS >= 1] [REPEATS >= 1]\n");
    return 2;
  }
  const size_t n = mib << 18;  // floats
  std::vector<float> source(n);
  for (size_t i = 0; i < n; ++i) source[i] = float(i % 1000);
  auto zeros = [](size_t) { return 0.0f; };
  auto same = [&](size_t i) { return source[i]; };
  auto timed = [&](const std::function<std::vector<float>()>& make, const std::function<float(size_t)>& want,
                   const char* what, int t) {
    set_compute_threads(t);
    const double t0 = now();
    std::vector<float> v = make();
    const double s = now() - t0;
    check(v, n, want, what);
    return s;
  };
  std::vector<Kind> kinds{
      {"std::vector<float>(n)", [&] { return timed([&] { return std::vector<float>(n); }, zeros, "vector", 1); }, {}},
      {"zeroed_floats, 1 thread", [&] { return timed([&] { return zeroed_floats(n); }, zeros, "zeroed 1", 1); }, {}},
      {"zeroed_floats, " + std::to_string(threads) + " threads",
       [&] { return timed([&] { return zeroed_floats(n); }, zeros, "zeroed N", threads); }, {}},
      {"std::vector copy", [&] { return timed([&] { return std::vector<float>(source); }, same, "copy", 1); }, {}},
      {"copied_floats, " + std::to_string(threads) + " threads",
       [&] { return timed([&] { return copied_floats(source); }, same, "copied N", threads); }, {}},
  };
  // Each repeat starts with the next kind, so that none always follows the same one (a buffer
  // just freed is memory the kernel may hand to the next one, faster on a virtual machine).
  for (int r = 0; r < repeats; ++r)
    for (size_t i = 0; i < kinds.size(); ++i) {
      auto& k = kinds[(size_t(r) + i) % kinds.size()];
      k.s.push_back(k.run());
    }
  std::printf("%zu MiB buffers, %d repeats, kinds alternating in rotating order\n", mib, repeats);
  std::printf("%-28s %10s %10s %14s\n", "buffer", "median s", "best s", "median ratio");
  double base[2] = {0, 0};
  for (size_t i = 0; i < kinds.size(); ++i) {
    auto s = kinds[i].s;
    std::sort(s.begin(), s.end());
    const double med = s[s.size() / 2];
    if (i == 0) base[0] = med;
    if (i == 3) base[1] = med;
    const double ref = i < 3 ? base[0] : base[1];
    std::printf("%-28s %10.3f %10.3f %13.3fx\n", kinds[i].name.c_str(), med, s.front(), med / ref);
  }
  return 0;
}
