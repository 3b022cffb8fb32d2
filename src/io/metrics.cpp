#include "io/metrics.h"

#include <fstream>

#include "core/error.h"
#include "core/fs.h"

namespace loco {

MetricsLog::MetricsLog(const std::string& path, int64_t keep_up_to_step) : path_(path) {
  if (keep_up_to_step >= 0 && file_exists(path)) {
    std::string kept;
    for (const auto& r : read_metrics(path))
      if (r.value("step", int64_t(0)) <= keep_up_to_step) kept += r.dump() + "\n";
    write_file_atomic(path, kept);
    f_ = std::fopen(path.c_str(), "a");
  } else {
    f_ = std::fopen(path.c_str(), "w");
  }
  if (!f_) fail(path + ": cannot open for writing");
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    fail(path_ + ": write failed");
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path + ": cannot open");
  std::vector<nlohmann::json> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {
      fail(path + ":" + std::to_string(n) + ": not a JSON object");
    }
  }
  return out;
}

}  // namespace loco
