// loco report: an HTML page comparing runs.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/fs.h"
#include "report/html_report.h"

namespace loco::cli {

void add_report(CLI::App& app) {
  struct Args {
    std::vector<std::string> runs;
    std::string out = "report.html";
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "report", "One self-contained HTML page of runs: loss curves, per-worker CU and bytes, traffic, configs");
  cmd->add_option("runs", a->runs, "run directories (metrics.jsonl; summary.json and config.toml when present)")
      ->required();
  cmd->add_option("--out", a->out, "output HTML file");
  cmd->callback([a] {
    write_file_atomic(a->out, report::build_html_report(a->runs));
    std::printf("wrote %s (%zu run%s)\n", a->out.c_str(), a->runs.size(), a->runs.size() == 1 ? "" : "s");
  });
}

}  // namespace loco::cli
