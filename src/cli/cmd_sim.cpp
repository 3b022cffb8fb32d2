// loco simulate cu | latency, loco estimate: predictions at scale (docs/simulator.md).
// loco simulate pipeline is in cmd_sim_pipeline.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "comm/link.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/gnuplot.h"
#include "report/run_data.h"
#include "algo/run_config.h"
#include "model/layout.h"
#include "sim/cu.h"
#include "comm/stats.h"
#include "core/json.h"
#include "sim/estimate.h"
#include "sim/latency.h"

namespace loco::cli {
namespace {

std::vector<double> parse_list(const std::string& text, const std::string& what) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, text.find(':') != std::string::npos ? ':' : ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      fail(what + ": \"" + item + "\" is not a number");
    }
  }
  if (out.empty()) fail(what + ": empty list");
  return out;
}

std::string gbit(double bps) {
  if (std::isinf(bps)) return "never";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", bps / 1e9);
  return buf;
}

struct CuArgs {
  std::vector<std::string> models{"1b", "10b", "100b"}, methods, sets;
  std::string profiles = std::string(LOCO_SOURCE_DIR) + "/configs/sim-profiles.toml";
  std::string range = "0.01:10000:31", targets = "0.5,0.8,0.9,0.95,0.99";
  std::string plot, gantt, calibrate, convention = "loco";
  int gantt_steps = 12;
  double gantt_gbit = 1.0;
  double grid = 1.2;  // the paper's table 4 reads off a log grid about 1.2x apart (docs/simulator.md)
};

std::vector<sim::Profile> selected_profiles(const CuArgs& a) {
  auto all = sim::load_profiles(a.profiles);
  for (const auto& s : a.sets) {
    const auto dot = s.find('.');
    if (dot == std::string::npos) fail("--set " + s + ": expected PROFILE.KEY=VALUE");
    const std::string name = s.substr(0, dot);
    if (!all.count(name)) {  // a new, custom profile starts from the defaults
      all[name] = sim::Profile{};
      all[name].name = name;
    }
    sim::set_profile_key(all[name], s.substr(dot + 1));
  }
  std::vector<sim::Profile> out;
  for (const auto& m : a.models) {
    auto it = all.find(m);
    if (it == all.end()) {
      std::string names;
      for (const auto& [k, v] : all) names += " " + k;
      fail("--model " + m + ": no such profile in " + a.profiles + " (have:" + names + ")");
    }
    sim::validate_profile(it->second);
    out.push_back(it->second);
  }
  return out;
}

void gantt_plot(const sim::Profile& p, const std::vector<sim::Method>& methods, const CuArgs& a) {
  GnuplotJob job;
  std::string script = GnuplotJob::terminal(a.gantt, 1200, 170 * int(methods.size()) + 80) +
                       "set multiplot layout " + std::to_string(methods.size()) + ",1\nset xlabel 'time (s)'\n"
                       "set ytics ('compute' 1, 'network' 0)\nset yrange [-0.6:1.6]\nset style fill solid 0.9 noborder\nset key outside right\n";
  for (size_t i = 0; i < methods.size(); ++i) {
    const auto r = sim::simulate_cu(p, methods[i], a.gantt_gbit * 1e9, a.gantt_steps, sim::parse_convention(a.convention));
    std::string fwd, bwd, red;
    const double t0 = r.spans.empty() ? 0.0 : r.spans.front().start;
    for (const auto& s : r.spans) {
      const double x = 0.5 * (s.start + s.end) - t0, half = 0.5 * (s.end - s.start);
      std::string& dst = s.kind == 'F' ? fwd : s.kind == 'R' ? red : bwd;
      dst += std::to_string(x) + " " + (s.lane == 0 ? "1" : "0") + " " + std::to_string(half) + " 0.35\n";
    }
    char title[200];
    std::snprintf(title, sizeof title, "%s, %s, %.3g Gbit/s: CU %.1f%%", p.name.c_str(),
                  sim::method_name(methods[i]).c_str(), a.gantt_gbit, 100 * r.cu);
    script += std::string("set title '") + title + "'\nplot '" + job.data("f" + std::to_string(i), fwd + "\n") +
              "' with boxxyerror lc rgb '#4a90d9' title 'forward', '" + job.data("b" + std::to_string(i), bwd + "\n") +
              "' with boxxyerror lc rgb '#7cb342' title 'backward (B, W)', '" +
              job.data("r" + std::to_string(i), red + "\n") + "' with boxxyerror lc rgb '#e53935' title 'reduction'\n";
  }
  job.run(script + "unset multiplot\n");
  std::printf("wrote %s\n", a.gantt.c_str());
}

