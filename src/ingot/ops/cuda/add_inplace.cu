// add_inplace: x (n) += y (n), summed in f32 and rounded once into x's dtype. x and y may differ
// in dtype (e.g. an f32 gradient accumulator += a bf16 gradient).
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

// Vector path: each thread adds kChunks chunks of 8 (one block-wide slab apart, so every load is
// coalesced), all loads issued before the first store. One pass, no grid-stride loop.
constexpr int kChunks = 2;
constexpr int kThreads = 256;

template <typename TX, typename TY>
__global__ void __launch_bounds__(kThreads) add_inplace_vec8_kernel(TX* __restrict__ x,
                                                                    const TY* __restrict__ y,
                                                                    int64_t n8) {
  const int64_t i0 = blockIdx.x * int64_t(kThreads) * kChunks + threadIdx.x;
  float a[kChunks][8], b[kChunks][8];
#pragma unroll
  for (int u = 0; u < kChunks; ++u) {
    const int64_t i = i0 + int64_t(u) * kThreads;
    if (i < n8) {
      load8(x + i * 8, a[u]);
      load8(y + i * 8, b[u]);
    }
  }
#pragma unroll
  for (int u = 0; u < kChunks; ++u) {
    const int64_t i = i0 + int64_t(u) * kThreads;
    if (i < n8) {
#pragma unroll
      for (int k = 0; k < 8; ++k) a[u][k] += b[u][k];
      store8(x + i * 8, a[u]);
    }
  }
}

template <typename TX, typename TY>
__global__ void add_inplace_kernel(TX* x, const TY* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f32<TX>(to_f32(x[i]) + to_f32(y[i]));
}

}  // namespace

void add_inplace(Context& ctx, Tensor x, Tensor y) {
  CudaState& state = state_of(ctx, "add_inplace");
  check_tensor(x, "add_inplace", "x");
  check_tensor(y, "add_inplace", "y");
  check_numel(y, x.numel(), "add_inplace", "y");
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype, "add_inplace", [&](auto x_tag) {
    using TX = decltype(x_tag);
    dispatch_float(y.dtype, "add_inplace", [&](auto y_tag) {
      using TY = decltype(y_tag);
      constexpr int threads = kThreads;
      if (n % 8 == 0 && aligned16(x.data) && aligned16(y.data)) {
        const unsigned blocks = unsigned(ceil_div(n / 8, int64_t(kThreads) * kChunks));
        add_inplace_vec8_kernel<TX, TY><<<blocks, kThreads, 0, state.stream>>>(
            x.ptr<TX>(), y.ptr<TY>(), n / 8);
        INGOT_LAUNCH_CHECK("add_inplace_vec8_kernel");
      } else {
        add_inplace_kernel<TX, TY><<<grid_for(n, threads, state), threads, 0, state.stream>>>(
            x.ptr<TX>(), y.ptr<TY>(), n);
        INGOT_LAUNCH_CHECK("add_inplace_kernel");
      }
    });
  });
}

}  // namespace ingot::cuda
