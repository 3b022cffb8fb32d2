#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/memory.h"

namespace loco {

AdamW::AdamW(const AdamWConfig& config, const ParamLayout& layout, const TrainableSet* trainable,
             bool subspace_moments)
    : config_(config) {
  int64_t compact_size = 0;
  for (size_t i = 0; i < layout.tensors().size(); ++i) {
    const auto& t = layout.tensors()[i];
    bool decay = t.is_matrix();
    if (t.kind == TensorKind::Embedding || t.kind == TensorKind::LmHead) decay = config_.decay_embeddings;
    if (!t.is_matrix()) decay = config_.decay_norms;
    Segment seg{t.offset, t.offset, t.numel()};
    if (trainable) {
      const auto& r = trainable->rows(i);
      seg = {t.offset + r.begin * t.cols, r.compact, (r.end - r.begin) * t.cols};
    }
    if (seg.size == 0) continue;
    compact_size = std::max(compact_size, seg.compact + seg.size);
    if (subspace_moments && is_constrained(layout.stage(), t)) {
      check(seg.size == t.numel(), "internal: a sliced protocol-constrained matrix");
      shared_.push_back({seg, t.rows, t.cols, t.transposed, decay});
      continue;
    }
    auto& list = decay ? decay_ : no_decay_;
    if (!list.empty() && list.back().param + list.back().size == seg.param &&
        list.back().compact + list.back().size == seg.compact)
      list.back().size += seg.size;
    else
      list.push_back(seg);
  }
  m_ = zeroed_floats(size_t(compact_size));
  v_ = zeroed_floats(size_t(compact_size));
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
  auto update = [&](const std::vector<Segment>& segments, float decay_factor) {
    for (const auto& s : segments) {
      float* p_seg = params + s.param;
      const float* g_seg = grads + s.compact;
      float* m_seg = m_.data() + s.compact;
      float* v_seg = v_.data() + s.compact;
      for (int64_t i = 0; i < s.size; ++i) {
        const float g = g_seg[i];
        float p = p_seg[i] * decay_factor;
        const float m = m_seg[i] * b1 + g * one_minus_b1;
        const float v = v_seg[i] * b2 + g * g * one_minus_b2;
        m_seg[i] = m;
        v_seg[i] = v;
        p -= step_size * (m / (std::sqrt(v) / bc2_sqrt + eps));
        p_seg[i] = p;
      }
    }
  };
  update(decay_, float(1.0 - lr * config_.weight_decay));
  update(no_decay_, 1.0f);
  // Subspace AdamW: moments as above, then one second moment per output column (the mean over
  // the d output entries), so each output vector of the update is m's scaled by one number.
  std::vector<float> vbar;
  for (const auto& sh : shared_) {
    const auto& s = sh.seg;
    float* p_seg = params + s.param;
    const float* g_seg = grads + s.compact;
    float* m_seg = m_.data() + s.compact;
    float* v_seg = v_.data() + s.compact;
    const float decay_factor = sh.decay ? float(1.0 - lr * config_.weight_decay) : 1.0f;
    for (int64_t i = 0; i < s.size; ++i) {
      const float g = g_seg[i];
      m_seg[i] = m_seg[i] * b1 + g * one_minus_b1;
      v_seg[i] = v_seg[i] * b2 + g * g * one_minus_b2;
    }
    // vbar indexed by the non-output index: stored rows for down_proj, columns for o_proj.
    const int64_t groups = sh.out_is_cols ? sh.rows : sh.cols, out = sh.out_is_cols ? sh.cols : sh.rows;
    vbar.assign(size_t(groups), 0.0f);
    std::vector<double> acc(size_t(groups), 0.0);
    for (int64_t r = 0; r < sh.rows; ++r)
      for (int64_t c = 0; c < sh.cols; ++c) acc[size_t(sh.out_is_cols ? r : c)] += v_seg[r * sh.cols + c];
    for (int64_t j = 0; j < groups; ++j) vbar[size_t(j)] = float(std::sqrt(acc[size_t(j)] / double(out))) / bc2_sqrt + eps;
    for (int64_t r = 0; r < sh.rows; ++r)
      for (int64_t c = 0; c < sh.cols; ++c) {
        const int64_t i = r * sh.cols + c;
        p_seg[i] = p_seg[i] * decay_factor - step_size * (m_seg[i] / vbar[size_t(sh.out_is_cols ? r : c)]);
      }
  }
}

double clip_grad_norm(float* grads, int64_t n, double max_norm) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(grads[i]) * grads[i];
  const double norm = std::sqrt(ss);
  scale_to_norm(grads, n, norm, max_norm);
  return norm;
}

void scale_to_norm(float* grads, int64_t n, double norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  const float c = float(coef);
  for (int64_t i = 0; i < n; ++i) grads[i] *= c;
}

}  // namespace loco
