// copy: dst (n) = src (n), converting between bf16 and f32 (round to nearest even). Same dtype is
// a device-to-device memcpy for any dtype.
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

// Vector path: n % 8 == 0 and both pointers 16-byte aligned; each thread converts kChunks chunks
// of 8 (one block-wide slab apart: coalesced), loads issued first. One pass, no grid-stride loop.
constexpr int kChunks = 2;
constexpr int kThreads = 256;

template <typename TD, typename TS>
__global__ void __launch_bounds__(kThreads) copy_convert_vec8_kernel(TD* __restrict__ dst,
                                                                     const TS* __restrict__ src,
                                                                     int64_t n8) {
  const int64_t i0 = blockIdx.x * int64_t(kThreads) * kChunks + threadIdx.x;
  float f[kChunks][8];
#pragma unroll
  for (int u = 0; u < kChunks; ++u) {
    const int64_t i = i0 + int64_t(u) * kThreads;
    if (i < n8) load8(src + i * 8, f[u]);
  }
#pragma unroll
  for (int u = 0; u < kChunks; ++u) {
    const int64_t i = i0 + int64_t(u) * kThreads;
    if (i < n8) store8(dst + i * 8, f[u]);
  }
}

template <typename TD, typename TS>
__global__ void copy_convert_kernel(TD* dst, const TS* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f32<TD>(to_f32(src[i]));
}

}  // namespace

void copy(Context& ctx, Tensor dst, Tensor src) {
  CudaState& state = state_of(ctx, "copy");
  check_tensor(dst, "copy", "dst");
  check_tensor(src, "copy", "src");
  check_numel(dst, src.numel(), "copy", "dst");
  const int64_t n = src.numel();
  if (n == 0) return;
  if (dst.dtype == src.dtype) {
    INGOT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.bytes()),
                                     cudaMemcpyDeviceToDevice, state.stream));
    return;
  }
  dispatch_float(dst.dtype, "copy", [&](auto dst_tag) {
    using TD = decltype(dst_tag);
    dispatch_float(src.dtype, "copy", [&](auto src_tag) {
      using TS = decltype(src_tag);
      constexpr int threads = kThreads;
      if (n % 8 == 0 && aligned16(dst.data) && aligned16(src.data)) {
        const unsigned blocks = unsigned(ceil_div(n / 8, int64_t(kThreads) * kChunks));
        copy_convert_vec8_kernel<TD, TS><<<blocks, kThreads, 0, state.stream>>>(
            dst.ptr<TD>(), src.ptr<TS>(), n / 8);
        INGOT_LAUNCH_CHECK("copy_convert_vec8_kernel");
      } else {
        copy_convert_kernel<TD, TS><<<grid_for(n, threads, state), threads, 0, state.stream>>>(
            dst.ptr<TD>(), src.ptr<TS>(), n);
        INGOT_LAUNCH_CHECK("copy_convert_kernel");
      }
    });
  });
}

}  // namespace ingot::cuda
