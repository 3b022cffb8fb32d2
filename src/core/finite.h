#pragma once
// Finding a NaN or Inf in a buffer of floats, the check every value from a peer, a file or a
// caller gets before use.
#include <cstdint>

namespace loco {

// The index of the first NaN or Inf among x[0, n), or -1 when every value is finite. The scan is
// split over the compute threads; the index is the first in order, whatever the threads.
int64_t first_non_finite(const float* x, int64_t n);
// Whether x[0..n) are all finite, on the calling thread: the largest magnitude's bits below
// infinity's, compared as integers so that the loop vectorizes.
bool all_finite(const float* x, int64_t n);

}  // namespace loco
