// Cross-entropy over logits (N,V). losses (N) f32 = logsumexp(row) - row[target] (0 for ignored
// targets); dlogits (N,V), optional, = (softmax(row) - onehot(target)) * dloss_scale, rows of
// ignored targets zeroed; dlogits may alias logits.
// Invariants:
//   - One block per row (grid-stride). Pass 1 keeps an online (max, sum of exp) per thread over the
//     row, merged by a fixed tree; pass 2 re-reads the row and writes dlogits. Reading a row once,
//     split over a thread-block cluster, measured slower (docs/perf.md, optimisation log). In-place
//     is safe: each element is read then written by the same thread, after the block has finished
//     pass 1.
//   - A target outside [0, V) that is not kIgnoreIndex gives a NaN loss (a kernel cannot throw).
#include <cmath>

#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

constexpr int kThreads = 512;

// (m, s) represents s * exp(m); merging rescales the smaller-max side. -inf maxima stay exact. A
// NaN is carried in s: fmaxf drops a NaN maximum, so an all-NaN side looks empty by its m alone.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) {  // both empty (0 + 0), or one of them all NaN (its s is NaN)
    s += s2;
    return;
  }
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

template <int VEC, typename TL, typename TD>
__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(float* losses, TD* dlogits, const TL* logits, const int32_t* targets,
                                     int64_t N, int64_t V, float dloss_scale) {
  __shared__ float shared_m[32], shared_s[32];
  __shared__ float row_lse;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int32_t target = targets[n];
    const TL* row = logits + n * V;
    TD* drow = dlogits ? dlogits + n * V : nullptr;
    if (target == ops::kIgnoreIndex) {
      if (threadIdx.x == 0) losses[n] = 0.f;
      if (drow)
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) drow[j] = from_f32<TD>(0.f);
      continue;
    }
    float m = -INFINITY, s = 0.f;
    for (int64_t j = int64_t(threadIdx.x) * VEC; j < V; j += int64_t(blockDim.x) * VEC) {
      float x[VEC];
      load_vec<VEC>(row + j, x);
      float cm = x[0];
#pragma unroll
      for (int k = 1; k < VEC; ++k) cm = fmaxf(cm, x[k]);
      float cs = 0.f;
#pragma unroll
      for (int k = 0; k < VEC; ++k) cs += expf(x[k] - cm);
      merge_max_sum(m, s, cm, cs);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge_max_sum(m, s, m2, s2);
    }
    if (lane == 0) { shared_m[warp] = m; shared_s[warp] = s; }
    __syncthreads();
    if (threadIdx.x == 0) {
      float bm = shared_m[0], bs = shared_s[0];
      for (int w = 1; w < warps; ++w) merge_max_sum(bm, bs, shared_m[w], shared_s[w]);
      const float lse = bm + logf(bs);
      row_lse = lse;
      const bool valid = target >= 0 && target < V;
      losses[n] = valid ? lse - to_f32(row[target]) : __int_as_float(0x7fc00000);
    }
    __syncthreads();
    const float lse = row_lse;
    if (drow) {
      for (int64_t j = int64_t(threadIdx.x) * VEC; j < V; j += int64_t(blockDim.x) * VEC) {
        float x[VEC];
        load_vec<VEC>(row + j, x);
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          x[k] = (expf(x[k] - lse) - (j + k == target ? 1.f : 0.f)) * dloss_scale;
        store_vec<VEC>(drow + j, x);
      }
    }
    __syncthreads();  // row_lse and shared_* are reused by the next row
  }
}

}  // namespace

void cross_entropy(Context& ctx, Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                   double dloss_scale) {
  constexpr const char* op = "cross_entropy";
  CudaState& state = state_of(ctx, op);
  check_tensor(losses, op, "losses");
  check_tensor(logits, op, "logits");
  check_tensor(targets, op, "targets");
  check_float(logits, op, "logits");
  check_dtype(losses, DType::f32, op, "losses");
  check_dtype(targets, DType::i32, op, "targets");
  const int64_t V = logits.dim(-1), N = V ? logits.numel() / V : 0;
  check_numel(losses, N, op, "losses");
  check_numel(targets, N, op, "targets");
  if (dlogits.present()) {
    check_tensor(dlogits, op, "dlogits");
    check_float(dlogits, op, "dlogits");
    check_numel(dlogits, N * V, op, "dlogits");
  }
  if (N == 0) return;
  const bool vec = V % 8 == 0 && aligned16(logits.data) &&
                   (!dlogits.present() || aligned16(dlogits.data));
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(N, int64_t(state.num_sms) * 8));
  const DType d_dtype = dlogits.present() ? dlogits.dtype : logits.dtype;
  dispatch_float(logits.dtype, op, [&](auto l_tag) {
    using TL = decltype(l_tag);
    dispatch_float(d_dtype, op, [&](auto d_tag) {
      using TD = decltype(d_tag);
      TD* d = dlogits.present() ? dlogits.ptr<TD>() : nullptr;
      if (vec)
        cross_entropy_kernel<8, TL, TD><<<grid, kThreads, 0, state.stream>>>(
            losses.ptr<float>(), d, logits.ptr<TL>(), targets.ptr<int32_t>(), N, V, float(dloss_scale));
      else
        cross_entropy_kernel<1, TL, TD><<<grid, kThreads, 0, state.stream>>>(
            losses.ptr<float>(), d, logits.ptr<TL>(), targets.ptr<int32_t>(), N, V, float(dloss_scale));
      INGOT_LAUNCH_CHECK("cross_entropy_kernel");
    });
  });
}

}  // namespace ingot::cuda
