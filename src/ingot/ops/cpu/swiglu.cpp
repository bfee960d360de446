// SwiGLU: gate_up (N,2F) = [gate | up] -> out (N,F) = silu(gate) * up.
// Invariants: elementwise, so any thread split gives identical bits; dgate_up OVERWRITES.
// silu(g) = g * sigmoid(g); d silu/dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
#include <algorithm>
#include <cmath>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {

void swiglu_forward(Context& ctx, Tensor out, Tensor gate_up) {
  constexpr const char* op = "swiglu_forward";
  detail::dispatch_float(op, gate_up.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "gate_up", gate_up, gate_up.dtype);
    detail::check_tensor(op, "out", out, gate_up.dtype);
    const int64_t F2 = gate_up.dim(-1), F = F2 / 2, N = gate_up.numel() / std::max<int64_t>(F2, 1);
    INGOT_CHECK(F2 % 2 == 0, op, ": gate_up ", gate_up.shape_string(), " last dim must be even");
    INGOT_CHECK(out.dim(-1) == F && out.numel() == N * F, op, ": out ", out.shape_string(),
                " is not (", N, ",", F, ")");
    const T* x = gate_up.ptr<T>();
    T* y = out.ptr<T>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* gate = x + n * F2;
      const T* up = gate + F;
      for (int64_t f = 0; f < F; ++f) {
        const T g = gate[f];
        y[n * F + f] = g / (T(1) + std::exp(-g)) * up[f];
      }
    }
  });
}

void swiglu_backward(Context& ctx, Tensor dgate_up, Tensor dout, Tensor gate_up) {
  constexpr const char* op = "swiglu_backward";
  detail::dispatch_float(op, gate_up.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "gate_up", gate_up, gate_up.dtype);
    detail::check_tensor(op, "dgate_up", dgate_up, gate_up.dtype);
    detail::check_tensor(op, "dout", dout, gate_up.dtype);
    const int64_t F2 = gate_up.dim(-1), F = F2 / 2, N = gate_up.numel() / std::max<int64_t>(F2, 1);
    INGOT_CHECK(F2 % 2 == 0, op, ": gate_up ", gate_up.shape_string(), " last dim must be even");
    detail::check_numel(op, "dgate_up", dgate_up, N * F2);
    detail::check_numel(op, "dout", dout, N * F);
    const T* x = gate_up.ptr<T>();
    const T* dy = dout.ptr<T>();
    T* dx = dgate_up.ptr<T>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* gate = x + n * F2;
      const T* up = gate + F;
      T* dgate = dx + n * F2;
      T* dup = dgate + F;
      for (int64_t f = 0; f < F; ++f) {
        const T g = gate[f], u = up[f], d = dy[n * F + f];
        const T sig = T(1) / (T(1) + std::exp(-g));
        dgate[f] = d * u * (sig * (T(1) + g * (T(1) - sig)));
        dup[f] = d * (g * sig);
      }
    }
  });
}

}  // namespace ingot::cpu