void calibrate(const CuArgs& a) {
  const std::string dir = a.calibrate;
  const RunConfig rc = load_run_config(dir + "/config.toml");
  const nlohmann::json summary = report::read_summary(dir + "/summary.json");  // counts and traffic in range
  const ParamLayout layout(rc.model);
  int64_t nonblock = 0;
  for (const auto& r : layout.nonblock_ranges()) nonblock += r.size();
  const std::string source = dir + "/summary.json";
  const int64_t steps = json_integer(summary, "steps", source);
  check(steps >= 1, source + ": steps must be >= 1");
  sim::Profile p;
  p.name = dir;
  p.layers = rc.model.num_layers;
  p.params = double(layout.size());
  p.nonblock_params = double(nonblock);
  p.inner_steps = rc.outer.inner_steps;
  p.fragment_layers = std::max(1, rc.streaming.fragment_blocks == 0 ? p.layers : rc.streaming.fragment_blocks);
  p.tau = rc.streaming.tau;
  p.replicas = int(std::clamp<int64_t>(json_integer(summary, "replicas", source), 0, 1 << 20));
  p.codec_block = rc.outer.block;
  p.latency_s = parse_duration(rc.network.latency, "network.latency");
  check(p.replicas >= 2, "--calibrate: the run has one replica: nothing crosses the network");
  check(summary.value("stages", 1) == 1, "--calibrate: a pipelined run; use loco simulate pipeline --calibrate");
  double compute = 0, cu = 0, bytes = 0;
  const auto& workers = summary.at("workers");
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto& w = workers[i];
    // What the calibration reads, each present (read_summary checked the values it finds).
    const std::string where = "workers[" + std::to_string(i) + "]";
    compute += report::required(w, "compute_s", source, where).get<double>();
    cu += report::required(w, "compute_utilization", source, where).get<double>();
    for (const auto& [op, v] : report::required(w, "by_operation", source, where).items())
      if (is_sync_traffic(op)) bytes += report::required(v, "bytes_sent", source, where + ".by_operation." + op).get<double>();
  }
  const double n = double(workers.size());
  p.step_time_s = compute / n / double(steps);
  sim::Method method = sim::Method::DDP;
  double syncs = double(steps);  // full-model reductions in the run (streaming: summed over fragments)
  if (rc.method() == MethodId::Diloco) {
    method = sim::Method::DiLoCo;
    syncs = std::ceil(double(steps) / double(p.inner_steps));
  } else if (rc.method() == MethodId::Streaming) {
    method = rc.streaming.tau == 0 ? sim::Method::Streaming
                                   : (rc.outer.codec == "fp32" ? sim::Method::StreamingOverlap
                                                               : sim::Method::StreamingOverlapFp4);
    check(rc.outer.codec == "fp32" || rc.outer.codec == "fp4-e3m0",
          "--calibrate: the simulator models fp32 and fp4-e3m0 outer gradients");
    syncs = double(steps) / double(p.inner_steps);
  } else if (rc.method() != MethodId::Ddp) {
    fail("--calibrate: algorithm " + rc.algorithm + " is not simulated");
  }
  check(bytes > 0, "--calibrate: the run has no gradient traffic to calibrate with");
  const double bandwidth = parse_bandwidth(rc.network.bandwidth, "network.bandwidth");
  const auto pred = sim::simulate_cu(p, method, bandwidth > 0 ? bandwidth : 1e18);
  std::printf("run %s: %s, %d replicas, %lld steps, link %s / %s\n", dir.c_str(), rc.algorithm.c_str(), p.replicas,
              (long long)steps, rc.network.bandwidth.c_str(), rc.network.latency.c_str());
  std::printf("  step compute time %.4f s, %g parameters, %d layers\n", p.step_time_s, p.params, p.layers);
  std::printf("  bytes sent per worker: measured %.4g, the simulator's formula %.4g (about %.4g syncs of the whole "
              "model)\n",
              bytes / n, syncs * sim::reduction_bytes(p, method, p.params), syncs);
  std::printf("  compute utilization: predicted %.1f%%, measured %.1f%% (gap %+.1f points)\n", 100 * pred.cu,
              100 * cu / n, 100 * (pred.cu - cu / n));
}

