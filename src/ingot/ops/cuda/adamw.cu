// AdamW over whole flat buffers with global-norm clipping: three launches whatever the parameter
// count (sum-of-squares partials, their ordered sum, the update). Same operation order as the CPU
// twin (ops/cpu/adamw.cpp), per element in f32:
//   g = grad * (clip / divisor); p *= decay (decayed runs only); m = b1 m + (1-b1) g;
//   v = b2 v + (1-b2) g^2; p -= step_size * m / (sqrt(v) / bc2 + eps)
// The per-step scalars are read from device memory (f64, written by the host before the step), so a
// captured graph replays with new values; clip and divisor are combined in f64 as on the CPU.
// Dtypes: params bf16 or f32; grads bf16 or f32; m, v both f32 or both bf16 (read as f32, the new
// values stored rounded after the update has used them); master (f32) optional: when present the
// update runs on master and params receive its rounded copy, otherwise on params read as f32.
// Rounding to bf16 is to nearest, or stochastic for the stores that carry the update (params
// without master, m, v) when asked, with the CPU twin's draws (core/stochastic_rounding.h).
#include <cmath>
#include <type_traits>

#include "ingot/core/stochastic_rounding.h"
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"
#include "ingot/ops/cuda/device.h"

namespace ingot::cuda {

namespace {

constexpr int kThreads = 256;

// Whether element i takes weight decay, and the range [lo, hi) around i where that stays true.
// runs: (n_runs, 2) sorted disjoint [begin, end); binary search (the table sits in L1/L2).
__device__ bool decay_range(const int64_t* runs, int n_runs, int64_t n, int64_t i, int64_t& lo, int64_t& hi) {
  int a = 0, b = n_runs;  // first run with begin > i
  while (a < b) {
    const int mid = (a + b) / 2;
    if (runs[2 * mid] <= i) a = mid + 1;
    else b = mid;
  }
  const int r = a - 1;  // last run with begin <= i, or -1
  if (r >= 0 && i < runs[2 * r + 1]) {
    lo = runs[2 * r];
    hi = runs[2 * r + 1];
    return true;
  }
  lo = r >= 0 ? runs[2 * r + 1] : 0;
  hi = a < n_runs ? runs[2 * a] : n;
  return false;
}

// store_vec, except that bf16 stores of an update that draws (adamw_draws) round with the
// elements' draws (one 64-bit draw an element, shared by its three stores: core/stochastic_rounding.h).
template <int VEC, typename T>
__device__ __forceinline__ void store_vec_rounded(T* p, const float (&f)[VEC], bool stochastic,
                                                  const uint64_t (&draws)[VEC], RoundingDraw which) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (stochastic) {
      uint16_t h[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) h[k] = bf16_bits_stochastic(__float_as_uint(f[k]), rounding_draw(draws[k], which));
      if constexpr (VEC == 8) {
        uint4 u;
        u.x = h[0] | (uint32_t(h[1]) << 16);
        u.y = h[2] | (uint32_t(h[3]) << 16);
        u.z = h[4] | (uint32_t(h[5]) << 16);
        u.w = h[6] | (uint32_t(h[7]) << 16);
        *reinterpret_cast<uint4*>(p) = u;
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) reinterpret_cast<uint16_t*>(p)[k] = h[k];
      }
      return;
    }
  }
  store_vec<VEC>(p, f);
}

template <int VEC, typename TP, typename TG, typename TS>
__global__ void __launch_bounds__(kThreads) adamw_step_kernel(TP* param, const TG* grad, TS* m, TS* v,
                                                              float* master, int64_t n, const int64_t* runs,
                                                              int n_runs, double* scalars, float beta1,
                                                              float beta2, float eps, bool stochastic,
                                                              uint64_t rounding_seed) {  // stochastic: adamw_draws
  const double divisor = scalars[ops::kAdamWGradDivisor];
  const double norm = sqrt(scalars[ops::kAdamWSumSquares]) / divisor;
  const double max_norm = scalars[ops::kAdamWMaxGradNorm];
  const double clip = max_norm > 0 ? fmin(1.0, max_norm / (norm + 1e-6)) : 1.0;
  const float grad_scale = float(clip / divisor);
  const float step_size = float(scalars[ops::kAdamWStepSize]);
  const float bc2 = float(scalars[ops::kAdamWBiasCorrection2]);
  const float decay_on = float(scalars[ops::kAdamWDecay]);
  if (blockIdx.x == 0 && threadIdx.x == 0) scalars[ops::kAdamWGradNorm] = norm;
  // Checked on the host where the CPU twin runs; here a value below 1 (never written) reads as 1.
  const uint64_t stream =
      stochastic ? rounding_stream(rounding_seed, uint64_t(fmax(scalars[ops::kAdamWUpdate], 1.0))) : 0;

  int64_t lo = 0, hi = 0;
  bool decays = false;
  // Tiles of kThreads*VEC contiguous elements, grid-stride: neighbouring threads share a decay
  // range, so the range lookup is mostly a cache hit.
  for (int64_t base = blockIdx.x * int64_t(kThreads) * VEC; base < n; base += int64_t(gridDim.x) * kThreads * VEC) {
    const int64_t i = base + int64_t(threadIdx.x) * VEC;
    if (i >= n) break;
    // Parameters start on 64-element boundaries, so a VEC chunk never straddles two ranges.
    if (i < lo || i >= hi) decays = decay_range(runs, n_runs, n, i, lo, hi);
    const float decay = decays ? decay_on : 1.f;
    float p[VEC], g[VEC], mm[VEC], vv[VEC];
    if (master) load_vec<VEC>(master + i, p);
    else load_vec<VEC>(param + i, p);
    load_vec<VEC>(grad + i, g);
    load_vec<VEC>(m + i, mm);
    load_vec<VEC>(v + i, vv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float gk = g[k] * grad_scale;
      p[k] = p[k] * decay;
      mm[k] = beta1 * mm[k] + (1.f - beta1) * gk;
      vv[k] = beta2 * vv[k] + (1.f - beta2) * gk * gk;
      p[k] = p[k] - step_size * mm[k] / (sqrtf(vv[k]) / bc2 + eps);
    }
    uint64_t draws[VEC] = {};
    if (stochastic) {
      if constexpr (VEC == 8) {  // i is a multiple of 8: the chunk is one group of rounding_bits
        const uint64_t group = rounding_group_bits(stream, uint64_t(i) >> 3);
#pragma unroll
        for (int k = 0; k < VEC; ++k) draws[k] = rounding_lane_bits(group, uint32_t(k));
      } else {
        draws[0] = rounding_bits(stream, uint64_t(i));
      }
    }
    store_vec_rounded<VEC>(m + i, mm, stochastic, draws, RoundingDraw::m);
    store_vec_rounded<VEC>(v + i, vv, stochastic, draws, RoundingDraw::v);
    if (master) {
      store_vec<VEC>(master + i, p);
      store_vec<VEC>(param + i, p);  // a copy of master: to nearest
    } else {
      store_vec_rounded<VEC>(param + i, p, stochastic, draws, RoundingDraw::params);
    }
  }
}

}  // namespace

