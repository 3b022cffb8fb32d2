#pragma once
// A worker's stage of the transformer as the pipeline executor's StageCompute: the
// microbatches of one step, each forward pass kept in a workspace until its backward pass
// (one workspace per microbatch in flight, all sharing one backward scratch). With one stage
// this is plain gradient accumulation.
#include <cstdint>
#include <memory>
#include <vector>

#include "model/protocol.h"
#include "model/trainable.h"
#include "model/transformer.h"
#include "pipeline/executor.h"

namespace loco {

class TransformerStage : public StageCompute {
 public:
  // `micro_windows` windows of `seq` tokens per microbatch, `microbatches` per step, at most
  // `in_flight` of them between forward and backward.
  TransformerStage(const Transformer& model, int micro_windows, int seq, int microbatches, int in_flight);

  // Before each step: the parameters and the gradient buffer to accumulate into (compact for
  // `trainable`), and on the first stage the step's batch (microbatch k is windows
  // [k w, (k+1) w)). `step` is 1-based, for messages.
  void begin_step(int64_t step, const float* params, float* grads, const TrainableSet* trainable,
                  const std::vector<int32_t>* inputs, const std::vector<int32_t>* targets);
  void forward(int mb, const BoundaryMessage& in, BoundaryMessage& out) override;
  void backward(int mb, const std::vector<float>& grad_out, std::vector<float>& grad_in) override;
  // Mean training loss over the step's microbatches (last stage; 0 elsewhere).
  double loss() const { return loss_; }

  // Loss summed over windows [first, first + count) of `tokens` run through the pipeline in
  // batches of `batch` windows (window i: inputs tokens[iT, iT+T), targets shifted by one):
  // the first stage reads them, every stage forwards, the last stage returns sum(loss * windows)
  // and the others 0. Every stage of the pipeline calls it with the same arguments.
  double eval_loss_sum(const float* params, PipelineExecutor& ex, const Route& route,
                       const std::vector<int32_t>& tokens, int64_t first, int64_t count, int batch);

  // Protocol models (docs/protocol.md): boundaries carry the k subspace coordinates of the activations
  // (with the token ids) and of the activation gradients when `compress`, else all d (the same
  // results, for checking). `grassmann` (the last stage only, or null): A += g^T g over the rows
  // of the full gradient g of this stage's input, before it is compressed.
  void set_protocol(const Subspace* subspace, bool compress, std::vector<double>* grassmann);

  // Bytes of activations held at most (workspaces of the microbatches in flight + scratch).
  int64_t activation_bytes() const;
  int in_flight() const { return int(slots_.size()); }

 private:
  struct Slot {
    std::unique_ptr<Workspace> ws;
    std::vector<int32_t> inputs, targets;
    int microbatch = -1;  // in flight, or -1
  };
  Slot& slot_for(int mb);
  const Transformer& model_;
  int windows_, seq_, microbatches_;
  std::shared_ptr<BackwardScratch> scratch_;
  std::vector<Slot> slots_;
  std::unique_ptr<Workspace> eval_ws_;
  int64_t step_ = 0;
  const float* params_ = nullptr;
  float* grads_ = nullptr;
  const TrainableSet* trainable_ = nullptr;
  const std::vector<int32_t>* inputs_ = nullptr;
  const std::vector<int32_t>* targets_ = nullptr;
  double loss_ = 0;
  // Protocol models.
  int width() const;  // floats per token crossing a boundary
  void receive_activations(const BoundaryMessage& in, const std::vector<int32_t>& tokens, const float*& x_in);
  void send_activations(const float* x_out, const std::vector<int32_t>& tokens, BoundaryMessage& out);
  const Subspace* subspace_ = nullptr;
  bool compress_ = false;
  std::vector<double>* grassmann_ = nullptr;
  std::vector<float> expanded_, compressed_;
  std::vector<double> grad64_;  // the gradient of A's accumulation, in double
};

// The tokens message for windows of T inputs and their targets (T + 1 ids per window), and
// back. Fails if the targets are not the inputs shifted by one.
void pack_windows(const int32_t* inputs, const int32_t* targets, int windows, int seq, std::vector<int32_t>& out);
void unpack_windows(const std::vector<int32_t>& packed, int windows, int seq, std::vector<int32_t>& inputs,
                    std::vector<int32_t>& targets);

}  // namespace loco
