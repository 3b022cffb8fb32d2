#pragma once
// AdamW with bias correction and decoupled weight decay, in the update order of
// torch.optim.AdamW: p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
#include <cstdint>
#include <vector>

#include "model/layout.h"
#include "model/trainable.h"

namespace loco {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // Which tensors decay: matrices always; embeddings/lm_head and norm weights configurable.
  bool decay_embeddings = true;
  bool decay_norms = false;
};

class AdamW {
 public:
  // Moments for the trained entries only (all parameters without `trainable`). With
  // `subspace_moments`, the protocol-constrained matrices of the layout's stage (docs/protocol.md) use
  // the subspace AdamW: the bias-corrected second moment is averaged over the output (d)
  // dimension, so an update whose first moment lies in the subspace stays there.
  AdamW(const AdamWConfig& config, const ParamLayout& layout, const TrainableSet* trainable = nullptr,
        bool subspace_moments = false);
  // One update of every trained parameter with learning rate `lr`; grads is compact (the
  // trainable set's buffer), params is the full layout.
  void step(float* params, const float* grads, double lr);
  int64_t steps() const { return step_; }
  void set_steps(int64_t s) { step_ = s; }
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const AdamWConfig& config() const { return config_; }

 private:
  AdamWConfig config_;
  struct Segment {
    int64_t param, compact, size;  // params[param + i] pairs with grads/m/v[compact + i]
  };
  std::vector<Segment> decay_, no_decay_;
  struct SharedTensor {
    Segment seg;
    int64_t rows, cols;
    bool out_is_cols;  // the output dimension is the stored columns (down_proj)
    bool decay;
  };
  std::vector<SharedTensor> shared_;
  std::vector<float> m_, v_;
  int64_t step_ = 0;
};

// Scales grads so that their global L2 norm is at most max_norm (torch's clip_grad_norm_:
// coefficient max_norm / (norm + 1e-6) when below 1). Returns the norm before clipping.
// max_norm <= 0 disables clipping but still returns the norm.
double clip_grad_norm(float* grads, int64_t n, double max_norm);
// The scaling step of clip_grad_norm given the norm (computed elsewhere, e.g. over the stages
// of a pipeline).
void scale_to_norm(float* grads, int64_t n, double norm, double max_norm);

}  // namespace loco
