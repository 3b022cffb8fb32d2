// A run directory's metrics.jsonl and summary.json, as loco report, compare and plot read them
// (they may come from another machine, be cut off by a crash, or be edited): the input up to its
// first NUL byte is metrics.jsonl, the rest, if any, summary.json; the whole report is built.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/fs.h"
#include "fuzz_common.h"
#include "io/metrics.h"
#include "report/html_report.h"

namespace {
// The run directory the inputs are written into, removed when the fuzzer exits.
struct RunDir {
  std::string path = std::filesystem::temp_directory_path().string() + "/loco-fuzz-run-" + std::to_string(::getpid());
  RunDir() { std::filesystem::create_directories(path); }
  ~RunDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
}  // namespace

LOCO_FUZZ_TARGET({
  static const RunDir run_dir;
  const std::string& dir = run_dir.path;
  const size_t cut = input.find('\0');
  loco::write_file_atomic(dir + "/metrics.jsonl", input.substr(0, cut));
  std::error_code ec;
  if (cut == std::string::npos)
    std::filesystem::remove(dir + "/summary.json", ec);
  else
    loco::write_file_atomic(dir + "/summary.json", input.substr(cut + 1));
  loco::read_metric_records(dir + "/metrics.jsonl");
  loco::report::build_html_report({dir});
})
