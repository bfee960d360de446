#include "ingot/core/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ingot/core/error.h"

namespace ingot {

namespace fs = std::filesystem;

DirectoryLock::DirectoryLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create output_dir ", dir, ": ", ec.message());
  const std::string path = (fs::path(dir) / ".ingot.lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot open ", path, ": ", std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      char text[32] = {};
      const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
      ::close(fd);
      const std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string();
      fail("output_dir ", dir, " is in use by another ingot run",
           holder.empty() ? std::string() : " (pid " + holder.substr(0, holder.find('\n')) + ")",
           ": two runs must not write one directory; wait for it to end, or choose another output_dir");
    }
    ::close(fd);
    warning_ = "cannot lock " + path + " (" + std::strerror(err) +
               "): nothing stops a second run from writing this output_dir at the same time";
    return;
  }
  // The holder's pid, for the message another run prints. The lock itself is the flock, so a
  // write that fails (a full disk) changes nothing.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, pid.data(), pid.size(), 0);
  fd_ = fd;
}

bool directory_in_use(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".ingot.lock").string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool busy = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // drops the shared lock if it was taken
  return busy;
}

int64_t checkpoint_step(const std::string& name) {
  const std::string prefix = "checkpoint-";
  if (name.rfind(prefix, 0) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  // 18 digits always fit an int64_t; Ingot never writes more, so a longer name is not one of its
  // checkpoints, like any other name (it made std::stoll throw "stoll" before).
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

std::vector<std::string> list_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (fs::is_directory(output_dir, ec))
    for (const auto& entry : fs::directory_iterator(output_dir)) {
      const int64_t step = checkpoint_step(entry.path().filename().string());
      // A link loop under a checkpoint's name is no folder (is_directory without ec threw a raw
      // filesystem error); the trainer refuses such an entry by name.
      if (step >= 0 && entry.is_directory(ec)) found.emplace_back(step, entry.path().string());
    }
  std::sort(found.begin(), found.end());
  std::vector<std::string> dirs;
  for (auto& [step, dir] : found) dirs.push_back(dir);
  return dirs;
}

std::string training_output_marker(const std::string& dir) {
  const std::vector<std::string> checkpoints = list_checkpoints(dir);
  if (!checkpoints.empty()) return fs::path(checkpoints.back()).filename().string();
  for (const char* marker : {"metrics.jsonl", "trainer_state.json"})
    if (fs::exists(fs::path(dir) / marker)) return marker;
  return "";
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace ingot