void add_simulate_cu(CLI::App& parent) {
  auto a = std::make_shared<CuArgs>();
  auto* cmd = parent.add_subcommand("cu", "Compute utilization vs bandwidth per method (discrete-event schedule)");
  cmd->add_option("--model", a->models, "profiles to simulate (1b 10b 100b llama405b deepseekv3 or your own)");
  cmd->add_option("--method", a->methods,
                  "methods: ddp diloco streaming streaming-overlap streaming-overlap-fp4 (default: all)");
  cmd->add_option("--profiles", a->profiles, "TOML file of model profiles")->capture_default_str();
  cmd->add_option("--set", a->sets, "PROFILE.KEY=VALUE: override a profile key, or define a custom profile");
  cmd->add_option("--bandwidth-range", a->range, "MIN:MAX:POINTS in Gbit/s, log-spaced")->capture_default_str();
  cmd->add_option("--targets", a->targets, "CU levels for the needed-bandwidth table")->capture_default_str();
  cmd->add_option("--plot", a->plot, "write CU vs bandwidth (log axis) to this .png/.svg");
  cmd->add_option("--gantt", a->gantt, "write the schedule of a few steps of the first model to this .png/.svg");
  cmd->add_option("--gantt-steps", a->gantt_steps, "steps shown by --gantt")->capture_default_str();
  cmd->add_option("--gantt-bandwidth", a->gantt_gbit, "bandwidth of --gantt in Gbit/s")
      ->capture_default_str()
      ->check(finite_number() & CLI::Range(1e-6, 1e9));
  cmd->add_option("--grid", a->grid, "ratio of the log grid whose first point reaching each CU is shown in brackets")
      ->capture_default_str()
      ->check(finite_number() & CLI::Range(1.000001, 10.0));
  cmd->add_option("--calibrate", a->calibrate, "predict the CU of a finished loco run and compare with its measurement");
  cmd->add_option("--convention", a->convention,
                  "loco (what loco sends: fp32 ring or its fp4 codec among the profile's replicas, whole-model "
                  "reductions after the step) or paper (the Streaming DiLoCo paper's: per-layer reductions, bf16, "
                  "payload / bandwidth)")
      ->capture_default_str();
  cmd->callback([a] {
    if (!a->calibrate.empty()) return calibrate(*a);
    std::vector<sim::Method> methods;
    for (const auto& m : a->methods) methods.push_back(sim::parse_method(m));
    if (methods.empty()) methods = sim::all_methods();
    const auto profiles = selected_profiles(*a);
    const auto range = parse_list(a->range, "--bandwidth-range");
    check(range.size() == 3 && range[0] > 0 && range[1] > range[0] && std::isfinite(range[1]) && range[2] >= 2 &&
              range[2] <= 10000 && range[2] == std::floor(range[2]),
          "--bandwidth-range: expected MIN:MAX:POINTS with 0 < MIN < MAX (finite) and POINTS a whole number in "
          "[2, 10000]");
    const auto targets = parse_list(a->targets, "--targets");
    for (double t : targets) check(t > 0 && t <= 1, "--targets: CU levels must be in (0, 1]");
    const sim::Convention convention = sim::parse_convention(a->convention);
    std::printf("convention: %s\n", a->convention == "paper"
                                         ? "paper (per-layer reductions, bf16 / fp4 at 4 bits, payload / bandwidth)"
                                         : "loco (what loco sends, among each profile's replicas)");
    std::vector<double> bws;
    for (int i = 0; i < int(range[2]); ++i)
      bws.push_back(range[0] * std::pow(range[1] / range[0], double(i) / (range[2] - 1)) * 1e9);

    GnuplotJob job;
    std::string plot_cmd;
    for (size_t pi = 0; pi < profiles.size(); ++pi) {
      const auto& p = profiles[pi];
      std::printf("\n%s: %d layers, %.3g parameters, step %.3g s, H %lld, %d-layer fragments, tau %lld\n",
                  p.name.c_str(), p.layers, p.params, p.step_time_s, (long long)p.inner_steps, p.fragment_layers,
                  (long long)p.tau);
      std::printf("%d replicas; bytes per value each worker sends per reduction:", p.replicas);
      for (auto m : methods)
        std::printf(" %s %.3g", sim::method_name(m).c_str(), sim::reduction_bytes(p, m, 1e8, convention) / 1e8);
      std::printf("\n%12s", "Gbit/s");
      for (auto m : methods) std::printf(" %22s", sim::method_name(m).c_str());
      std::printf("\n");
      std::vector<std::string> series(methods.size());
      for (double bw : bws) {
        std::printf("%12.4g", bw / 1e9);
        for (size_t mi = 0; mi < methods.size(); ++mi) {
          const double cu = sim::simulate_cu(p, methods[mi], bw, 0, convention).cu;
          std::printf(" %21.1f%%", 100 * cu);
          series[mi] += std::to_string(bw / 1e9) + " " + std::to_string(100 * cu) + "\n";
        }
        std::printf("\n");
      }
      for (size_t mi = 0; mi < methods.size(); ++mi)
        plot_cmd += std::string(plot_cmd.empty() ? "plot " : ", ") + "'" +
                    job.data("s" + std::to_string(pi) + "_" + std::to_string(mi), series[mi]) +
                    "' with linespoints lw 2 pt " + std::to_string(pi + 5) + " lc " + std::to_string(mi + 1) +
                    " title '" + p.name + " " + sim::method_name(methods[mi]) + "'";
    }
    std::printf("\nbandwidth (Gbit/s) needed for a compute utilization of (interpolated; in brackets the first "
                "point of the grid %g^k Gbit/s that reaches it, as the paper's table reads)\n%-12s %-22s",
                a->grid, "model", "method");
    for (double t : targets) std::printf(" %19.0f%%", 100 * t);
    std::printf("\n");
    for (const auto& p : profiles)
      for (auto m : methods) {
        std::printf("%-12s %-22s", p.name.c_str(), sim::method_name(m).c_str());
        for (double t : targets) {
          const double bw = sim::bandwidth_for_cu(p, m, t, convention);
          std::string cell = gbit(bw);
          if (std::isfinite(bw)) {
            // CU grows with bandwidth, so the first grid point at or above bw reaches t.
            double k = std::ceil(std::log(bw / 1e9) / std::log(a->grid) - 1e-9);
            double point = std::pow(a->grid, k) * 1e9;
            if (sim::simulate_cu(p, m, point, 0, convention).cu < t) point *= a->grid;  // bisection rounding
            cell += " [" + gbit(point) + "]";
          }
          std::printf(" %20s", cell.c_str());
        }
        std::printf("\n");
      }
    if (!a->plot.empty()) {
      job.run(GnuplotJob::terminal(a->plot, 1000, 600) +
              "set logscale x\nset xlabel 'bandwidth (Gbit/s)'\nset ylabel 'compute utilization (%)'\n"
              "set yrange [0:105]\nset grid\nset key bottom right font ',9'\n" + plot_cmd);
      std::printf("wrote %s\n", a->plot.c_str());
    }
    if (!a->gantt.empty()) gantt_plot(profiles.front(), methods, *a);
  });
}

