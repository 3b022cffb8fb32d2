// loco simulate pipeline: the step time, bubble and compute utilization of a pipelined run for
// a link (sim/pipeline.h), from a run config and FLOPs at a given speed, or from the measured
// stage times of a finished run (--calibrate), next to what that run measured.
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "comm/link.h"
#include "core/error.h"
#include "report/run_data.h"
#include "core/json.h"
#include "core/fs.h"
#include "algo/run_config.h"
#include "pipeline/grid.h"
#include "sim/estimate.h"
#include "sim/pipeline.h"

namespace loco::cli {

namespace {

struct LinkSpec {
  std::string text;
  double bandwidth_bps = 0, latency_s = 0;
};

// "100Mbit/30ms", "1Gbit" or "inf".
LinkSpec parse_link(const std::string& text) {
  const auto slash = text.find('/');
  LinkSpec l{text};
  l.bandwidth_bps = parse_bandwidth(text.substr(0, slash), "--link " + text);
  if (slash != std::string::npos) l.latency_s = parse_duration(text.substr(slash + 1), "--link " + text);
  return l;
}

// Everything but the stage times, from a run config.
sim::PipelineProfile profile_of(const RunConfig& c) {
  sim::PipelineProfile p;
  p.stages = c.pipeline.stages;
  p.microbatches = c.microbatches();
  p.schedule = parse_schedule(c.pipeline.schedule);
  const double windows = c.micro_windows(), T = c.data.seq_len;
  // Protocol models send k numbers per token (protocol.rank with protocol.compress).
  const double width = c.protocol.rank > 0 && c.protocol.compress ? c.protocol.rank : c.model.hidden_size;
  p.activation_bytes = windows * T * width * 4;
  p.token_bytes = windows * (T + 1) * 4;
  p.tied_bytes = c.model.tie_embeddings ? double(c.model.vocab_size) * c.model.hidden_size * 4 : 0.0;
  // Partial sums of the norm: (tensor index, sum) in doubles for each tensor of a stage.
  const auto stages = partition_stages(c.model, c.pipeline.stages, c.pipeline.split);
  p.norm_bytes = 16.0 * double(ParamLayout(c.model, stages[0]).tensors().size());
  return p;
}

// Forward and backward seconds per microbatch of each stage from FLOPs at `gflops`.
void stage_times_from_flops(const RunConfig& c, double gflops, sim::PipelineProfile& p) {
  const auto stages = partition_stages(c.model, c.pipeline.stages, c.pipeline.split);
  const double b = c.micro_windows(), T = c.data.seq_len;
  auto flops = [&](int layers) {
    auto a = sim::arch_of(c.model);
    a.layers = layers;
    return sim::step_flops(a, b, T);
  };
  const auto ends = flops(0);  // embedding and head
  for (const auto& st : stages) {
    const int n = st.last_block - st.first_block;
    const auto with = flops(n);
    double fwd = with.forward - ends.forward, bwd = with.backward() - ends.backward();
    if (st.head) {
      fwd += ends.forward;
      bwd += ends.backward();
    }
    p.forward_s.push_back(fwd / (gflops * 1e9));
    p.backward_s.push_back(bwd / (gflops * 1e9));
  }
}

void print_stages(const RunConfig& c, const sim::PipelineProfile& p) {
  const auto stages = partition_stages(c.model, c.pipeline.stages, c.pipeline.split);
  std::printf("%s, %d stages, %d microbatches of %d windows x %d tokens; per microbatch and boundary %.4g bytes "
              "of activations (each direction) + %.4g of token ids\n",
              c.pipeline.schedule.c_str(), p.stages, p.microbatches, c.micro_windows(), c.data.seq_len,
              p.activation_bytes, p.token_bytes);
  std::printf("  %-6s %-8s %14s %14s %14s\n", "stage", "blocks", "forward ms/mb", "backward ms/mb", "other ms/step");
  for (int s = 0; s < p.stages; ++s)
    std::printf("  %-6d %-8s %14.3f %14.3f %14.3f\n", s,
                (std::to_string(stages[size_t(s)].first_block) + "-" + std::to_string(stages[size_t(s)].last_block - 1))
                    .c_str(),
                1e3 * p.forward_s[size_t(s)], 1e3 * p.backward_s[size_t(s)],
                1e3 * (p.optimizer_s.empty() ? 0.0 : p.optimizer_s[size_t(s)]));
}

std::string percents(const std::vector<double>& v) {
  std::string out;
  char buf[16];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, "%s%.0f", out.empty() ? "" : " ", 100 * x);
    out += buf;
  }
  return out;
}

