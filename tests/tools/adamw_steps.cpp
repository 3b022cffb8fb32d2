// Test tool: runs AdamW steps (constant lr, global-norm clipping) from a checkpoint on
// consecutive windows of a token file and writes the resulting checkpoint, for comparison with
// torch.optim.AdamW by tests/oracle/llama_oracle.py.
#include <cstdio>
#include <string>

#include "core/error.h"
#include "data/token_file.h"
#include "io/checkpoint.h"
#include "model/evaluate.h"
#include "optim/adamw.h"

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: %s CKPT DATA SEQ BATCH STEPS LR WEIGHT_DECAY CLIP OUT\n", argv[0]);
    return 2;
  }
  try {
    auto m = loco::load_model_checkpoint(argv[1]);
    const auto data = loco::read_token_file(argv[2]);
    const int seq = std::stoi(argv[3]), batch = std::stoi(argv[4]), steps = std::stoi(argv[5]);
    const double lr = std::stod(argv[6]), wd = std::stod(argv[7]), clip = std::stod(argv[8]);
    loco::Transformer model(m.config);
    loco::AdamWConfig oc;
    oc.weight_decay = wd;
    oc.decay_embeddings = true;
    oc.decay_norms = false;
    loco::AdamW opt(oc, model.layout());
    std::vector<float> grads(m.params.size());
    for (int s = 0; s < steps; ++s) {
      std::fill(grads.begin(), grads.end(), 0.0f);
      const std::vector<int32_t> window_tokens(data.tokens.begin() + int64_t(s) * batch * seq,
                                               data.tokens.begin() + int64_t(s + 1) * batch * seq + 1);
      loco::windows_loss(model, m.params.data(), window_tokens, seq, batch, batch, grads.data());
      loco::clip_grad_norm(grads.data(), int64_t(grads.size()), clip);
      opt.step(m.params.data(), grads.data(), lr);
    }
    loco::save_model_checkpoint(argv[9], m.config, model.layout(), m.params.data());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
