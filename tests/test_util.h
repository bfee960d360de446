// Shared helpers for Ingot's tests: random tensors, norm-wise relative error, paths.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "ingot/core/error.h"
#include "ingot/core/tensor.h"

namespace ingot::test {

// ||a - b|| / ||b|| over n elements; returns +inf if either side holds a NaN.
double relative_error(const double* a, const double* b, int64_t n);
double relative_error(const float* a, const float* b, int64_t n);
double relative_error(const std::vector<double>& a, const std::vector<double>& b);

// Owning host buffer plus a Tensor view of it. Movable (a moved vector keeps its buffer, so the
// view stays valid) but not copyable: a copy's view would point at the original's storage.
template <typename T>
struct HostTensor {
  std::vector<T> storage;
  Tensor tensor;
  HostTensor(DType dtype, std::initializer_list<int64_t> dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    storage.assign(static_cast<size_t>(n), T{});
    tensor = Tensor(storage.data(), dtype, Device::cpu, dims);
  }
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor(HostTensor&&) noexcept = default;
  HostTensor& operator=(HostTensor&&) noexcept = default;
  T* data() { return storage.data(); }
  int64_t size() const { return static_cast<int64_t>(storage.size()); }
};

template <typename T>
void fill_normal(std::vector<T>& v, uint64_t seed, double stddev = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  for (auto& x : v) x = static_cast<T>(dist(rng));
}

std::string source_dir();      // repository root
// The project's shared folder (its Qwen3 tokenizer): $INGOT_SHARED_DIR, else ../shared beside the
// repository. Tests that need it skip where it is absent.
std::string shared_dir();
std::string binary_path();     // the built `ingot` CLI
std::string temp_dir(const std::string& name);  // fresh empty directory under the build tree, per process; removed when the process passed
std::string read_file(const std::string& path);  // whole file, bytes as they are ("" if unreadable)

// error_of(fn) (below), with file permissions binding:
// run directly by a user they bind for, in a forked child that has become uid/gid 65534 (nobody)
// when the tests run as root (as CI does), where permission tests would otherwise skip. Sets
// *why and returns "" when that child could not drop root or, as nobody, cannot enter the folder
// `reach` (a build tree under a private home). fn must not need threads the parent started, nor
// write outside what nobody may write.
std::string error_with_permissions_binding(const std::function<void()>& fn, const std::string& reach,
                                           std::string* why);

// Runs fn, which must throw ingot::Error, and returns its message ("" and a test failure if it
// does not throw).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an ingot::Error";
  return "";
}

// Runs action, which must throw ingot::Error whose message contains every one of parts.
template <typename Action>
void expect_error(Action action, std::initializer_list<std::string> parts) {
  try {
    action();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const auto& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "message lacks \"" << part << "\": " << message;
    return;
  }
  ADD_FAILURE() << "expected ingot::Error";
}

// Runs a shell command; returns its exit status and captures stdout+stderr into *output.
int run_command(const std::string& command, std::string* output);

}  // namespace ingot::test
