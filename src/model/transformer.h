#pragma once
// The Llama-style decoder of docs/model.md as a pipeline stage (the whole model is the
// stage with every block, the embedding and the head). Parameters and gradients are flat
// buffers laid out by ParamLayout and owned by the caller; activations live in a Workspace.
#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/layout.h"
#include "model/trainable.h"

namespace loco {

class Subspace;

// Backward-pass scratch for a (batch, seq) shape: needed by one backward pass at a time, so the
// workspaces of microbatches in flight in a pipeline share one.
struct BackwardScratch {
  BackwardScratch(const ModelConfig& c, int batch, int seq);
  std::vector<float> dx, dln, dq, dk, dv, dq2, dk2, datt, dgate, dup, dact;
  int64_t floats() const;
  static int64_t floats_for(const ModelConfig& c, int batch, int seq);
};

// Activations of one forward pass for a (batch, seq) shape, kept for the backward pass, and a
// (possibly shared) backward scratch.
struct Workspace {
  Workspace(const ModelConfig& c, const StageSpec& stage, int batch, int seq,
            std::shared_ptr<BackwardScratch> scratch = nullptr);
  int batch, seq;
  int64_t rows() const { return int64_t(batch) * seq; }

  struct Block {
    std::vector<float> x_in, ln1, rstd1, q_lin, k_lin, v, q_normed, rstd_q, k_normed, rstd_k, q, k, att, lse;
    std::vector<float> x_mid, ln2, rstd2, gate, up, act;
  };
  std::vector<Block> blocks;
  std::vector<float> x_out;              // residual stream after the last block (N, d)
  std::vector<float> final_ln, rstd_f;   // head only
  std::vector<float> logits;             // (N, V), head only; holds dlogits after backward
  std::vector<float> logits_lse;         // (N) log-sum-exp of each logits row
  std::vector<float> target_logits;      // (N) each row's logit at its target (the fused cross-entropy)
  double fused_dloss = 0;                // > 0: forward already wrote dlogits, scaled by this, into logits
  std::vector<float> rope_cos, rope_sin;
  std::shared_ptr<BackwardScratch> scratch;  // shared by all blocks

  // Floats held by the activations (without the scratch), and the same count computed
  // without allocating; floats_for with_scratch adds one scratch.
  int64_t activation_floats() const;
  int64_t floats() const { return activation_floats() + scratch->floats(); }
  static int64_t activation_floats_for(const ModelConfig& c, const StageSpec& stage, int batch, int seq);
  static int64_t floats_for(const ModelConfig& c, const StageSpec& stage, int batch, int seq) {
    return activation_floats_for(c, stage, batch, seq) + BackwardScratch::floats_for(c, batch, seq);
  }
};

class Transformer {
 public:
  explicit Transformer(const ModelConfig& config, StageSpec stage = {});

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  const StageSpec& stage() const { return layout_.stage(); }
  // Protocol models: the subspace the embedding coordinates E_s (stage().embedding_rank > 0)
  // live in (owned by the caller, kept alive while the model is used).
  void set_protocol(const Subspace* subspace);
  const Subspace* protocol() const;

  // Seeded init of docs/model.md. Each tensor draws from its own stream (seed, name), in
  // Hugging Face element order, so a stage gets the same values as the full model.
  void init_params(float* params, uint64_t seed) const;

  // Forward. Embedding stage: `tokens` (B*S) is the input, else `x_in` (B*S, d).
  // Head stage: returns the mean loss over `targets` (B*S); else the output residual stream
  // is ws.x_out and the return value is 0. With `dloss` > 0 (training), the head computes the
  // loss's gradient in the same pass over the logits (cross-entropy fused with its backward), so
  // the backward that follows must take the same dloss; the result is the same bits either way.
  double forward(const float* params, const int32_t* tokens, const float* x_in, const int32_t* targets,
                 Workspace& ws, double dloss = 0) const;

  // Backward after forward on the same workspace. grads (+=, layout-sized).
  // Head stage: `dloss` scales the loss gradient (e.g. 1/micro-batches); else `dy` (B*S, d) is
  // the gradient of the output residual stream. Non-embedding stage: dx_in (B*S, d) +=.
  // With `trainable`, grads is its compact buffer: parameter gradients are computed only for
  // the trained rows (the frozen slices' weight-gradient products are skipped), while the
  // gradients with respect to activations stay complete.
  void backward(const float* params, float* grads, const int32_t* tokens, const int32_t* targets, double dloss,
                const float* dy, float* dx_in, Workspace& ws, const TrainableSet* trainable = nullptr) const;

 private:
  ModelConfig config_;
  ParamLayout layout_;
  const Subspace* subspace_ = nullptr;
};

}  // namespace loco
