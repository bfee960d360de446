// Counter-based random numbers: value i of stream (seed, stream_id) is a pure function of its three
// inputs, so initialisation is reproducible regardless of thread count or the order parameters are
// visited, and identical on every machine (no std:: distributions, whose algorithms vary).
#pragma once
#include <cmath>
#include <cstdint>

// Functions the CUDA kernels share with the host code (stochastic_rounding.h) carry this.
#if defined(__CUDACC__)
#define INGOT_HOST_DEVICE __host__ __device__
#else
#define INGOT_HOST_DEVICE
#endif

namespace ingot {

INGOT_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1): never exactly 0, so log() below is finite.
inline double uniform_open01(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t bits = splitmix64(splitmix64(seed ^ splitmix64(stream)) + index);
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal via Box-Muller on two uniforms of the same counter.
inline double normal01(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = uniform_open01(seed, stream, 2 * index), u2 = uniform_open01(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// A small sequential generator for sampling (generation), seeded explicitly. The seed is hashed
// before counting from it: counting from the seed itself made seed s + 1's draws seed s's shifted
// by one, so samples for adjacent seeds were near copies.
struct SplitMixRng {
  uint64_t state;
  explicit SplitMixRng(uint64_t seed) : state(splitmix64(seed)) {}
  uint64_t next() { return splitmix64(state++); }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
};

}  // namespace ingot