void add_simulate_latency(CLI::App& parent) {
  struct Args {
    std::string workers = "4,8,16,32,64,128,256,512,1024", sigmas = "0.5,1,1.5,2";
    double mu = 0, step_mu = 1, step_sigma = 0.5;
    int64_t inner_steps = 100;
    int trials = 2000;
    uint64_t seed = 1;
    std::string plot;
    double jitter = -1;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = parent.add_subcommand("latency", "Tree all-reduce vs pair averaging, and the global-barrier cost");
  cmd->add_option("--workers", a->workers, "worker counts (powers of two)")->capture_default_str();
  cmd->add_option("--sigma", a->sigmas, "log-normal sigma of message times")->capture_default_str();
  cmd->add_option("--mu", a->mu, "log-normal mu of message times")->capture_default_str();
  cmd->add_option("--step-mu", a->step_mu, "log-normal mu of inner-step times")->capture_default_str();
  cmd->add_option("--step-sigma", a->step_sigma, "log-normal sigma of inner-step times")->capture_default_str();
  cmd->add_option("--inner-steps", a->inner_steps, "H between barriers")->capture_default_str()->check(
      CLI::Range(int64_t(1), int64_t(1000000)));
  cmd->add_option("--trials", a->trials, "Monte Carlo trials")->capture_default_str()->check(CLI::Range(2, 100000000));
  cmd->add_option("--seed", a->seed, "Monte Carlo seed")->capture_default_str();
  cmd->add_option("--plot", a->plot, "write the tree / pair time ratio vs workers to this .png/.svg");
  cmd->add_option("--compute-jitter", a->jitter,
                  "barrier cost for inner-step times min(20, exp(sigma |Z|)) as network.compute_jitter = sigma emulates "
                  "(replaces --step-mu/--step-sigma)")
      ->check(finite_number() & CLI::Range(0.0, 2.0));
  cmd->callback([a] {
    const bool folded = a->jitter >= 0;
    if (folded) {
      a->step_mu = 0;
      a->step_sigma = a->jitter;
    }
    const auto workers = parse_list(a->workers, "--workers");
    const auto sigmas = parse_list(a->sigmas, "--sigma");
    // Bounds that keep the Monte Carlo finite (and the closed forms' exponentials finite): the
    // default run draws about 1.2e7 values (1024 workers) in a second.
    double most = 0;
    for (double wf : workers) {
      if (!(wf == std::floor(wf) && wf >= 2 && wf <= 65536)) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", wf);
        fail(std::string("--workers: ") + text + " is not a whole number in [2, 65536]");
      }
      // The tree's closed form needs a power of two: refused here, before any output.
      const int n = int(wf);
      check((n & (n - 1)) == 0, "--workers: " + std::to_string(n) + " is not a power of two");
      most = std::max(most, wf);
    }
    for (double s : sigmas) check(std::isfinite(s) && s > 0 && s <= 10, "--sigma: each must be in (0, 10]");
    check(std::isfinite(a->mu) && std::abs(a->mu) <= 100, "--mu must be in [-100, 100]");
    check(std::isfinite(a->step_mu) && std::abs(a->step_mu) <= 100, "--step-mu must be in [-100, 100]");
    check(std::isfinite(a->step_sigma) && a->step_sigma >= 0 && a->step_sigma <= 10, "--step-sigma must be in [0, 10]");
    const double draws = most * (double(a->inner_steps) * std::max(20, a->trials / 20) + 2.0 * a->trials);
    check(draws <= 5e8, "the Monte Carlo would draw " + std::to_string(int64_t(draws)) +
                            " values (workers x (inner steps x trials / 20 + 2 trials)), above 5e8: lower --trials, "
                            "--workers or --inner-steps");
    std::printf("message times ~ LogNormal(mu = %g, sigma^2); times in units of e^mu\n", a->mu);
    std::printf("%8s %6s %8s %12s %12s %12s %12s %12s %7s %10s\n", "workers", "sigma", "std/t_c", "tree closed",
                "tree MC", "pair closed", "pair MC", "full tree MC", "ratio", "full ratio");
    GnuplotJob job;
    std::string plot_cmd;
    for (size_t si = 0; si < sigmas.size(); ++si) {
      const double s = sigmas[si];
      std::string series;
      for (double wf : workers) {
        const int n = int(wf);  // a whole number in [2, 65536] (checked above)
        const double tc = sim::tree_allreduce_closed(n, a->mu, s), pc = sim::pair_average_closed(a->mu, s);
        const auto tm = sim::tree_allreduce_mc(n, a->mu, s, a->trials, a->seed);
        const auto pm = sim::pair_average_mc(a->mu, s, a->trials, a->seed + 1);
        const auto full = sim::tree_allreduce_full_mc(n, a->mu, s, std::max(2, a->trials / 10), a->seed + 2);
        std::printf("%8d %6.2f %8.3f %12.4g %12.4g %12.4g %12.4g %12.4g %7.2f %10.2f\n", n, s,
                    std::sqrt(std::exp(s * s) - 1), tc, tm.mean, pc, pm.mean, full.mean, tc / pc, full.mean / pc);
        series += std::to_string(n) + " " + std::to_string(tc / pc) + " " + std::to_string(full.mean / pc) + "\n";
      }
      const std::string f = job.data("lat" + std::to_string(si), series);
      plot_cmd += std::string(plot_cmd.empty() ? "plot " : ", ") + "'" + f + "' using 1:2 with linespoints lc " +
                  std::to_string(si + 1) + " title 'hop model, sigma " + std::to_string(s).substr(0, 4) + "', '" + f +
                  "' using 1:3 with linespoints dt 2 lc " + std::to_string(si + 1) + " title 'full tree, sigma " +
                  std::to_string(s).substr(0, 4) + "'";
    }
    if (folded)
      std::printf("\nglobal barrier: %lld inner steps, each min(20, exp(%g |Z|)) times the compute (network.compute_jitter); "
                  "cost = E[slowest] / E[mean] - 1\n",
                  (long long)a->inner_steps, a->step_sigma);
    else
      std::printf("\nglobal barrier: %lld inner steps ~ LogNormal(%g, %g^2); cost = E[slowest] / E[mean] - 1\n",
                  (long long)a->inner_steps, a->step_mu, a->step_sigma);
    std::printf("%8s %16s %16s %16s %16s\n", "workers", "barrier closed", "barrier MC", "pair closed", "pair MC");
    for (double wf : workers) {
      const int n = int(wf);
      // Fewer trials for the global barrier (n x H draws each): its spread is small.
      const auto bm = sim::barrier_cost_mc(n, a->inner_steps, a->step_mu, a->step_sigma, std::max(20, a->trials / 20),
                                           a->seed + 3, folded);
      const auto pm = sim::barrier_cost_mc(2, a->inner_steps, a->step_mu, a->step_sigma, a->trials, a->seed + 4, folded);
      std::printf("%8d %15.2f%% %15.2f%% %15.2f%% %15.2f%%\n", n,
                  100 * sim::barrier_cost_closed(n, a->inner_steps, a->step_mu, a->step_sigma, folded), 100 * bm.mean,
                  100 * sim::barrier_cost_closed(2, a->inner_steps, a->step_mu, a->step_sigma, folded), 100 * pm.mean);
    }
    if (!a->plot.empty()) {
      job.run(GnuplotJob::terminal(a->plot, 900, 540) +
              "set logscale x 2\nset xlabel 'workers'\nset ylabel 'all-reduce time / pair-averaging time'\n"
              "set logscale y\nset grid\nset key top left font ',9'\n" + plot_cmd);
      std::printf("wrote %s\n", a->plot.c_str());
    }
  });
}

