#pragma once
// A run directory's safety: one process trains in it at a time (an advisory lock), and a new
// run never silently reuses the files of an old one.
#include <string>

namespace loco {

// Holds RUN/lock (flock) for its lifetime. Fails, naming the holder's process id, if another
// process holds it.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Before a new run starts in `run_dir`: fails if it already holds a run (a config, metrics or
// checkpoints), unless `overwrite`, which removes loco's files from it first (and nothing
// else).
void prepare_new_run_dir(const std::string& run_dir, bool overwrite);

// Removes all but the newest `keep` checkpoints of a run (never the one `latest` names);
// keep = 0 keeps all.
void prune_checkpoints(const std::string& run_dir, int keep);

}  // namespace loco
