// Deterministic reductions into one f64 on the device: sum_to (the op; the step's loss sum) and
// sum_squares_async (global-norm clipping, device.h). A fixed grid of G blocks (G from the SM
// count) writes one f64 partial each with a fixed-tree block reduction; one more block sums the
// partials in index order. Nothing is read back, so both can sit inside a captured step.
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

// partial[blockIdx.x] = sum over this block's grid-stride share of x (or of x^2 when SQUARE).
template <bool SQUARE, int VEC, typename T>
__global__ void __launch_bounds__(kThreads) partial_sum_kernel(double* partial, const T* x, int64_t n) {
  __shared__ double shared[32];
  double acc = 0.0;
  const int64_t chunks = n / VEC;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < chunks;
       t += int64_t(gridDim.x) * blockDim.x) {
    float f[VEC];
    load_vec<VEC>(x + t * VEC, f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc += SQUARE ? double(f[k]) * double(f[k]) : double(f[k]);
  }
  acc = block_sum_f64(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *result = (accumulate ? *result : 0) + sum of partial[0..count) in index order (one block).
__global__ void __launch_bounds__(kThreads) sum_partials_kernel(double* result, const double* partial,
                                                                int64_t count, bool accumulate) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum_f64(acc, shared);
  if (threadIdx.x == 0) *result = accumulate ? *result + acc : acc;
}

// Enough blocks to keep many loads in flight (at 2 per SM the pass ran at about half of bandwidth).
int64_t partial_blocks(const CudaState& state) { return int64_t(state.num_sms) * 8; }

// Enqueues the partial-sum kernel of one tensor into partial[0..G).
template <bool SQUARE>
void launch_partials(CudaState& state, const Tensor& x, double* partial, const char* op) {
  const int64_t n = x.numel();
  const unsigned G = unsigned(partial_blocks(state));
  dispatch_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if (n % 8 == 0 && aligned16(x.data))
      partial_sum_kernel<SQUARE, 8, T><<<G, kThreads, 0, state.stream>>>(partial, x.ptr<T>(), n);
    else
      partial_sum_kernel<SQUARE, 1, T><<<G, kThreads, 0, state.stream>>>(partial, x.ptr<T>(), n);
    INGOT_LAUNCH_CHECK("partial_sum_kernel");
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
    launch_partials<true>(state, tensors[i], partial + i * G, op);
  }
  sum_partials_kernel<<<1, kThreads, 0, state.stream>>>(device_result, partial, count * G, false);
  INGOT_LAUNCH_CHECK("sum_partials_kernel");
}

void sum_to(Context& ctx, Tensor out, Tensor x, bool accumulate) {
  constexpr const char* op = "sum_to";
  CudaState& state = state_of(ctx, op);
  check_tensor(out, op, "out");
  check_dtype(out, DType::f64, op, "out");
  check_numel(out, 1, op, "out");
  check_tensor(x, op, "x");
  const int64_t G = partial_blocks(state);
  double* partial = static_cast<double*>(scratch_buffer(state, G * int64_t(sizeof(double)), op));
  launch_partials<false>(state, x, partial, op);
  sum_partials_kernel<<<1, kThreads, 0, state.stream>>>(out.ptr<double>(), partial, G, accumulate);
  INGOT_LAUNCH_CHECK("sum_partials_kernel");
}

}  // namespace ingot::cuda