void print_estimate(const sim::Arch& arch, double batch, double seq, const sim::Slicing& s, int fragment_layers,
                    const std::string& label) {
  const auto p = sim::param_counts(arch, s);
  const auto f = sim::step_flops(arch, batch, seq, s);
  const auto full = sim::step_flops(arch, batch, seq);
  std::printf("%s\n", label.c_str());
  std::printf("  parameters            %.6g (blocks %.6g, non-block %.6g)\n", p.total, p.total - p.nonblock,
              p.nonblock);
  std::printf("  trainable per node    %.6g (%.1f%%) with %d slice(s), strategy %s\n", p.trainable,
              100 * p.trainable / p.total, s.slices, s.strategy.c_str());
  std::printf("  FLOPs per step        forward %.4g, backward %.4g (input %.4g, params %.4g), total %.4g (%.1f%% of"
              " full backward)\n",
              f.forward, f.backward(), f.backward_input, f.backward_params, f.total(),
              100 * f.backward() / full.backward());
  std::printf("  memory per node (MiB) for the papers' accelerator setup, not loco's engine (`loco info`): bf16 weights\n"
              "  and gradients, fp32 master weights and AdamW moments of trainable parameters, fp32 outer state,\n"
              "  checkpointed activations\n");
  std::printf("                        %-10s %9s %9s %9s %9s %9s %11s %9s\n", "method", "weights", "grads", "master",
              "adam", "outer", "activations", "total");
  for (const auto& [method, label] : sim::memory_methods()) {
    const auto m = sim::memory_per_node(arch, method, batch, seq, fragment_layers, s);
    const double MiB = 1024.0 * 1024.0;
    std::printf("                        %-10s %9.1f %9.1f %9.1f %9.1f %9.1f %11.1f %9.1f\n", label.c_str(),
                m.weights / MiB, m.grads / MiB, m.master / MiB, m.adam / MiB, m.outer / MiB, m.activations / MiB,
                m.total() / MiB);
  }
}

