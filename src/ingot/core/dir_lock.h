// One writer per output directory. `ingot train` holds an exclusive flock(2) on DIR/.ingot.lock for
// the whole run, so a second run started on the same output_dir stops at once with the holder's pid
// instead of interleaving its checkpoints and metrics with the first. The kernel drops the lock
// when the process exits however it exits, so a killed run never leaves a stale lock behind; and
// while it is held, any partial checkpoint or set-aside run in DIR was left by a process that is
// gone (no pid test needed, which a reused pid would fool).
#pragma once
#include <string>

namespace ingot {

class DirectoryLock {
 public:
  // Creates dir if missing. Throws, naming dir and the holder's pid, if another process holds it.
  // A filesystem without flock support (some network mounts) leaves the lock unheld: held() is
  // false and warning() says why.
  explicit DirectoryLock(const std::string& dir);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& warning() const { return warning_; }

 private:
  int fd_ = -1;
  std::string warning_;
};

// Whether a process holds dir's DirectoryLock now (without taking it, or creating the lock file),
// so that another command (export --overwrite) does not replace a directory a run is writing.
bool directory_in_use(const std::string& dir);

}  // namespace ingot
