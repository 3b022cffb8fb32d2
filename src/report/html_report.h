#pragma once
// `loco report RUN_DIR... --out report.html`: one self-contained HTML page (inline SVG plots, a
// few lines of inline script, no fetches) comparing runs: loss against tokens and wall time,
// per-worker compute utilization and bytes over time, traffic by operation, config differences,
// and, where the runs have them, pipeline bubbles and replica spread (docs/metrics.md).
#include <string>
#include <vector>

namespace loco::report {

// Reads the run directories (metrics.jsonl required; summary.json and config.toml when present)
// and returns the page. Fails naming the file of a directory that is not a run or a malformed file.
std::string build_html_report(const std::vector<std::string>& run_dirs);

}  // namespace loco::report
