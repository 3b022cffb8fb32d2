// loco init / grad / eval: single-model commands over checkpoints and token files.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/parallel.h"
#include "core/error.h"
#include "data/token_file.h"
#include "io/checkpoint.h"
#include "io/run_config.h"
#include "io/safetensors.h"
#include "model/evaluate.h"
#include "model/transformer.h"

namespace loco::cli {

namespace {

struct WindowArgs {
  std::string checkpoint, data;
  int seq_len = 0;
  int64_t windows = 0;
  int batch = 8;
  int threads = 0;
};

void add_window_options(CLI::App* cmd, WindowArgs& a) {
  cmd->add_option("--checkpoint", a.checkpoint, "checkpoint directory (config.json + model.safetensors)")->required();
  cmd->add_option("--data", a.data, "LOCOTOKS token file")->required();
  cmd->add_option("--seq-len", a.seq_len, "window length T")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--windows", a.windows, "number of windows W from the start of the file")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", a.batch, "windows per micro-batch (memory vs speed; result is the same)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", a.threads, "compute threads (0: all cores)")->check(CLI::NonNegativeNumber);
}

struct Loaded {
  LoadedModel model;
  TokenFile data;
};

Loaded load_inputs(const WindowArgs& a) {
  if (a.threads > 0) set_compute_threads(a.threads);
  Loaded l{load_model_checkpoint(a.checkpoint), read_token_file(a.data)};
  if (l.data.vocab_size > uint64_t(l.model.config.vocab_size))
    fail(a.data + ": vocabulary size " + std::to_string(l.data.vocab_size) + " exceeds the model's " +
         std::to_string(l.model.config.vocab_size));
  return l;
}

}  // namespace

void add_init(CLI::App& app) {
  struct Args {
    std::string config, out;
    uint64_t seed = 0;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("init", "Write a freshly initialized checkpoint (safetensors + config.json)");
  cmd->add_option("--config", args->config, "run config (.toml, [model] table) or Hugging Face config.json")
      ->required();
  cmd->add_option("--seed", args->seed, "initialization seed")->required();
  cmd->add_option("--out", args->out, "output checkpoint directory")->required();
  cmd->add_option("--set", args->overrides, "override a config key, e.g. --set model.num_layers=4");
  cmd->callback([args] {
    ModelConfig mc;
    if (!args->overrides.empty()) {
      if (args->config.size() >= 5 && args->config.compare(args->config.size() - 5, 5, ".json") == 0)
        fail("--set applies to TOML configs only");
      mc = load_run_config(args->config, args->overrides).model;
    } else {
      mc = read_model_config(args->config);
    }
    Transformer model(mc);
    std::vector<float> params(size_t(model.layout().size()));
    model.init_params(params.data(), args->seed);
    save_model_checkpoint(args->out, mc, model.layout(), params.data());
    std::printf("wrote %s (%lld parameters)\n", args->out.c_str(), static_cast<long long>(params.size()));
  });
}

void add_grad(CLI::App& app) {
  auto args = std::make_shared<WindowArgs>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("grad", "Write the gradient of the mean loss over the first W windows");
  add_window_options(cmd, *args);
  cmd->add_option("--out", *out, "output .safetensors (Hugging Face names and shapes)")->required();
  cmd->callback([args, out] {
    auto in = load_inputs(*args);
    Transformer model(in.model.config);
    std::vector<float> grads(in.model.params.size(), 0.0f);
    const double loss = windows_loss(model, in.model.params.data(), in.data.tokens, args->seq_len, args->windows,
                                     args->batch, grads.data());
    const auto tensors = export_hf(model.layout(), grads.data());
    char loss_str[32];
    std::snprintf(loss_str, sizeof loss_str, "%.9g", loss);
    write_safetensors(*out, tensor_refs(tensors), {{"loss", loss_str}});
    std::printf("loss %.6f\n", loss);
  });
}

void add_eval(CLI::App& app) {
  auto args = std::make_shared<WindowArgs>();
  auto* cmd = app.add_subcommand("eval", "Print the mean loss over the first W windows");
  add_window_options(cmd, *args);
  cmd->callback([args] {
    auto in = load_inputs(*args);
    Transformer model(in.model.config);
    const double loss =
        windows_loss(model, in.model.params.data(), in.data.tokens, args->seq_len, args->windows, args->batch, nullptr);
    std::printf("loss %.6f\n", loss);
  });
}

}  // namespace loco::cli
