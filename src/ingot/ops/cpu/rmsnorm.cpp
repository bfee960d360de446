// RMSNorm over the last dimension of (R,C) rows.
// Invariants: rstd (R) is in the input dtype (the CPU compute dtype); din ACCUMULATES (it is the
// residual-stream gradient); dweight accumulates and is summed over rows in row order by the
// thread that owns its column block, so it is bit-identical for any thread count.
#include <algorithm>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {

// out (R,C) = in (R,C) * rstd * weight (C); rstd (R)
void rmsnorm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, double eps) {
  constexpr const char* op = "rmsnorm_forward";
  detail::dispatch_float(op, in.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "in", in, in.dtype);
    detail::check_tensor(op, "out", out, in.dtype);
    detail::check_tensor(op, "weight", weight, in.dtype);
    detail::check_tensor(op, "rstd", rstd, ops::compute_dtype(in.dtype));
    const int64_t C = weight.numel();
    INGOT_CHECK(C > 0 && in.dim(-1) == C, op, ": in ", in.shape_string(), " does not end in C = ", C);
    const int64_t R = in.numel() / C;
    detail::check_numel(op, "out", out, R * C);
    detail::check_numel(op, "rstd", rstd, R);
    const T* x = in.ptr<T>();
    const T* w = weight.ptr<T>();
    T* y = out.ptr<T>();
    T* s = rstd.ptr<T>();
    const T e = static_cast<T>(eps);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t r = 0; r < R; ++r) s[r] = detail::rmsnorm_row_forward(y + r * C, x + r * C, w, C, e);
  });
}

// din (R,C) += d in; dweight (C) += sum_r dout * in * rstd
void rmsnorm_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in,
                      Tensor weight, Tensor rstd) {
  constexpr const char* op = "rmsnorm_backward";
  detail::dispatch_float(op, in.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "in", in, in.dtype);
    detail::check_tensor(op, "dout", dout, in.dtype);
    detail::check_tensor(op, "weight", weight, in.dtype);
    detail::check_tensor(op, "rstd", rstd, ops::compute_dtype(in.dtype));
    const int64_t C = weight.numel();
    INGOT_CHECK(C > 0 && in.dim(-1) == C, op, ": in ", in.shape_string(), " does not end in C = ", C);
    const int64_t R = in.numel() / C;
    detail::check_numel(op, "dout", dout, R * C);
    detail::check_numel(op, "rstd", rstd, R);
    const T* x = in.ptr<T>();
    const T* w = weight.ptr<T>();
    const T* g = dout.ptr<T>();
    const T* s = rstd.ptr<T>();
    if (din.present()) {
      detail::check_tensor(op, "din", din, in.dtype);
      detail::check_numel(op, "din", din, R * C);
      T* dx = din.ptr<T>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
      for (int64_t r = 0; r < R; ++r)
        detail::rmsnorm_row_backward(dx + r * C, g + r * C, x + r * C, w, s[r], C, true);
    }
    if (dweight.present()) {
      detail::check_tensor(op, "dweight", dweight, in.dtype);
      detail::check_numel(op, "dweight", dweight, C);
      T* dw = dweight.ptr<T>();
      constexpr int64_t kBlock = 32;
      const int64_t n_blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        const int64_t c0 = blk * kBlock, width = std::min(kBlock, C - c0);
        T acc[kBlock] = {};
        for (int64_t r = 0; r < R; ++r) {
          const T* gr = g + r * C + c0;
          const T* xr = x + r * C + c0;
          for (int64_t c = 0; c < width; ++c) acc[c] += gr[c] * (xr[c] * s[r]);
        }
        for (int64_t c = 0; c < width; ++c) dw[c0 + c] += acc[c];
      }
    }
  });
}

}  // namespace ingot::cpu
