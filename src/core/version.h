#pragma once
// What produced a run: loco's version (the git commit it was built from, when built from a
// checkout), the command line, the host and its CPU.
#include <string>

namespace loco {

// e.g. "0.1 (git 63da37f1a2b3)" or "0.1 (git 63da37f1a2b3-dirty)"; "0.1" outside a checkout.
std::string loco_version();
// The process's command line, each argument quoted for a POSIX shell when it needs it.
void set_command_line(int argc, char** argv);
const std::string& command_line();
std::string host_name();

}  // namespace loco
