// SwiGLU. gate_up (N,2F) = [gate | up]; out (N,F) = silu(gate) * up; dgate_up (N,2F) overwrite.
// One thread per VEC-element chunk of a row of F: a 2-D grid (x: chunks of the row, y: rows), so
// no 64-bit division per chunk; f32 math, one rounding per output.
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

template <int VEC, typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int64_t N, int64_t F) {
  const int64_t chunks = F / VEC;
  const int64_t f = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * VEC;
  if (f >= chunks * VEC) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    float g[VEC], u[VEC], y[VEC];
    load_vec<VEC>(gate_up + n * 2 * F + f, g);
    load_vec<VEC>(gate_up + n * 2 * F + F + f, u);
#pragma unroll
    for (int k = 0; k < VEC; ++k) y[k] = g[k] * sigmoid(g[k]) * u[k];
    store_vec<VEC>(out + n * F + f, y);
  }
}

template <int VEC, typename T>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t N,
                                       int64_t F) {
  const int64_t chunks = F / VEC;
  const int64_t f = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * VEC;
  if (f >= chunks * VEC) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    float g[VEC], u[VEC], dy[VEC], dg[VEC], du[VEC];
    load_vec<VEC>(gate_up + n * 2 * F + f, g);
    load_vec<VEC>(gate_up + n * 2 * F + F + f, u);
    load_vec<VEC>(dout + n * F + f, dy);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float s = sigmoid(g[k]);
      // d silu(g)/dg = s * (1 + g * (1 - s))
      dg[k] = dy[k] * u[k] * s * (1.f + g[k] * (1.f - s));
      du[k] = dy[k] * g[k] * s;
    }
    store_vec<VEC>(dgate_up + n * 2 * F + f, dg);
    store_vec<VEC>(dgate_up + n * 2 * F + F + f, du);
  }
}

// x: the row's chunks in blocks of 256 threads; y: rows (grid-stride past the 65535 limit).
dim3 swiglu_grid(int64_t N, int64_t chunks) {
  return dim3(unsigned(ceil_div(chunks, 256)), unsigned(std::min<int64_t>(N, 65535)));
}

int64_t swiglu_width(const char* op, const Tensor& out, const Tensor& gate_up) {
  INGOT_CHECK(gate_up.dim(-1) % 2 == 0, op, ": gate_up ", gate_up.shape_string(),
              " last dim must be 2F");
  const int64_t F = gate_up.dim(-1) / 2;
  check_numel(out, gate_up.numel() / 2, op, "out");
  return F;
}

}  // namespace

void swiglu_forward(Context& ctx, Tensor out, Tensor gate_up) {
  constexpr const char* op = "swiglu_forward";
  CudaState& state = state_of(ctx, op);
  check_tensor(out, op, "out");
  check_tensor(gate_up, op, "gate_up");
  check_float(gate_up, op, "gate_up");
  check_dtype(out, gate_up.dtype, op, "out");
  const int64_t F = swiglu_width(op, out, gate_up);
  const int64_t N = F ? gate_up.numel() / (2 * F) : 0;
  if (N == 0 || F == 0) return;
  const bool vec = F % 8 == 0 && aligned16(out.data) && aligned16(gate_up.data);
  dispatch_float(gate_up.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if (vec)
      swiglu_forward_kernel<8, T><<<swiglu_grid(N, F / 8), 256, 0, state.stream>>>(
          out.ptr<T>(), gate_up.ptr<T>(), N, F);
    else
      swiglu_forward_kernel<1, T><<<swiglu_grid(N, F), 256, 0, state.stream>>>(
          out.ptr<T>(), gate_up.ptr<T>(), N, F);
    INGOT_LAUNCH_CHECK("swiglu_forward_kernel");
  });
}

void swiglu_backward(Context& ctx, Tensor dgate_up, Tensor dout, Tensor gate_up) {
  constexpr const char* op = "swiglu_backward";
  CudaState& state = state_of(ctx, op);
  check_tensor(dgate_up, op, "dgate_up");
  check_tensor(dout, op, "dout");
  check_tensor(gate_up, op, "gate_up");
  check_float(gate_up, op, "gate_up");
  check_dtype(dout, gate_up.dtype, op, "dout");
  check_dtype(dgate_up, gate_up.dtype, op, "dgate_up");
  check_numel(dgate_up, gate_up.numel(), op, "dgate_up");
  const int64_t F = swiglu_width(op, dout, gate_up);
  const int64_t N = F ? gate_up.numel() / (2 * F) : 0;
  if (N == 0 || F == 0) return;
  const bool vec = F % 8 == 0 && aligned16(dgate_up.data) && aligned16(dout.data) &&
                   aligned16(gate_up.data);
  dispatch_float(gate_up.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if (vec)
      swiglu_backward_kernel<8, T><<<swiglu_grid(N, F / 8), 256, 0, state.stream>>>(
          dgate_up.ptr<T>(), dout.ptr<T>(), gate_up.ptr<T>(), N, F);
    else
      swiglu_backward_kernel<1, T><<<swiglu_grid(N, F), 256, 0, state.stream>>>(
          dgate_up.ptr<T>(), dout.ptr<T>(), gate_up.ptr<T>(), N, F);
    INGOT_LAUNCH_CHECK("swiglu_backward_kernel");
  });
}

}  // namespace ingot::cuda
