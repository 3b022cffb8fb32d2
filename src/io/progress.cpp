#include "io/progress.h"

#include <unistd.h>

#include <cstdio>

namespace loco {

std::string format_duration(double s) {
  char buf[32];
  if (s < 0 || s > 1e7) return "?";
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  return buf;
}

Progress::Progress(int64_t total_steps, bool quiet)
    : total_(total_steps), tty_(::isatty(STDERR_FILENO) == 1), quiet_(quiet) {}

void Progress::update(int64_t step, double loss, double tps, double eta, const std::string& extra) {
  if (quiet_) return;
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | %.0f tok/s | ETA %s%s%s", (long long)step,
                (long long)total_, loss, tps, format_duration(eta).c_str(), extra.empty() ? "" : " | ",
                extra.c_str());
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", buf);
    live_ = true;
  } else {
    std::fprintf(stdout, "%s\n", buf);
  }
  std::fflush(tty_ ? stderr : stdout);
}

void Progress::note(const std::string& line) {
  if (quiet_) return;
  if (live_) std::fprintf(stderr, "\r\033[K");
  live_ = false;
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

void Progress::finish() {
  if (live_) std::fprintf(stderr, "\n");
  live_ = false;
}

}  // namespace loco
