// Cache-blocked, OpenMP-parallel matrix multiply for the CPU linear layer.
//   C (M,N) = A (M,K) @ B (K,N)        when accumulate is false
//   C (M,N) += A (M,K) @ B (K,N)       when accumulate is true
// A and B are addressed through (row stride, column stride), so transposed operands (W^T in the
// forward, dout^T in dweight) need no copy by the caller; C is row-major with leading dim ldc.
// Determinism: every C element is summed over k in the same order (k chunks of fixed size, each
// chunk from zero, then added to C) whatever num_threads is, so results are bit-identical.
#pragma once
#include <cstdint>

namespace ingot::cpu {

template <typename T>
void matmul(int num_threads, int64_t M, int64_t N, int64_t K, const T* A, int64_t a_row_stride,
            int64_t a_col_stride, const T* B, int64_t b_row_stride, int64_t b_col_stride, T* C,
            int64_t ldc, bool accumulate);

extern template void matmul<float>(int, int64_t, int64_t, int64_t, const float*, int64_t, int64_t,
                                   const float*, int64_t, int64_t, float*, int64_t, bool);
extern template void matmul<double>(int, int64_t, int64_t, int64_t, const double*, int64_t,
                                    int64_t, const double*, int64_t, int64_t, double*, int64_t,
                                    bool);

}  // namespace ingot::cpu
