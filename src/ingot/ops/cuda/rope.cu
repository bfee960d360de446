// Rotary position embedding (Hugging Face "rotate half"), in place on x (N,Htot,D); heads
// [0, rotated_heads) rotated. angle = float(positions[n]) * inv_freq[i] in f32 and full-precision
// sincosf (not __sincosf: positions reach 1e5 rad, where the fast path loses digits), matching HF's
// float32 rope. The backward applies the transposed rotation (sin negated).
// Invariants:
//   - Vector path (D % 16 == 0, x 16-byte aligned): a block takes 16 tokens. The angles depend
//     only on (token, frequency), so the block first fills a shared table of (cos, sin) for its
//     16 x D/2 pairs (sincosf once per pair, not once per head), then one thread per (token, head,
//     8-frequency chunk) rotates with 16-byte loads of both halves, two items per thread with all
//     loads issued first.
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


constexpr int kTokensPerBlock = 16;
constexpr int kRopeThreads = 256;
constexpr int kItemsPerThread = 2;  // (token, head, chunk) items per thread per step

// Block: kTokensPerBlock tokens. Phase 1 fills a shared table of (cos, direction * sin) for the
// block's (token, frequency) pairs; phase 2 walks the (token, head, 8-frequency chunk) items,
// chunk fastest, so consecutive threads touch consecutive 16 bytes of a head.
template <typename T>
__global__ void __launch_bounds__(kRopeThreads) rope_vec_kernel(T* x, const int32_t* positions,
                                                                const float* inv_freq, int64_t N,
                                                                int Htot, int rotated_heads, int D,
                                                                float direction) {
  extern __shared__ float4 table4[];  // [token][half] (cos, sin) pairs, two per float4
  float2* table = reinterpret_cast<float2*>(table4);
  const int half = D / 2, chunks = half / 8;
  const int64_t n0 = blockIdx.x * int64_t(kTokensPerBlock);
  const int tokens = int(N - n0 < kTokensPerBlock ? N - n0 : kTokensPerBlock);
  for (int i = threadIdx.x; i < tokens * half; i += kRopeThreads) {
    const int tk = i / half, f = i - tk * half;
    float sn, cs;
    sincosf(float(positions[n0 + tk]) * inv_freq[f], &sn, &cs);
    table[i] = make_float2(cs, sn * direction);
  }
  __syncthreads();
  const int items = tokens * rotated_heads * chunks;
  for (int base = 0; base < items; base += kRopeThreads * kItemsPerThread) {
    Raw8<T> lo[kItemsPerThread], hi[kItemsPerThread];
    T* at[kItemsPerThread];
    int row[kItemsPerThread];  // table offset of the item's first frequency
#pragma unroll
    for (int u = 0; u < kItemsPerThread; ++u) {
      const int item = base + u * kRopeThreads + threadIdx.x;
      at[u] = nullptr;
      row[u] = 0;
      if (item < items) {
        const int c = item % chunks, rest = item / chunks;
        const int h = rest % rotated_heads, tk = rest / rotated_heads;
        at[u] = x + ((n0 + tk) * Htot + h) * D + c * 8;
        row[u] = tk * half + c * 8;
        load_raw8(at[u], lo[u]);
        load_raw8(at[u] + half, hi[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kItemsPerThread; ++u) {
      if (at[u] == nullptr) continue;
      float a[8], b[8], ya[8], yb[8];
      unpack8(lo[u], a);
      unpack8(hi[u], b);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 t = table4[(row[u] >> 1) + q];  // (cos, sin) of frequencies 2q, 2q+1
        const float cs[2] = {t.x, t.z}, sn[2] = {t.y, t.w};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 2 * q + r;
          ya[e] = a[e] * cs[r] - b[e] * sn[r];
          yb[e] = b[e] * cs[r] + a[e] * sn[r];
        }
      }
      store8(at[u], ya);
      store8(at[u] + half, yb);
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
    const int smem = int(kTokensPerBlock * (D / 2) * sizeof(float2));  // <= 48 KB for D <= 768
    INGOT_CHECK(smem <= 48 * 1024, op, ": head dim ", D, " too large for the vector path");
    dispatch_float(x.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      rope_vec_kernel<T><<<unsigned(ceil_div(N, kTokensPerBlock)), kRopeThreads, smem, state.stream>>>(
          x.ptr<T>(), positions.ptr<int32_t>(), inv_freq.ptr<float>(), N, int(Htot), rotated_heads,
          int(D), direction);
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
