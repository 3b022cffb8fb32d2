#include "core/finite.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cmath>

#include "core/parallel.h"

namespace loco {

bool all_finite(const float* x, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
  return top < 0x7F800000u;
}

int64_t first_non_finite(const float* x, int64_t n) {
  std::atomic<bool> finite{true};
  parallel_for(n, int64_t(1) << 18, [&](int64_t b, int64_t e) {
    if (!all_finite(x + b, e - b)) finite = false;
  });
  if (finite) return -1;
  for (int64_t i = 0; i < n; ++i)  // the first one, whatever the threads
    if (!std::isfinite(x[i])) return i;
  return -1;
}

}  // namespace loco
