// Matmul for the CPU backend (see matmul.h for the contract). Structure, BLIS-style:
//   1. pack A into row panels  pa[ip] (K, MR)  and B into column panels  pb[jp] (K, NR),
//      zero-padded to whole panels, so the micro-kernel reads both operands contiguously;
//   2. for each k chunk of KC (fixed order): every (ip, jp) tile runs the micro-kernel, an
//      MR x NR register block updated by axpy-style loops over the contiguous NR dimension
//      (GCC vectorises these without -ffast-math: no reassociation is needed), then adds its
//      block into C (or stores it for the first chunk when not accumulating).
// Threads split the tiles; a tile's arithmetic does not depend on which thread runs it.
#include "ingot/ops/cpu/matmul.h"

#include <algorithm>
#include <vector>

namespace ingot::cpu {
namespace {

// MR x NR accumulators: 6 rows x 4 vectors of 256 bits = 24 registers, within the 32 that
// AVX-512VL exposes (and still fine, with some spilling, on plain AVX2).
template <typename T> struct Tile;
template <> struct Tile<float> { static constexpr int MR = 6, NR = 32; };
template <> struct Tile<double> { static constexpr int MR = 6, NR = 16; };
constexpr int64_t KC = 256;  // k chunk: a (KC, NR) B panel stays in L1

// pa (K, MR) <- A rows [i0, i0+MR), zero rows past M.
template <typename T>
void pack_a(T* pa, const T* A, int64_t rs, int64_t cs, int64_t i0, int64_t M, int64_t K) {
  constexpr int MR = Tile<T>::MR;
  const int64_t height = std::min<int64_t>(MR, M - i0);
  if (cs == 1) {  // rows of A are contiguous (in, dout): walk each row
    for (int64_t i = 0; i < MR; ++i) {
      if (i >= height) {
        for (int64_t k = 0; k < K; ++k) pa[k * MR + i] = T(0);
        continue;
      }
      const T* a = A + (i0 + i) * rs;
      for (int64_t k = 0; k < K; ++k) pa[k * MR + i] = a[k];
    }
  } else {  // columns of A are contiguous (A = dout^T): copy MR-wide strips
    for (int64_t k = 0; k < K; ++k) {
      const T* a = A + k * cs + i0 * rs;
      T* dst = pa + k * MR;
      for (int64_t i = 0; i < height; ++i) dst[i] = a[i * rs];
      for (int64_t i = height; i < MR; ++i) dst[i] = T(0);
    }
  }
}

// pb (K, NR) <- B columns [j0, j0+NR), zero columns past N.
template <typename T>
void pack_b(T* pb, const T* B, int64_t rs, int64_t cs, int64_t j0, int64_t N, int64_t K) {
  constexpr int NR = Tile<T>::NR;
  const int64_t width = std::min<int64_t>(NR, N - j0);
  if (cs == 1) {  // rows of B are contiguous: copy NR-wide strips
    for (int64_t k = 0; k < K; ++k) {
      const T* b = B + k * rs + j0;
      T* dst = pb + k * NR;
      for (int64_t j = 0; j < width; ++j) dst[j] = b[j];
      for (int64_t j = width; j < NR; ++j) dst[j] = T(0);
    }
  } else {  // columns of B are contiguous (B = W^T): walk each column
    for (int64_t j = 0; j < NR; ++j) {
      if (j >= width) {
        for (int64_t k = 0; k < K; ++k) pb[k * NR + j] = T(0);
        continue;
      }
      const T* b = B + (j0 + j) * cs;
      for (int64_t k = 0; k < K; ++k) pb[k * NR + j] = b[k * rs];
    }
  }
}

// acc (MR, NR) = pa (kc, MR)^T @ pb (kc, NR), summed over k in order.
template <typename T>
inline void micro_kernel(int64_t kc, const T* __restrict pa, const T* __restrict pb,
                         T* __restrict out) {
  constexpr int MR = Tile<T>::MR, NR = Tile<T>::NR;
  T acc[MR][NR] = {};
  for (int64_t k = 0; k < kc; ++k) {
    const T* b = pb + k * NR;
    const T* a = pa + k * MR;
    // The pragmas pin the vectorisation to j (contiguous in pb and acc) and unroll i: left to
    // itself GCC 12 sometimes vectorises across i with permutes (1 GFLOP/s for double 6x16).
    // `omp simd` only chooses the loop; each acc element still sums k in order.
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const T ai = a[i];
#pragma omp simd
      for (int j = 0; j < NR; ++j) acc[i][j] += ai * b[j];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) out[i * NR + j] = acc[i][j];
}

template <typename T>
std::vector<T>& scratch(int which) {
  thread_local std::vector<T> buffers[2];
  return buffers[which];
}

}  // namespace

template <typename T>
void matmul(int num_threads, int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs,
            int64_t a_cs, const T* B, int64_t b_rs, int64_t b_cs, T* C, int64_t ldc,
            bool accumulate) {
  constexpr int MR = Tile<T>::MR, NR = Tile<T>::NR;
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, T(0));
    return;
  }
  const int64_t n_ip = (M + MR - 1) / MR, n_jp = (N + NR - 1) / NR;
  std::vector<T>& pa_all = scratch<T>(0);
  std::vector<T>& pb_all = scratch<T>(1);
  pa_all.resize(static_cast<size_t>(n_ip * K * MR));
  pb_all.resize(static_cast<size_t>(n_jp * K * NR));
  T* pa_data = pa_all.data();
  T* pb_data = pb_all.data();
  const int64_t n_tiles = n_ip * n_jp;

#pragma omp parallel num_threads(num_threads)
  {
#pragma omp for schedule(static)
    for (int64_t ip = 0; ip < n_ip; ++ip) pack_a(pa_data + ip * K * MR, A, a_rs, a_cs, ip * MR, M, K);
#pragma omp for schedule(static)
    for (int64_t jp = 0; jp < n_jp; ++jp) pack_b(pb_data + jp * K * NR, B, b_rs, b_cs, jp * NR, N, K);

    alignas(64) T block[MR * NR];
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = std::min(KC, K - k0);
      const bool add = accumulate || k0 > 0;
      // Tiles ordered row panel major: a thread keeps one A panel in L1 while it sweeps the
      // (kc, N) slab of B, which stays in L2.
#pragma omp for schedule(static)
      for (int64_t t = 0; t < n_tiles; ++t) {
        const int64_t ip = t / n_jp, jp = t % n_jp;
        micro_kernel<T>(kc, pa_data + ip * K * MR + k0 * MR, pb_data + jp * K * NR + k0 * NR,
                        block);
        const int64_t rows = std::min<int64_t>(MR, M - ip * MR);
        const int64_t cols = std::min<int64_t>(NR, N - jp * NR);
        for (int64_t i = 0; i < rows; ++i) {
          T* c = C + (ip * MR + i) * ldc + jp * NR;
          const T* b = block + i * NR;
          if (add)
            for (int64_t j = 0; j < cols; ++j) c[j] += b[j];
          else
            for (int64_t j = 0; j < cols; ++j) c[j] = b[j];
        }
      }
    }
  }
}

template void matmul<float>(int, int64_t, int64_t, int64_t, const float*, int64_t, int64_t,
                            const float*, int64_t, int64_t, float*, int64_t, bool);
template void matmul<double>(int, int64_t, int64_t, int64_t, const double*, int64_t, int64_t,
                             const double*, int64_t, int64_t, double*, int64_t, bool);

}  // namespace ingot::cpu
