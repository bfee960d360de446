// Host <-> device transfers for the CUDA tests: float vectors in and out of bf16 or f32 device
// tensors (bf16 rounded to nearest even on the way in), and raw bytes for bitwise comparisons.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "ingot/core/context.h"
#include "ingot/core/dtype.h"
#include "ingot/core/env.h"
#include "ingot/core/error.h"
#include "ingot/core/tensor.h"
#include "ingot/ops/cuda/device.h"
#include "skip_or_fail.h"

namespace ingot::test {

// A CUDA context on device 0 that owns its state (stream, cuBLASLt, workspace).
struct CudaContext {
  Context ctx;
  CudaContext() {
    ctx.device = Device::cuda;
    ctx.cuda = cuda::create_state(0);
  }
  ~CudaContext() { cuda::destroy_state(ctx.cuda); }
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;
};

inline void write_floats(Tensor t, const std::vector<float>& values, CudaState* state) {
  if (t.dtype == DType::f32) {
    cuda::copy_to_device(t.data, values.data(), t.bytes(), state);
    return;
  }
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
  cuda::copy_to_device(t.data, bits.data(), t.bytes(), state);
}

inline std::vector<float> read_floats(const Tensor& t, CudaState* state) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::f32) {
    cuda::copy_to_host(out.data(), t.data, t.bytes(), state);
    return out;
  }
  std::vector<uint16_t> bits(out.size());
  cuda::copy_to_host(bits.data(), t.data, t.bytes(), state);
  for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(bits[i]);
  return out;
}

inline std::vector<uint8_t> read_bytes(const Tensor& t, CudaState* state) {
  std::vector<uint8_t> out(static_cast<size_t>(t.bytes()));
  cuda::copy_to_host(out.data(), t.data, t.bytes(), state);
  return out;
}

// The seed a test's random inputs are drawn from. Unset or INGOT_TEST_SEED=0: the seed as written,
// the draws every recorded run used. INGOT_TEST_SEED=N (N > 0) mixes N into every seed (splitmix64),
// so a run with a new N checks the ops on inputs no earlier run saw; tolerances must hold for any N.
inline uint64_t test_seed(uint64_t seed) {
  static const uint64_t salt = [] {
    const char* env = std::getenv("INGOT_TEST_SEED");
    if (env == nullptr || *env == '\0') return uint64_t{0};
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(env, &end, 10);
    if (*end != '\0' || std::strspn(env, "0123456789") != std::strlen(env) || errno == ERANGE) {
      std::fprintf(stderr, "INGOT_TEST_SEED must be a non-negative integer, got \"%s\"\n", env);
      std::exit(2);
    }
    if (n != 0) std::fprintf(stderr, "INGOT_TEST_SEED=%llu: every random input is drawn afresh\n", n);
    return uint64_t(n);
  }();
  if (salt == 0) return seed;
  uint64_t z = seed + salt * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Packed documents: segment ids increase along each row, documents of random length.
inline std::vector<int32_t> make_segments(int64_t B, int64_t T, uint64_t seed) {
  std::mt19937_64 rng(test_seed(seed));
  std::uniform_int_distribution<int64_t> len(1, std::max<int64_t>(2, T / 3));
  std::vector<int32_t> seg(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    int64_t left = len(rng);
    for (int64_t t = 0; t < T; ++t) {
      if (left-- == 0) { ++id; left = len(rng) - 1; }
      seg[b * T + t] = id;
    }
  }
  return seg;
}

// Perf-mode tests print timings and assert nothing; they run only with INGOT_CUDA_PERF=1.
inline bool perf_mode() { return env_flag("INGOT_CUDA_PERF"); }

// Median milliseconds (CUDA events on the state's stream) of `iters` runs after `warmup` untimed ones.
inline double median_ms(CudaState* state, const std::function<void()>& fn, int warmup = 3, int iters = 10) {
  for (int i = 0; i < warmup; ++i) fn();
  cuda::Event start = cuda::event_create(), end = cuda::event_create();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    cuda::event_record(start, state);
    fn();
    cuda::event_record(end, state);
    ms.push_back(cuda::event_elapsed_ms(start, end));
  }
  cuda::event_destroy(start);
  cuda::event_destroy(end);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Base of the op-test suites: one CudaState per suite (its tests skip when there is no device), a
// CUDA and a CPU context, device tensors freed after each test, and float transfers in and out.
class CudaFixture : public ::testing::Test {
 protected:
  using Floats = std::vector<float>;
  using Dims = std::vector<int64_t>;

  static inline CudaState* state_ = nullptr;
  static void SetUpTestSuite() {
    if (cuda::device_available() && !state_) state_ = cuda::create_state(0);
  }
  static void TearDownTestSuite() {
    cuda::destroy_state(state_);
    state_ = nullptr;
  }
  void SetUp() override {
    if (!state_) INGOT_SKIP_OR_FAIL("no CUDA device");
    gpu.device = Device::cuda;
    gpu.cuda = state_;
    cpu.device = Device::cpu;
    cpu.num_threads = 2;
  }
  void TearDown() override {
    if (state_) cuda::synchronize(state_);
    for (void* p : allocations_) cuda::device_free(p);
    allocations_.clear();
  }

  // Uninitialised device tensor (at least one byte, so that empty tensors have an address).
  Tensor alloc(DType dtype, const Dims& dims) {
    INGOT_CHECK(dims.size() <= size_t(Tensor::kMaxDims), "alloc: rank ", dims.size(), " exceeds ", Tensor::kMaxDims);
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    void* p = cuda::device_alloc(std::max<int64_t>(n * dtype_size(dtype), 1));
    allocations_.push_back(p);
    Tensor t;
    t.data = p;
    t.dtype = dtype;
    t.device = Device::cuda;
    t.ndim = static_cast<int>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) t.shape[i] = dims[i];
    return t;
  }
  void write(Tensor t, const Floats& values) { write_floats(t, values, state_); }
  Floats download(const Tensor& t) { return read_floats(t, state_); }
  std::vector<uint8_t> download_bytes(const Tensor& t) { return read_bytes(t, state_); }
  // NaN in every element, so that elements an op forgets to write fail the comparison.
  void poison(Tensor t) { write(t, Floats(static_cast<size_t>(t.numel()), std::numeric_limits<float>::quiet_NaN())); }
  Tensor poisoned(DType dtype, const Dims& dims) {
    Tensor t = alloc(dtype, dims);
    poison(t);
    return t;
  }
  // Captures fn into the state's CUDA graph (nothing runs while capturing), instantiates the graph,
  // replays it once and waits for it.
  void capture_and_replay(const std::function<void()>& fn) {
    cuda::begin_capture(state_);
    fn();
    cuda::end_capture_and_instantiate(state_);
    cuda::replay(state_);
    cuda::synchronize(state_);
  }

  Context gpu, cpu;

 private:
  std::vector<void*> allocations_;
};

}  // namespace ingot::test
