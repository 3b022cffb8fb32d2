// Times a full training step (forward, backward, AdamW) of loco on random tokens, with fp32 or
// bf16 products, and measures the machine's matmul peaks in the same run (OpenBLAS SGEMM, oneDNN
// fp32 and, where the CPU has bf16 instructions, oneDNN bf16), printing achieved GFLOP/s
// (6 x params x tokens, plus attention's 12 x L x B x S^2 x d). Used by bench/run.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <dnnl.hpp>

#include "core/blas.h"
#include "core/parallel.h"
#include "core/precision.h"
#include "core/rng.h"
#include "model/transformer.h"
#include "optim/adamw.h"

using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best of OpenBLAS's own threading and loco's row split, on a large square SGEMM.
static double sgemm_peak_gflops(int threads) {
  const int n = 2048;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  double best = 1e30;
  for (bool native : {true, false}) {
    loco::set_blas_threads(native ? threads : 1);
    for (int r = 0; r < 4; ++r) {
      const auto t0 = Clock::now();
      if (native)
        loco::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      else
        loco::gemm_mt(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      if (r > 0) best = std::min(best, seconds_since(t0));
    }
  }
  loco::set_blas_threads(1);
  return 2.0 * n * n * double(n) / best / 1e9;
}

extern "C" void omp_set_num_threads(int);

// oneDNN's own matmul (its OpenMP threads) on a large square product of data type `dt`.
static double onednn_peak_gflops(dnnl::memory::data_type dt, int threads) {
  const int n = 2048;
  omp_set_num_threads(threads);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc a({n, n}, dt, tag::ab), b({n, n}, dt, tag::ab), c({n, n}, dnnl::memory::data_type::f32, tag::ab);
  const dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), eng));
  dnnl::memory am(a, eng), bm(b, eng), cm(c, eng);
  double best = 1e30;
  // The first products of a process run slower (measured 277 against 380 GFLOP/s in bf16): warm up.
  for (int r = 0; r < 10; ++r) {
    const auto t0 = Clock::now();
    prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
    if (r >= 3) best = std::min(best, seconds_since(t0));
  }
  omp_set_num_threads(1);
  return 2.0 * n * n * double(n) / best / 1e9;
}

int main(int argc, char** argv) {
  if (argc != 10 && argc != 11) {
    std::fprintf(stderr, "usage: %s D LAYERS HEADS FFN VOCAB SEQ BATCH THREADS ITERS [fp32|fp32-onednn|bf16]\n",
                 argv[0]);
    return 2;
  }
  // fp32: OpenBLAS; fp32-onednn: fp32 products through oneDNN; bf16: bf16 products (oneDNN).
  const std::string mode = argc == 11 ? argv[10] : "fp32";
  const std::string precision = mode == "bf16" ? "bf16" : "fp32";
  loco::set_fp32_library(mode == "fp32-onednn" ? loco::Fp32Library::onednn : loco::Fp32Library::openblas);
  std::string note;
  loco::set_matmul_precision(loco::resolve_precision(precision, loco::fp32_library(), &note));
  if (precision == "bf16" && loco::matmul_precision() != loco::Precision::bf16) {
    std::fprintf(stderr, "%s\n", note.c_str());
    return 3;
  }
  loco::ModelConfig c;
  c.hidden_size = std::stoi(argv[1]);
  c.num_layers = std::stoi(argv[2]);
  c.num_heads = std::stoi(argv[3]);
  c.intermediate_size = std::stoi(argv[4]);
  c.vocab_size = std::stoi(argv[5]);
  const int seq = std::stoi(argv[6]), batch = std::stoi(argv[7]), threads = std::stoi(argv[8]),
            iters = std::stoi(argv[9]);
  c.max_seq_len = seq;
  loco::set_compute_threads(threads);
  loco::Transformer model(c);
  std::vector<float> params(size_t(model.layout().size())), grads(params.size());
  model.init_params(params.data(), 1);
  loco::AdamW opt({}, model.layout());
  loco::Workspace ws(c, model.stage(), batch, seq);
  loco::Rng rng(7);
  std::vector<int32_t> tokens(size_t(batch) * seq), targets(tokens.size());
  for (auto& t : tokens) t = int32_t(rng.next_u64() % uint64_t(c.vocab_size));
  for (auto& t : targets) t = int32_t(rng.next_u64() % uint64_t(c.vocab_size));
  auto step = [&] {
    std::fill(grads.begin(), grads.end(), 0.0f);
    model.forward(params.data(), tokens.data(), nullptr, targets.data(), ws, 1.0);  // as training: fused head
    model.backward(params.data(), grads.data(), tokens.data(), targets.data(), 1.0, nullptr, nullptr, ws);
    loco::clip_grad_norm(grads.data(), int64_t(grads.size()), 1.0);
    opt.step(params.data(), grads.data(), 1e-4);
  };
  step();  // warm up
  double best = 1e30, total = 0;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    step();
    const double s = seconds_since(t0);
    best = std::min(best, s);
    total += s;
  }
  const double n_params = double(params.size());
  const double tokens_per_step = double(batch) * seq;
  const double flops = 6.0 * n_params * tokens_per_step + 12.0 * c.num_layers * batch * double(seq) * seq * c.hidden_size;
  loco::set_matmul_precision(loco::Precision::fp32);
  const double peak = sgemm_peak_gflops(threads);
  std::printf("loco_step_seconds %.6f\n", best);
  std::printf("loco_step_mean_seconds %.6f\n", total / iters);
  std::printf("params %.0f\n", n_params);
  std::printf("gflops_6nt %.2f\n", 6.0 * n_params * tokens_per_step / best / 1e9);
  std::printf("gflops_with_attention %.2f\n", flops / best / 1e9);
  std::printf("sgemm_peak_gflops %.2f\n", peak);
  std::printf("onednn_fp32_peak_gflops %.2f\n", onednn_peak_gflops(dnnl::memory::data_type::f32, threads));
  if (loco::cpu_runs_bf16())
    std::printf("onednn_bf16_peak_gflops %.2f\n", onednn_peak_gflops(dnnl::memory::data_type::bf16, threads));
  std::printf("cpu %s\n", loco::describe_cpu().c_str());
  return 0;
}
