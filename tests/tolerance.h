#pragma once
// Floating-point tolerances that report their margins. LOCO_EXPECT_NEAR(a, b, tol) and
// LOCO_EXPECT_BELOW(x, bound) (and the ASSERT_ forms) check as gtest's EXPECT_NEAR and EXPECT_LT
// do, and record at each site the largest |a - b| / tol (or x / bound) seen. With
// LOCO_TOLERANCE_REPORT=FILE in the environment the test binary appends one line per site to FILE
// when it exits: "file:line worst_ratio checks", so that a machine kind whose arithmetic differs
// shows how close each tolerance came to failing (docs/testing.md, "Tolerances").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace loco_test {

struct Margins {
  std::mutex mu;
  std::map<std::pair<std::string, int>, std::pair<double, long>> sites;  // worst ratio, checks
  ~Margins() {
    const char* path = std::getenv("LOCO_TOLERANCE_REPORT");
    if (!path || !*path) return;
    FILE* f = std::fopen(path, "a");
    if (!f) return;
    for (const auto& [site, v] : sites) std::fprintf(f, "%s:%d %.3g %ld\n", site.first.c_str(), site.second, v.first, v.second);
    std::fclose(f);
  }
};

inline Margins& margins() {
  static Margins m;
  return m;
}

inline void record(const char* file, int line, double ratio) {
  std::string name = file;
  const auto at = name.find("tests/");
  if (at != std::string::npos) name = name.substr(at);
  auto& m = margins();
  std::lock_guard<std::mutex> lock(m.mu);
  auto& v = m.sites[{name, line}];
  v.first = std::max(v.first, std::isnan(ratio) ? INFINITY : ratio);
  ++v.second;
}

// Returns a (for the check), having recorded |a - b| / tol.
template <class A, class B, class T>
A near(const char* file, int line, const A& a, const B& b, const T& tol) {
  record(file, line, std::abs(double(a) - double(b)) / double(tol));
  return a;
}
template <class X, class B>
X below(const char* file, int line, const X& x, const B& bound) {
  record(file, line, double(x) / double(bound));
  return x;
}

}  // namespace loco_test

#define LOCO_EXPECT_NEAR(a, b, tol) EXPECT_NEAR(::loco_test::near(__FILE__, __LINE__, (a), (b), (tol)), (b), (tol))
#define LOCO_ASSERT_NEAR(a, b, tol) ASSERT_NEAR(::loco_test::near(__FILE__, __LINE__, (a), (b), (tol)), (b), (tol))
#define LOCO_EXPECT_BELOW(x, bound) EXPECT_LT(::loco_test::below(__FILE__, __LINE__, (x), (bound)), (bound))
#define LOCO_EXPECT_AT_MOST(x, bound) EXPECT_LE(::loco_test::below(__FILE__, __LINE__, (x), (bound)), (bound))
#define LOCO_ASSERT_BELOW(x, bound) ASSERT_LT(::loco_test::below(__FILE__, __LINE__, (x), (bound)), (bound))
#define LOCO_ASSERT_AT_MOST(x, bound) ASSERT_LE(::loco_test::below(__FILE__, __LINE__, (x), (bound)), (bound))
