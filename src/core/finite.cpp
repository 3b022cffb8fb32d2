#include "core/finite.h"

#include <atomic>
#include <cmath>

#include "core/parallel.h"

namespace loco {

int64_t first_non_finite(const float* x, int64_t n) {
  std::atomic<bool> finite{true};
  parallel_for(n, int64_t(1) << 18, [&](int64_t b, int64_t e) {
    bool ok = true;
    for (int64_t i = b; i < e; ++i) ok &= std::isfinite(x[i]);
    if (!ok) finite = false;
  });
  if (finite) return -1;
  for (int64_t i = 0; i < n; ++i)  // the first one, whatever the threads
    if (!std::isfinite(x[i])) return i;
  return -1;
}

}  // namespace loco
