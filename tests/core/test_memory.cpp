// Model-sized host buffers (core/memory.h): whatever the kernel does with the huge-page advice and
// the pages made present on the compute threads, zeroed_floats gives n zeros and copied_floats an
// exact copy, for sizes below and above the 32 MiB where the requests start, ends inside a huge
// page, and any number of compute threads.
#include <gtest/gtest.h>

#include <vector>

#include "core/memory.h"
#include "core/parallel.h"

using namespace loco;

TEST(Memory, ZeroedAndCopiedFloatsHoldTheirValuesAtEverySizeAndThreadCount) {
  const int before = compute_threads();
  // 0, 1 and a few values; just below and above 32 MiB; 40 MiB and a bit (an end inside a page).
  const std::vector<size_t> sizes{0, 1, 1000, (size_t(8) << 20) - 1, size_t(8) << 20, (size_t(10) << 20) + 12345};
  for (int threads : {1, 3}) {
    set_compute_threads(threads);
    for (size_t n : sizes) {
      std::vector<float> z = zeroed_floats(n);
      ASSERT_EQ(z.size(), n);
      size_t nonzero = 0;
      for (float x : z) nonzero += x != 0.0f;
      EXPECT_EQ(nonzero, 0u) << n << " values, " << threads << " threads";

      std::vector<float> from(n);
      for (size_t i = 0; i < n; ++i) from[i] = float(i % 4093) - 2046.5f;
      std::vector<float> c = copied_floats(from);
      EXPECT_EQ(c, from) << n << " values, " << threads << " threads";
    }
  }
  set_compute_threads(before);
}
