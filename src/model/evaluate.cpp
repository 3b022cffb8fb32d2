#include "model/evaluate.h"

#include <algorithm>
#include <memory>

#include "core/error.h"

namespace loco {

double windows_loss(const Transformer& model, const float* params, const std::vector<int32_t>& tokens, int seq_len,
                    int64_t windows, int batch, float* grads) {
  check(seq_len >= 1, "--seq-len must be >= 1");
  check(windows >= 1, "--windows must be >= 1");
  check(batch >= 1, "--batch must be >= 1");
  const int64_t needed = windows * seq_len + 1;
  check(int64_t(tokens.size()) >= needed, "the data has " + std::to_string(tokens.size()) + " tokens, but " +
                                              std::to_string(windows) + " windows of " + std::to_string(seq_len) +
                                              " need " + std::to_string(needed));
  std::unique_ptr<Workspace> ws;
  std::vector<int32_t> in, tgt;
  double total = 0;
  for (int64_t w0 = 0; w0 < windows; w0 += batch) {
    const int b = int(std::min<int64_t>(batch, windows - w0));
    if (!ws || ws->batch != b) ws = std::make_unique<Workspace>(model.config(), model.stage(), b, seq_len);
    in.assign(tokens.begin() + w0 * seq_len, tokens.begin() + (w0 + b) * seq_len);
    tgt.assign(tokens.begin() + w0 * seq_len + 1, tokens.begin() + (w0 + b) * seq_len + 1);
    const double weight = double(b) / double(windows);
    const double loss = model.forward(params, in.data(), nullptr, tgt.data(), *ws, grads ? weight : 0.0);
    total += loss * weight;
    if (grads) model.backward(params, grads, in.data(), tgt.data(), weight, nullptr, nullptr, *ws);
  }
  return total;
}

}  // namespace loco
