// One writer per output directory. `ingot train` holds an exclusive flock(2) on DIR/.ingot.lock for
// the whole run, so a second run started on the same output_dir stops at once with the holder's pid
// instead of interleaving its checkpoints and metrics with the first. The kernel drops the lock
// when the process exits however it exits, so a killed run never leaves a stale lock behind; and
// while it is held, any partial checkpoint or set-aside run in DIR was left by a process that is
// gone (no pid test needed, which a reused pid would fool). Also here: what marks a directory as a
// run's output_dir (its checkpoints, metrics.jsonl), for the commands that must not write into one.
#pragma once
#include <string>
#include <vector>

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

// The step of a folder named checkpoint-<step> (at most 18 digits, as Ingot writes them); -1 for
// any other name.
int64_t checkpoint_step(const std::string& name);

// checkpoint-<step> directories under output_dir, oldest first.
std::vector<std::string> list_checkpoints(const std::string& output_dir);

// What marks dir as a training run's output_dir or a checkpoint: its newest checkpoint-<step>
// folder's name, else metrics.jsonl or trainer_state.json; "" for none. prepare and export refuse
// such a folder (a dataset or an export inside it would change what `model:` and --resume read).
std::string training_output_marker(const std::string& dir);

}  // namespace ingot
