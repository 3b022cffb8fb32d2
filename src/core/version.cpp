#include "core/version.h"

#include <unistd.h>

namespace loco {

namespace {
std::string g_command_line;

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_") ==
                        std::string::npos)
    return s;
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}
}  // namespace

std::string loco_version() {
#ifdef LOCO_GIT_COMMIT
  const std::string commit = LOCO_GIT_COMMIT;
  if (!commit.empty()) return "0.1 (git " + commit + ")";
#endif
  return "0.1";
}

void set_command_line(int argc, char** argv) {
  g_command_line.clear();
  for (int i = 0; i < argc; ++i) g_command_line += (i ? " " : "") + shell_quote(argv[i]);
}

const std::string& command_line() { return g_command_line; }

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown host";
  return buf;
}

}  // namespace loco
