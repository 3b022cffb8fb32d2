// Test tool: a protocol model (docs/protocol.md) of the model in a TOML config, cut into STAGES stages
// with subspace rank K: initialised as `loco train` does (seed 11), its materialised Llama
// written to OUT_CKPT, and the gradient of the mean loss over the first W windows computed
// through the compressed pipeline (the stages driven in turn in one thread, two microbatches)
// written to OUT_GRADS: HF names, the embedding's gradient as that of E_s (V x k), the
// constrained matrices' gradients projected, and U as "protocol.U". tests/oracle/llama_oracle.py
// protocol-grad checks them against PyTorch on the materialised model.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "core/error.h"
#include "data/token_file.h"
#include "io/checkpoint.h"
#include "algo/run_config.h"
#include "model/protocol.h"
#include "pipeline/grid.h"
#include "pipeline/stage_model.h"

using namespace loco;

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: %s CONFIG DATA SEQ WINDOWS STAGES K OUT_CKPT OUT_GRADS\n", argv[0]);
    return 2;
  }
  try {
    const ModelConfig model = read_model_config(argv[1], {});
    const auto data = read_token_file(argv[2]);
    const int seq = std::stoi(argv[3]), windows = std::stoi(argv[4]), S = std::stoi(argv[5]), k = std::stoi(argv[6]);
    check(windows % 2 == 0, "WINDOWS must be even (two microbatches)");
    Subspace sub(model, k, 7, 1.0);
    auto specs = partition_stages(model, S, "");
    specs.front().embedding_rank = k;
    for (auto& s : specs) s.constrained_end = specs.back().first_block;
    std::vector<std::unique_ptr<Transformer>> stages;
    std::vector<std::vector<float>> params, grads;
    std::vector<std::unique_ptr<TransformerStage>> compute;
    const ParamLayout full(model);
    std::vector<float> full_params(size_t(full.size()));
    std::vector<HfTensor> grad_tensors;
    const std::vector<int32_t> inputs(data.tokens.begin(), data.tokens.begin() + int64_t(windows) * seq);
    const std::vector<int32_t> targets(data.tokens.begin() + 1, data.tokens.begin() + int64_t(windows) * seq + 1);
    for (int s = 0; s < S; ++s) {
      stages.push_back(std::make_unique<Transformer>(model, specs[size_t(s)]));
      stages.back()->set_protocol(&sub);
      const auto& layout = stages.back()->layout();
      params.emplace_back(size_t(layout.size()));
      grads.emplace_back(size_t(layout.size()), 0.0f);
      stages.back()->init_params(params.back().data(), 11);
      sub.init_constrained(layout, params.back().data());
      compute.push_back(std::make_unique<TransformerStage>(*stages.back(), windows / 2, seq, 2, 2));
      compute.back()->set_protocol(&sub, true, nullptr);
      compute.back()->begin_step(1, params.back().data(), grads.back().data(), nullptr, &inputs, &targets);
      // The stage's part of the materialised model.
      StageSpec plain_spec = specs[size_t(s)];
      plain_spec.embedding_rank = 0;
      const ParamLayout plain(model, plain_spec);
      const auto plain_params = sub.materialise(layout, params.back().data());
      for (const auto& t : plain.tensors())
        std::copy_n(plain_params.begin() + t.offset, t.numel(), full_params.begin() + full.find(t.name)->offset);
    }
    for (int mb = 0; mb < 2; ++mb) {
      BoundaryMessage in, out;
      for (int s = 0; s < S; ++s) {
        compute[size_t(s)]->forward(mb, in, out);
        in = out;
      }
    }
    for (int mb = 0; mb < 2; ++mb) {
      std::vector<float> g_out, g_in;
      for (int s = S; s-- > 0;) {
        compute[size_t(s)]->backward(mb, g_out, g_in);
        g_out = g_in;
      }
    }
    for (int s = 0; s < S; ++s) {
      sub.project_constrained(stages[size_t(s)]->layout(), grads[size_t(s)].data());
      for (auto& t : export_hf(stages[size_t(s)]->layout(), grads[size_t(s)].data())) grad_tensors.push_back(std::move(t));
    }
    grad_tensors.push_back({"protocol.U", {model.hidden_size, k}, sub.basis()});
    save_model_checkpoint(argv[7], model, full, full_params.data());
    char loss_str[32];
    std::snprintf(loss_str, sizeof loss_str, "%.9g", compute.back()->loss());
    write_safetensors(argv[8], tensor_refs(grad_tensors),
                      {{"loss", loss_str}, {"constrained_end", std::to_string(specs.back().first_block)}});
    std::printf("loss %s\n", loss_str);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
