#pragma once
// Live progress: on a terminal one line rewritten in place (step, loss, tokens/s, ETA);
// otherwise plain lines, one per call to update().
#include <cstdint>
#include <string>

namespace loco {

class Progress {
 public:
  Progress(int64_t total_steps, bool quiet);
  void update(int64_t step, double loss, double tokens_per_second, double eta_seconds, const std::string& extra);
  // A line that stays (evaluation results, checkpoints).
  void note(const std::string& line);
  void finish();

 private:
  int64_t total_;
  bool tty_, quiet_, live_ = false;
};

std::string format_duration(double seconds);

}  // namespace loco
