#pragma once
// Interrupting a wait on peers from the outside (Ctrl-C in Python): a process that embeds loco
// (the Python extension) installs a check, and the waits that can last long (an operation's
// completion, an elastic joiner's wait to be taken in) call interrupted() every few tens of
// milliseconds. A wait that finds it true aborts what it waits for (communication: the peers
// fail with the reason, this member's operations end) and throws Interrupted once nothing writes
// into its buffers. The loco program installs none: its signals ask the run to stop after the
// step (core/stop_signal.h), and a second one exits.
#include <string>

#include "core/error.h"

namespace loco {

class Interrupted : public Error {
 public:
  explicit Interrupted(const std::string& msg) : Error(msg) {}
};

// Installs the check (nullptr: none). Set once, before any wait (a plain function pointer, read
// without a lock by the waiting threads).
void set_interrupt_check(bool (*check)());
// Whether the installed check says the process was interrupted (false without one).
bool interrupted();

}  // namespace loco