void adamw_step(Context& ctx, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor master,
                Tensor decay_runs, Tensor scalars, const AdamWConstants& constants) {
  constexpr const char* op = "adamw_step";
  CudaState& state = state_of(ctx, op);
  check_tensor(params, op, "params");
  check_tensor(grads, op, "grads");
  check_tensor(m, op, "m");
  check_tensor(v, op, "v");
  check_tensor(decay_runs, op, "decay_runs");
  check_tensor(scalars, op, "scalars");
  check_float(params, op, "params");
  check_float(grads, op, "grads");
  check_float(m, op, "m");
  check_dtype(v, m.dtype, op, "v");
  check_dtype(decay_runs, DType::i64, op, "decay_runs");
  check_dtype(scalars, DType::f64, op, "scalars");
  check_numel(scalars, ops::kAdamWSlots, op, "scalars");
  INGOT_CHECK(decay_runs.ndim == 2 && decay_runs.dim(1) == 2, op, ": decay_runs must be (R,2), got ",
              decay_runs.shape_string());
  const int64_t n = params.numel();
  check_numel(grads, n, op, "grads");
  check_numel(m, n, op, "m");
  check_numel(v, n, op, "v");
  if (master.present()) {
    check_tensor(master, op, "master");
    check_dtype(master, DType::f32, op, "master");
    check_numel(master, n, op, "master");
  }
  double* s = scalars.ptr<double>();
  sum_squares_async(ctx, &grads, 1, s + ops::kAdamWSumSquares);
  float* w = master.present() ? master.ptr<float>() : nullptr;
  const bool vec = n % 8 == 0 && aligned16(params.data) && aligned16(grads.data) && aligned16(m.data) &&
                   aligned16(v.data) && (!w || aligned16(w));
  const int n_runs = static_cast<int>(decay_runs.dim(0));
  const float b1 = float(constants.beta1), b2 = float(constants.beta2), eps = float(constants.eps);
  const bool stochastic = adamw_draws(constants.stochastic_rounding, m.dtype == DType::bf16,
                                      params.dtype == DType::bf16, master.present());
  dispatch_float(params.dtype, op, [&](auto p_tag) {
    using TP = decltype(p_tag);
    dispatch_float(grads.dtype, op, [&](auto g_tag) {
      using TG = decltype(g_tag);
      dispatch_float(m.dtype, op, [&](auto s_tag) {
        using TS = decltype(s_tag);
        if (vec)
          adamw_step_kernel<8, TP, TG, TS><<<grid_for(n / 8, kThreads, state), kThreads, 0, state.stream>>>(
              params.ptr<TP>(), grads.ptr<TG>(), m.ptr<TS>(), v.ptr<TS>(), w, n, decay_runs.ptr<int64_t>(),
              n_runs, s, b1, b2, eps, stochastic, constants.rounding_seed);
        else
          adamw_step_kernel<1, TP, TG, TS><<<grid_for(n, kThreads, state), kThreads, 0, state.stream>>>(
              params.ptr<TP>(), grads.ptr<TG>(), m.ptr<TS>(), v.ptr<TS>(), w, n, decay_runs.ptr<int64_t>(),
              n_runs, s, b1, b2, eps, stochastic, constants.rounding_seed);
        INGOT_LAUNCH_CHECK("adamw_step_kernel");
      });
    });
  });
}

}  // namespace ingot::cuda