void calibrate(const std::string& dir) {
  const RunConfig c = load_run_config(dir + "/config.toml");
  const std::string source = dir + "/summary.json";
  const nlohmann::json summary = report::read_summary(source);  // counts and times in range
  auto p = profile_of(c);
  const LinkSpec link{c.network.bandwidth + "/" + c.network.latency,
                      parse_bandwidth(c.network.bandwidth, "network.bandwidth"),
                      parse_duration(c.network.latency, "network.latency")};
  p.bandwidth_bps = link.bandwidth_bps;
  p.latency_s = link.latency_s;
  const auto& workers = summary.at("workers");
  const int R = int(json_integer(summary, "replicas", source));  // in [1, 1e6] (read_summary)
  // Measured: each stage's pass times (mean over its replicas), step time and bubble share.
  std::vector<double> fwd(size_t(p.stages), 0), bwd(size_t(p.stages), 0), opt(size_t(p.stages), 0),
      bubble(size_t(p.stages), 0), cu(size_t(p.stages), 0);
  double step_s = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto& w = workers[i];
    const std::string where = "workers[" + std::to_string(i) + "]";
    const auto at = [&](const char* key) { return report::required(w, key, source, where).get<double>(); };
    const int64_t stage = json_integer(w, "stage", source);
    if (stage < 0 || stage >= p.stages) fail(source + ": a worker's stage is out of range");
    const size_t s = size_t(stage);
    const double steps = std::max(1.0, at("steps_run"));
    fwd[s] += at("forward_s_per_step") / p.microbatches / R;
    bwd[s] += at("backward_s_per_step") / p.microbatches / R;
    opt[s] += at("optimizer_s_per_step") / R;
    const double busy = at("wall_s") - at("eval_s") - at("checkpoint_s");
    bubble[s] += at("bubble_share") / R;
    cu[s] += at("compute_utilization") / R;
    step_s += busy / steps / double(workers.size());
  }
  p.forward_s = fwd;
  p.backward_s = bwd;
  p.optimizer_s = opt;
  const auto pred = sim::simulate_pipeline(p, 6);
  std::printf("run %s: %s, %d stage(s) x %d replica(s), link %s\n", dir.c_str(), c.algorithm.c_str(), p.stages, R,
              link.text.c_str());
  print_stages(c, p);
  const double tokens = double(c.data.batch_size) * c.data.seq_len * R;
  std::printf("  %-10s %10s %12s %20s %20s\n", "", "step s", "tokens/s", "CU % by stage", "bubble % by stage");
  std::printf("  %-10s %10.4f %12.0f %20s %20s\n", "predicted", pred.step_s, tokens / pred.step_s,
              percents(pred.compute_utilization).c_str(), percents(pred.bubble_share).c_str());
  std::printf("  %-10s %10.4f %12.0f %20s %20s\n", "measured", step_s, tokens / step_s, percents(cu).c_str(),
              percents(bubble).c_str());
  std::printf("  step time gap %+.1f%% (predicted vs measured)\n", 100 * (pred.step_s / step_s - 1));
  // What the link costs: the same stage times on an unlimited link, and on this link without
  // the tied-embedding exchange (what the activations alone cost).
  auto free = p;
  free.bandwidth_bps = 0;
  free.latency_s = 0;
  std::printf("  predicted on an unlimited link: %.4f s per step\n", sim::simulate_pipeline(free, 6).step_s);
  if (p.tied_bytes > 0) {
    auto untied = p;
    untied.tied_bytes = 0;
    std::printf("  predicted without the tied-embedding exchange: %.4f s per step\n",
                sim::simulate_pipeline(untied, 6).step_s);
  }
  if (R > 1 && c.method() == MethodId::Ddp)
    std::printf("  note: the model leaves out the data-parallel reductions among the %d replicas of each stage\n", R);
}

}  // namespace

void add_simulate_pipeline(CLI::App& simulate) {
  struct Args {
    std::string config, calibrate;
    std::vector<std::string> sets, links;
    double gflops = 50;
    int steps = 6;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = simulate.add_subcommand("pipeline", "Step time, bubble and CU of a pipelined run over a link");
  cmd->add_option("--config", a->config, "run config (its model, batch, pipeline.* and network.* keys)");
  cmd->add_option("--set", a->sets, "override a config key (repeatable)");
  cmd->add_option("--link", a->links,
                  "BANDWIDTH/LATENCY to predict, e.g. 100Mbit/30ms (repeatable; default: the config's network)");
  cmd->add_option("--gflops", a->gflops, "speed of one stage worker for the FLOP-based stage times")
      ->capture_default_str();
  cmd->add_option("--steps", a->steps, "steps simulated (the first is warm-up)")->capture_default_str();
  cmd->add_option("--calibrate", a->calibrate, "predict a finished run from its measured stage times and compare");
  cmd->callback([a] {
    if (!a->calibrate.empty()) return calibrate(a->calibrate);
    if (a->config.empty()) fail("loco simulate pipeline: give --config FILE or --calibrate RUN_DIR");
    check(std::isfinite(a->gflops) && a->gflops > 0, "--gflops must be a finite number > 0");
    check(a->steps >= 2 && a->steps <= 100000, "--steps must be in [2, 100000]");
    const RunConfig c = load_run_config(a->config, a->sets);
    auto p = profile_of(c);
    stage_times_from_flops(c, a->gflops, p);
    std::vector<LinkSpec> links;  // parsed before any output: a bad --link prints nothing but its error
    for (const auto& l : a->links) links.push_back(parse_link(l));
    if (links.empty()) links.push_back(parse_link(c.network.bandwidth + "/" + c.network.latency));
    print_stages(c, p);
    const double tokens = double(c.data.batch_size) * c.data.seq_len;
    std::printf("  %-16s %10s %12s %20s %20s %16s\n", "link", "step s", "tokens/s", "CU % by stage",
                "bubble % by stage", "boundary B/step");
    for (const auto& l : links) {
      p.bandwidth_bps = l.bandwidth_bps;
      p.latency_s = l.latency_s;
      const auto r = sim::simulate_pipeline(p, a->steps);
      std::printf("  %-16s %10.4f %12.0f %20s %20s %16.4g\n", l.text.c_str(), r.step_s, tokens / r.step_s,
                  percents(r.compute_utilization).c_str(), percents(r.bubble_share).c_str(),
                  p.microbatches * (2 * p.activation_bytes + p.token_bytes));
    }
  });
}

}  // namespace loco::cli
