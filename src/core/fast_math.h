#pragma once
// exp for float that GCC auto-vectorizes (AVX2): range reduction by ln 2 and a degree-6
// polynomial (Cephes coefficients), max relative error about 2e-7 (tested). Inputs below
// -87.3 give 0, so masked scores can be passed through; NaN gives NaN. Double stays on std::exp: the
// double instantiations exist for gradient tests, where accuracy matters and speed does not.
#include <bit>
#include <cmath>
#include <cstdint>

namespace loco {

inline float fast_exp(float x) {
  // Ternaries, not fmin/fmax: they compile to vector min/max instead of library calls. Written
  // so that NaN clamps to -87.3 (no NaN reaches the integer conversion below, which would be
  // undefined) and is passed through at the end.
  float xc = x > -87.3f ? x : -87.3f;
  xc = xc < 88.7f ? xc : 88.7f;
  const float fx = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  const float z = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const float scale = std::bit_cast<float>(int32_t(int32_t(fx) + 127) << 23);
  const float e = y * scale;
  return x < -87.3f ? 0.0f : (x != x ? x : e);
}

inline double fast_exp(double x) { return std::exp(x); }

}  // namespace loco