void add_estimate_cmd(CLI::App& app) {
  struct Args {
    std::string config;
    int slices = 1;
    std::string strategy = "mlp";
    double batch = 0, seq = 0;
    int fragment_layers = 3;
    bool paper_table = false;
    int nodes = 0;
    std::string bandwidth;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("estimate", "FLOPs per step, trainable parameters and memory per node");
  cmd->add_option("--config", a->config, "TOML run config or Hugging Face config.json");
  cmd->add_option("--slices", a->slices, "partial updates: N slices")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--strategy", a->strategy, "partial updates: mlp or mlp+heads")
      ->capture_default_str()
      ->check(CLI::IsMember({"mlp", "mlp+heads"}));
  cmd->add_option("--batch", a->batch, "sequences per node per step (default: the config's)")
      ->check(finite_number() & CLI::Range(1.0, 1e9));
  cmd->add_option("--seq", a->seq, "tokens per sequence (default: the config's)")
      ->check(finite_number() & CLI::Range(1.0, 1e9));
  cmd->add_option("--fragment-layers", a->fragment_layers, "layers per streaming fragment")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_flag("--paper-table", a->paper_table, "table for the 1.3B GPT-3 XL configuration of the partial-updates paper");
  cmd->add_option("--nodes", a->nodes, "with --bandwidth: ring all-reduce time of the bf16 gradients over this many nodes")
      ->check(CLI::Range(2, 1000000000));
  cmd->add_option("--bandwidth", a->bandwidth, "link bandwidth for --nodes, e.g. 23Gbit");
  cmd->callback([a] {
    check((a->nodes > 0) == !a->bandwidth.empty(), "--nodes and --bandwidth go together");
    const double bw = a->bandwidth.empty() ? 0 : parse_bandwidth(a->bandwidth, "--bandwidth");  // checked first
    if (a->paper_table) {
      const sim::Arch arch = sim::gpt3_xl();
      const double B = a->batch > 0 ? a->batch : 16, S = a->seq > 0 ? a->seq : 2048;
      const double base_mem = sim::memory_per_node(arch, sim::MemoryMethod::Streaming, B, S, a->fragment_layers).total();
      const double base_bwd = sim::step_flops(arch, B, S).backward(), base_all = sim::step_flops(arch, B, S).total();
      std::printf("GPT-3 XL (d 2048, L 24, D_ff 8192, tied, vocab 32000), batch %g x %g tokens per node, "
                  "%d-layer fragments\n",
                  B, S, a->fragment_layers);
      std::printf("%-22s %14s %10s %12s %12s %12s %12s\n", "method", "trainable", "share", "memory GB",
                  "vs DiLoCo", "bwd FLOPs", "step FLOPs");
      const std::vector<std::pair<std::string, sim::Slicing>> rows = {
          {"Streaming DiLoCo", {1, "mlp"}},      {"1/2 MLPs", {2, "mlp"}},   {"1/4 MLPs", {4, "mlp"}},
          {"1/8 MLPs", {8, "mlp"}},              {"1/16 MLPs", {16, "mlp"}}, {"1/2 MLPs + heads", {2, "mlp+heads"}},
          {"1/4 MLPs + heads", {4, "mlp+heads"}}};
      for (const auto& [name, s] : rows) {
        const auto p = sim::param_counts(arch, s);
        const auto f = sim::step_flops(arch, B, S, s);
        const double mem = sim::memory_per_node(arch, sim::MemoryMethod::Partial, B, S, a->fragment_layers, s).total();
        std::printf("%-22s %14.4g %9.1f%% %12.2f %+11.1f%% %+11.1f%% %+11.1f%%\n", name.c_str(), p.trainable,
                    100 * p.trainable / p.total, mem / 1e9, 100 * (mem / base_mem - 1),
                    100 * (f.backward() / base_bwd - 1), 100 * (f.total() / base_all - 1));
      }
      std::printf("(memory: bf16 weights and gradients, fp32 master and AdamW moments of trainable parameters, "
                  "fp32 outer state of one fragment, checkpointed activations)\n");
      return;
    }
    if (a->config.empty()) fail("estimate: give --config FILE or --paper-table");
    RunConfig rc;
    const bool json = a->config.size() >= 5 && a->config.compare(a->config.size() - 5, 5, ".json") == 0;
    if (json)
      rc.model = read_model_config(a->config);
    else
      rc = load_run_config(a->config);
    const sim::Arch arch = sim::arch_of(rc.model);
    const double B = a->batch > 0 ? a->batch : rc.data.batch_size;
    const double S = a->seq > 0 ? a->seq : std::min(rc.data.seq_len, rc.model.max_seq_len);
    print_estimate(arch, B, S, {a->slices, a->strategy}, a->fragment_layers,
                   a->config + ": batch " + std::to_string(int64_t(B)) + " x " + std::to_string(int64_t(S)) +
                       " tokens per node");
    if (a->nodes > 0) {
      const double bytes = 2 * sim::param_counts(arch).total;
      std::printf("  ring all-reduce of %.4g bytes (bf16) over %d nodes at %s: %.4g s per sync\n", bytes, a->nodes,
                  a->bandwidth.c_str(), sim::ring_allreduce_seconds(bytes, a->nodes, bw));
    }
  });
}

}  // namespace

void add_simulate(CLI::App& app) {
  auto* cmd = app.add_subcommand("simulate", "Predictions at scale: compute utilization, latency");
  cmd->require_subcommand(1);
  add_simulate_cu(*cmd);
  add_simulate_latency(*cmd);
  add_simulate_pipeline(*cmd);
}

void add_estimate(CLI::App& app) { add_estimate_cmd(app); }

}  // namespace loco::cli
