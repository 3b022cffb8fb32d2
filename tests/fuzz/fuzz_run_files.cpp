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

LOCO_FUZZ_TARGET({
  static const std::string dir = [] {
    const std::string d = std::filesystem::temp_directory_path().string() + "/loco-fuzz-run-" +
                          std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
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
