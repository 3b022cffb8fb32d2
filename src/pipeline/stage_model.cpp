#include "pipeline/stage_model.h"

#include <algorithm>
#include <cmath>

#include "core/blas.h"
#include "core/error.h"

namespace loco {

void pack_windows(const int32_t* inputs, const int32_t* targets, int windows, int seq, std::vector<int32_t>& out) {
  out.resize(size_t(windows) * (seq + 1));
  for (int w = 0; w < windows; ++w) {
    const int32_t* in = inputs + int64_t(w) * seq;
    const int32_t* tg = targets + int64_t(w) * seq;
    for (int i = 0; i + 1 < seq; ++i)
      check(tg[i] == in[i + 1], "internal: targets are not the inputs shifted by one");
    int32_t* dst = out.data() + int64_t(w) * (seq + 1);
    std::copy(in, in + seq, dst);
    dst[seq] = tg[seq - 1];
  }
}

void unpack_windows(const std::vector<int32_t>& packed, int windows, int seq, std::vector<int32_t>& inputs,
                    std::vector<int32_t>& targets) {
  if (packed.size() != size_t(windows) * (seq + 1))
    fail("pipeline: a tokens message of " + std::to_string(packed.size()) + " ids, expected " +
         std::to_string(int64_t(windows) * (seq + 1)) + " (mismatched configs across workers?)");
  inputs.resize(size_t(windows) * seq);
  targets.resize(inputs.size());
  for (int w = 0; w < windows; ++w) {
    const int32_t* src = packed.data() + int64_t(w) * (seq + 1);
    std::copy(src, src + seq, inputs.begin() + int64_t(w) * seq);
    std::copy(src + 1, src + seq + 1, targets.begin() + int64_t(w) * seq);
  }
}

TransformerStage::TransformerStage(const Transformer& model, int micro_windows, int seq, int microbatches,
                                   int in_flight)
    : model_(model),
      windows_(micro_windows),
      seq_(seq),
      microbatches_(microbatches),
      scratch_(std::make_shared<BackwardScratch>(model.config(), micro_windows, seq)) {
  slots_.resize(size_t(std::max(1, in_flight)));
  for (auto& s : slots_) s.ws = std::make_unique<Workspace>(model.config(), model.stage(), windows_, seq_, scratch_);
}

void TransformerStage::begin_step(int64_t step, const float* params, float* grads, const TrainableSet* trainable,
                                  const std::vector<int32_t>* inputs, const std::vector<int32_t>* targets) {
  step_ = step;
  params_ = params;
  grads_ = grads;
  trainable_ = trainable;
  inputs_ = inputs;
  targets_ = targets;
  loss_ = 0;
}

TransformerStage::Slot& TransformerStage::slot_for(int mb) { return slots_[size_t(mb) % slots_.size()]; }

int TransformerStage::width() const {
  return compress_ ? subspace_->k() : model_.config().hidden_size;
}

void TransformerStage::set_protocol(const Subspace* subspace, bool compress, std::vector<double>* grassmann) {
  subspace_ = subspace;
  compress_ = subspace && compress;
  grassmann_ = grassmann;
  if (grassmann_) grassmann_->assign(size_t(model_.config().hidden_size) * model_.config().hidden_size, 0.0);
}

void TransformerStage::receive_activations(const BoundaryMessage& in, const std::vector<int32_t>& tokens,
                                           const float*& x_in) {
  const int64_t n = int64_t(tokens.size());
  const int64_t expect = n * width();
  if (int64_t(in.activations.size()) != expect)
    fail("pipeline: activations of " + std::to_string(in.activations.size()) + " floats, expected " +
         std::to_string(expect) + " (mismatched configs across workers?)");
  x_in = in.activations.data();
  if (!compress_) return;
  expanded_.resize(size_t(n) * model_.config().hidden_size);
  subspace_->expand(in.activations.data(), tokens.data(), n, expanded_.data());
  x_in = expanded_.data();
}

void TransformerStage::send_activations(const float* x_out, const std::vector<int32_t>& tokens, BoundaryMessage& out) {
  const int64_t n = int64_t(tokens.size());
  if (!compress_) {
    out.activations.assign(x_out, x_out + n * model_.config().hidden_size);
    return;
  }
  out.activations.resize(size_t(n) * subspace_->k());
  subspace_->compress(x_out, tokens.data(), n, out.activations.data());
}

void TransformerStage::forward(int mb, const BoundaryMessage& in, BoundaryMessage& out) {
  const auto& st = model_.stage();
  Slot& slot = slot_for(mb);
  check(slot.microbatch < 0, "internal: microbatch " + std::to_string(mb) + " would overwrite the activations of " +
                                 std::to_string(slot.microbatch) + " (schedule exceeds the workspaces)");
  slot.microbatch = mb;
  const int64_t n = int64_t(windows_) * seq_;
  const float* x_in = nullptr;
  if (st.embedding) {
    slot.inputs.assign(inputs_->begin() + mb * n, inputs_->begin() + (mb + 1) * n);
    slot.targets.assign(targets_->begin() + mb * n, targets_->begin() + (mb + 1) * n);
  } else {
    unpack_windows(in.tokens, windows_, seq_, slot.inputs, slot.targets);
    receive_activations(in, slot.inputs, x_in);
  }
  // Every training forward is followed by its backward: the head fuses the loss's gradient.
  const double loss =
      model_.forward(params_, slot.inputs.data(), x_in, slot.targets.data(), *slot.ws, 1.0 / microbatches_);
  if (st.head) {
    if (!std::isfinite(loss))
      fail("non-finite training loss at step " + std::to_string(step_) + " (lower optimizer.lr?); stopped before "
           "the update");
    loss_ += loss / microbatches_;
  } else {
    send_activations(slot.ws->x_out.data(), slot.inputs, out);
    pack_windows(slot.inputs.data(), slot.targets.data(), windows_, seq_, out.tokens);
  }
}

void TransformerStage::backward(int mb, const std::vector<float>& grad_out, std::vector<float>& grad_in) {
  const auto& st = model_.stage();
  Slot& slot = slot_for(mb);
  check(slot.microbatch == mb, "internal: backward of microbatch " + std::to_string(mb) + " before its forward");
  const int d = model_.config().hidden_size;
  const int64_t n = int64_t(windows_) * seq_, nd = n * d;
  const float* dy = nullptr;
  if (!st.head) {
    if (int64_t(grad_out.size()) != n * width())
      fail("pipeline: activation gradients of " + std::to_string(grad_out.size()) + " floats, expected " +
           std::to_string(n * width()));
    dy = grad_out.data();
    if (compress_) {
      expanded_.resize(size_t(nd));
      subspace_->expand(grad_out.data(), nullptr, n, expanded_.data());
      dy = expanded_.data();
    }
  }
  if (!st.embedding) grad_in.assign(size_t(nd), 0.0f);
  model_.backward(params_, grads_, slot.inputs.data(), slot.targets.data(), 1.0 / microbatches_, dy,
                  st.embedding ? nullptr : grad_in.data(), *slot.ws, trainable_);
  slot.microbatch = -1;
  if (st.embedding) return;
  if (grassmann_) {  // A += g^T g, in double
    grad64_.assign(grad_in.begin(), grad_in.end());
    gemm(true, false, d, d, int(n), 1.0, grad64_.data(), d, grad64_.data(), d, 1.0, grassmann_->data(), d);
  }
  if (compress_) {
    compressed_.resize(size_t(n) * subspace_->k());
    subspace_->compress(grad_in.data(), nullptr, n, compressed_.data());
    grad_in.swap(compressed_);
  }
}

double TransformerStage::eval_loss_sum(const float* params, PipelineExecutor& ex, const Route& route,
                                       const std::vector<int32_t>& tokens, int64_t first, int64_t count, int batch) {
  const auto& st = model_.stage();
  const int T = seq_;
  double total = 0;
  std::vector<int32_t> in, tgt;
  BoundaryMessage msg;
  for (int64_t w0 = 0; w0 < count; w0 += batch) {
    const int b = int(std::min<int64_t>(batch, count - w0));
    if (!eval_ws_ || eval_ws_->batch != b)
      eval_ws_ = std::make_unique<Workspace>(model_.config(), st, b, T, nullptr);
    const int mb = int(w0 / batch);
    if (st.embedding) {
      const auto begin = tokens.begin() + (first + w0) * T;
      in.assign(begin, begin + int64_t(b) * T);
      tgt.assign(begin + 1, begin + int64_t(b) * T + 1);
    } else {
      ex.recv_forward(route.prev(mb), msg, mb, true);
      unpack_windows(msg.tokens, b, T, in, tgt);
    }
    const float* x_in = nullptr;
    if (!st.embedding) receive_activations(msg, in, x_in);
    const double loss = model_.forward(params, in.data(), x_in, tgt.data(), *eval_ws_);
    if (st.head) {
      total += loss * double(b);
    } else {
      BoundaryMessage out;
      send_activations(eval_ws_->x_out.data(), in, out);
      pack_windows(in.data(), tgt.data(), b, T, out.tokens);
      ex.send_forward(route.next(mb), out, true);
    }
  }
  return total;
}

int64_t TransformerStage::activation_bytes() const {
  return int64_t(sizeof(float)) *
         (int64_t(slots_.size()) * slots_[0].ws->activation_floats() + scratch_->floats());
}

}  // namespace loco
