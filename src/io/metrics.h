#pragma once
// Metrics as JSON Lines (docs/metrics.md): one object per logged step, appended and flushed
// as training goes, so a run can be plotted while it runs.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loco {

class MetricsLog {
 public:
  // Opens `path` for appending. keep_up_to_step < 0 starts a new file; otherwise records with a
  // step above it (written after the checkpoint a run resumes from) are dropped first.
  MetricsLog(const std::string& path, int64_t keep_up_to_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

// Every record of a metrics file (fails naming the file and line on malformed JSON). Both
// readers leave out a last line cut short by a crash or a full disk (no newline, not JSON).
std::vector<nlohmann::json> read_metrics(const std::string& path);

// Every record of a metrics file, each checked to be one loco writes (docs/metrics.md): an
// object whose `step` is a whole number, `tokens` a finite number >= 0, `train_loss` a number or
// null (a non-finite loss), `val_loss` when present a number or null, `time` when present a
// finite number >= 0. Fails naming the file, the line and what is wrong.
std::vector<nlohmann::json> read_metric_records(const std::string& path);

}  // namespace loco
