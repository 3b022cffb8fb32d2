#include "core/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace loco {

namespace {

std::atomic<int> g_signal{0};

void write_stderr(const char* s) {
  // Only async-signal-safe calls here.
  ssize_t ignored = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

extern "C" void on_stop_signal(int sig) {
  if (g_signal.exchange(sig) != 0) {
    write_stderr("\nloco: second signal: exiting now, without a checkpoint\n");
    ::_exit(128 + sig);
  }
  write_stderr(sig == SIGINT ? "\nloco: SIGINT: stopping after this step with a checkpoint (again to exit at once)\n"
                             : "\nloco: SIGTERM: stopping after this step with a checkpoint (again to exit at once)\n");
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_signal() { return g_signal.load(); }

void clear_stop_signal() { g_signal.store(0); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

}  // namespace loco
