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

// Reads every 1024th value (one per 4 KiB page) and fails unless it is from's (zero without from).
void check(const std::vector<float>& v, size_t n, const std::vector<float>* from, const char* what) {
  if (v.size() != n) {
    std::fprintf(stderr, "%s: %zu values, not %zu\n", what, v.size(), n);
    std::exit(1);
  }
  for (size_t i = 0; i < n; i += 1024) {
    const float want = from ? (*from)[i] : 0.0f;
    if (v[i] != want) {
      std::fprintf(stderr, "%s: value %zu is %g, not %g\n", what, i, double(v[i]), double(want));
      std::exit(1);
    }
  }
}

struct Kind {
  std::string name;
  std::function<std::vector<float>()> make;
  bool copy;     // a copy of the source (else zeros)
  int threads;   // compute threads while it is made
  size_t base;   // the kind its ratio is to
  std::vector<double> s{};
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
  const std::string all = std::to_string(threads) + " threads";
  std::vector<Kind> kinds{
      {"std::vector<float>(n)", [&] { return std::vector<float>(n); }, false, 1, 0},
      {"zeroed_floats, 1 thread", [&] { return zeroed_floats(n); }, false, 1, 0},
      {"zeroed_floats, " + all, [&] { return zeroed_floats(n); }, false, threads, 0},
      {"std::vector copy", [&] { return std::vector<float>(source); }, true, 1, 3},
      {"copied_floats, " + all, [&] { return copied_floats(source); }, true, threads, 3},
  };
  // Each repeat starts with the next kind, so that none always follows the same one (a buffer
  // just freed is memory the kernel may hand to the next one, faster on a virtual machine). A
  // buffer is checked, then freed, outside its time.
  for (int r = 0; r < repeats; ++r)
    for (size_t i = 0; i < kinds.size(); ++i) {
      Kind& k = kinds[(size_t(r) + i) % kinds.size()];
      set_compute_threads(k.threads);
      const double t0 = now();
      std::vector<float> v = k.make();
      k.s.push_back(now() - t0);
      check(v, n, k.copy ? &source : nullptr, k.name.c_str());
    }
  std::printf("%zu MiB buffers, %d repeats, kinds alternating in rotating order\n", mib, repeats);
  std::printf("%-28s %10s %10s %14s\n", "buffer", "median s", "best s", "median ratio");
  auto median = [](std::vector<double> s) {
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  };
  for (const Kind& k : kinds)
    std::printf("%-28s %10.3f %10.3f %13.3fx\n", k.name.c_str(), median(k.s), *std::min_element(k.s.begin(), k.s.end()),
                median(k.s) / median(kinds[k.base].s));
  return 0;
}
