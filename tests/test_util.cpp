#include "test_util.h"

#include "ingot/core/env.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <limits>
#include <cstdlib>
#include <vector>
#include <gtest/gtest.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

namespace ingot::test {

template <typename T>
static double relative_error_impl(const T* a, const T* b, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<double>::infinity();
    diff += (x - y) * (x - y);
    ref += y * y;
  }
  if (ref == 0) return std::sqrt(diff);
  return std::sqrt(diff / ref);
}

double relative_error(const double* a, const double* b, int64_t n) { return relative_error_impl(a, b, n); }
double relative_error(const float* a, const float* b, int64_t n) { return relative_error_impl(a, b, n); }
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  return relative_error_impl(a.data(), b.data(), static_cast<int64_t>(a.size()));
}

std::string source_dir() { return INGOT_SOURCE_DIR; }
std::string shared_dir() {
  const char* dir = std::getenv("INGOT_SHARED_DIR");
  return dir && *dir ? std::string(dir) : std::string(INGOT_SOURCE_DIR) + "/../shared";
}
std::string binary_path() { return INGOT_BINARY; }

namespace {

std::vector<std::filesystem::path>& temp_dirs_made() {
  static std::vector<std::filesystem::path> dirs;
  return dirs;
}

// A test process that passed removes the folders temp_dir made for it; one that failed keeps them
// to look at, as does any run with INGOT_KEEP_TEST_TMP=1. (They used to pile up, one per test
// and run, under the working directory's test_tmp.)
class RemoveTempDirsWhenPassed : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!::testing::UnitTest::GetInstance()->Passed() || env_flag("INGOT_KEEP_TEST_TMP")) return;
    // (test_tmp itself stays: removing it could race another process creating its folder there.)
    std::error_code ec;
    for (const std::filesystem::path& dir : temp_dirs_made()) std::filesystem::remove_all(dir, ec);
  }
};

[[maybe_unused]] const ::testing::Environment* const remove_temp_dirs =
    ::testing::AddGlobalTestEnvironment(new RemoveTempDirsWhenPassed);

}  // namespace

std::string temp_dir(const std::string& name) {
  namespace fs = std::filesystem;
  // ctest runs tests as parallel processes: the pid keeps one test's files away from another's.
  fs::path dir = fs::current_path() / "test_tmp" / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  temp_dirs_made().push_back(dir);
  return dir.string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int run_command(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buffer;
  std::string text;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) text.append(buffer.data(), n);
  int status = pclose(pipe);
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string error_with_permissions_binding(const std::function<void()>& fn, const std::string& reach,
                                           std::string* why) {
  if (::geteuid() != 0) return error_of(fn);
  int fds[2];
  if (::pipe(fds) != 0) {
    *why = "pipe failed";
    return "";
  }
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    *why = "fork failed";
    return "";
  }
  if (child == 0) {
    ::close(fds[0]);
    const gid_t groups[1] = {65534};
    if (::setgroups(1, groups) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    if (::access(reach.c_str(), R_OK | X_OK) != 0) ::_exit(5);
    const std::string message = error_of(fn);
    const char* p = message.data();
    for (size_t left = message.size(); left > 0;) {
      const ssize_t n = ::write(fds[1], p, left);
      if (n <= 0) ::_exit(4);
      p += n;
      left -= size_t(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string message;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) message.append(buffer, size_t(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *why = WIFEXITED(status) && WEXITSTATUS(status) == 5
               ? "running as root, and uid 65534 cannot enter " + reach + " to run the check"
               : "running as root, and a child could not run as uid 65534 (status " + std::to_string(status) + ")";
    return "";
  }
  return message;
}

}  // namespace ingot::test
