// Sum of squares, accumulated in f64 (global-norm clipping). Deterministic: a fixed grid of G
// blocks (G from the SM count) writes one f64 partial each with a fixed-tree block reduction; one
// more block sums the partials in order. sum_squares reads the result back (synchronising);
// sum_squares_async (device.h) covers many tensors and leaves the result on the device.
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"
#include "ingot/ops/cuda/device.h"

namespace ingot::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ double block_sum_f64(double x, double* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  double total = lane < warps ? shared[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  __syncthreads();
  return total;
}

template <int VEC, typename T>
__global__ void __launch_bounds__(kThreads) sum_squares_partial_kernel(double* partial, const T* x, int64_t n) {
  __shared__ double shared[32];
  double acc = 0.0;
  const int64_t chunks = n / VEC;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < chunks;
       t += int64_t(gridDim.x) * blockDim.x) {
    float f[VEC];
    load_vec<VEC>(x + t * VEC, f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc += double(f[k]) * double(f[k]);
  }
  acc = block_sum_f64(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// result = sum of partial[0..count) in index order (one block, fixed tree per stride).
__global__ void __launch_bounds__(kThreads) sum_partials_kernel(double* result, const double* partial, int64_t count) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum_f64(acc, shared);
  if (threadIdx.x == 0) *result = acc;
}

int64_t partial_blocks(const CudaState& state) { return int64_t(state.num_sms) * 2; }

// Enqueues the partial-sum kernel of one tensor into partial[0..G).
void launch_partials(CudaState& state, const Tensor& x, double* partial, const char* op) {
  const int64_t n = x.numel();
  const unsigned G = unsigned(partial_blocks(state));
  dispatch_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if (n % 8 == 0 && aligned16(x.data))
      sum_squares_partial_kernel<8, T><<<G, kThreads, 0, state.stream>>>(partial, x.ptr<T>(), n);
    else
      sum_squares_partial_kernel<1, T><<<G, kThreads, 0, state.stream>>>(partial, x.ptr<T>(), n);
    INGOT_LAUNCH_CHECK("sum_squares_partial_kernel");
  });
}

}  // namespace

void sum_squares_async(Context& ctx, const Tensor* tensors, int count, double* device_result) {
  constexpr const char* op = "sum_squares_async";
  CudaState& state = state_of(ctx, op);
  INGOT_CHECK(count >= 0 && (count == 0 || tensors != nullptr), op, ": bad tensor list");
  const int64_t G = partial_blocks(state);
  double* partial = static_cast<double*>(
      scratch_buffer(state, std::max<int64_t>(1, count) * G * int64_t(sizeof(double)), op));
  for (int i = 0; i < count; ++i) {
    check_tensor(tensors[i], op, "tensors[i]");
    launch_partials(state, tensors[i], partial + i * G, op);
  }
  sum_partials_kernel<<<1, kThreads, 0, state.stream>>>(device_result, partial, count * G);
  INGOT_LAUNCH_CHECK("sum_partials_kernel");
}

double sum_squares(Context& ctx, Tensor x) {
  constexpr const char* op = "sum_squares";
  CudaState& state = state_of(ctx, op);
  check_tensor(x, op, "x");
  INGOT_CHECK(!state.capturing, op, ": reads back to the host, which graph capture forbids; "
              "use sum_squares_async");
  if (x.numel() == 0) return 0.0;
  const int64_t G = partial_blocks(state);
  // Scratch: G partials, then the result (f64).
  double* partial = static_cast<double*>(scratch_buffer(state, (G + 1) * int64_t(sizeof(double)), op));
  launch_partials(state, x, partial, op);
  sum_partials_kernel<<<1, kThreads, 0, state.stream>>>(partial + G, partial, G);
  INGOT_LAUNCH_CHECK("sum_partials_kernel");
  INGOT_CUDA_CHECK(cudaMemcpyAsync(state.host_result, partial + G, sizeof(double),
                                   cudaMemcpyDeviceToHost, state.stream));
  INGOT_CUDA_CHECK(cudaStreamSynchronize(state.stream));
  return *state.host_result;
}

}  // namespace ingot::cuda
