// loco init / grad / eval: single-model commands over checkpoints and token files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>

#include "cli/commands.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "core/precision.h"
#include "core/rng.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "core/fs.h"
#include "io/checkpoint.h"
#include "algo/run_config.h"
#include "io/safetensors.h"
#include "io/train_state.h"
#include "model/evaluate.h"
#include "model/trainable.h"
#include "model/transformer.h"
#include "sim/estimate.h"

namespace loco::cli {

namespace {

struct WindowArgs {
  std::string checkpoint, data;
  int seq_len = 0;
  int64_t windows = 0;
  int batch = 8;
  int threads = 0;
  std::string precision = "fp32";
  std::string library = "auto";
};

void add_window_options(CLI::App* cmd, WindowArgs& a) {
  cmd->add_option("--checkpoint", a.checkpoint, "checkpoint directory (config.json + model.safetensors)")->required();
  cmd->add_option("--data", a.data, "LOCOTOKS token file")->required();
  cmd->add_option("--seq-len", a.seq_len, "window length T")->required()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--windows", a.windows, "number of windows W from the start of the file")
      ->required()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  cmd->add_option("--batch", a.batch, "windows per micro-batch (memory vs speed; result is the same)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--threads", a.threads, "compute threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--precision", a.precision, "matrix products: fp32, bf16 or auto (as train.precision)")
      ->check(CLI::IsMember({"fp32", "bf16", "auto"}));
  cmd->add_option("--matmul-library", a.library, "fp32 products: auto, openblas or onednn (as train.matmul_library)")
      ->check(CLI::IsMember({"auto", "openblas", "onednn"}));
}

struct Loaded {
  LoadedModel model;
  TokenFile data;
};

Loaded load_inputs(const WindowArgs& a) {
  if (a.threads > 0) set_compute_threads(a.threads);
  std::string note;
  const Fp32Library library = resolve_fp32_library(a.library);
  set_fp32_library(library);
  set_matmul_precision(resolve_precision(a.precision, library, &note));
  if (a.precision != "fp32") std::fprintf(stderr, "%s\n", note.c_str());
  Loaded l{load_model_checkpoint(a.checkpoint), read_token_file(a.data)};
  if (l.data.vocab_size > uint64_t(l.model.config.vocab_size))
    fail(a.data + ": vocabulary size " + std::to_string(l.data.vocab_size) + " exceeds the model's " +
         std::to_string(l.model.config.vocab_size));
  const double needed = double(a.windows) * a.seq_len + 1;
  if (a.seq_len >= 1 && a.windows >= 1 && double(l.data.tokens.size()) < needed)
    fail(a.data + ": the data has " + std::to_string(l.data.tokens.size()) + " tokens, but " +
         std::to_string(a.windows) + " windows of " + std::to_string(a.seq_len) + " need " +
         std::to_string(int64_t(needed)));
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
    const ModelConfig mc = read_model_config(args->config, args->overrides);
    require_memory(2 * 4 * mc.parameter_count(), 0, "a model of " + std::to_string(int64_t(mc.parameter_count())) +
                   " parameters", "lower the model sizes in " + args->config);
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

namespace loco::cli {

void add_generate(CLI::App& app) {
  struct Args {
    std::string checkpoint, prompt, tokenizer;
    int max_tokens = 200;
    double temperature = 0.8;
    int top_k = 40;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("generate", "Sample text from a checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "checkpoint directory, or a run directory (its latest checkpoint)")
      ->required();
  cmd->add_option("--prompt", a->prompt, "text to continue")->required();
  cmd->add_option("--max-tokens", a->max_tokens, "tokens to generate")->check(CLI::Range(1, 1000000));
  cmd->add_option("--temperature", a->temperature, "sampling temperature (0: greedy)")
      ->check(finite_number() & CLI::Range(0.0, 1000.0));
  cmd->add_option("--top-k", a->top_k, "sample among the k most likely tokens (0: all)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--seed", a->seed, "sampling seed");
  cmd->add_option("--tokenizer", a->tokenizer,
                  "directory with tokenizer.json (default: the checkpoint's run directory)");
  cmd->callback([a] {
    const std::string checkpoint =
        file_exists(a->checkpoint + "/checkpoints/latest") ? latest_checkpoint(a->checkpoint) : a->checkpoint;
    auto m = load_model_checkpoint(checkpoint);
    std::string tok_dir = a->tokenizer;
    if (tok_dir.empty()) {
      for (const std::string& d : {checkpoint, checkpoint + "/../.."})
        if (file_exists(d + "/tokenizer.json")) {
          tok_dir = d;
          break;
        }
      if (tok_dir.empty()) fail(checkpoint + ": no tokenizer.json next to the checkpoint; give --tokenizer DIR");
    }
    const auto tok = load_tokenizer(tok_dir);
    if (tok->vocab_size() > m.config.vocab_size)
      fail("the tokenizer's vocabulary (" + std::to_string(tok->vocab_size()) + ") exceeds the model's (" +
           std::to_string(m.config.vocab_size) + ")");
    std::vector<int32_t> ids = tok->encode(a->prompt);
    if (ids.empty()) fail("--prompt encodes to no tokens");
    Transformer model(m.config);
    Rng rng(a->seed);
    const int V = m.config.vocab_size;
    for (int t = 0; t < a->max_tokens; ++t) {
      const size_t ctx = std::min<size_t>(ids.size(), size_t(m.config.max_seq_len));
      std::vector<int32_t> in(ids.end() - std::ptrdiff_t(ctx), ids.end()), dummy(ctx, 0);
      Workspace ws(m.config, model.stage(), 1, int(ctx));
      model.forward(m.params.data(), in.data(), nullptr, dummy.data(), ws);
      const float* logits = ws.logits.data() + (ctx - 1) * size_t(V);
      std::vector<int32_t> order(static_cast<size_t>(V));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return logits[x] > logits[y]; });
      int32_t next = order[0];
      if (a->temperature > 0) {
        const size_t k = a->top_k > 0 ? std::min<size_t>(size_t(a->top_k), order.size()) : order.size();
        std::vector<double> p(k);
        double sum = 0;
        for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / a->temperature);
        double u = rng.uniform() * sum;
        for (size_t i = 0; i < k; ++i) {
          next = order[i];
          if ((u -= p[i]) <= 0) break;
        }
      }
      if (next == tok->eos_id()) break;
      ids.push_back(next);
    }
    // Decoding the whole sequence keeps the word boundary between prompt and continuation
    // (SentencePiece drops a leading space when a piece starts the decoded text).
    std::printf("%s\n", tok->decode(ids).c_str());
  });
}

void add_info(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto slices = std::make_shared<int>(0);
  auto strategy = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("info", "Parameter count, FLOPs per token and memory estimate of a config");
  cmd->add_option("--config", *path, "TOML run config or Hugging Face config.json")->required();
  cmd->add_option("--slices", *slices, "partial updates: N slices (default: the config's partial.slices)");
  cmd->add_option("--strategy", *strategy, "partial updates: mlp or mlp+heads (default: the config's)");
  cmd->callback([path, slices, strategy] {
    RunConfig rc;
    const bool json = path->size() >= 5 && path->compare(path->size() - 5, 5, ".json") == 0;
    if (json)
      rc.model = read_hf_config_file(*path);
    else
      rc = load_run_config(*path);
    const auto& c = rc.model;
    const ParamLayout layout(c);
    int64_t embedding = 0;
    for (const auto& t : layout.tensors())
      if (t.kind == TensorKind::Embedding || t.kind == TensorKind::LmHead) embedding += t.numel();
    const int64_t n = layout.size();
    const int seq = std::min(rc.data.seq_len, c.max_seq_len), batch = rc.data.batch_size;
    // Matrix products touch every parameter except the embedding lookup (the tied or untied
    // head does a product); attention adds 2 x 2 x S x d per layer and token for QK^T and PV.
    const int64_t matmul_params = n - (c.tie_embeddings ? 0 : int64_t(c.vocab_size) * c.hidden_size);
    const double fwd = 2.0 * double(matmul_params) + 4.0 * c.num_layers * double(seq) * c.hidden_size;
    // Activations of one micro-batch (train.micro_batch_size; the whole batch by default).
    const int micro = rc.train.micro_batch_size > 0 ? rc.train.micro_batch_size : batch;
    const double act_bytes = 4.0 * double(Workspace::floats_for(c, {}, micro, seq));
    auto mib = [](double b) { return b / (1024.0 * 1024.0); };
    std::printf("parameters            %lld (%lld in embeddings/head, %lld in blocks)\n", (long long)n,
                (long long)embedding, (long long)(n - embedding));
    std::printf("FLOPs per token       forward %.3g, training (x3) %.3g  (sequence %d, full attention)\n", fwd,
                3 * fwd, seq);
    std::printf("memory (loco's engine: float32 state, activations kept for the backward; `loco estimate` models "
                "the papers' bf16 accelerator setup instead)\n");
    std::printf("                      parameters %.1f MiB, gradients %.1f MiB, AdamW %.1f MiB\n", mib(4.0 * n),
                mib(4.0 * n), mib(8.0 * n));
    std::printf("                      activations %.1f MiB for micro-batch %d x %d\n", mib(act_bytes), micro, seq);
    std::printf("                      total %.1f MiB per replica (DiLoCo adds outer parameters and momentum: %.1f MiB)\n",
                mib(16.0 * n + act_bytes), mib(8.0 * n));
    // Per node under partial updates: what a worker really allocates (node 0's slice).
    const int N = *slices > 0 ? *slices : rc.partial.slices;
    const std::string strat = strategy->empty() ? rc.partial.strategy : *strategy;
    const TrainableSet trainable = N > 1 ? TrainableSet(layout, 0, N, strat) : TrainableSet(layout);
    const double t = double(trainable.size());
    const auto flops = sim::step_flops(sim::arch_of(c), batch, seq, {N, strat});
    std::printf("per node (%d slice(s), %s): trainable %lld (%.1f%%); params %.1f MiB, gradients %.1f MiB, "
                "AdamW %.1f MiB, outer (DiLoCo) %.1f MiB; backward %.4g FLOPs per step (batch %d x %d)\n",
                N, strat.c_str(), (long long)trainable.size(), 100.0 * t / double(n), mib(4.0 * n), mib(4.0 * t),
                mib(8.0 * t), mib(8.0 * n), flops.backward(), batch, seq);
  });
}

}  // namespace loco::cli
