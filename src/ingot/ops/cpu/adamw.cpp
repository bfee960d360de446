// AdamW (torch.optim.AdamW semantics) and the sum of squares used for global-norm clipping.
// Invariants:
//   - The update follows ops.h operation by operation:
//       g = grad * grad_scale; p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//       p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
//     Scalars (1 - lr*wd, lr/(1-b1^t), sqrt(1-b2^t)) are formed in double and rounded once to
//     the compute dtype, as torch does with Python-float hyperparameters.
//   - With a master copy (f32) the update runs on master in f32 and param (f32/bf16/f16) receives
//     its rounded copy; grad may then be f32, bf16 or f16.
//   - sum_squares sums fixed-size chunks in double and adds the chunk sums in chunk order, so the
//     result is bit-identical for any thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {
namespace {

// Element access for the dtypes a gradient or parameter may have.
template <typename T>
struct Elem {
  static T load(const void* p, int64_t i) { return static_cast<const T*>(p)[i]; }
  static void store(void* p, int64_t i, T x) { static_cast<T*>(p)[i] = x; }
};
struct Bf16Elem {
  static float load(const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, float x) { static_cast<uint16_t*>(p)[i] = f32_to_bf16(x); }
};
struct F16Elem {
  static float load(const void* p, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, float x) { static_cast<uint16_t*>(p)[i] = f32_to_f16(x); }
};

template <typename Fn>
void dispatch_storage(const char* op, const char* name, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(Elem<float>{});
    case DType::bf16: return fn(Bf16Elem{});
    case DType::f16: return fn(F16Elem{});
    default: fail(op, ": ", name, " dtype ", dtype_name(dtype), " is not f32, bf16 or f16");
  }
}

struct AdamWScalars {
  double decay, step_size, bias_correction2_sqrt;
};

AdamWScalars adamw_scalars(const AdamWHyper& h) {
  INGOT_CHECK(h.step >= 1, "adamw_update: step ", h.step, " must be >= 1 (it is 1-based)");
  const double t = static_cast<double>(h.step);
  return {1.0 - h.lr * h.weight_decay, h.lr / (1.0 - std::pow(h.beta1, t)),
          std::sqrt(1.0 - std::pow(h.beta2, t))};
}

// One element of the update on p (compute dtype T); returns the new p.
template <typename T>
inline T adamw_element(T p, T g, T& m, T& v, T grad_scale, T decay, T b1, T b2, T step_size,
                       T bc2_sqrt, T eps) {
  g = g * grad_scale;
  p = p * decay;
  m = b1 * m + (T(1) - b1) * g;
  v = b2 * v + (T(1) - b2) * g * g;
  return p - step_size * m / (std::sqrt(v) / bc2_sqrt + eps);
}

}  // namespace

void adamw_update(Context& ctx, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor master,
                  const AdamWHyper& hyper) {
  constexpr const char* op = "adamw_update";
  const int64_t n = param.numel();
  detail::check_numel(op, "grad", grad, n);
  detail::check_numel(op, "m", m, n);
  detail::check_numel(op, "v", v, n);
  const AdamWScalars s = adamw_scalars(hyper);
  if (n == 0) return;

  if (master.present()) {
    detail::check_tensor(op, "master", master, DType::f32);
    detail::check_tensor(op, "m", m, DType::f32);
    detail::check_tensor(op, "v", v, DType::f32);
    detail::check_numel(op, "master", master, n);
    INGOT_CHECK(param.present() && param.device == Device::cpu && grad.present() &&
                    grad.device == Device::cpu, op, ": param and grad must be host tensors");
    dispatch_storage(op, "param", param.dtype, [&](auto param_elem) {
      dispatch_storage(op, "grad", grad.dtype, [&](auto grad_elem) {
        using P = decltype(param_elem);
        using G = decltype(grad_elem);
        float* w = master.ptr<float>();
        float* mm = m.ptr<float>();
        float* vv = v.ptr<float>();
        const float gs = float(hyper.grad_scale), decay = float(s.decay), b1 = float(hyper.beta1),
                    b2 = float(hyper.beta2), step = float(s.step_size),
                    bc2 = float(s.bias_correction2_sqrt), eps = float(hyper.eps);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          w[i] = adamw_element<float>(w[i], float(G::load(grad.data, i)), mm[i], vv[i], gs, decay,
                                      b1, b2, step, bc2, eps);
          P::store(param.data, i, w[i]);
        }
      });
    });
    return;
  }

  detail::dispatch_float(op, param.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "param", param, param.dtype);
    detail::check_tensor(op, "grad", grad, param.dtype);
    detail::check_tensor(op, "m", m, ops::compute_dtype(param.dtype));
    detail::check_tensor(op, "v", v, ops::compute_dtype(param.dtype));
    T* p = param.ptr<T>();
    const T* g = grad.ptr<T>();
    T* mm = m.ptr<T>();
    T* vv = v.ptr<T>();
    const T gs = T(hyper.grad_scale), decay = T(s.decay), b1 = T(hyper.beta1), b2 = T(hyper.beta2),
            step = T(s.step_size), bc2 = T(s.bias_correction2_sqrt), eps = T(hyper.eps);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      p[i] = adamw_element<T>(p[i], g[i], mm[i], vv[i], gs, decay, b1, b2, step, bc2, eps);
  });
}

// sum(x^2) in double.
double sum_squares(Context& ctx, Tensor x) {
  constexpr const char* op = "sum_squares";
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  INGOT_CHECK(x.present() && x.device == Device::cpu, op, ": x must be a present host tensor");
  constexpr int64_t kChunk = 4096;  // fixed, so the summation order ignores the thread count
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(n_chunks));
  auto run = [&](auto load) {
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t end = std::min(n, (c + 1) * kChunk);
      double lane[8] = {};
      for (int64_t i = c * kChunk; i < end; ++i) {
        const double e = load(i);
        lane[i & 7] += e * e;
      }
      partial[c] = ((lane[0] + lane[4]) + (lane[2] + lane[6])) +
                   ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    }
  };
  switch (x.dtype) {
    case DType::f32: run([p = x.ptr<float>()](int64_t i) { return double(p[i]); }); break;
    case DType::f64: run([p = x.ptr<double>()](int64_t i) { return p[i]; }); break;
    case DType::bf16:
      run([p = x.ptr<uint16_t>()](int64_t i) { return double(bf16_to_f32(p[i])); });
      break;
    case DType::f16:
      run([p = x.ptr<uint16_t>()](int64_t i) { return double(f16_to_f32(p[i])); });
      break;
    default: fail(op, ": unsupported dtype ", dtype_name(x.dtype), " on the CPU backend");
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace ingot::cpu
