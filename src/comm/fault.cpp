#include "comm/fault.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/rng.h"

namespace loco {

Fault parse_fault(const std::string& whole, const std::string& key) {
  Fault f;
  if (whole.empty()) return f;
  const size_t at = whole.find('@');
  const std::string text = whole.substr(0, at);
  if (at != std::string::npos) {
    const std::string from = whole.substr(at + 1);
    size_t used = 0;
    try {
      f.from_step = std::stoll(from, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != from.size() || f.from_step < 0)
      fail(key + " = \"" + whole + "\": @S needs a step S >= 0, e.g. scale:-10@40");
  }
  if (text == "nan") {
    f.kind = Fault::Kind::Nan;
  } else if (text == "inf") {
    f.kind = Fault::Kind::Inf;
  } else if (text == "noise") {
    f.kind = Fault::Kind::Noise;
  } else if (text.rfind("scale:", 0) == 0) {
    size_t used = 0;
    try {
      f.scale = std::stod(text.substr(6), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() - 6 || !std::isfinite(f.scale))
      fail(key + " = \"" + whole + "\": scale:X needs a finite number X, e.g. scale:-10");
    f.kind = Fault::Kind::Scale;
  } else {
    fail(key + " = \"" + whole + "\": use \"\" (none), \"nan\", \"inf\", \"noise\" or \"scale:X\", each maybe followed by @S");
  }
  return f;
}

void apply_fault(const Fault& f, int64_t step, const std::vector<float>& theta, std::vector<float>& contribution,
                 uint64_t seed) {
  if (f.kind == Fault::Kind::None || contribution.empty() || step < f.from_step) return;
  if (f.kind == Fault::Kind::Noise) {
    double norm = 0, drawn = 0;
    std::vector<double> z(contribution.size());
    Rng rng(seed);
    for (size_t i = 0; i < z.size(); ++i) {
      const double d = double(theta[i]) - contribution[i];
      norm += d * d;
      z[i] = rng.normal();
      drawn += z[i] * z[i];
    }
    const double scale = drawn > 0 ? std::sqrt(norm / drawn) : 0;
    for (size_t i = 0; i < z.size(); ++i) contribution[i] = float(theta[i] - scale * z[i]);
    return;
  }
  if (f.kind == Fault::Kind::Nan) {
    contribution[0] = std::numeric_limits<float>::quiet_NaN();
  } else if (f.kind == Fault::Kind::Inf) {
    contribution[0] = -std::numeric_limits<float>::infinity();  // delta = +Inf
  } else {
    for (size_t i = 0; i < contribution.size(); ++i)
      contribution[i] = float(theta[i] - f.scale * double(theta[i] - contribution[i]));
  }
}

}  // namespace loco
