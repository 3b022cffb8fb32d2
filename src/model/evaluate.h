#pragma once
// Loss (and optionally gradient) of the mean token loss over consecutive windows of a token
// stream: window i has inputs tokens[i*T .. i*T+T-1] and targets tokens[i*T+1 .. i*T+T].
#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace loco {

// Processes the first `windows` windows in micro-batches of at most `batch` windows. If grads is
// non-null, accumulates (+=) the gradient of the mean loss over all windows.
double windows_loss(const Transformer& model, const float* params, const std::vector<int32_t>& tokens, int seq_len,
                    int64_t windows, int batch, float* grads);

}  // namespace loco
