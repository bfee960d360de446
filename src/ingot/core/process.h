// Whether a process still exists, for the folders a run names after its pid (partial checkpoints,
// a replaced run set aside): a folder whose process is gone was left by a run that was killed.
#pragma once
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

namespace ingot {

// kill(pid, 0) probes without signalling: success, or EPERM (another user's process), means it exists.
inline bool process_exists(int64_t pid) {
  if (pid <= 0 || pid > INT32_MAX) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// The pid that ends a folder name "<prefix><digits>", or -1 when the name has another form.
inline int64_t pid_suffix(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 9 || name.compare(0, prefix.size(), prefix) != 0)
    return -1;
  int64_t pid = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

}  // namespace ingot
