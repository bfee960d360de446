// Rotary position embedding (Hugging Face "rotate half"), in place on x (N,Htot,D); heads
// [0, rotated_heads) rotated. angle = float(positions[n]) * inv_freq[i] in f32 and full-precision
// sincosf (not __sincosf: positions reach 1e5 rad, where the fast path loses digits), matching HF's
// float32 rope. The backward applies the transposed rotation (sin negated).
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

// One thread per (token, head, pair i < D/2). direction: +1 forward, -1 inverse.
template <typename T>
__global__ void rope_kernel(T* x, const int32_t* positions, const float* inv_freq, int64_t N,
                            int Htot, int rotated_heads, int D, float direction) {
  const int half = D / 2;
  const int64_t total = N * rotated_heads * int64_t(half);
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int i = int(t % half);
    const int64_t nh = t / half;
    const int h = int(nh % rotated_heads);
    const int64_t n = nh / rotated_heads;
    const float angle = float(positions[n]) * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    s *= direction;
    T* lo = x + (n * Htot + h) * D + i;
    T* hi = lo + half;
    const float a = to_f32(*lo), b = to_f32(*hi);
    *lo = from_f32<T>(a * c - b * s);
    *hi = from_f32<T>(b * c + a * s);
  }
}

void rope_apply(const char* op, Context& ctx, Tensor x, Tensor positions, Tensor inv_freq,
                int rotated_heads, float direction) {
  CudaState& state = state_of(ctx, op);
  check_tensor(x, op, "x");
  check_tensor(positions, op, "positions");
  check_tensor(inv_freq, op, "inv_freq");
  check_float(x, op, "x");
  check_dtype(positions, DType::i32, op, "positions");
  check_dtype(inv_freq, DType::f32, op, "inv_freq");
  INGOT_CHECK(x.ndim >= 3, op, ": x must be (N,Htot,D), got ", x.shape_string());
  const int64_t Htot = x.dim(-2), D = x.dim(-1), N = x.numel() / (Htot * D);
  INGOT_CHECK(D % 2 == 0, op, ": head dim ", D, " must be even");
  INGOT_CHECK(rotated_heads >= 0 && rotated_heads <= Htot, op, ": rotated_heads ", rotated_heads,
              " is outside [0, ", Htot, "]");
  check_numel(positions, N, op, "positions");
  check_numel(inv_freq, D / 2, op, "inv_freq");
  const int64_t total = N * rotated_heads * (D / 2);
  if (total == 0) return;
  dispatch_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<grid_for(total, 256, state), 256, 0, state.stream>>>(
        x.ptr<T>(), positions.ptr<int32_t>(), inv_freq.ptr<float>(), N, int(Htot), rotated_heads,
        int(D), direction);
    INGOT_LAUNCH_CHECK("rope_kernel");
  });
}

}  // namespace

void rope_forward(Context& ctx, Tensor x, Tensor positions, Tensor inv_freq, int rotated_heads) {
  rope_apply("rope_forward", ctx, x, positions, inv_freq, rotated_heads, 1.f);
}

void rope_backward(Context& ctx, Tensor dx, Tensor positions, Tensor inv_freq, int rotated_heads) {
  rope_apply("rope_backward", ctx, dx, positions, inv_freq, rotated_heads, -1.f);
}

}  // namespace ingot::cuda
