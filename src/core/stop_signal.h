#pragma once
// Stopping a run on SIGTERM or SIGINT (Slurm sends SIGTERM some time before it kills a job): the
// first signal asks the run to stop after the step in progress, with a checkpoint; a second one
// ends the process at once.
namespace loco {

// Installs the handlers (idempotent).
void install_stop_handlers();
// The signal that asked for a stop, or 0.
int stop_signal();
// Forgets a received signal (tests).
void clear_stop_signal();
// "SIGTERM", "SIGINT", or "signal N".
const char* signal_name(int sig);

}  // namespace loco
