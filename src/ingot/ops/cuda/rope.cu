// Rotary position embedding (Hugging Face "rotate half"), in place on x (N,Htot,D); heads
// [0, rotated_heads) rotated. angle = float(positions[n]) * inv_freq[i] in f32 and full-precision
// sincosf (not __sincosf: positions reach 1e5 rad, where the fast path loses digits), matching HF's
// float32 rope. The backward applies the transposed rotation (sin negated).
// Invariants:
//   - Vector path (D % 16 == 0, x 16-byte aligned): one thread per (token, chunk of 8 frequencies,
//     group of kHeadsPerThread heads). The angles depend only on (token, frequency), so a thread
//     computes its 8 sin/cos pairs once (first: sincosf's slow path needs many registers) and
//     applies them to every head of its group, whose 16-byte loads of both halves are all issued
//     before the first use.
//   - Scalar fallback: one thread per (token, head, pair).
//   - Both paths compute each element with the same f32 expressions, so they agree bitwise.
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


constexpr int kHeadsPerThread = 8;

template <typename T>
__global__ void __launch_bounds__(256, 2) rope_vec_kernel(T* x, const int32_t* positions,
                                                       const float* inv_freq, int64_t N, int Htot,
                                                       int rotated_heads, int D, int head_groups,
                                                       float direction) {
  const int half = D / 2, chunks = half / 8;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= N * head_groups * chunks) return;
  const int c = int(t % chunks);
  const int64_t rest = t / chunks;
  const int group = int(rest % head_groups);
  const int64_t n = rest / head_groups;
  const int h0 = group * kHeadsPerThread;
  const int heads = min(kHeadsPerThread, rotated_heads - h0);
  const float p = float(positions[n]);
  float sn[8], cs[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    sincosf(p * inv_freq[c * 8 + e], &sn[e], &cs[e]);
    sn[e] *= direction;
  }
  T* base = x + (n * Htot + h0) * D + c * 8;
  Raw8<T> lo[kHeadsPerThread], hi[kHeadsPerThread];
#pragma unroll
  for (int k = 0; k < kHeadsPerThread; ++k) {
    if (k < heads) {
      load_raw8(base + k * D, lo[k]);
      load_raw8(base + k * D + half, hi[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kHeadsPerThread; ++k) {
    if (k < heads) {
      float a[8], b[8], ya[8], yb[8];
      unpack8(lo[k], a);
      unpack8(hi[k], b);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        ya[e] = a[e] * cs[e] - b[e] * sn[e];
        yb[e] = b[e] * cs[e] + a[e] * sn[e];
      }
      store8(base + k * D, ya);
      store8(base + k * D + half, yb);
    }
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
  if (D % 16 == 0 && aligned16(x.data)) {
    const int head_groups = int(ceil_div(rotated_heads, kHeadsPerThread));
    const int64_t threads = N * head_groups * (D / 16);
    dispatch_float(x.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      rope_vec_kernel<T><<<unsigned(ceil_div(threads, 256)), 256, 0, state.stream>>>(
          x.ptr<T>(), positions.ptr<int32_t>(), inv_freq.ptr<float>(), N, int(Htot),
          rotated_heads, int(D), head_groups, direction);
      INGOT_LAUNCH_CHECK("rope_vec_kernel");
    });
    return;
  }
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
