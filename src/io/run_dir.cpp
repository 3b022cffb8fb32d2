#include "io/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/fs.h"

namespace loco {

namespace fs = std::filesystem;

RunDirLock::RunDirLock(const std::string& run_dir) {
  make_dirs(run_dir);
  const std::string path = run_dir + "/lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path + ": cannot open: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {0};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      fail(run_dir + " is in use by another loco train" +
           (n > 0 ? " (process " + std::string(buf, size_t(n)) + ")" : std::string()) +
           "; wait for it to finish or use another directory");
    fail(path + ": cannot lock: " + std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

namespace {
// What loco writes into a run directory.
bool is_run_file(const std::string& name) {
  for (const char* f : {"config.toml", "metrics.jsonl", "summary.json", "checkpoints", "tokenizer.json",
                        "tokenizer.model", "loss.png", "invocations.jsonl"})
    if (name == f) return true;
  if (name.rfind("events.out.tfevents.", 0) == 0) return true;  // train.tensorboard
  return name.rfind("outer-state-", 0) == 0 && name.size() > 8 && name.substr(name.size() - 8) == ".scratch";
}
}  // namespace

void prepare_new_run_dir(const std::string& run_dir, bool overwrite) {
  std::error_code ec;
  if (!fs::exists(run_dir, ec)) return;
  if (!fs::is_directory(run_dir, ec)) fail("train.out_dir " + run_dir + " exists and is not a directory");
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (is_run_file(e.path().filename().string())) found.push_back(e.path());
  if (found.empty()) return;
  if (!overwrite)
    fail(run_dir + " already holds a run (" + found.front().filename().string() + "): continue it with --resume " +
         run_dir + ", replace it with --overwrite, or set train.out_dir to a new directory");
  for (const auto& p : found) {
    fs::remove_all(p, ec);
    if (ec) fail(p.string() + ": cannot remove: " + ec.message());
  }
}

void prune_checkpoints(const std::string& run_dir, int keep) {
  if (keep <= 0) return;
  const std::string root = run_dir + "/checkpoints";
  std::string latest = read_file(root + "/latest");
  while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
  std::vector<std::string> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos) steps.push_back(name);
  }
  std::sort(steps.begin(), steps.end());  // zero-padded: lexical order is step order
  for (size_t i = 0; i + size_t(keep) < steps.size(); ++i)
    if (steps[i] != latest) fs::remove_all(root + "/" + steps[i], ec);
}

}  // namespace loco
