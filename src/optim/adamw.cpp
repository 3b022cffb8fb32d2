#include "optim/adamw.h"

#include <cmath>

namespace loco {

AdamW::AdamW(const AdamWConfig& config, const ParamLayout& layout)
    : config_(config), m_(size_t(layout.size()), 0.0f), v_(size_t(layout.size()), 0.0f) {
  for (const auto& t : layout.tensors()) {
    bool decay = t.is_matrix();
    if (t.kind == TensorKind::Embedding || t.kind == TensorKind::LmHead) decay = config_.decay_embeddings;
    if (!t.is_matrix()) decay = config_.decay_norms;
    (decay ? decay_ranges_ : no_decay_ranges_).push_back({t.offset, t.offset + t.numel()});
  }
  decay_ranges_ = merge_ranges(decay_ranges_);
  no_decay_ranges_ = merge_ranges(no_decay_ranges_);
}

void AdamW::step(float* params, const float* grads, double lr) {
  ++step_;
  // Coefficients rounded from double, as torch does with Python-float scalars.
  const float b1 = float(config_.beta1), b2 = float(config_.beta2), eps = float(config_.eps);
  const float one_minus_b1 = float(1.0 - config_.beta1), one_minus_b2 = float(1.0 - config_.beta2);
  const double bc1 = 1.0 - std::pow(config_.beta1, double(step_));
  const double bc2 = 1.0 - std::pow(config_.beta2, double(step_));
  const float step_size = float(lr / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  auto update = [&](const std::vector<Range>& ranges, float decay_factor) {
    for (const auto& r : ranges) {
      for (int64_t i = r.begin; i < r.end; ++i) {
        const float g = grads[i];
        float p = params[i] * decay_factor;
        const float m = m_[i] * b1 + g * one_minus_b1;
        const float v = v_[i] * b2 + g * g * one_minus_b2;
        m_[i] = m;
        v_[i] = v;
        p -= step_size * (m / (std::sqrt(v) / bc2_sqrt + eps));
        params[i] = p;
      }
    }
  };
  update(decay_ranges_, float(1.0 - lr * config_.weight_decay));
  update(no_decay_ranges_, 1.0f);
}

double clip_grad_norm(float* grads, int64_t n, double max_norm) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(grads[i]) * grads[i];
  const double norm = std::sqrt(ss);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      const float c = float(coef);
      for (int64_t i = 0; i < n; ++i) grads[i] *= c;
    }
  }
  return norm;
}

}  // namespace loco
