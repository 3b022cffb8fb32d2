#pragma once
// `loco report RUN_DIR... --out report.html`: one self-contained HTML page (inline SVG plots, a
// few lines of inline script, no fetches) comparing runs: loss against tokens and wall time,
// per-worker compute utilization and bytes over time, traffic by operation, config differences,
// and, where the runs have them, pipeline bubbles and replica spread (docs/metrics.md).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loco::report {

// What `loco compare` and the report's runs table show of a run summary's workers.
struct RunTotals {
  size_t workers = 0;
  double training_bytes_sent = 0;  // training traffic, summed over workers
  double largest_sync = 0;         // most bytes one worker sent in one reduction
  double peak_send = 0;            // highest send rate of any worker (bytes/s)
  double cu_sum = 0;               // compute utilization, summed over workers
};
// Fields a summary lacks count as zero (json type errors for present fields of the wrong type).
RunTotals run_totals(const nlohmann::json& summary);

// Reads the run directories (metrics.jsonl required; summary.json and config.toml when present)
// and returns the page. Fails naming the file of a directory that is not a run or a malformed file.
std::string build_html_report(const std::vector<std::string>& run_dirs);

}  // namespace loco::report
