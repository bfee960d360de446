// AdamW (torch.optim.AdamW semantics), elementwise over n parameters. Same operation order as the
// CPU twin (ops/cpu/adamw.cpp) in f32:
//   g = grad * grad_scale; p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
// Scalars are formed in double on the host and rounded once to f32.
// Dtypes: param bf16 or f32; grad bf16 or f32; m, v f32; master (f32) optional: when present the
// update runs on master and param receives its rounded copy, otherwise on param read as f32.
// This is the per-tensor kernel; a multi-tensor launch over all parameters comes later.
#include <cmath>

#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

struct AdamWScalars {
  float grad_scale, decay, beta1, beta2, step_size, bias_correction2_sqrt, eps;
};

template <int VEC, typename TP, typename TG>
__global__ void adamw_kernel(TP* param, const TG* grad, float* m, float* v, float* master,
                             int64_t n, AdamWScalars s) {
  const int64_t chunks = n / VEC;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < chunks;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = t * VEC;
    float p[VEC], g[VEC], mm[VEC], vv[VEC];
    if (master) load_vec<VEC>(master + i, p);
    else load_vec<VEC>(param + i, p);
    load_vec<VEC>(grad + i, g);
    load_vec<VEC>(m + i, mm);
    load_vec<VEC>(v + i, vv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float gk = g[k] * s.grad_scale;
      p[k] = p[k] * s.decay;
      mm[k] = s.beta1 * mm[k] + (1.f - s.beta1) * gk;
      vv[k] = s.beta2 * vv[k] + (1.f - s.beta2) * gk * gk;
      p[k] = p[k] - s.step_size * mm[k] / (sqrtf(vv[k]) / s.bias_correction2_sqrt + s.eps);
    }
    store_vec<VEC>(m + i, mm);
    store_vec<VEC>(v + i, vv);
    if (master) store_vec<VEC>(master + i, p);
    store_vec<VEC>(param + i, p);
  }
}

}  // namespace

void adamw_update(Context& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor master,
                  const AdamWHyper& hyper) {
  constexpr const char* op = "adamw_update";
  CudaState& state = state_of(ctx, op);
  check_tensor(param, op, "param");
  check_tensor(grad, op, "grad");
  check_tensor(m, op, "m");
  check_tensor(v, op, "v");
  check_float(param, op, "param");
  check_float(grad, op, "grad");
  check_dtype(m, DType::f32, op, "m");
  check_dtype(v, DType::f32, op, "v");
  const int64_t n = param.numel();
  check_numel(grad, n, op, "grad");
  check_numel(m, n, op, "m");
  check_numel(v, n, op, "v");
  if (master.present()) {
    check_tensor(master, op, "master");
    check_dtype(master, DType::f32, op, "master");
    check_numel(master, n, op, "master");
  }
  INGOT_CHECK(hyper.step >= 1, op, ": step ", hyper.step, " must be >= 1 (it is 1-based)");
  if (n == 0) return;
  const double t = static_cast<double>(hyper.step);
  const AdamWScalars s{float(hyper.grad_scale),
                       float(1.0 - hyper.lr * hyper.weight_decay),
                       float(hyper.beta1),
                       float(hyper.beta2),
                       float(hyper.lr / (1.0 - std::pow(hyper.beta1, t))),
                       float(std::sqrt(1.0 - std::pow(hyper.beta2, t))),
                       float(hyper.eps)};
  float* w = master.present() ? master.ptr<float>() : nullptr;
  const bool vec = n % 8 == 0 && aligned16(param.data) && aligned16(grad.data) &&
                   aligned16(m.data) && aligned16(v.data) && (!w || aligned16(w));
  dispatch_float(param.dtype, op, [&](auto p_tag) {
    using TP = decltype(p_tag);
    dispatch_float(grad.dtype, op, [&](auto g_tag) {
      using TG = decltype(g_tag);
      if (vec)
        adamw_kernel<8, TP, TG><<<grid_for(n / 8, 256, state), 256, 0, state.stream>>>(
            param.ptr<TP>(), grad.ptr<TG>(), m.ptr<float>(), v.ptr<float>(), w, n, s);
      else
        adamw_kernel<1, TP, TG><<<grid_for(n, 256, state), 256, 0, state.stream>>>(
            param.ptr<TP>(), grad.ptr<TG>(), m.ptr<float>(), v.ptr<float>(), w, n, s);
      INGOT_LAUNCH_CHECK("adamw_kernel");
    });
  });
}

}  // namespace ingot::cuda
