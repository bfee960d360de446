// Folders a command names after its pid (partial checkpoints, a replaced run or dataset set aside,
// an export's staging): whether their process still exists (a folder whose process is gone was left
// by a command that was killed), and a fresh such name.
#pragma once
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
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

// dir/<prefix><pid>, or dir/<prefix><pid>-<k> for the first k >= 2 whose name is free: a folder a
// command names after its pid must not be one that a killed process with the same pid (pids are
// reused, and in a container often 1) left behind, which may hold what it had set aside.
inline std::filesystem::path fresh_pid_path(const std::filesystem::path& dir, const std::string& prefix) {
  const std::string base = prefix + std::to_string(::getpid());
  std::filesystem::path path = dir / base;
  for (int k = 2; std::filesystem::exists(path); ++k) path = dir / (base + "-" + std::to_string(k));
  return path;
}

}  // namespace ingot
