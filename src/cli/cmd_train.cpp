// loco data prepare / train / plot.
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>

#include <toml++/toml.h>

#include "run/trainer.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "core/stop_signal.h"
#include "data/prepare.h"
#include "core/fs.h"
#include "io/gnuplot.h"
#include "io/metrics.h"
#include "algo/run_config.h"
#include "report/html_report.h"
#include "report/run_data.h"
#include "report/svg_chart.h"

namespace loco::cli {

void add_data(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare training data");
  data->require_subcommand(1);
  auto o = std::make_shared<PrepareOptions>();
  auto* prep = data->add_subcommand("prepare", "Tokenize text or JSON Lines files into LOCOTOKS train/val files");
  prep->add_option("--input", o->inputs,
                   "UTF-8 text or JSON Lines files (gzip-compressed or not) or directories (searched recursively)")
      ->required();
  prep->add_option("--input-format", o->input.format,
                   "auto (names ending .jsonl or .jsonl.gz are JSON Lines, others text), text or jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  prep->add_option("--jsonl-field", o->input.jsonl_field, "JSON Lines: the string field holding each document's text");
  prep->add_option("--tokenizer", o->tokenizer, "sentencepiece or bytes")
      ->check(CLI::IsMember({"sentencepiece", "bytes"}));
  prep->add_option("--vocab-size", o->vocab_size, "vocabulary size (default 4096 for SentencePiece, 256 for bytes)");
  prep->add_option("--model-type", o->model_type, "SentencePiece model: bpe or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}));
  prep->add_option("--extensions", o->extensions,
                   "in input directories, read only files with these extensions, before an optional .gz (default: "
                   "txt,text,md,rst,jsonl; hidden files are skipped; files named directly are always read)")
      ->delimiter(',');
  prep->add_option("--val-fraction", o->val_fraction,
                   "fraction held out for validation: of 64-line blocks of text, of JSON Lines documents (when "
                   "that holds out nothing, the input's last lines)");
  prep->add_option("--seed", o->seed, "seed of the train/val split and tokenizer training");
  prep->add_option("--out", o->out_dir, "output directory")->required();
  prep->callback([o] {
    const auto s = prepare_data(*o);
    std::printf("%lld files, %lld bytes, %lld lines -> %lld train / %lld val tokens, vocabulary %d\n",
                (long long)s.files, (long long)s.bytes, (long long)s.lines, (long long)s.train_tokens,
                (long long)s.val_tokens, s.vocab_size);
    std::printf("unigram entropy of the training tokens: %.4f nats\n", s.unigram_entropy);
    std::printf("wrote %s/{train.tok,val.tok,tokenizer.json}\n", o->out_dir.c_str());
    if (!s.skipped.empty()) {
      std::string names;
      for (size_t i = 0; i < s.skipped.size() && i < 5; ++i) names += (i ? ", " : "") + s.skipped[i];
      std::printf("skipped %zu file(s) in the input directories (hidden, or not %s): %s%s\n", s.skipped.size(),
                  describe_extensions(o->extensions).c_str(), names.c_str(), s.skipped.size() > 5 ? ", ..." : "");
    }
    if (o->val_fraction > 0 && s.val_tokens == 0)
      std::fprintf(stderr, "loco: warning: --val-fraction %g held out no validation text: the input has %lld line(s)\n",
                   o->val_fraction, (long long)s.lines);
    else if (s.val_tail)
      std::printf("note: --val-fraction %g of %lld lines held out no whole block of %d lines or document, so "
                  "validation is the input's last lines\n",
                  o->val_fraction, (long long)s.lines, o->block_lines);
  });
}

void add_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  auto print_config = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("train", "Train a model (see docs/configs.md)");
  cmd->add_option("--config", o->config_path, "TOML run config");
  cmd->add_option("--resume", o->resume_dir, "run directory to continue from its latest checkpoint");
  cmd->add_option("--set", o->overrides, "override a config key: --set optimizer.lr=1e-3 (repeatable)");
  cmd->add_flag("--print-config", *print_config, "print every config key with its value and meaning, then exit");
  cmd->add_option("--until", o->until, "stop after this step with a checkpoint (continue with --resume)")
      ->check(CLI::Range(int64_t(1), std::numeric_limits<int64_t>::max()));
  cmd->add_flag("--overwrite", o->overwrite,
                "start over in a train.out_dir that holds an earlier run (removes its config, metrics and checkpoints)");
  cmd->add_option("--trace", o->trace_path, "write a Chrome trace-event timeline of all workers (Perfetto)");
  cmd->add_flag("--quiet", o->quiet, "no progress output");
  cmd->add_option("--join", o->join_url,
                  "elastic: join the run coordinated at redis://HOST:PORT/RUN (password: elastic.password_file or "
                  "$LOCO_REDIS_PASSWORD)");
  cmd->add_option("--worker", o->worker_name,
                  "elastic: this worker's name; its run directory is train.out_dir/NAME");
  cmd->callback([o, print_config] {
    if (*print_config) {
      const auto cfg = load_run_config(o->config_path, o->overrides);
      std::printf("%s", run_config_to_toml(cfg).c_str());
      return;
    }
    install_stop_handlers();
    const auto s = run_training(*o);
    if (s.already_complete) {
      std::printf("%s: the run is complete (its last checkpoint is at step %lld, the end of its schedule); "
                  "nothing to do\n",
                  s.run_dir.c_str(), (long long)s.steps);
      return;
    }
    // A run stopped by SIGTERM/SIGINT (with its checkpoint) exits as such, after its summary.
    const int stopped_exit = s.stopped_by ? 128 + s.stopped_by : 0;
    if (!s.is_reporter) {
      if (stopped_exit) std::exit(stopped_exit);
      return;
    }
    const std::string shape = s.backend == "elastic" ? std::string("one worker of an elastic run (see summary.json: elastic)")
                              : s.stages > 1 ? std::to_string(s.stages) + " stages x " + std::to_string(s.replicas) +
                                                 " replica(s)"
                                           : std::to_string(s.replicas) + " replica(s)";
    std::printf("\nsummary: %s, %s over %s: %lld steps, %lld tokens, %.1f s\n", s.algorithm.c_str(), shape.c_str(),
                s.backend.c_str(), (long long)s.steps, (long long)s.tokens, s.seconds);
    std::printf("  final train loss      %.4f nats\n", s.final_train_loss);
    if (s.final_val_loss >= 0) std::printf("  final val loss        %.4f nats\n", s.final_val_loss);
    std::printf("  unigram entropy       %.4f nats (training tokens)\n", s.unigram_entropy);
    std::printf("  checkpoint            %s\n",
                s.checkpoint.empty() ? "none here (elastic: another member wrote the model)" : s.checkpoint.c_str());
    std::printf("  metrics               %s/metrics.jsonl, %s/summary.json\n", s.run_dir.c_str(), s.run_dir.c_str());
    std::printf("  %-6s %5s %12s %12s %9s %14s %10s %10s %10s %6s\n", "worker", "stage", "sent", "received",
                "messages", "peak send/s", "compute s", "wait s", "bubble s", "CU");
    for (const auto& w : s.workers)
      std::printf("  %-6d %5d %12.4g %12.4g %9lld %14.4g %10.2f %10.2f %10.2f %5.1f%%\n", w["rank"].get<int>(),
                  w["stage"].get<int>(), w["bytes_sent"].get<double>(), w["bytes_received"].get<double>(),
                  (long long)w["messages_sent"].get<int64_t>(), w["peak_send_bytes_per_s"].get<double>(),
                  w["compute_s"].get<double>(), w["comm_wait_s"].get<double>(), w["bubble_s"].get<double>(),
                  100 * w["compute_utilization"].get<double>());
    std::printf("  %-6s %12s %12s %12s %12s %12s %14s %12s\n", "worker", "trainable", "params B", "grads B",
                "optimizer B", "outer B", "bwd FLOPs/step", "bwd s/step");
    for (const auto& w : s.workers)
      std::printf("  %-6d %12lld %12lld %12lld %12lld %12lld %14.4g %12.4f\n", w["rank"].get<int>(),
                  (long long)w["trainable_params"].get<int64_t>(), (long long)w["param_bytes"].get<int64_t>(),
                  (long long)w["grad_bytes"].get<int64_t>(), (long long)w["optimizer_bytes"].get<int64_t>(),
                  (long long)w.value("outer_state_bytes", int64_t(0)), w.value("backward_flops_per_step", 0.0),
                  w["backward_s_per_step"].get<double>());
    if (stopped_exit) {
      std::fflush(stdout);
      std::fprintf(stderr, "loco: stopped by %s after step %lld with a checkpoint; continue with: loco train --resume %s\n",
                   signal_name(s.stopped_by), (long long)s.steps, s.run_dir.c_str());
      std::exit(stopped_exit);
    }
  });
}

void add_plot(CLI::App& app) {
  struct Args {
    std::vector<std::string> runs;
    std::string out;
    std::string x = "tokens";
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("plot", "Plot train/val loss curves of one or more runs (PNG or SVG, gnuplot)");
  cmd->add_option("runs", a->runs, "run directories")->required();
  cmd->add_option("--out", a->out, "output file, .png or .svg (default: RUN/loss.png)");
  cmd->add_option("--x", a->x, "x axis: tokens, step or time")->check(CLI::IsMember({"tokens", "step", "time"}));
  cmd->callback([a] {
    const std::string out = a->out.empty() ? a->runs[0] + "/loss.png" : a->out;
    GnuplotJob job;
    std::string script = GnuplotJob::terminal(out, 900, 540) + "set xlabel '" + a->x +
                         "'\nset ylabel 'loss (nats)'\nset grid\nset key top right\nplot ";
    bool first = true;
    double x_lo = INFINITY, x_hi = -INFINITY;
    std::string plots;
    for (size_t i = 0; i < a->runs.size(); ++i) {
      const std::string path = a->runs[i] + "/metrics.jsonl";
      if (!file_exists(path)) fail(a->runs[i] + ": not a loco run directory (no metrics.jsonl)");
      const auto recs = read_metric_records(path);
      if (recs.empty()) fail(path + ": no records yet");
      // A non-finite loss or evaluation is written as null; gnuplot skips "nan" points.
      const auto text = [](double v) {
        char b[32];
        std::snprintf(b, sizeof b, "%.9g", v);
        return std::string(b);
      };
      const auto value = [&](const nlohmann::json& v) { return v.is_number() ? text(v.get<double>()) : "nan"; };
      std::string train, val;
      for (size_t k = 0; k < recs.size(); ++k) {
        const auto& r = recs[k];
        if (!r.contains(a->x)) fail(path + ": record " + std::to_string(k + 1) + " has no " + a->x + " to plot against");
        const double x = r[a->x].get<double>();
        x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
        train += text(x) + " " + value(r["train_loss"]) + "\n";
        if (r.contains("val_loss")) val += text(x) + " " + value(r["val_loss"]) + "\n";
      }
      const std::string name = std::filesystem::path(a->runs[i]).filename().string();
      const std::string tf = job.data("train" + std::to_string(i), train), vf = job.data("val" + std::to_string(i), val);
      // Each run in the colour `loco report` gives it (the runs in the same order).
      const std::string color = " lc rgb '" + report::palette(int(i)) + "'";
      plots += std::string(first ? "" : ", ") + "'" + tf + "' with lines lw 1" + color + " title '" + name + " train'";
      if (!val.empty()) plots += ", '" + vf + "' with linespoints lw 2 pt 7" + color + " title '" + name + " val'";
      first = false;
    }
    // Tick labels as the report writes numbers (350k, 1.5M), not 350000.
    if (x_hi > x_lo) {
      std::string tics;
      for (const double t : report::nice_ticks(std::min(0.0, x_lo), x_hi, 6))
        tics += std::string(tics.empty() ? "" : ", ") + "\"" + report::short_number(t) + "\" " + std::to_string(t);
      script = "set xtics (" + tics + ")\n" + script;
    }
    job.run(script + plots);
    std::printf("wrote %s\n", out.c_str());
  });
}

}  // namespace loco::cli

namespace loco::cli {

namespace {

// The algorithm of a run from its config.toml text ("?" when it cannot be read).
std::string config_algorithm(const std::string& text) {
  try {
    return toml::parse(text)["algorithm"].value_or(std::string("?"));
  } catch (const toml::parse_error&) {
    return "?";
  }
}

}  // namespace

void add_compare(CLI::App& app) {
  auto runs = std::make_shared<std::vector<std::string>>();
  auto* cmd = app.add_subcommand("compare", "Table of runs: loss, traffic, compute utilization");
  cmd->add_option("runs", *runs, "run directories (finished: summary.json; running or stopped: metrics.jsonl)")
      ->required();
  cmd->callback([runs] {
    using report::fixed;
    auto num = [](double v, const char* unit = "") {
      return v < 0 || !std::isfinite(v) ? std::string("-") : report::short_number(v) + unit;
    };
    using Row = std::array<std::string, 11>;
    std::vector<Row> rows;  // every run is read before anything is printed
    for (const auto& dir : *runs) {
      const std::string name = std::filesystem::path(dir).filename().string();
      if (!file_exists(dir + "/summary.json")) {
        // Running, or stopped before its summary: what its metrics say so far.
        if (!file_exists(dir + "/metrics.jsonl")) fail(dir + ": not a run directory (no summary.json or metrics.jsonl)");
        const auto recs = read_metric_records(dir + "/metrics.jsonl");
        if (recs.empty()) fail(dir + "/metrics.jsonl: no records yet");
        std::string val = "-";
        for (const auto& r : recs)
          if (r.contains("val_loss"))  // null: a non-finite evaluation
            val = r["val_loss"].is_number() ? fixed(r["val_loss"].get<double>(), 4) : "nan";
        const auto& last = recs.back();
        const std::string config = file_exists(dir + "/config.toml") ? read_file(dir + "/config.toml") : "";
        rows.push_back(Row{name + " (at " + std::to_string(last.value("step", int64_t(0))) + ")",
                        config_algorithm(config), "-", num(last.value("tokens", -1.0)), val,
                        num(last.value("bytes_sent", -1.0), "B"), "-", "-", "-", "-", fixed(last.value("time", 0.0), 1)});
        continue;
      }
      try {
        const nlohmann::json j = report::read_summary(dir + "/summary.json");
        const auto t = report::run_totals(j);
        const double n = double(std::max<size_t>(1, t.workers));
        const double steps = std::max(1.0, j.at("steps").get<double>());
        const double val = j.at("final_val_loss").is_number() ? j["final_val_loss"].get<double>() : NAN;
        rows.push_back(Row{name, j.at("algorithm").get<std::string>(),
                        std::to_string(json_integer(j, "replicas", dir + "/summary.json")), num(j.at("tokens").get<double>()),
                        std::isnan(val) ? "nan" : val < 0 ? "-" : fixed(val, 4), num(t.training_bytes_sent / n, "B"),
                        num(t.training_bytes_sent / n / steps, "B"), num(t.largest_sync, "B"), num(t.peak_send, "B/s"),
                        fixed(100 * t.cu_sum / n, 1) + "%", fixed(j.at("seconds").get<double>(), 1)});
      } catch (const nlohmann::json::exception& e) {
        fail(dir + "/summary.json: not a loco run summary (" + e.what() + ")");
      }
    }
    const char* f = "%-22s %-9s %3s %8s %9s %12s %12s %13s %12s %7s %8s\n";
    std::printf(f, "run", "method", "M", "tokens", "val loss", "sent/worker", "sent/w/step", "largest sync",
                "peak send", "CU", "wall s");
    for (const auto& r : rows)
      std::printf(f, r[0].c_str(), r[1].c_str(), r[2].c_str(), r[3].c_str(), r[4].c_str(), r[5].c_str(), r[6].c_str(),
                  r[7].c_str(), r[8].c_str(), r[9].c_str(), r[10].c_str());
    std::printf("(sent: payload bytes of the training method's traffic per worker (gradients, outer gradients, "
                "NoLoCo exchanges, pipeline activations); largest sync: most bytes one worker sent in one reduction "
                "(NoLoCo: one message to a partner); peak: highest send rate over network.peak_window, all traffic; "
                "CU: mean compute utilization; \"-\": not measured, e.g. no final evaluation; a run without a "
                "summary, \"(at STEP)\", is shown from its metrics so far: its reporter's bytes)\n");
  });
}

}  // namespace loco::cli
